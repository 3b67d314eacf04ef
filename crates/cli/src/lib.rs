#![forbid(unsafe_code)]
//! What both `substrat-sandbox` and the small `substrat-run` binary need:
//! the launcher (`run`) and the start of a launch's egress proxy.
//!
//! - `launch`: `run`'s arguments to a plan, the launch, the report;
//!   `workspace_git`: the workspace's git metadata around a launch;
//!   `workspace_guard`: the workspace and home a launch refuses;
//!   `proxy_process`: the egress proxy a `network = "proxy"` launch starts;
//!   `findings`: what the audit says about the policy, told before a run;
//!   `explain`: `run --dry-run`, the plan in words or JSON; `not_found`:
//!   the bind that would show a command found on the host only; `term`:
//!   colour only on a terminal; `terminal`: the pseudo-terminal of
//!   `run -t`; `state_dirs`: where state goes when no flag says.
//!
//! The `substrat-sandbox` binary's own commands (check, daemon, agent,
//! demo) are modules of main.rs.

pub mod explain;
pub mod findings;
pub mod launch;
pub mod layer_commands;
pub mod layer_dir;
pub mod learn;
pub mod not_found;
pub mod overlay_ids;
pub mod progress;
pub mod proxy_process;
pub mod state_dirs;
pub mod term;
pub mod terminal;
pub mod workspace_git;
pub mod workspace_guard;
pub mod workspace_layer;
