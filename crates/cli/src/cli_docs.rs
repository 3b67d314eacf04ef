//! Shell completions and man pages, generated from the CLI definition so
//! they never drift from it (`substrat-sandbox completions SHELL`,
//! `substrat-sandbox man [--dir DIR]`; `scripts/install-shell-files`
//! installs both).

use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::CommandFactory;
use clap_complete::Shell;

use crate::Cli;

const NAME: &str = "substrat-sandbox";

/// The completion script for `shell` on stdout.
pub fn completions(shell: Shell) -> ExitCode {
    let mut command = Cli::command();
    clap_complete::generate(shell, &mut command, NAME, &mut std::io::stdout());
    ExitCode::SUCCESS
}

/// The man page on stdout, or with `dir` one page per command there
/// (`substrat-sandbox.1`, `substrat-sandbox-run.1`...).
pub fn man(dir: Option<&Path>) -> ExitCode {
    let result = match dir {
        Some(dir) => write_pages(dir),
        None => clap_mangen::Man::new(Cli::command())
            .render(&mut std::io::stdout())
            .context("cannot write the man page"),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{NAME} man: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn write_pages(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    clap_mangen::generate_to(Cli::command(), dir)
        .with_context(|| format!("cannot write man pages to {}", dir.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every command and every flag a user can see says what it does:
    /// `--help` has no blank entries.
    #[test]
    fn every_visible_command_and_argument_is_described() {
        fn walk(command: &clap::Command, path: &str, blank: &mut Vec<String>) {
            if command.get_about().is_none() && !path.is_empty() {
                blank.push(format!("command `{path}`"));
            }
            for arg in command.get_arguments() {
                let builtin = matches!(arg.get_id().as_str(), "help" | "version");
                if !arg.is_hide_set() && !builtin && arg.get_help().is_none() {
                    blank.push(format!("`{path}` argument `{}`", arg.get_id()));
                }
            }
            for sub in command.get_subcommands() {
                if !sub.is_hide_set() && sub.get_name() != "help" {
                    walk(sub, format!("{path} {}", sub.get_name()).trim(), blank);
                }
            }
        }
        let mut blank = Vec::new();
        walk(&Cli::command(), "", &mut blank);
        assert_eq!(blank, Vec::<String>::new());
    }

    #[test]
    fn the_man_pages_name_every_command() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        write_pages(dir.path()).unwrap_or_else(|e| panic!("{e:#}"));
        for page in [
            "substrat-sandbox.1",
            "substrat-sandbox-run.1",
            "substrat-sandbox-agent-spawn.1",
        ] {
            let text = std::fs::read_to_string(dir.path().join(page)).unwrap_or_default();
            assert!(text.contains(".TH"), "{page}: {text}");
        }
    }
}
