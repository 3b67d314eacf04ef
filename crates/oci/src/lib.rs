//! `substrat-oci`: an OCI runtime (the runtime-spec's command line) over
//! the native backend. A bundle's `config.json` is parsed (`spec`),
//! translated into the launch plan the policies also produce (`translate`,
//! `mounts`), made at least as strict as the substrat policies the
//! operator and the container name (`runtime_config`, `layer`), and run by
//! the same code as `substrat-run`; `state` keeps each container's record
//! under the runtime's root directory.

#![forbid(unsafe_code)]

mod checks;
pub mod engine_cgroup;
pub mod exec;
pub mod freeze;
pub mod grant_paths;
pub mod host_paths;
pub mod layer;
mod limits;
pub mod mounts;
pub mod own_places;
pub mod runtime_config;
pub mod sockets;
pub mod spec;
pub mod state;
#[cfg(test)]
mod tests;
pub mod translate;
pub mod update;
#[cfg(test)]
mod walls_tests;
