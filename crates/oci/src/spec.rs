//! The bundle's `config.json` (runtime-spec 1.x), as far as a Linux
//! container on this runtime can use it. Every object refuses fields it
//! does not name (`deny_unknown_fields`): a setting this runtime has never
//! heard of is refused at `create`, never dropped. Fields it knows but does
//! not implement are kept as raw JSON and refused by `translate`, which
//! names them.
//!
//! Written here rather than taken from the oci-spec crate: that crate
//! accepts and drops unknown fields, the opposite of what a runtime that
//! must refuse what it cannot honour needs, and brings a builder layer the
//! runtime has no use for.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

/// The largest `config.json` read (podman's are a few KiB).
pub const MAX_CONFIG_BYTES: usize = 4 << 20;

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Spec {
    pub oci_version: String,
    pub root: Option<Root>,
    pub process: Option<Process>,
    pub hostname: Option<String>,
    pub domainname: Option<String>,
    #[serde(default)]
    pub mounts: Vec<Mount>,
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    pub linux: Option<Linux>,
    pub hooks: Option<Value>,
    /// Other platforms' sections: refused when present.
    pub windows: Option<Value>,
    pub solaris: Option<Value>,
    pub vm: Option<Value>,
    pub zos: Option<Value>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Root {
    pub path: String,
    #[serde(default)]
    pub readonly: bool,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Process {
    #[serde(default)]
    pub terminal: bool,
    pub console_size: Option<ConsoleSize>,
    pub user: User,
    #[serde(default)]
    pub args: Vec<String>,
    pub command_line: Option<String>,
    #[serde(default)]
    pub env: Vec<String>,
    pub cwd: String,
    pub capabilities: Option<Capabilities>,
    #[serde(default)]
    pub rlimits: Vec<Rlimit>,
    #[serde(default)]
    pub no_new_privileges: bool,
    pub apparmor_profile: Option<String>,
    pub oom_score_adj: Option<i32>,
    pub selinux_label: Option<String>,
    pub io_priority: Option<Value>,
    pub scheduler: Option<Value>,
    #[serde(rename = "execCPUAffinity")]
    pub exec_cpu_affinity: Option<Value>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct User {
    pub uid: u32,
    pub gid: u32,
    pub umask: Option<u32>,
    #[serde(default)]
    pub additional_gids: Vec<u32>,
    pub username: Option<String>,
}

/// The terminal's size, with `process.terminal`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConsoleSize {
    pub height: u32,
    pub width: u32,
}

/// Accepted whatever they ask: the container gets no capability at all
/// (the stricter of the two), which `translate` reports.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Capabilities {
    #[serde(default)]
    pub bounding: Vec<String>,
    #[serde(default)]
    pub effective: Vec<String>,
    #[serde(default)]
    pub inheritable: Vec<String>,
    #[serde(default)]
    pub permitted: Vec<String>,
    #[serde(default)]
    pub ambient: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rlimit {
    #[serde(rename = "type")]
    pub kind: String,
    pub hard: u64,
    pub soft: u64,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Mount {
    pub destination: String,
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub source: Option<String>,
    #[serde(default)]
    pub options: Vec<String>,
    pub uid_mappings: Option<Value>,
    pub gid_mappings: Option<Value>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Linux {
    #[serde(default)]
    pub namespaces: Vec<Namespace>,
    #[serde(default)]
    pub uid_mappings: Vec<IdMapping>,
    #[serde(default)]
    pub gid_mappings: Vec<IdMapping>,
    pub time_offsets: Option<Value>,
    #[serde(default)]
    pub devices: Vec<Value>,
    pub cgroups_path: Option<String>,
    pub resources: Option<Resources>,
    pub rootfs_propagation: Option<String>,
    pub seccomp: Option<Value>,
    #[serde(default)]
    pub sysctl: BTreeMap<String, String>,
    #[serde(default)]
    pub masked_paths: Vec<String>,
    #[serde(default)]
    pub readonly_paths: Vec<String>,
    pub mount_label: Option<String>,
    pub intel_rdt: Option<Value>,
    pub personality: Option<Value>,
    pub memory_policy: Option<Value>,
    pub net_devices: Option<Value>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Namespace {
    #[serde(rename = "type")]
    pub kind: String,
    pub path: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct IdMapping {
    #[serde(rename = "containerID")]
    pub container_id: u32,
    #[serde(rename = "hostID")]
    pub host_id: u32,
    pub size: u32,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Resources {
    /// Device cgroup rules: accepted, since they cannot widen the sandbox's
    /// /dev (the harmless nodes only); see `translate`.
    #[serde(default)]
    pub devices: Vec<DeviceRule>,
    pub memory: Option<Memory>,
    pub cpu: Option<Cpu>,
    pub pids: Option<Pids>,
    #[serde(rename = "blockIO")]
    pub block_io: Option<Value>,
    #[serde(default)]
    pub hugepage_limits: Vec<serde_json::Map<String, Value>>,
    pub network: Option<Value>,
    pub rdma: Option<Value>,
    pub unified: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DeviceRule {
    pub allow: bool,
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub major: Option<i64>,
    pub minor: Option<i64>,
    pub access: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Memory {
    pub limit: Option<i64>,
    pub reservation: Option<i64>,
    pub swap: Option<i64>,
    pub kernel: Option<i64>,
    #[serde(rename = "kernelTCP")]
    pub kernel_tcp: Option<i64>,
    pub swappiness: Option<u64>,
    #[serde(rename = "disableOOMKiller")]
    pub disable_oom_killer: Option<bool>,
    pub use_hierarchy: Option<bool>,
    pub check_before_update: Option<bool>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Cpu {
    pub shares: Option<u64>,
    pub quota: Option<i64>,
    pub burst: Option<u64>,
    pub period: Option<u64>,
    pub realtime_runtime: Option<i64>,
    pub realtime_period: Option<u64>,
    pub cpus: Option<String>,
    pub mems: Option<String>,
    pub idle: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pids {
    pub limit: i64,
}

/// Why `config.json` is not a spec this runtime reads.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    #[error("config.json is {0} bytes, over the limit of {MAX_CONFIG_BYTES}")]
    TooLarge(usize),
    #[error("config.json: {path}: {message}")]
    Invalid { path: String, message: String },
}

/// Parses `config.json`; the error names the field (`linux.resources.foo`).
pub fn parse(bytes: &[u8]) -> Result<Spec, SpecError> {
    if bytes.len() > MAX_CONFIG_BYTES {
        return Err(SpecError::TooLarge(bytes.len()));
    }
    let deserializer = &mut serde_json::Deserializer::from_slice(bytes);
    serde_path_to_error::deserialize(deserializer).map_err(|err| SpecError::Invalid {
        path: err.path().to_string(),
        message: err.into_inner().to_string(),
    })
}
