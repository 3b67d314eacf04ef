//! `substrat-sandbox agent ...`: the commands an operator gives a running
//! daemon's agents, as clap reads them.

use std::path::PathBuf;

use clap::Subcommand;

use crate::cli_args::parse_role_arg;

#[derive(Debug, clap::Args)]
pub struct AgentArgs {
    /// The daemon's state directory. Default: ~/.substrat (with no home directory: as `daemon --help` says).
    #[arg(long, global = true, value_name = "DIR", env = "SUBSTRAT_STATE_DIR")]
    pub state_dir: Option<PathBuf>,
    /// Print JSON.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub command: AgentCommand,
}

#[derive(Debug, Subcommand)]
pub enum AgentCommand {
    /// Start a root agent: its first turn runs INSTRUCTIONS in its sandbox.
    #[command(
        long_about = "Start a root agent: its first turn runs INSTRUCTIONS in its sandbox, \
built from the role's policy, in WORKSPACE. The workspace is judged first: one that exposes \
more than a project (/, a home, credentials) is refused unless the role allows it.\n\n\
Examples:\n  substrat-sandbox agent spawn lead --workspace ~/proj \"Plan the refactor; spawn workers as needed\"\n  \
substrat-sandbox agent spawn rev --role reviewer --provider claude --workspace ~/proj \"Review the last commit\""
    )]
    Spawn {
        /// The agent's name (1-64 of letters, digits, `-`, `_`, `.`), unique in the team.
        name: String,
        /// Its role: a policy of the daemon's --policies directory or a built-in one.
        #[arg(long, default_value = "worker")]
        role: String,
        /// The directory it works in (bound read-write at the same path by most roles).
        #[arg(long)]
        workspace: PathBuf,
        /// The model its CLI asks for (passed to the CLI; default: the CLI's own).
        #[arg(long)]
        model: Option<String>,
        /// The agent CLI its turns run (claude, codex, gemini, cursor-agent,
        /// stand-in); default: the daemon's `--provider`.
        #[arg(long)]
        provider: Option<String>,
        /// An argument of a script role (`persona.script`), as KEY=VALUE; repeatable. The role resolves its system prompt with them once, now.
        #[arg(long = "arg", value_name = "KEY=VALUE", value_parser = parse_role_arg)]
        args: Vec<(String, String)>,
        /// The first turn's prompt.
        instructions: String,
    },
    /// Register an agent without a turn and open its broker socket.
    Create {
        /// The agent's name, unique in the team.
        name: String,
        /// Its role: a policy of the daemon's --policies directory or a built-in one.
        #[arg(long, default_value = "worker")]
        role: String,
        /// The agent it reports to (it starts in its parent's workspace unless --workspace).
        #[arg(long)]
        parent: Option<String>,
        /// The directory it works in.
        #[arg(long)]
        workspace: Option<PathBuf>,
        /// The agent CLI its turns run; default: the daemon's `--provider`.
        #[arg(long)]
        provider: Option<String>,
    },
    /// List agents as a tree with their states (idle, busy, waiting, suspended, failed).
    List,
    /// Show an agent and its recent activity (last 5 turns, last 10 messages); --json for the whole record.
    Inspect {
        /// The agent.
        name: String,
    },
    /// Give an agent TEXT as its next turn's prompt.
    Send {
        /// The agent.
        name: String,
        /// The prompt of its next turn.
        text: String,
    },
    /// Stop the agent's running turn (it is queued again) and start no new ones.
    Suspend {
        /// The agent.
        name: String,
    },
    /// Let a suspended or failed agent run turns again, continuing its session.
    Resume {
        /// The agent.
        name: String,
    },
    /// Stop the agent's running turn now; the agent is failed until resumed.
    Kill {
        /// The agent.
        name: String,
    },
    /// Remove an agent (refused while it has children) and its socket.
    Remove {
        /// The agent.
        name: String,
    },
    /// Issue the agent a client certificate for a relay on another host (`daemon --listen-tls`): writes agent.crt, agent.key (0600) and ca.crt into DIR.
    Cert {
        /// The agent.
        name: String,
        /// Where to write the files (made 0700 when missing).
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
        /// Revoke the agent's earlier certificates.
        #[arg(long)]
        replace: bool,
    },
    /// What an agent of an overlay role changed in its workspace: a git patch (`git apply` takes it), --stat, or --json; its commits as a range.
    Diff {
        /// The agent.
        name: String,
        /// One line per changed path, with why apply would skip it.
        #[arg(long)]
        stat: bool,
    },
    /// Take an overlay agent's changes (or those under PATH...) into its workspace; refused where the host changed since, unless --force.
    Apply {
        /// The agent.
        name: String,
        /// Only these paths (relative to the workspace) and what is below them.
        #[arg(value_name = "PATH")]
        paths: Vec<PathBuf>,
        /// Take the agent's side where the host changed since the agent's base.
        #[arg(long)]
        force: bool,
        /// Apply only if the changes are the ones whose digest `diff` printed; without it, only if nothing changed since the last diff.
        #[arg(long, value_name = "DIGEST")]
        expect: Option<String>,
    },
    /// Suspend an overlay agent and show its changes (as `diff`); it resumes after `agent apply` or `agent discard`.
    Review {
        /// The agent.
        name: String,
        /// One line per changed path, with why apply would skip it.
        #[arg(long)]
        stat: bool,
    },
    /// Throw an overlay agent's changes away (its workspace is again the host's).
    Discard {
        /// The agent.
        name: String,
    },
    /// Undo an overlay agent's turn N and every later one (its earlier turns stay).
    Rollback {
        /// The agent.
        name: String,
        /// The first turn to undo (`agent diff --json` lists its turns).
        #[arg(long, value_name = "N")]
        turn: u32,
    },
}
