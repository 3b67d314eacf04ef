//! `run --dry-run` and `substrat-sandbox explain`: the launch plan in
//! words or JSON, with the audit's findings and what this host can
//! enforce; nothing is started. Environment values are never printed (a
//! policy may pass a token through `env.allow`): only names.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::Serialize;
use substrat_policy::LoadedPolicy;
use substrat_policy::check::{Finding, HostFacts, PolicyReport, check_policy_on_host, rule_info};
use substrat_policy::model::{LandlockMode, NetworkMode};
use substrat_sandbox::plan::{
    Access, BridgePlan, CgroupLimits, LaunchPlan, MountStep, Namespaces, RlimitSetting,
    SocketFamily, SocketUse,
};

/// What a launch would do, for people and for programs.
#[derive(Debug, Serialize)]
pub struct Explanation<'a> {
    pub policy: &'a str,
    pub policy_file: &'a Path,
    pub argv: &'a [String],
    pub cwd: &'a Path,
    pub network: NetworkMode,
    pub namespaces: Namespaces,
    /// Host ids root inside maps to.
    pub runs_as: (u32, u32),
    pub mounts: Vec<MountLine<'a>>,
    pub landlock: LandlockLine,
    pub seccomp: Option<SeccompLine<'a>>,
    pub rlimits: &'a [RlimitSetting],
    pub cgroup: CgroupLimits,
    /// Names only: values can be secrets.
    pub env: Vec<&'a str>,
    pub bridges: Vec<&'a BridgePlan>,
    /// The audit's exposure score (0-10) and findings, the host's included.
    pub exposure: f64,
    pub findings: Vec<Finding>,
    /// Whether this host was probed (then the findings say what it cannot do).
    pub host_probed: bool,
    /// The command can write the workspace: at launch its `.git` becomes
    /// the command's own and other repositories in writable trees read-only.
    pub workspace_git: bool,
}

#[derive(Debug, Serialize)]
pub struct MountLine<'a> {
    pub kind: &'static str,
    pub target: PathBuf,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<&'a Path>,
    /// `ro`, `rw`, or what the kind implies.
    pub mode: &'static str,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub optional: bool,
    /// A Unix socket the command may connect to (`socket = true`, or the
    /// launcher's own).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub socket: bool,
}

#[derive(Debug, Serialize)]
pub struct LandlockLine {
    pub mode: LandlockMode,
    pub rules: usize,
    /// This kernel's Landlock ABI (0: none); absent when the host was not probed.
    pub kernel_abi: Option<u32>,
    /// connect(2) to pathname Unix sockets restricted to the socket binds
    /// (Landlock ABI 9); false: not restricted by Landlock.
    pub unix_connect: bool,
}

#[derive(Debug, Serialize)]
pub struct SeccompLine<'a> {
    pub profile: &'a str,
    pub path: &'a Path,
    pub default_action: String,
    /// Syscalls the profile's rules allow by name (some only for some arguments).
    pub allowed_by_name: usize,
    pub socket_families: &'a [SocketFamily],
    /// Dangerous syscalls denied whatever the arguments.
    pub denied: Vec<&'static str>,
    /// Dangerous syscalls allowed (fully or for some arguments).
    pub allowed_dangerous: Vec<&'static str>,
}

