//! `substrat-sandbox team`: the team key (`team key new FILE`) and the
//! team's certificate authorities (`team ca show|rotate|retire`, asked of
//! the daemon of --state-dir, which must have been given the team key).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Result, bail};
use clap::{Args, Subcommand};
use serde_json::Value;
use substrat_broker::control::{Request, TeamCaAction};

#[derive(Debug, Args)]
pub struct TeamArgs {
    /// The daemon's state directory. Default: ~/.substrat (with no home directory: as `daemon --help` says).
    #[arg(long, global = true, value_name = "DIR", env = "SUBSTRAT_STATE_DIR")]
    pub state_dir: Option<PathBuf>,
    /// Print JSON.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub command: TeamCommand,
}

#[derive(Debug, Subcommand)]
pub enum TeamCommand {
    /// The team key every daemon of the team is given (`daemon --team-key FILE`).
    #[command(subcommand)]
    Key(KeyCommand),
    /// The team's certificate authorities for relays on other hosts.
    #[command(subcommand)]
    Ca(CaCommand),
}

#[derive(Debug, Subcommand)]
pub enum KeyCommand {
    /// Write a new team key to FILE (0600, never over an existing file); copy it to each daemon's host.
    New { file: PathBuf },
}

#[derive(Debug, Subcommand)]
pub enum CaCommand {
    /// The team's authorities: generation, fingerprint, state (current, trusted, retired).
    Show,
    /// Make a new current authority; the old one stays trusted (certificates of both work) until `retire`.
    Rotate,
    /// Refuse every authority but the current one from now on; the certificates they issued are revoked and their connections closed.
    Retire,
}

pub fn team(args: &TeamArgs) -> ExitCode {
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!(
                "substrat-sandbox team: {}",
                substrat_cli::term::error_text(&e)
            );
            ExitCode::from(2)
        }
    }
}

fn run(args: &TeamArgs) -> Result<()> {
    let action = match &args.command {
        TeamCommand::Key(KeyCommand::New { file }) => {
            substrat_broker::team_key::TeamKey::create(file)?;
            println!(
                "wrote {} (0600): give it to every daemon of the team as --team-key",
                file.display()
            );
            return Ok(());
        }
        TeamCommand::Ca(CaCommand::Show) => TeamCaAction::Show,
        TeamCommand::Ca(CaCommand::Rotate) => TeamCaAction::Rotate,
        TeamCommand::Ca(CaCommand::Retire) => TeamCaAction::Retire,
    };
    let state_dir = crate::daemon::state_dir(args.state_dir.as_deref())?;
    let reply = crate::daemon::call(&state_dir, &Request::TeamCa { action })?;
    if reply["ok"] != Value::Bool(true) {
        bail!(
            "{} ({})",
            reply["message"].as_str().unwrap_or("refused"),
            reply["error"].as_str().unwrap_or("error")
        );
    }
    if args.json {
        println!("{reply}");
        return Ok(());
    }
    if let Some(generation) = reply["rotated_to"].as_i64() {
        println!(
            "rotated: generation {generation} issues now; the others stay trusted until `team ca retire`"
        );
    }
    if let Some(retired) = reply["retired"].as_u64() {
        println!(
            "retired {retired} authorities; {} certificates revoked",
            reply["certificates_revoked"].as_u64().unwrap_or(0)
        );
    }
    for authority in reply["authorities"].as_array().into_iter().flatten() {
        println!(
            "{:>3}  {:<8}  {}",
            authority["generation"].as_i64().unwrap_or(0),
            authority["state"].as_str().unwrap_or("?"),
            authority["fingerprint"].as_str().unwrap_or("?"),
        );
    }
    Ok(())
}
