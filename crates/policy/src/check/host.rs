//! What the host can enforce, and whether each policy can be enforced here.
//! The facts are gathered by the sandbox crate (which may make syscalls);
//! the judgement below is pure so it can be tested with made-up hosts.

use serde::Serialize;

use super::{Finding, RuleInfo, Severity};
use crate::load::{LoadedPolicy, SeccompChoice};
use crate::model::{LandlockMode, LimitEnforcement};

/// The Landlock ABI that covers every rule the launcher writes: filesystem
/// rights up to truncation (3), ioctl on devices (5) and scoping (6).
pub const LANDLOCK_FULL_ABI: u32 = 6;

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HostFacts {
    pub kernel_release: String,
    pub running_as_root: bool,
    /// A process of the invoking user could create a user namespace.
    pub userns_for_invoker: Probe,
    /// An unprivileged user (nobody) could; as non-root this equals the above.
    pub userns_unprivileged: Probe,
    /// 0 when the kernel has no Landlock or it is disabled.
    pub landlock_abi: u32,
    pub seccomp_filter: bool,
    pub seccomp_actions: Vec<String>,
    pub bwrap: Option<BwrapInfo>,
    /// The bwrap backend's helper (`substrat-init`) beside this program is
    /// an executable file. Without one bwrap launches are refused; with one,
    /// its build and the policy's view are still checked at each launch.
    pub bwrap_helper: Probe,
    pub cgroup: CgroupInfo,
    /// How launches by root run here; probed only when this check runs as root.
    pub root_launches: Option<RootLaunches>,
}

/// Launched by root, a sandbox runs as subordinate ids of root's and sees
/// its binds through idmapped mounts: what this host allows of that.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RootLaunches {
    /// How many sandboxes root's subordinate ranges can run at once (each
    /// takes one uid and one gid); 0: every launch by root is refused.
    pub subordinate_slots: u64,
    /// Whether an idmapped copy of the mounts holding each probed path
    /// can be made (the current directory, the temporary directory, HOME, /usr).
    pub idmap: Vec<IdmapProbe>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct IdmapProbe {
    pub path: String,
    #[serde(flatten)]
    pub probe: Probe,
}

/// The outcome of an attempt made in a child process.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "result", rename_all = "kebab-case")]
pub enum Probe {
    Yes,
    No { reason: String },
}