impl<'a> Explanation<'a> {
    pub fn new(
        plan: &'a LaunchPlan,
        policy: &'a LoadedPolicy,
        facts: Option<&HostFacts>,
        workspace: &Path,
    ) -> Self {
        let host = facts
            .map(|f| check_policy_on_host(f, policy))
            .unwrap_or_default();
        let report = PolicyReport::new(policy, host);
        Self {
            policy: &policy.name,
            policy_file: &policy.path,
            argv: &plan.argv,
            cwd: &plan.cwd,
            network: policy.policy.network,
            namespaces: plan.namespaces,
            runs_as: (plan.uid_map.outside, plan.gid_map.outside),
            mounts: plan.mounts.iter().filter_map(mount_line).collect(),
            landlock: LandlockLine {
                mode: plan.landlock.mode,
                rules: plan.landlock.rules.len(),
                kernel_abi: facts.map(|f| f.landlock_abi),
                unix_connect: plan.landlock.unix_connect,
            },
            seccomp: plan.seccomp.as_ref().map(|s| SeccompLine {
                profile: &s.name,
                path: &s.path,
                default_action: word(&s.profile.default_action),
                allowed_by_name: s
                    .profile
                    .syscalls
                    .iter()
                    .filter(|r| r.action.permits())
                    .map(|r| r.names.len())
                    .sum(),
                socket_families: &s.socket_families,
                denied: s.profile.dangerous_denied(),
                allowed_dangerous: s.profile.dangerous_allowed(),
            }),
            rlimits: &plan.rlimits,
            cgroup: plan.cgroup,
            env: plan.env.iter().map(|(k, _)| k.as_str()).collect(),
            bridges: plan.bridges().collect(),
            exposure: report.score,
            findings: report.findings,
            host_probed: facts.is_some(),
            workspace_git: substrat_sandbox::writable_in_view(plan, workspace),
        }
    }

    /// The explanation in words, one section per layer.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        let w = &mut out;
        let _ = writeln!(
            w,
            "policy {} ({}): nothing is started\ncommand: {} (in {})\nruns as host uid {} gid {} (root inside)",
            self.policy,
            self.policy_file.display(),
            self.argv.join(" "),
            self.cwd.display(),
            self.runs_as.0,
            self.runs_as.1
        );
        let ns = self.namespaces;
        let _ = writeln!(
            w,
            "namespaces: user mount{}{}{}{}; nested user namespaces {}",
            if ns.pid { " pid" } else { "" },
            if ns.ipc { " ipc" } else { "" },
            if ns.uts { " uts" } else { "" },
            if ns.net { " net" } else { "" },
            if ns.nested_userns {
                "allowed"
            } else {
                "blocked"
            }
        );
        let _ = writeln!(w, "network: {}", network_words(self.network));
        for bridge in &self.bridges {
            let _ = writeln!(
                w,
                "  127.0.0.1:{} inside reaches {}",
                bridge.port,
                bridge.socket.display()
            );
        }
        let _ = writeln!(w, "mounts (in order):");
        for m in &self.mounts {
            let source = m.source.map(|s| format!(" <- {}", s.display()));
            let _ = writeln!(
                w,
                "  {:<9} {:<4} {}{}{}{}",
                m.kind,
                m.mode,
                m.target.display(),
                source.unwrap_or_default(),
                if m.optional { " (optional)" } else { "" },
                if m.socket {
                    " (socket: may connect)"
                } else {
                    ""
                }
            );
        }
        if self.workspace_git {
            let _ = writeln!(
                w,
                "  git: the workspace's .git is the command's own (made at launch, see --git-state); \
                 repositories in writable trees are bound read-only"
            );
        }
        self.layers_text(w);
        self.findings_text(w);
        out
    }

    fn layers_text(&self, w: &mut String) {
        let abi = match self.landlock.kernel_abi {
            Some(0) => ", this kernel has none".to_string(),
            Some(abi) => format!(", kernel ABI {abi}"),
            None => String::new(),
        };
        let _ = writeln!(
            w,
            "landlock: {}, {} path rules mirroring the mounts{abi}",
            word(&self.landlock.mode),
            self.landlock.rules
        );
        let connect = if self.landlock.unix_connect {
            "only to the sockets bound as sockets (Landlock ABI 9)"
        } else {
            "not restricted by Landlock (its right needs ABI 9); socket binds must be marked"
        };
        let _ = writeln!(w, "  connect to Unix sockets in the view: {connect}");
        match &self.seccomp {
            Some(s) => {
                let _ = writeln!(
                    w,
                    "seccomp: profile {} ({}), default {}, {} syscalls allowed by name; \
                     sockets {} only\n  denied: {}",
                    s.profile,
                    s.path.display(),
                    s.default_action,
                    s.allowed_by_name,
                    s.socket_families
                        .iter()
                        .map(word)
                        .collect::<Vec<_>>()
                        .join(" "),
                    s.denied.join(" ")
                );
                if !s.allowed_dangerous.is_empty() {
                    let _ = writeln!(
                        w,
                        "  allowed (dangerous): {}",
                        s.allowed_dangerous.join(" ")
                    );
                }
            }
            None => {
                let _ = writeln!(w, "seccomp: none (unconfined)");
            }
        }
        let rlimits: Vec<String> = self
            .rlimits
            .iter()
            .map(|r| format!("{}={}", word(&r.kind), r.value))
            .collect();
        let _ = writeln!(w, "rlimits: {}", or_none(&rlimits.join(" ")));
        let c = &self.cgroup;
        let _ = writeln!(
            w,
            "cgroup: pids.max {}, memory.max {}, cpus {} ({})",
            opt(c.pids_max),
            opt(c.memory_max),
            opt(c.cpu_max),
            word(&c.enforcement)
        );
        let _ = writeln!(
            w,
            "capabilities: none; no_new_privs\nenvironment (names; values not shown): {}",
            or_none(&self.env.join(" "))
        );
    }

    fn findings_text(&self, w: &mut String) {
        let _ = writeln!(
            w,
            "audit: exposure {:.1}/10, {} finding(s){}",
            self.exposure,
            self.findings.len(),
            if self.host_probed {
                ", this host's included"
            } else {
                " (host not probed)"
            }
        );
        for f in &self.findings {
            let name = rule_info(f.rule_id).map_or("", |r| r.name);
            let _ = writeln!(
                w,
                "  {:<8} {} {name}: {}",
                f.severity.as_str(),
                f.rule_id,
                f.message
            );
        }
    }
}

