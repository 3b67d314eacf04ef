#![forbid(unsafe_code)]
//! The policy language of substrat-sandbox: model, loading with positions,
//! validation, and the `check` audit. Pure: reads files, makes no other
//! system calls, changes nothing.
//!
//! The modules, in the order a policy goes through them:
//! - `source`: TOML with the position of every key; `location`: a place in
//!   a file; `error`: errors that point at one.
//! - `load`: a policy file or a built-in one (`builtin`), `extends` merged;
//!   `model`: what a policy says; `paths`: path templates (`${HOME}`...);
//!   `seccomp`: seccomp profiles; `hosts`: host patterns for the proxy;
//!   `validate`: what a loaded policy must satisfy.
//! - `check`: the audit (rules per family, host facts, reports);
//!   `subid`: subordinate id ranges (/etc/subuid), which the audit and the
//!   launcher read; `workspace_risk`: workspaces that expose more than a
//!   project (`/`, a home, credentials), which the launcher refuses;
//!   `sockets`: the Unix sockets at or below a bind's source (a bounded
//!   scan), which `check` and the launchers report.
//! - `text`: agent-chosen text made safe to show a person (every printer
//!   of the other crates uses it; here as the crate they all depend on).

pub mod builtin;
pub mod check;
pub mod error;
pub mod hosts;
pub mod inline;
pub mod learn;
pub mod load;
pub mod location;
pub mod model;
pub mod paths;
pub mod place;
pub mod seccomp;
pub mod sockets;
pub mod source;
pub mod subid;
pub mod text;
mod validate;
pub mod workspace_risk;

pub use error::{ErrorKind, PolicyError, PolicyErrors};
pub use load::{
    LoadOptions, LoadedPolicy, SeccompChoice, load_builtin, load_file, load_str, valid_role_name,
};
pub use model::Policy;