impl Probe {
    pub fn ok(&self) -> bool {
        matches!(self, Probe::Yes)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BwrapInfo {
    pub path: String,
    pub version: String,
    pub disable_userns: bool,
    /// `--ro-bind-fd` and `--add-seccomp-fd`, which the bwrap backend needs.
    pub fd_binds: bool,
}

impl HostFacts {
    /// What `run --backend auto` would use here, and why: native when the
    /// invoking user can create user namespaces, else a capable bwrap with
    /// its helper installed.
    pub fn auto_backend(&self) -> (&'static str, String) {
        match (&self.userns_for_invoker, &self.bwrap, &self.bwrap_helper) {
            (Probe::Yes, _, _) => (
                "native",
                "user namespaces are available to the invoking user".into(),
            ),
            (Probe::No { reason }, Some(b), Probe::Yes) if b.fd_binds => (
                "bwrap",
                format!(
                    "no user namespaces for the native backend ({reason}); bwrap {} can",
                    b.version
                ),
            ),
            (Probe::No { reason }, Some(b), Probe::No { reason: helper }) if b.fd_binds => (
                "none",
                format!("no user namespaces ({reason}), and bwrap's helper cannot run ({helper})"),
            ),
            (Probe::No { reason }, _, _) => (
                "none",
                format!("no user namespaces ({reason}) and no bwrap 0.8 or later"),
            ),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum CgroupVersion {
    V1,
    V2,
    Hybrid,
    None,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CgroupInfo {
    pub version: CgroupVersion,
    /// Whether a child group with each limit could be made (tried, then removed).
    pub pids: Probe,
    pub memory: Probe,
    pub cpu: Probe,
}

pub static HOST_RULES: &[RuleInfo] = &[
    RuleInfo {
        id: "HST001",
        name: "userns-unavailable",
        severity: Severity::Critical,
        title: "User namespaces cannot be created here",
        description: "The native sandbox starts with a user namespace; without one no policy can be enforced by it.",
        remediation: "Allow user namespaces (kernel.unprivileged_userns_clone=1, user.max_user_namespaces>0, or an AppArmor profile for the launcher), or use the bwrap backend where bwrap is setuid.",
    },
    RuleInfo {
        id: "HST002",
        name: "landlock-required-unavailable",
        severity: Severity::High,
        title: "The policy requires Landlock and this kernel has none",
        description: "With `landlock = \"required\"` the launcher refuses to start on this host.",
        remediation: "Boot a kernel with Landlock (5.13+, `lsm=...,landlock`), or set `landlock = \"best-effort\"` knowingly.",
    },
    RuleInfo {
        id: "HST003",
        name: "landlock-partial",
        severity: Severity::Medium,
        title: "Landlock here is older than the rules the policy needs",
        description: "Rules the kernel does not know (truncation from ABI 3, device ioctls from ABI 5, scoping of abstract sockets and signals from ABI 6) are not enforced.",
        remediation: "Use a kernel with Landlock ABI 6 or later.",
    },
    RuleInfo {
        id: "HST004",
        name: "seccomp-unavailable",
        severity: Severity::High,
        title: "The policy has a seccomp profile and this kernel cannot filter",
        description: "Without seccomp filters the launch fails closed rather than run unfiltered.",
        remediation: "Use a kernel built with CONFIG_SECCOMP_FILTER.",
    },
    RuleInfo {
        id: "HST005",
        name: "cgroup-limits-unavailable",
        severity: Severity::Medium,
        title: "Cgroup limits of the policy cannot be set here",
        description: "The launcher cannot create a cgroup with these limits: a policy that requires them (`[cgroup] enforcement = \"required\"`, the default) is refused at launch (exit 2); a best-effort one runs with rlimits standing in, and the run report says so.",
        remediation: "Run as root, or give the launcher a delegated group (`--cgroup-parent`) with the pids, memory and cpu controllers.",
    },
    RuleInfo {
        id: "HST006",
        name: "bwrap-unavailable",
        severity: Severity::Info,
        title: "bubblewrap is not installed",
        description: "Only the native backend is available on this host.",
        remediation: "Install bubblewrap (Debian: apt-get install bubblewrap) to have the bwrap backend.",
    },
    RuleInfo {
        id: "HST007",
        name: "bwrap-helper-missing",
        severity: Severity::Medium,
        title: "The bwrap backend's helper is not installed beside the launcher",
        description: "bwrap runs substrat-init inside its sandbox to apply Landlock, no_new_privs and the rlimits; without it every bwrap launch (`--backend bwrap`, and `auto` where the native backend is unavailable) is refused before anything runs.",
        remediation: "Install substrat-init from the same build beside substrat-sandbox and substrat-run (`cargo install --path crates/cli` installs all three).",
    },
    RuleInfo {
        id: "HST008",
        name: "root-has-no-subordinate-ids",
        severity: Severity::Medium,
        title: "Launches by root are refused: root has no subordinate ids",
        description: "A sandbox launched by root never runs as host root: it runs as a uid and a gid of its own from root's subordinate ranges (/etc/subuid, /etc/subgid), one pair per running sandbox, so a kernel bug in an allowed system call would give an id that owns nothing. Root has no such range here, so every launch by root (the daemon's turns too) is refused with exit 2.",
        remediation: "Give root a range: `usermod --add-subuids 1000000-1065535 --add-subgids 1000000-1065535 root`, a range no other account has (65,536 sandboxes at once), or launch agents as an unprivileged user with a delegated cgroup (`--cgroup-parent`).",
    },
    RuleInfo {
        id: "HST009",
        name: "idmap-unsupported",
        severity: Severity::Medium,
        title: "Launches by root that bind paths on this filesystem are refused",
        description: "A sandbox launched by root sees every bind through an idmapped mount, so that root's files stay its own while it runs as a subordinate id and what it writes stays root's on the disk. A bind whose filesystem, or one mounted below it, cannot be idmapped (older kernels, some network and FUSE filesystems) is refused with exit 2; nothing is bound without the map.",
        remediation: "Keep workspaces and bound trees on a filesystem that supports idmapped mounts (ext4, xfs, btrfs, overlayfs, tmpfs since Linux 6.3), or launch as the workspace's owner (an unprivileged user).",
    },
    RuleInfo {
        id: "HST010",
        name: "workspace-overlay-unavailable",
        severity: Severity::High,
        title: "The policy's overlay workspace cannot be mounted here",
        description: "`workspace_mode = \"overlay\"` shows the agent its workspace through a layer, mounted by the native backend in the sandbox's user namespace. Without user namespaces for the invoking user only bwrap could run, and bubblewrap 0.8 has no overlay mount: every launch of this policy is refused (the workspace is never silently written directly).",
        remediation: "Allow user namespaces for the launching user (kernel.unprivileged_userns_clone, or launch as root), or use `workspace_mode = \"direct\"`.",
    },
];

fn host_rule(id: &str) -> &'static RuleInfo {
    HOST_RULES
        .iter()
        .find(|r| r.id == id)
        .unwrap_or(&HOST_RULES[0])
}

fn finding(id: &str, message: String, key_path: &str, policy: Option<&LoadedPolicy>) -> Finding {
    let rule = host_rule(id);
    let location = match policy {
        Some(p) => p.locate(key_path),
        None => crate::location::Location::start_of(std::path::Path::new("host")),
    };
    Finding {
        rule_id: rule.id,
        severity: rule.severity,
        message,
        remediation: rule.remediation,
        key_path: key_path.to_string(),
        location,
    }
}

/// Findings about the host alone (no policy given).
pub fn check_host(facts: &HostFacts) -> Vec<Finding> {
    let mut out = Vec::new();
    if let Probe::No { reason } = &facts.userns_for_invoker {
        out.push(finding(
            "HST001",
            format!("creating a user namespace failed: {reason}"),
            "",
            None,
        ));
    }
    if let Some(root) = &facts.root_launches {
        if root.subordinate_slots == 0 {
            out.push(finding(
                "HST008",
                "this check runs as root, and root has no subordinate uid and gid range: \
                 launches like this are refused"
                    .into(),
                "",
                None,
            ));
        }
        for probe in &root.idmap {
            if let Probe::No { reason } = &probe.probe {
                out.push(finding(
                    "HST009",
                    format!(
                        "launches by root that bind {} are refused: {reason}",
                        probe.path
                    ),
                    "",
                    None,
                ));
            }
        }
    }
    if facts.bwrap.is_none() {
        out.push(finding(
            "HST006",
            "bwrap was not found on PATH".into(),
            "",
            None,
        ));
    }
    // Only worth saying where there is a bwrap the backend could use.
    if let (Some(b), Probe::No { reason }) = (&facts.bwrap, &facts.bwrap_helper)
        && b.fd_binds
    {
        out.push(finding(
            "HST007",
            format!("bwrap launches will be refused: {reason}"),
            "",
            None,
        ));
    }
    out
}

/// Findings about enforcing `policy` on this host.
pub fn check_policy_on_host(facts: &HostFacts, policy: &LoadedPolicy) -> Vec<Finding> {
    let mut out = Vec::new();
    let p = &policy.policy;
    if let Probe::No { reason } = &facts.userns_for_invoker {
        out.push(finding(
            "HST001",
            format!("this policy needs a user namespace: {reason}"),
            "namespaces",
            Some(policy),
        ));
    }
    if p.filesystem.workspace_mode == crate::model::WorkspaceMode::Overlay
        && !facts.userns_for_invoker.ok()
    {
        out.push(finding(
            "HST010",
            "`workspace_mode = \"overlay\"` needs the native backend (user namespaces); bwrap has no overlay mount: launches will be refused".into(),
            "filesystem.workspace_mode",
            Some(policy),
        ));
    }
    match (p.landlock, facts.landlock_abi) {
        (LandlockMode::Off, _) => {}
        (LandlockMode::Required, 0) => out.push(finding(
            "HST002",
            "`landlock = \"required\"` but this kernel has no Landlock: launches will be refused".into(),
            "landlock",
            Some(policy),
        )),
        (_, 0) => out.push(finding(
            "HST003",
            "no Landlock on this kernel: file rules come from mounts alone".into(),
            "landlock",
            Some(policy),
        )),
        (_, abi) if abi < LANDLOCK_FULL_ABI => out.push(finding(
            "HST003",
            format!("Landlock ABI {abi} here; truncation rules need 3, device ioctl rules 5 and socket/signal scoping {LANDLOCK_FULL_ABI}"),
            "landlock",
            Some(policy),
        )),
        _ => {}
    }
    if matches!(policy.seccomp, SeccompChoice::Profile { .. }) && !facts.seccomp_filter {
        out.push(finding(
            "HST004",
            "this kernel has no seccomp filter support".into(),
            "seccomp.profile",
            Some(policy),
        ));
    }
    let c = &p.cgroup;
    let wanted = [
        ("cgroup.pids_max", c.pids_max.is_some(), &facts.cgroup.pids),
        (
            "cgroup.memory_max",
            c.memory_max.is_some(),
            &facts.cgroup.memory,
        ),
        ("cgroup.cpu_max", c.cpu_max.is_some(), &facts.cgroup.cpu),
    ];
    for (key, set, probe) in wanted {
        if let (true, Probe::No { reason }) = (set, probe) {
            let outcome = match c.enforcement {
                LimitEnforcement::Required => "launches will be refused (the policy requires it)",
                LimitEnforcement::BestEffort => "runs go ahead without it (best effort)",
            };
            out.push(finding(
                "HST005",
                format!("`{key}` cannot be enforced here: {reason}; {outcome}"),
                key,
                Some(policy),
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::{LoadOptions, load_str};
    use std::path::Path;

    fn good_host() -> HostFacts {
        HostFacts {
            kernel_release: "6.18.0".into(),
            running_as_root: false,
            userns_for_invoker: Probe::Yes,
            userns_unprivileged: Probe::Yes,
            landlock_abi: 7,
            seccomp_filter: true,
            seccomp_actions: vec!["kill_process".into(), "errno".into(), "allow".into()],
            bwrap: Some(BwrapInfo {
                path: "/usr/bin/bwrap".into(),
                version: "0.8.0".into(),
                disable_userns: true,
                fd_binds: true,
            }),
            bwrap_helper: Probe::Yes,
            cgroup: CgroupInfo {
                version: CgroupVersion::V2,
                pids: Probe::Yes,
                memory: Probe::Yes,
                cpu: Probe::Yes,
            },
            root_launches: None,
        }
    }

    fn policy(extra: &str) -> LoadedPolicy {
        let text =
            format!("version = 1\n{extra}\n[cgroup]\npids_max = 10\nmemory_max = \"1GiB\"\n");
        load_str(Path::new("p.toml"), &text, &LoadOptions::default()).unwrap()
    }

    fn ids(findings: &[Finding]) -> Vec<&str> {
        findings.iter().map(|f| f.rule_id).collect()
    }

    #[test]
    fn good_host_has_no_findings() {
        assert!(ids(&check_host(&good_host())).is_empty());
        assert!(ids(&check_policy_on_host(&good_host(), &policy(""))).is_empty());
    }

    #[test]
    fn required_landlock_without_kernel_support() {
        let host = HostFacts {
            landlock_abi: 0,
            ..good_host()
        };
        let found = check_policy_on_host(&host, &policy("landlock = \"required\""));
        assert_eq!(ids(&found), ["HST002"]);
        assert_eq!(found[0].location.line, 2);
        assert_eq!(
            ids(&check_policy_on_host(
                &host,
                &policy("landlock = \"best-effort\"")
            )),
            ["HST003"]
        );
        assert!(check_policy_on_host(&host, &policy("landlock = \"off\"")).is_empty());
        let old = HostFacts {
            landlock_abi: 3,
            ..good_host()
        };
        assert_eq!(ids(&check_policy_on_host(&old, &policy(""))), ["HST003"]);
    }

    #[test]
    fn missing_userns_seccomp_cgroups_and_bwrap() {
        let no = || Probe::No {
            reason: "EPERM".into(),
        };
        let host = HostFacts {
            userns_for_invoker: no(),
            seccomp_filter: false,
            bwrap: None,
            cgroup: CgroupInfo {
                version: CgroupVersion::None,
                pids: no(),
                memory: no(),
                cpu: no(),
            },
            ..good_host()
        };
        assert_eq!(ids(&check_host(&host)), ["HST001", "HST006"]);
        // As root: launches run as subordinate ids, through idmapped binds.
        let root = |slots: u64, idmap: Probe| HostFacts {
            running_as_root: true,
            root_launches: Some(RootLaunches {
                subordinate_slots: slots,
                idmap: vec![
                    IdmapProbe {
                        path: "/usr".into(),
                        probe: Probe::Yes,
                    },
                    IdmapProbe {
                        path: "/mnt/nfs".into(),
                        probe: idmap,
                    },
                ],
            }),
            ..good_host()
        };
        assert!(ids(&check_host(&root(65536, Probe::Yes))).is_empty());
        let found = check_host(&root(0, no()));
        assert_eq!(ids(&found), ["HST008", "HST009"]);
        assert_eq!(
            found[1].message,
            "launches by root that bind /mnt/nfs are refused: EPERM"
        );
        assert!(ids(&check_host(&good_host())).is_empty());
        assert_eq!(host.auto_backend().0, "none");
        assert_eq!(good_host().auto_backend().0, "native");
        let bwrap_only = HostFacts {
            userns_for_invoker: no(),
            ..good_host()
        };
        assert_eq!(bwrap_only.auto_backend().0, "bwrap");
        // bwrap without its helper: a finding, and `auto` has no backend.
        let helper_missing = HostFacts {
            bwrap_helper: Probe::No {
                reason: "/opt/substrat/substrat-init is missing".into(),
            },
            ..bwrap_only
        };
        let found = check_host(&helper_missing);
        assert_eq!(ids(&found), ["HST001", "HST007"]);
        assert_eq!(
            found[1].message,
            "bwrap launches will be refused: /opt/substrat/substrat-init is missing"
        );
        assert_eq!(
            helper_missing.auto_backend(),
            (
                "none",
                "no user namespaces (EPERM), and bwrap's helper cannot run \
                 (/opt/substrat/substrat-init is missing)"
                    .to_string()
            )
        );
        // Where native works the helper is still reported, as bwrap is there.
        let native_helper_missing = HostFacts {
            bwrap_helper: helper_missing.bwrap_helper.clone(),
            ..good_host()
        };
        assert_eq!(ids(&check_host(&native_helper_missing)), ["HST007"]);
        assert_eq!(native_helper_missing.auto_backend().0, "native");
        // A bwrap too old for the backend: nothing to say about its helper.
        let old_bwrap = HostFacts {
            bwrap: Some(BwrapInfo {
                fd_binds: false,
                ..good_host().bwrap.unwrap()
            }),
            ..native_helper_missing.clone()
        };
        assert!(check_host(&old_bwrap).is_empty());
        // No bwrap: nothing to say about its helper either.
        assert_eq!(
            ids(&check_host(&HostFacts {
                bwrap: None,
                ..native_helper_missing
            })),
            ["HST006"]
        );
        // cpu_max is not set by the policy, so only pids and memory are reported.
        assert_eq!(
            ids(&check_policy_on_host(&host, &policy(""))),
            ["HST001", "HST004", "HST005", "HST005"]
        );
        assert!(
            check_policy_on_host(&host, &policy("[seccomp]\nprofile = \"unconfined\""))
                .iter()
                .all(|f| f.rule_id != "HST004")
        );
    }
}
