#![forbid(unsafe_code)]
//! `substrat-init`: the bwrap backend's step inside the sandbox. bwrap runs
//! it after its mounts; it applies Landlock, no_new_privs and the rlimits,
//! reports to the launcher and execs the command.
//!
//! A binary of its own, not a subcommand of `substrat-sandbox`: it is
//! started on every bwrap launch, and a small program with no argument
//! parser starts in a fraction of the time (docs/benchmarks.md).

use substrat_sandbox::bwrap::{HelperArgs, helper_main};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match HelperArgs::parse(&args) {
        Ok(parsed) => helper_main(&parsed),
        Err(message) => {
            eprintln!("substrat-init: {message}");
            eprintln!("usage: substrat-init --status-fd FD --config-fd FD -- COMMAND [ARG...]");
            std::process::exit(125)
        }
    }
}
