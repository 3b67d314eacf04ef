#![forbid(unsafe_code)]
//! Agent CLI providers: how a turn is invoked and how its output is read.
//! The broker drives turns through [`Provider`] only, so another agent CLI
//! is one more implementation here, not a change to the broker.

pub mod cursor;
pub mod events;
pub mod transcript;

use std::path::{Path, PathBuf};

pub use cursor::CursorAgent;
pub use events::{Line, StreamEvent, parse_line};
pub use transcript::{Transcript, TurnEnd};

/// One turn as the provider is asked to run it.
#[derive(Debug, Clone)]
pub struct TurnRequest<'a> {
    pub model: Option<&'a str>,
    /// The workspace path inside the sandbox (the same as on the host).
    pub workspace: &'a Path,
    /// The session to continue (`--resume`), if the agent has one.
    pub resume: Option<&'a str>,
    pub prompt: &'a str,
}

/// A host path the provider's program needs inside the sandbox, read-only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProgramMount {
    pub source: PathBuf,
    pub target: PathBuf,
}

pub trait Provider: std::fmt::Debug + Send + Sync {
    /// A short name for logs and `agent inspect`.
    fn name(&self) -> &str;
    /// What to bind read-only so `argv` can run inside the sandbox.
    fn mounts(&self) -> Vec<ProgramMount>;
    /// The command line of one turn, as run inside the sandbox.
    fn argv(&self, turn: &TurnRequest<'_>) -> Vec<String>;
    /// One line of the turn's standard output.
    fn parse_line(&self, line: &str) -> Line;
}
