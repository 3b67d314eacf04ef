#![forbid(unsafe_code)]
//! What both `substrat-sandbox` and the small `substrat-run` binary need:
//! the launcher (`run`) and the start of a launch's egress proxy.

pub mod launch;
pub mod proxy_process;
pub mod workspace_git;
