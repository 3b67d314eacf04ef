//! The policy language, version 1. Every table denies unknown keys so a typo
//! is an error, never a silent default. Ranges and path rules are checked in
//! `validate`, which can report all problems at once with their positions.
//! docs/policy.md documents each key; keep the two in step.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize};

use crate::paths::PathTemplate;

mod budget;
pub use budget::{
    DEFAULT_CONCURRENT_REQUESTS, HostedTool, MAX_MODEL_NAME, ModelBudget, model_matches,
    model_name_problem,
};

pub const POLICY_VERSION: u32 = 1;

/// The protected paths used when a policy does not list its own.
pub const DEFAULT_PROTECTED: [&str; 3] = [".cursor/", ".git/hooks/", ".git/config"];

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    pub version: u32,
    /// Resolved by the loader; kept here so the key is known to the schema.
    #[serde(default, skip_serializing)]
    pub extends: Option<String>,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub persona: Persona,
    #[serde(default)]
    pub filesystem: Filesystem,
    #[serde(default)]
    pub namespaces: Namespaces,
    #[serde(default)]
    pub network: NetworkMode,
    /// The allowlist of `network = "proxy"`.
    #[serde(default)]
    pub proxy: Option<ProxyPolicy>,
    #[serde(default)]
    pub seccomp: SeccompSettings,
    #[serde(default)]
    pub landlock: LandlockMode,
    #[serde(default)]
    pub rlimits: Rlimits,
    #[serde(default)]
    pub cgroup: CgroupLimits,
    #[serde(default)]
    pub env: EnvPolicy,
    #[serde(default)]
    pub mcp: McpLimits,
    /// The agent's model use through the daemon's gateway.
    #[serde(default)]
    pub model: ModelBudget,
    #[serde(default)]
    pub tools: ToolScope,
}

/// A role is a policy plus a persona: what the agent is told it is.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Persona {
    pub description: Option<String>,
    pub system_prompt: Option<String>,
    /// A Lua script resolving the role's prompt from arguments and the
    /// team (seed 004 §3.2), relative to the policy file; instead of
    /// `system_prompt`.
    pub script: Option<std::path::PathBuf>,
    /// The script's time limit per evaluation (default 2,000 ms).
    pub timeout_ms: Option<u64>,
    /// The script's memory limit (default 32 MiB).
    pub memory_mb: Option<u64>,
    /// Passed to the script's `resolve` as `config`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub config: BTreeMap<String, toml::Value>,
}

/// Script roles' defaults and bounds.
pub const DEFAULT_SCRIPT_TIMEOUT_MS: u64 = 2_000;
pub const MAX_SCRIPT_TIMEOUT_MS: u64 = 60_000;
pub const DEFAULT_SCRIPT_MEMORY_MB: u64 = 32;
pub const MAX_SCRIPT_MEMORY_MB: u64 = 512;

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Filesystem {
    /// Host paths made visible inside the sandbox. Nothing else of the host is.
    #[serde(default)]
    pub binds: Vec<Bind>,
    /// Binds appended to `binds` (after `extends`): moved there by the
    /// loader, so always empty in a loaded policy; here so that a value
    /// of the wrong type is reported where it is.
    #[serde(default, skip_serializing)]
    pub binds_add: Vec<Bind>,
    /// Paths relative to every writable bind that stay read-only (and cannot
    /// be created when absent). A trailing `/` marks a directory: a missing
    /// entry is created empty as a directory, else as a file. `None` means
    /// the defaults.
    #[serde(default)]
    pub protected: Option<Vec<String>>,
    /// Empty, private tmpfs mounts.
    #[serde(default = "default_tmpfs")]
    pub tmpfs: Vec<PathTemplate>,
    /// Run even in a workspace that exposes more than a project (`/`, a
    /// home directory, credentials: `workspace_risk`); `check`: medium.
    #[serde(default)]
    pub allow_workspace_risk: bool,
    /// How the agent sees its workspace: the host tree itself, or through
    /// a layer of its own (reviewed, then applied: docs/workspaces.md).
    #[serde(default)]
    pub workspace_mode: WorkspaceMode,
    /// With `overlay`: the most the agent's layer may hold, every turn
    /// together; writes beyond it fail with ENOSPC inside.
    #[serde(default)]
    pub layer_quota: Option<ByteSize>,
}

/// `filesystem.workspace_mode`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WorkspaceMode {
    /// The host tree, read-write: writes land there at once.
    #[default]
    Direct,
    /// Through a layer of the agent's own: the host tree is not written.
    Overlay,
}

