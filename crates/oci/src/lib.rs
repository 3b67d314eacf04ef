//! `substrat-oci`: an OCI runtime (the runtime-spec's command line) over
//! the native backend. A bundle's `config.json` is parsed (`spec`),
//! translated into the launch plan the policies also produce (`translate`,
//! `mounts`), and run by the same code as `substrat-run`; `state` keeps
//! each container's record under the runtime's root directory.

#![forbid(unsafe_code)]

mod checks;
pub mod exec;
mod limits;
pub mod mounts;
pub mod spec;
pub mod state;
#[cfg(test)]
mod tests;
pub mod translate;
