//! What substrat-sandbox does with the kernel. For now: probing what a host
//! can enforce. All unsafe code of this crate lives in `sys`.

pub mod host;
mod sys;

pub use host::{ProbeOptions, probe_host, userns_probe_child};