fn mount_line(step: &MountStep) -> Option<MountLine<'_>> {
    let mode = |a: &Access| match a {
        Access::Ro => "ro",
        Access::Rw => "rw",
    };
    let line = |kind, target: &Path, mode| MountLine {
        kind,
        target: target.to_path_buf(),
        source: None,
        mode,
        optional: false,
        socket: false,
    };
    Some(match step {
        MountStep::Bind {
            source,
            target,
            access,
            optional,
            socket,
        } => MountLine {
            kind: "bind",
            target: target.clone(),
            source: Some(source),
            mode: mode(access),
            optional: *optional,
            socket: *socket == SocketUse::Connect,
        },
        MountStep::Tmpfs { target, .. } => line("tmpfs", target, "rw"),
        MountStep::Dev { target } => line("dev", target, "rw"),
        MountStep::Proc { target } => line("proc", target, "ro"),
        MountStep::Protect {
            target, relative, ..
        } => line("protected", &target.join(relative), "ro"),
        MountStep::Sysfs { target } => line("sysfs", target, "ro"),
        MountStep::Mqueue { target } => line("mqueue", target, "rw"),
        MountStep::Mask { target } => line("masked", target, "ro"),
        MountStep::Empty { target } => line("empty", target, "ro"),
        MountStep::ReadOnly { target } => line("read-only", target, "ro"),
        MountStep::RootReadOnly => return None,
    })
}

fn network_words(mode: NetworkMode) -> &'static str {
    match mode {
        NetworkMode::None => "none: its own namespace with only its own loopback",
        NetworkMode::Host => "host: the host's network, loopback services and LAN included",
        NetworkMode::Proxy => {
            "proxy: its own namespace with only its own loopback, egress through the proxy to allowed hosts"
        }
    }
}

/// A value as its serialized name (`required`, `SCMP_ACT_ERRNO`).
fn word<T: Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(s)) => s,
        Ok(other) => other.to_string(),
        Err(_) => "?".into(),
    }
}

fn opt<T: std::fmt::Display>(value: Option<T>) -> String {
    value.map_or("unset".into(), |v| v.to_string())
}

fn or_none(text: &str) -> &str {
    if text.is_empty() { "none" } else { text }
}
