//! The command line's own pieces besides its definition in main.rs: the
//! value parsers of `--arg` and `--warm-pool`, and which commands end at a
//! closed pipe.

use crate::Command;

impl Command {
    /// Whether the command prints and ends, as C tools do: then SIGPIPE
    /// gets its default action, so output into a pipe whose reader is gone
    /// (`agent list | head -1`) ends it quietly wherever it writes (our
    /// prints, clap's generators), where Rust's ignored SIGPIPE made
    /// `println!` panic. Not for the processes that serve or supervise
    /// (the daemon, a launch, the proxy, the terminal relay, the probes):
    /// a peer hanging up on one of their sockets or pipes must be an error
    /// they handle, not their end. Their children get the default anyway
    /// (std's `Command` restores it).
    pub(crate) fn prints_and_ends(&self) -> bool {
        match self {
            Command::Run(args) => args.dry_run,
            Command::Daemon(_)
            | Command::Top(_)
            | Command::Proxy { .. }
            | Command::TtyRelay
            | Command::ProbeUserns { .. }
            | Command::ProbeIdmap { .. }
            | Command::RoleEval
            | Command::Learn(_)
            | Command::LearnExec { .. } => false,
            Command::Check(_)
            | Command::Explain(_)
            | Command::Agent(_)
            | Command::Tools(_)
            | Command::Role(_)
            | Command::Team(_)
            | Command::Workspace(_)
            | Command::Demo { .. }
            | Command::Completions { .. }
            | Command::Man { .. } => true,
        }
    }
}

/// `--arg KEY=VALUE`: a role argument (the key non-empty).
pub fn parse_role_arg(given: &str) -> Result<(String, String), String> {
    match given.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_string(), value.to_string())),
        _ => Err(format!("`{given}`: expected KEY=VALUE")),
    }
}

/// `--warm-pool ROLE=COUNT`: a role's name and 1 to 16 sandboxes.
pub fn parse_pool_size(text: &str) -> Result<(String, usize), String> {
    let (role, count) = text
        .split_once('=')
        .ok_or_else(|| format!("`{text}`: expected ROLE=COUNT"))?;
    if role.is_empty() {
        return Err(format!("`{text}`: no role before `=`"));
    }
    match count.parse::<usize>() {
        Ok(n @ 1..=16) => Ok((role.to_string(), n)),
        _ => Err(format!("`{text}`: COUNT must be a number from 1 to 16")),
    }
}