impl Default for Filesystem {
    fn default() -> Self {
        Self {
            binds: Vec::new(),
            binds_add: Vec::new(),
            protected: None,
            tmpfs: default_tmpfs(),
            allow_workspace_risk: false,
            workspace_mode: WorkspaceMode::Direct,
            layer_quota: None,
        }
    }
}

impl Filesystem {
    /// The protected list in force: the policy's own, or the defaults.
    pub fn protected_paths(&self) -> Vec<String> {
        match &self.protected {
            Some(list) => list.clone(),
            None => DEFAULT_PROTECTED.iter().map(|s| s.to_string()).collect(),
        }
    }
}

fn default_tmpfs() -> Vec<PathTemplate> {
    vec![PathTemplate::new("/tmp")]
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Bind {
    pub source: PathTemplate,
    /// Where the source appears inside; the same path as `source` if absent.
    #[serde(default)]
    pub target: Option<PathTemplate>,
    pub mode: BindMode,
    /// A missing optional source is skipped (and reported); a missing
    /// required one stops the launch.
    #[serde(default)]
    pub optional: bool,
    /// The source is a Unix socket the command may connect to (or a
    /// directory of them). Without it a launch refuses a bind whose source,
    /// as resolved, is a socket: Landlock before ABI 9 cannot stop a
    /// connect(2) to it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub socket: bool,
}

impl Bind {
    pub fn target(&self) -> &PathTemplate {
        self.target.as_ref().unwrap_or(&self.source)
    }

    pub fn writable(&self) -> bool {
        self.mode == BindMode::Rw
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BindMode {
    Ro,
    Rw,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Namespaces {
    #[serde(default = "yes")]
    pub user: bool,
    #[serde(default = "yes")]
    pub mount: bool,
    #[serde(default = "yes")]
    pub pid: bool,
    #[serde(default = "yes")]
    pub ipc: bool,
    #[serde(default = "yes")]
    pub uts: bool,
    /// Whether the sandboxed command may create user namespaces of its own.
    #[serde(default)]
    pub nested_userns: bool,
}

impl Default for Namespaces {
    fn default() -> Self {
        Self {
            user: true,
            mount: true,
            pid: true,
            ipc: true,
            uts: true,
            nested_userns: false,
        }
    }
}

fn yes() -> bool {
    true
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum NetworkMode {
    /// A new network namespace with only loopback.
    #[default]
    None,
    /// The host's network stack, loopback services and LAN included.
    Host,
    /// A new network namespace with only loopback, and egress through an
    /// HTTP proxy outside to the hosts of `[proxy]` only.
    Proxy,
}

/// `[proxy]`: which hosts `network = "proxy"` may reach.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ProxyPolicy {
    /// Host patterns (`name`, `*.name`, `*`, each with an optional `:port`).
    #[serde(default)]
    pub allow: Vec<String>,
    /// Patterns refused even when allowed: deny wins.
    #[serde(default)]
    pub deny: Vec<String>,
    /// Test only: read so that `check` reports it (critical); every
    /// launch refuses a policy that sets it (`test_switches`).
    #[serde(default)]
    pub test_allow_private: bool,
    /// Test only, like `test_allow_private`: names resolved to these
    /// addresses instead of DNS.
    #[serde(default)]
    pub test_hosts: BTreeMap<String, String>,
}

impl ProxyPolicy {
    /// The keys of switches that exist for tests this policy sets: a
    /// launch refuses them (the launcher's own flags are the operator's
    /// way), `check` reports them.
    pub fn test_switches(&self) -> Vec<&'static str> {
        let mut keys = Vec::new();
        if self.test_allow_private {
            keys.push("proxy.test_allow_private");
        }
        if !self.test_hosts.is_empty() {
            keys.push("proxy.test_hosts");
        }
        keys
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SeccompSettings {
    /// `unconfined`, a profile name (`default` -> seccomp/default.json), or a
    /// path to an OCI/Docker JSON profile relative to the policy file.
    #[serde(default = "default_profile")]
    pub profile: String,
    /// The kernel's Speculative Store Bypass mitigation for the sandbox's
    /// processes, which loading a filter turns on unless told otherwise:
    /// `allow` (default, as Docker and podman do: about 1.3 ms per launch
    /// and slower code inside) or `mitigate` (keep it, for code that holds
    /// secrets another process on the core could probe for).
    #[serde(default)]
    pub speculative_store_bypass: SpeculativeStoreBypass,
}

/// `seccomp.speculative_store_bypass`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SpeculativeStoreBypass {
    /// SECCOMP_FILTER_FLAG_SPEC_ALLOW: the filter leaves the CPU's default.
    #[default]
    Allow,
    /// The filter turns the mitigation on (the kernel's default for seccomp).
    Mitigate,
}

impl Default for SeccompSettings {
    fn default() -> Self {
        Self {
            profile: default_profile(),
            speculative_store_bypass: SpeculativeStoreBypass::Allow,
        }
    }
}

fn default_profile() -> String {
    "default".to_string()
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum LandlockMode {
    /// Refuse to launch unless the kernel enforces every rule.
    #[default]
    Required,
    /// Enforce what the kernel supports and report the rest.
    BestEffort,
    Off,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Rlimits {
    pub nofile: Option<u64>,
    pub nproc: Option<u64>,
    pub core: Option<ByteSize>,
    pub fsize: Option<ByteSize>,
    pub address_space: Option<ByteSize>,
    pub cpu_seconds: Option<u64>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CgroupLimits {
    pub pids_max: Option<u64>,
    pub memory_max: Option<ByteSize>,
    /// CPU bandwidth in CPUs, e.g. 1.5.
    pub cpu_max: Option<f64>,
    /// Whether a launch that cannot apply these limits stops (the default)
    /// or goes on with rlimits standing in.
    #[serde(default)]
    pub enforcement: LimitEnforcement,
}

/// What a launch does when the host does not let it apply a cgroup limit
/// (an unprivileged user without a delegated group).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum LimitEnforcement {
    /// Refuse to launch (exit 2) before anything runs, saying how to fix it.
    #[default]
    Required,
    /// Warn, and bound what can be bounded with rlimits instead
    /// (RLIMIT_NPROC for pids_max, RLIMIT_DATA for memory_max; nothing
    /// stands in for cpu_max); the run report says which.
    BestEffort,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct EnvPolicy {
    /// Host variables passed through: exact names or `PREFIX_*` patterns.
    #[serde(default)]
    pub allow: Vec<String>,
    /// Variables set to fixed values (paths may use `${HOME}` and friends).
    #[serde(default)]
    pub set: BTreeMap<String, String>,
}

/// The list limit where a policy sets none: the seed's
/// `AGENT_MAX_LIST_ENTRIES` (MCP tooling standards, safety limits).
pub const DEFAULT_MAX_LIST_ENTRIES: u32 = 5000;

/// Limits the broker enforces on an agent's MCP traffic. An absent limit is
/// no limit, and `check` reports it (but `max_list_entries`, which has a
/// default).
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct McpLimits {
    pub calls_per_minute: Option<u32>,
    pub burst: Option<u32>,
    pub per_tool_calls_per_minute: Option<u32>,
    pub per_tool_burst: Option<u32>,
    pub tool_steps_per_turn: Option<u32>,
    pub tool_cap: Option<u32>,
    pub max_output_bytes: Option<ByteSize>,
    /// Entries of a list in a tool's result (absent: `DEFAULT_MAX_LIST_ENTRIES`).
    pub max_list_entries: Option<u32>,
    pub max_message_bytes: Option<ByteSize>,
    pub inbox_depth: Option<u32>,
    pub spawn_depth: Option<u32>,
    pub children_per_agent: Option<u32>,
    pub broadcast_fanout: Option<u32>,
}

impl McpLimits {
    /// How many entries a list in a tool's result keeps.
    pub fn list_entries(&self) -> usize {
        self.max_list_entries.unwrap_or(DEFAULT_MAX_LIST_ENTRIES) as usize
    }
}

/// The most tools cursor-agent takes; it drops the rest without a word.
pub const MAX_TOOLS: u32 = 40;

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ToolScope {
    /// Tool names or glob patterns the agent may see and call; absent = all.
    pub allow: Option<Vec<String>>,
    /// Names or patterns refused even when allowed.
    #[serde(default)]
    pub deny: Vec<String>,
}

/// A byte count written as an integer or a string with a unit
/// (`B`, `KiB`, `MiB`, `GiB`, `TiB`, `KB`, `MB`, `GB`, `TB`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct ByteSize(pub u64);

impl ByteSize {
    pub fn parse(text: &str) -> Result<Self, ByteSizeError> {
        let text = text.trim();
        let split = text
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(text.len());
        let (digits, unit) = text.split_at(split);
        let number: u64 = digits
            .parse()
            .map_err(|_| ByteSizeError::NotASize(text.to_string()))?;
        let factor: u64 = match unit.trim() {
            "" | "B" => 1,
            "KiB" => 1 << 10,
            "MiB" => 1 << 20,
            "GiB" => 1 << 30,
            "TiB" => 1 << 40,
            "KB" => 1_000,
            "MB" => 1_000_000,
            "GB" => 1_000_000_000,
            "TB" => 1_000_000_000_000,
            other => return Err(ByteSizeError::Unit(other.to_string())),
        };
        number
            .checked_mul(factor)
            .map(ByteSize)
            .ok_or_else(|| ByteSizeError::TooLarge(text.to_string()))
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ByteSizeError {
    #[error("`{0}` is not a size such as 256KiB or 2GiB")]
    NotASize(String),
    #[error("unknown size unit `{0}` (use B, KiB, MiB, GiB, TiB, KB, MB, GB or TB)")]
    Unit(String),
    #[error("`{0}` is too large")]
    TooLarge(String),
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [(&str, u64); 4] = [
            ("TiB", 1 << 40),
            ("GiB", 1 << 30),
            ("MiB", 1 << 20),
            ("KiB", 1 << 10),
        ];
        for (unit, size) in UNITS {
            if self.0 >= size && self.0.is_multiple_of(size) {
                return write!(f, "{}{unit}", self.0 / size);
            }
        }
        write!(f, "{}B", self.0)
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct SizeVisitor;
        impl Visitor<'_> for SizeVisitor {
            type Value = ByteSize;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a byte count: a non-negative integer or a string such as \"256KiB\"")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<ByteSize, E> {
                u64::try_from(v)
                    .map(ByteSize)
                    .map_err(|_| E::invalid_value(de::Unexpected::Signed(v), &self))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<ByteSize, E> {
                Ok(ByteSize(v))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<ByteSize, E> {
                ByteSize::parse(v).map_err(E::custom)
            }
        }
        deserializer.deserialize_any(SizeVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_sizes_parse_and_print() {
        assert_eq!(ByteSize::parse("256KiB"), Ok(ByteSize(262_144)));
        assert_eq!(ByteSize::parse("2GiB"), Ok(ByteSize(2 << 30)));
        assert_eq!(ByteSize::parse("1000"), Ok(ByteSize(1000)));
        assert_eq!(ByteSize::parse("5MB"), Ok(ByteSize(5_000_000)));
        assert!(ByteSize::parse("12 parsecs").is_err());
        assert!(ByteSize::parse("-1KiB").is_err());
        assert!(ByteSize::parse("99999999999TiB").is_err());
        assert_eq!(ByteSize(262_144).to_string(), "256KiB");
        assert_eq!(ByteSize(1000).to_string(), "1000B");
    }

    #[test]
    fn a_roles_model_budget_loads_and_is_bounded() {
        let load = |text: &str| {
            crate::load_str(
                std::path::Path::new("r.toml"),
                &format!("version = 1\nextends = \"worker\"\n{text}"),
                &Default::default(),
            )
        };
        let loaded = load("[model]\nrequests_per_minute = 30\ntokens_per_day = 1000000\n").unwrap();
        assert_eq!(
            loaded.policy.model,
            ModelBudget {
                requests_per_minute: Some(30),
                tokens_per_day: Some(1_000_000),
                ..ModelBudget::default()
            }
        );
        let loaded = load("[model]\nhosted_tools = [\"web_search\", \"remote_mcp\"]\n").unwrap();
        assert_eq!(
            loaded.policy.model.hosted_tools,
            [HostedTool::WebSearch, HostedTool::RemoteMcp]
        );
        let errors = load("[model]\nhosted_tools = [\"shell\"]\n").unwrap_err();
        assert!(errors.to_string().contains("shell"), "{errors}");
        let errors = load("[model]\nconcurrent_requests = 0\n").unwrap_err();
        assert!(
            errors.to_string().contains("model.concurrent_requests"),
            "{errors}"
        );
        let errors = load("[model]\nrequests_per_minute = 0\ntokens = 5\n").unwrap_err();
        let text = errors.to_string();
        assert!(text.contains("tokens"), "an unknown key: {text}");
        let errors = load("[model]\ntokens_per_turn = 0\n").unwrap_err();
        assert!(
            errors.to_string().contains("model.tokens_per_turn"),
            "{errors}"
        );
    }
}
