#![forbid(unsafe_code)]
//! The policy language of substrat-sandbox: model, loading with positions,
//! validation, and the `check` audit. Pure: reads files, makes no other
//! system calls, changes nothing.

pub mod builtin;
pub mod check;
pub mod error;
pub mod hosts;
pub mod load;
pub mod location;
pub mod model;
pub mod paths;
pub mod seccomp;
pub mod source;
pub mod subid;
mod validate;

pub use error::{ErrorKind, PolicyError, PolicyErrors};
pub use load::{LoadOptions, LoadedPolicy, SeccompChoice, load_builtin, load_file, load_str};
pub use model::Policy;
