#![forbid(unsafe_code)]
//! `substrat-run`: `substrat-sandbox run` in a binary of its own. It holds
//! only the launcher, so it starts in a fraction of the time the full
//! command needs (docs/benchmarks.md); the daemon starts its turns and
//! upstream servers with it.

use std::process::ExitCode;

use clap::Parser;
use substrat_cli::launch::{self, RunArgs};

#[derive(Debug, Parser)]
#[command(
    name = "substrat-run",
    version,
    about = "Run a command inside a sandbox built from a policy (the same as `substrat-sandbox run`).",
    long_about = launch::LONG_HELP
)]
struct Cli {
    #[command(flatten)]
    args: RunArgs,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    launch::run(&cli.args, "substrat-run")
}
