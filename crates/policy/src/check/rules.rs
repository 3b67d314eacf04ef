//! The policy rules. Each is a small function over a loaded policy that
//! reports findings at key paths; the table below is the catalog that the
//! text, JSON and SARIF outputs and docs/check.md describe.

use super::{Finding, RuleInfo, Severity};
use crate::load::{LoadedPolicy, SeccompChoice};
use crate::model::{Bind, LandlockMode, MAX_TOOLS, NetworkMode};
use crate::paths::{PathTemplate, PathVar};
use crate::seccomp::Verdict;

pub struct PolicyRule {
    pub info: RuleInfo,
    run: fn(&LoadedPolicy, &mut Emit<'_>),
}

impl std::fmt::Debug for PolicyRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PolicyRule")
            .field("id", &self.info.id)
            .finish()
    }
}

/// Collects the findings of one rule, filling in the location of each key.
struct Emit<'a> {
    policy: &'a LoadedPolicy,
    info: &'a RuleInfo,
    findings: &'a mut Vec<Finding>,
}

impl Emit<'_> {
    fn at(&mut self, key_path: &str, message: impl Into<String>) {
        self.findings.push(Finding {
            rule_id: self.info.id,
            severity: self.info.severity,
            message: message.into(),
            remediation: self.info.remediation,
            key_path: key_path.to_string(),
            location: self.policy.locate(key_path),
        });
    }
}

pub fn check_policy(policy: &LoadedPolicy) -> Vec<Finding> {
    let mut findings = Vec::new();
    for rule in POLICY_RULES {
        let mut emit = Emit {
            policy,
            info: &rule.info,
            findings: &mut findings,
        };
        (rule.run)(policy, &mut emit);
    }
    findings
}

macro_rules! rule {
    ($id:literal, $name:literal, $sev:ident, $title:literal, $desc:literal, $fix:literal, $run:expr) => {
        PolicyRule {
            info: RuleInfo {
                id: $id,
                name: $name,
                severity: Severity::$sev,
                title: $title,
                description: $desc,
                remediation: $fix,
            },
            run: $run,
        }
    };
}

pub static POLICY_RULES: &[PolicyRule] = &[
    rule!(
        "SBX001",
        "network-host",
        High,
        "The sandbox shares the host's network",
        "With `network = \"host\"` the agent reaches the host's loopback services, the LAN and cloud metadata endpoints, and can send anything anywhere.",
        "Use `network = \"none\"`, or `network = \"proxy\"` with the hosts the agent needs (its model API) in `proxy.allow`.",
        network_host
    ),
    rule!(
        "SBX002",
        "writable-root",
        Critical,
        "The host's root filesystem is writable",
        "A writable bind of `/` hands the agent every file the invoking user can write: other agents' workspaces, dotfiles, the broker's state.",
        "Bind only what the agent needs; make system paths read-only and the workspace the only writable bind.",
        writable_root
    ),
    rule!(
        "SBX003",
        "writable-home",
        High,
        "A home directory is writable",
        "A writable home lets the agent plant shell startup files, git hooks and credentials that run outside the sandbox later, and read every secret kept there.",
        "Bind only the workspace read-write; bind single files or directories of $HOME read-only if needed.",
        writable_home
    ),
    rule!(
        "SBX004",
        "writable-system-dir",
        Critical,
        "A system directory is writable",
        "Writable /usr, /etc, /bin, /lib, /boot, /opt or /var lets the agent replace programs and configuration the host and other agents run.",
        "Make system directories read-only (`mode = \"ro\"`).",
        writable_system_dir
    ),
    rule!(
        "SBX005",
        "container-runtime-socket",
        Critical,
        "A container runtime socket is visible",
        "Access to docker.sock, containerd, podman or CRI-O sockets is root on the host: the agent can start a privileged container.",
        "Remove the bind; never expose container runtime sockets to agents.",
        container_socket
    ),
    rule!(
        "SBX006",
        "ssh-or-gpg-agent",
        High,
        "SSH or GPG keys or agent sockets are visible",
        "With an ssh-agent socket or ~/.ssh the agent can log in wherever the user can; with gpg-agent it can sign as the user.",
        "Remove the bind; give agents scoped deploy credentials through the broker, not the user's keys.",
        ssh_or_gpg
    ),
    rule!(
        "SBX007",
        "display-server",
        High,
        "An X11 or Wayland display is visible",
        "A display socket lets the agent read keystrokes and screen contents of the user's session and inject input.",
        "Remove binds of /tmp/.X11-unix, .Xauthority and wayland sockets.",
        display_server
    ),
    rule!(
        "SBX008",
        "dbus",
        High,
        "A D-Bus socket is visible",
        "The system or session bus reaches services (systemd, secret stores, desktop portals) that act outside the sandbox.",
        "Remove binds of /run/dbus and /run/user/*/bus.",
        dbus
    ),
    rule!(
        "SBX009",
        "shared-chats",
        High,
        "cursor-agent chats are shared instead of per agent",
        "~/.cursor holds every conversation (chats/<hash>/<session>/store.db); a shared bind lets one agent read and alter the others' sessions.",
        "Do not bind ~/.cursor or ~/.cursor/chats; the launcher binds each agent's own chats directory. Use ${AGENT_ID} in a source path if you add one.",
        shared_chats
    ),
    rule!(
        "SBX010",
        "mcp-config-writable",
        High,
        "The workspace's .cursor/ (mcp.json) is writable",
        "An agent that can edit .cursor/mcp.json chooses which MCP servers its next turn starts, outside the broker's control.",
        "Keep `.cursor` in `filesystem.protected` and do not bind anything in it read-write.",
        mcp_config_writable
    ),
    rule!(
        "SBX011",
        "missing-protected-paths",
        Low,
        "Default protected paths are missing",
        "The launcher already keeps host git from running what an agent writes: the workspace's `.git` is the agent's own, repositories in other writable binds are bound read-only and new ones made inert after the run. Protecting `.git/hooks` and `.git/config` as well keeps a writable bind's repository read-only where those mechanisms are bypassed (a bind of a `.git` directory itself, a tree other tools treat as git metadata).",
        "Add `.git/hooks` and `.git/config` (or `.git`) to `filesystem.protected`, as the shipped policies do.",
        missing_protected
    ),
    rule!(
        "SBX012",
        "seccomp-unconfined",
        High,
        "No seccomp filter",
        "Without a filter every system call of the kernel is reachable, including the ones behind most container escapes.",
        "Use `profile = \"default\"` or another allowlist profile.",
        seccomp_unconfined
    ),
    rule!(
        "SBX013",
        "seccomp-default-allow",
        High,
        "The seccomp profile allows by default",
        "A denylist misses every dangerous syscall it does not name, including ones added by newer kernels.",
        "Use an allowlist: `defaultAction` SCMP_ACT_ERRNO with the needed syscalls allowed.",
        seccomp_default_allow
    ),
    rule!(
        "SBX014",
        "seccomp-dangerous-syscalls",
        High,
        "The seccomp profile allows dangerous syscalls",
        "ptrace, process_vm_*, bpf, io_uring, keyctl, userfaultfd, perf_event_open, the mount API, module and kexec calls are the common paths to kernel exploits and sandbox escapes.",
        "Remove them from the allowed names (the shipped default profile denies them).",
        seccomp_dangerous
    ),
    rule!(
        "SBX015",
        "seccomp-namespace-clone",
        Low,
        "The seccomp profile lets processes create namespaces",
        "clone3 cannot be filtered by flags and unfiltered clone/unshare/setns allow new namespaces; the filter is a second wall behind the user namespace limit.",
        "Return ENOSYS for clone3, filter clone's CLONE_NEW* flags and deny unshare and setns.",
        seccomp_namespace_clone
    ),
    rule!(
        "SBX016",
        "landlock-off",
        Medium,
        "Landlock is off",
        "Landlock is the layer that still holds if a mount is wrong: it limits file access by path from inside the process.",
        "Set `landlock = \"required\"` (or `best-effort` on kernels without it).",
        landlock_off
    ),
    rule!(
        "SBX017",
        "landlock-best-effort",
        Low,
        "Landlock is best-effort",
        "On a kernel without (full) Landlock the sandbox starts anyway with weaker file rules; the run report says so, but nothing stops the launch.",
        "Use `landlock = \"required\"` where the fleet's kernels support it (check --host tells).",
        landlock_best_effort
    ),
    rule!(
        "SBX018",
        "nested-userns",
        High,
        "Nested user namespaces are allowed",
        "New user namespaces give the agent capabilities over fresh namespaces and the kernel code behind them, the source of many privilege escalations.",
        "Set `namespaces.nested_userns = false`.",
        nested_userns
    ),
    rule!(
        "SBX019",
        "namespace-disabled",
        Medium,
        "A namespace is not unshared",
        "Without its own pid, ipc or uts namespace the agent sees and can signal host processes, or reach host IPC objects.",
        "Leave `namespaces.pid`, `ipc` and `uts` at true.",
        namespace_disabled
    ),
    rule!(
        "SBX020",
        "no-pids-limit",
        Medium,
        "No process limit",
        "A fork bomb in one agent takes the whole host down.",
        "Set `cgroup.pids_max` (the worker policy uses 512).",
        no_pids_limit
    ),
    rule!(
        "SBX021",
        "no-memory-limit",
        Medium,
        "No memory limit",
        "One agent can exhaust host memory and get other agents, or the broker, killed by the OOM killer.",
        "Set `cgroup.memory_max` (for example \"4GiB\").",
        no_memory_limit
    ),
    rule!(
        "SBX022",
        "no-cpu-limit",
        Low,
        "No CPU limit",
        "One busy agent can starve the others and the broker of CPU.",
        "Set `cgroup.cpu_max` to a number of CPUs.",
        no_cpu_limit
    ),
    rule!(
        "SBX023",
        "secret-env",
        Medium,
        "Secret-looking environment variables pass into the sandbox",
        "Variables named like tokens, keys, secrets or passwords are readable by everything the agent runs, and can be sent out through any allowed channel.",
        "Pass only the credential the provider needs; prefer scoped, short-lived keys.",
        secret_env
    ),
    rule!(
        "SBX024",
        "env-passthrough-all",
        High,
        "The whole host environment passes into the sandbox",
        "`*` in `env.allow` passes every variable of the launching shell: tokens, SSH_AUTH_SOCK, cloud credentials.",
        "List the variables the agent needs by name.",
        env_passthrough_all
    ),
    rule!(
        "SBX025",
        "no-rate-limit",
        Medium,
        "No MCP call rate limit",
        "An agent can flood the broker and, through it, other agents and upstream servers.",
        "Set `mcp.calls_per_minute` and `mcp.burst` (worker: 120 and 30).",
        no_rate_limit
    ),
    rule!(
        "SBX026",
        "tool-cap",
        Medium,
        "Tool cap absent or above 40",
        "cursor-agent keeps only the first 40 tools across all servers and drops the rest without a word; above 40, which tools an agent gets is decided by ordering, not by policy.",
        "Set `mcp.tool_cap` to 40 or less.",
        tool_cap
    ),
    rule!(
        "SBX027",
        "no-output-limit",
        Medium,
        "No tool output limit",
        "Unbounded tool output can fill the agent's context and the broker's memory.",
        "Set `mcp.max_output_bytes` (worker: \"256KiB\").",
        no_output_limit
    ),
    rule!(
        "SBX028",
        "no-step-limit",
        Low,
        "No tool step limit per turn",
        "Without a step limit a looping agent calls tools until its turn is killed.",
        "Set `mcp.tool_steps_per_turn` (worker: 20).",
        no_step_limit
    ),
    rule!(
        "SBX029",
        "unbounded-messaging",
        Low,
        "Messaging limits are missing",
        "Without message size, inbox depth and broadcast fan-out limits one agent can fill others' inboxes and the broker's store.",
        "Set `mcp.max_message_bytes`, `mcp.inbox_depth` and `mcp.broadcast_fanout`.",
        unbounded_messaging
    ),
    rule!(
        "SBX030",
        "unbounded-spawning",
        Medium,
        "Agent spawning is unbounded",
        "Without spawn depth and children limits an agent can create agents without end, each with its own sandbox and budget.",
        "Set `mcp.spawn_depth` and `mcp.children_per_agent`.",
        unbounded_spawning
    ),
    rule!(
        "SBX031",
        "no-tool-scope",
        Low,
        "All tools are in scope",
        "Without `tools.allow` the agent may call every tool the broker serves, including upstream tools added later.",
        "List the tools (or patterns) the role needs in `tools.allow`.",
        no_tool_scope
    ),
    rule!(
        "SBX032",
        "host-kernel-interfaces",
        High,
        "Host /proc, /sys or /dev is bound in",
        "The sandbox makes its own /proc and a minimal /dev; binding the host's exposes other processes, kernel knobs and devices.",
        "Remove binds of /proc, /sys and /dev.",
        host_kernel_interfaces
    ),
    rule!(
        "SBX033",
        "host-runtime-dir",
        High,
        "A host runtime directory with sockets is bound in",
        "/run, /var/run and /run/user/<uid> hold the sockets of every host service; binding them exposes all at once.",
        "Bind the single file or socket needed, if any.",
        host_runtime_dir
    ),
    rule!(
        "SBX034",
        "home-readable",
        High,
        "A whole home directory is readable",
        "A home directory holds keys, tokens, shell history and other agents' chats; read access is enough to steal them.",
        "Bind only the needed subdirectories of $HOME, read-only.",
        home_readable
    ),
    rule!(
        "SBX035",
        "host-root-readable",
        High,
        "The host's whole filesystem is readable",
        "A bind of `/` shows everything the invoking user can read, other agents' workspaces included.",
        "Bind /usr and the few /etc files tools need, read-only.",
        host_root_readable
    ),
    rule!(
        "SBX036",
        "missing-rlimits",
        Low,
        "Core dumps or open files are not limited",
        "Core dumps can write secrets from memory into the workspace; unlimited descriptors let one agent exhaust the host's file table.",
        "Set `rlimits.core = 0` and `rlimits.nofile`.",
        missing_rlimits
    ),
    rule!(
        "SBX037",
        "proxy-allows-any-host",
        High,
        "The proxy allows any host",
        "A `*` pattern lets the agent reach every public host on those ports: exfiltration anywhere, as with `network = \"host\"` minus the LAN.",
        "List the hosts the agent needs (`api2.cursor.sh`, `*.example.com:443`).",
        proxy_allows_any
    ),
    rule!(
        "SBX038",
        "proxy-allows-nothing",
        Low,
        "The proxy allows no host",
        "With an empty `proxy.allow` nothing is reachable: the sandbox gets a proxy it cannot use, and the agent needing its API fails.",
        "Add the hosts the agent needs to `proxy.allow`, or use `network = \"none\"`.",
        proxy_allows_nothing
    ),
    rule!(
        "SBX039",
        "proxy-test-settings",
        Critical,
        "The proxy's test-only settings are on",
        "`test_allow_private` lets agents reach loopback, private ranges and cloud metadata (169.254.169.254); `test_hosts` replaces DNS with fixed addresses. Both exist for tests only.",
        "Remove `proxy.test_allow_private` and `proxy.test_hosts`.",
        proxy_test_settings
    ),
];

fn binds(p: &LoadedPolicy) -> impl Iterator<Item = (usize, &Bind)> {
    p.policy.filesystem.binds.iter().enumerate()
}

fn bind_key(i: usize) -> String {
    format!("filesystem.binds[{i}]")
}

fn t(s: &str) -> PathTemplate {
    PathTemplate::new(s)
}

fn components(path: &PathTemplate) -> Vec<String> {
    path.normalized_components()
}

/// The source is `prefix` or lies below it.
fn source_within(bind: &Bind, prefix: &str) -> bool {
    bind.source.is_within(&t(prefix))
}

/// The source is `prefix`, lies below it, or contains it (binding a parent
/// exposes the child too).
fn source_exposes(bind: &Bind, path: &str) -> bool {
    source_within(bind, path) || t(path).is_within(&bind.source)
}

fn source_is_root(bind: &Bind) -> bool {
    components(&bind.source) == [""]
}

/// `${HOME}`, `/root`, `/home` or `/home/<user>`: a whole home directory.
fn is_home_dir(path: &PathTemplate) -> bool {
    let c = components(path);
    let c: Vec<&str> = c.iter().map(String::as_str).collect();
    matches!(
        c.as_slice(),
        ["${HOME}"] | ["", "root"] | ["", "home"] | ["", "home", _]
    )
}

fn network_host(p: &LoadedPolicy, e: &mut Emit<'_>) {
    if p.policy.network == NetworkMode::Host {
        e.at(
            "network",
            "`network = \"host\"`: the agent shares the host's network stack",
        );
    }
}

fn writable_root(p: &LoadedPolicy, e: &mut Emit<'_>) {
    for (i, b) in binds(p).filter(|(_, b)| b.writable() && source_is_root(b)) {
        e.at(
            &bind_key(i),
            format!("`/` is bound read-write at `{}`", b.target()),
        );
    }
}

fn writable_home(p: &LoadedPolicy, e: &mut Emit<'_>) {
    for (i, b) in binds(p).filter(|(_, b)| b.writable() && is_home_dir(&b.source)) {
        e.at(
            &bind_key(i),
            format!("home directory `{}` is bound read-write", b.source),
        );
    }
}

const SYSTEM_DIRS: [&str; 12] = [
    "/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/boot", "/opt",
    "/var", "/snap",
];

fn writable_system_dir(p: &LoadedPolicy, e: &mut Emit<'_>) {
    for (i, b) in binds(p).filter(|(_, b)| b.writable() && !source_is_root(b)) {
        if let Some(dir) = SYSTEM_DIRS.iter().find(|d| source_exposes(b, d)) {
            e.at(
                &bind_key(i),
                format!(
                    "`{}` is bound read-write and exposes system directory `{dir}`",
                    b.source
                ),
            );
        }
    }
}

fn source_text_matches(b: &Bind, needles: &[&str]) -> Option<String> {
    let s = b.source.as_str();
    needles
        .iter()
        .find(|n| s.contains(*n))
        .map(|n| n.to_string())
}

fn container_socket(p: &LoadedPolicy, e: &mut Emit<'_>) {
    const NEEDLES: [&str; 7] = [
        "docker.sock",
        "/containerd",
        "podman",
        "crio",
        "buildkit",
        "/run/docker",
        "/var/lib/docker",
    ];
    for (i, b) in binds(p) {
        if let Some(what) = source_text_matches(b, &NEEDLES) {
            e.at(
                &bind_key(i),
                format!(
                    "bind source `{}` is a container runtime socket or directory ({what})",
                    b.source
                ),
            );
        }
    }
}

fn ssh_or_gpg(p: &LoadedPolicy, e: &mut Emit<'_>) {
    const NEEDLES: [&str; 6] = [
        "ssh-agent",
        "/tmp/ssh-",
        "/.ssh",
        "/.gnupg",
        "gpg-agent",
        "keyring",
    ];
    for (i, b) in binds(p) {
        if let Some(what) = source_text_matches(b, &NEEDLES) {
            e.at(
                &bind_key(i),
                format!(
                    "bind source `{}` exposes SSH/GPG keys or agents ({what})",
                    b.source
                ),
            );
        }
    }
}

fn display_server(p: &LoadedPolicy, e: &mut Emit<'_>) {
    const NEEDLES: [&str; 4] = [".X11-unix", ".Xauthority", "wayland-", "/.ICEauthority"];
    for (i, b) in binds(p) {
        if let Some(what) = source_text_matches(b, &NEEDLES) {
            e.at(
                &bind_key(i),
                format!(
                    "bind source `{}` exposes the display server ({what})",
                    b.source
                ),
            );
        }
    }
}

fn dbus(p: &LoadedPolicy, e: &mut Emit<'_>) {
    for (i, b) in binds(p) {
        let c = components(&b.source);
        let c: Vec<&str> = c.iter().map(String::as_str).collect();
        let hit = b.source.as_str().contains("dbus")
            || matches!(
                c.as_slice(),
                ["", "run", "user", _, "bus"] | ["", "var", "run", "user", _, "bus"]
            );
        if hit {
            e.at(
                &bind_key(i),
                format!("bind source `{}` is a D-Bus socket or directory", b.source),
            );
        }
    }
}

fn shared_chats(p: &LoadedPolicy, e: &mut Emit<'_>) {
    for (i, b) in binds(p) {
        let per_agent = b.source.uses(PathVar::AgentId);
        let touches_chats = source_exposes(b, "${HOME}/.cursor/chats")
            || b.target().is_within(&t("${HOME}/.cursor"))
            || b.source.as_str().contains("/.cursor/chats");
        if touches_chats && !per_agent && !is_home_dir(&b.source) {
            e.at(
                &bind_key(i),
                format!(
                    "bind `{}` -> `{}` shares cursor-agent chats between agents",
                    b.source,
                    b.target()
                ),
            );
        }
    }
}

fn has_writable_bind(p: &LoadedPolicy) -> bool {
    p.policy.filesystem.binds.iter().any(Bind::writable)
}

fn protected_covers(p: &LoadedPolicy, wanted: &str) -> bool {
    p.policy.filesystem.protected_paths().iter().any(|entry| {
        t(&format!("/{wanted}")).is_within(&t(&format!("/{}", entry.trim_end_matches('/'))))
    })
}

fn mcp_config_writable(p: &LoadedPolicy, e: &mut Emit<'_>) {
    if has_writable_bind(p) && !protected_covers(p, ".cursor") {
        e.at(
            "filesystem.protected",
            "`.cursor` is not protected: the agent can rewrite .cursor/mcp.json in its workspace",
        );
    }
    for (i, b) in binds(p).filter(|(_, b)| b.writable()) {
        if b.target().as_str().contains("/.cursor")
            && !b.target().is_within(&t("${HOME}/.cursor/chats"))
        {
            e.at(
                &bind_key(i),
                format!(
                    "`{}` is bound read-write inside a .cursor directory",
                    b.target()
                ),
            );
        }
    }
}

fn missing_protected(p: &LoadedPolicy, e: &mut Emit<'_>) {
    if !has_writable_bind(p) {
        return;
    }
    for wanted in [".git/hooks", ".git/config"] {
        if !protected_covers(p, wanted) {
            e.at(
                "filesystem.protected",
                format!("`{wanted}` is not protected in writable binds"),
            );
        }
    }
}

fn seccomp_unconfined(p: &LoadedPolicy, e: &mut Emit<'_>) {
    if matches!(p.seccomp, SeccompChoice::Unconfined) {
        e.at(
            "seccomp.profile",
            "seccomp is `unconfined`: every system call is allowed",
        );
    }
}

fn seccomp_default_allow(p: &LoadedPolicy, e: &mut Emit<'_>) {
    if let SeccompChoice::Profile { profile, path, .. } = &p.seccomp
        && profile.default_action.permits()
    {
        e.at(
            "seccomp.profile",
            format!(
                "profile {} allows every syscall it does not name",
                path.display()
            ),
        );
    }
}

fn seccomp_dangerous(p: &LoadedPolicy, e: &mut Emit<'_>) {
    if let SeccompChoice::Profile { profile, path, .. } = &p.seccomp {
        let allowed = profile.dangerous_allowed();
        if !allowed.is_empty() {
            e.at(
                "seccomp.profile",
                format!("profile {} allows {}", path.display(), allowed.join(", ")),
            );
        }
    }
}

fn seccomp_namespace_clone(p: &LoadedPolicy, e: &mut Emit<'_>) {
    if let SeccompChoice::Profile { profile, path, .. } = &p.seccomp {
        let mut open = Vec::new();
        for name in ["clone3", "unshare", "setns"] {
            if profile.verdict(name) != Verdict::Denied {
                open.push(name);
            }
        }
        if profile.verdict("clone") == Verdict::Allowed {
            open.push("clone (any flags)");
        }
        if !open.is_empty() {
            e.at(
                "seccomp.profile",
                format!("profile {} allows {}", path.display(), open.join(", ")),
            );
        }
    }
}

fn landlock_off(p: &LoadedPolicy, e: &mut Emit<'_>) {
    if p.policy.landlock == LandlockMode::Off {
        e.at("landlock", "`landlock = \"off\"`");
    }
}

fn landlock_best_effort(p: &LoadedPolicy, e: &mut Emit<'_>) {
    if p.policy.landlock == LandlockMode::BestEffort {
        e.at(
            "landlock",
            "`landlock = \"best-effort\"`: a kernel without Landlock does not stop the launch",
        );
    }
}

fn nested_userns(p: &LoadedPolicy, e: &mut Emit<'_>) {
    if p.policy.namespaces.nested_userns {
        e.at(
            "namespaces.nested_userns",
            "the sandboxed command may create user namespaces",
        );
    }
}

fn namespace_disabled(p: &LoadedPolicy, e: &mut Emit<'_>) {
    let ns = &p.policy.namespaces;
    for (name, on) in [("pid", ns.pid), ("ipc", ns.ipc), ("uts", ns.uts)] {
        if !on {
            e.at(
                &format!("namespaces.{name}"),
                format!("the {name} namespace is shared with the host"),
            );
        }
    }
}

fn no_pids_limit(p: &LoadedPolicy, e: &mut Emit<'_>) {
    if p.policy.cgroup.pids_max.is_none() {
        e.at("cgroup", "`cgroup.pids_max` is not set");
    }
}

fn no_memory_limit(p: &LoadedPolicy, e: &mut Emit<'_>) {
    if p.policy.cgroup.memory_max.is_none() {
        e.at("cgroup", "`cgroup.memory_max` is not set");
    }
}

fn no_cpu_limit(p: &LoadedPolicy, e: &mut Emit<'_>) {
    if p.policy.cgroup.cpu_max.is_none() {
        e.at("cgroup", "`cgroup.cpu_max` is not set");
    }
}

const SECRET_WORDS: [&str; 10] = [
    "TOKEN",
    "KEY",
    "SECRET",
    "PASSWORD",
    "PASSWD",
    "PASS",
    "CREDENTIAL",
    "AUTH",
    "APIKEY",
    "PAT",
];

/// Whether a variable name has a word (between `_`) that names a secret:
/// `GITHUB_TOKEN`, `CURSOR_API_KEY`, `DB_PASSWORD`, `AWS_SECRET_ACCESS_KEY`,
/// but not `MONKEY_BUSINESS`. Plural words count (`CREDENTIALS`).
fn looks_secret(name: &str) -> bool {
    name.to_ascii_uppercase().split(['_', '*']).any(|word| {
        let singular = word.strip_suffix('S').unwrap_or(word);
        SECRET_WORDS.contains(&word) || SECRET_WORDS.contains(&singular)
    })
}

fn secret_env(p: &LoadedPolicy, e: &mut Emit<'_>) {
    for (i, name) in p.policy.env.allow.iter().enumerate() {
        if name != "*" && looks_secret(name) {
            e.at(
                &format!("env.allow[{i}]"),
                format!("`{name}` looks like a secret and passes into the sandbox"),
            );
        }
    }
    for name in p.policy.env.set.keys().filter(|n| looks_secret(n)) {
        e.at(
            &crate::source::join_key("env.set", name),
            format!("`{name}` looks like a secret and is written into the policy"),
        );
    }
}

fn env_passthrough_all(p: &LoadedPolicy, e: &mut Emit<'_>) {
    for (i, name) in p.policy.env.allow.iter().enumerate() {
        if name == "*" {
            e.at(
                &format!("env.allow[{i}]"),
                "`*` passes the whole host environment",
            );
        }
    }
}

fn no_rate_limit(p: &LoadedPolicy, e: &mut Emit<'_>) {
    let m = &p.policy.mcp;
    if m.calls_per_minute.is_none() {
        e.at(
            "mcp",
            "`mcp.calls_per_minute` is not set: tool calls are not rate limited",
        );
    } else if m.burst.is_none() {
        e.at(
            "mcp",
            "`mcp.burst` is not set: the whole minute's calls may come at once",
        );
    }
}

fn tool_cap(p: &LoadedPolicy, e: &mut Emit<'_>) {
    match p.policy.mcp.tool_cap {
        None => e.at("mcp", format!("`mcp.tool_cap` is not set (cursor-agent silently keeps the first {MAX_TOOLS})")),
        Some(cap) if cap > MAX_TOOLS => e.at("mcp.tool_cap", format!(
            "tool cap {cap} is above {MAX_TOOLS}: cursor-agent silently drops every tool after the 40th"
        )),
        Some(_) => {}
    }
}

fn no_output_limit(p: &LoadedPolicy, e: &mut Emit<'_>) {
    if p.policy.mcp.max_output_bytes.is_none() {
        e.at("mcp", "`mcp.max_output_bytes` is not set");
    }
}

fn no_step_limit(p: &LoadedPolicy, e: &mut Emit<'_>) {
    if p.policy.mcp.tool_steps_per_turn.is_none() {
        e.at("mcp", "`mcp.tool_steps_per_turn` is not set");
    }
}

fn unbounded_messaging(p: &LoadedPolicy, e: &mut Emit<'_>) {
    let m = &p.policy.mcp;
    let missing: Vec<&str> = [
        ("max_message_bytes", m.max_message_bytes.is_none()),
        ("inbox_depth", m.inbox_depth.is_none()),
        ("broadcast_fanout", m.broadcast_fanout.is_none()),
    ]
    .into_iter()
    .filter(|(_, absent)| *absent)
    .map(|(k, _)| k)
    .collect();
    if !missing.is_empty() {
        e.at("mcp", format!("not set: mcp.{}", missing.join(", mcp.")));
    }
}

fn unbounded_spawning(p: &LoadedPolicy, e: &mut Emit<'_>) {
    let m = &p.policy.mcp;
    let missing: Vec<&str> = [
        ("spawn_depth", m.spawn_depth.is_none()),
        ("children_per_agent", m.children_per_agent.is_none()),
    ]
    .into_iter()
    .filter(|(_, absent)| *absent)
    .map(|(k, _)| k)
    .collect();
    if !missing.is_empty() {
        e.at("mcp", format!("not set: mcp.{}", missing.join(", mcp.")));
    }
}

fn no_tool_scope(p: &LoadedPolicy, e: &mut Emit<'_>) {
    match &p.policy.tools.allow {
        None => e.at("tools", "`tools.allow` is not set: every tool is in scope"),
        Some(list) => {
            if let Some(i) = list.iter().position(|pat| pat == "*") {
                e.at(&format!("tools.allow[{i}]"), "`*` puts every tool in scope");
            }
        }
    }
}

fn host_kernel_interfaces(p: &LoadedPolicy, e: &mut Emit<'_>) {
    for (i, b) in binds(p).filter(|(_, b)| !source_is_root(b)) {
        if let Some(dir) = ["/proc", "/sys", "/dev"]
            .iter()
            .find(|d| source_exposes(b, d))
        {
            e.at(
                &bind_key(i),
                format!("bind source `{}` exposes the host's {dir}", b.source),
            );
        }
    }
}

fn host_runtime_dir(p: &LoadedPolicy, e: &mut Emit<'_>) {
    for (i, b) in binds(p).filter(|(_, b)| !source_is_root(b)) {
        let c = components(&b.source);
        let c: Vec<&str> = c.iter().map(String::as_str).collect();
        let hit = matches!(
            c.as_slice(),
            ["", "run"]
                | ["", "var", "run"]
                | ["", "var"]
                | ["", "run", "user"]
                | ["", "run", "user", _]
        );
        if hit {
            e.at(
                &bind_key(i),
                format!("bind source `{}` holds host service sockets", b.source),
            );
        }
    }
}

fn home_readable(p: &LoadedPolicy, e: &mut Emit<'_>) {
    for (i, b) in binds(p).filter(|(_, b)| !b.writable() && is_home_dir(&b.source)) {
        e.at(
            &bind_key(i),
            format!(
                "home directory `{}` is bound (read-only still exposes its secrets)",
                b.source
            ),
        );
    }
}

fn host_root_readable(p: &LoadedPolicy, e: &mut Emit<'_>) {
    for (i, b) in binds(p).filter(|(_, b)| !b.writable() && source_is_root(b)) {
        e.at(
            &bind_key(i),
            format!("`/` is bound read-only at `{}`", b.target()),
        );
    }
}

fn proxy_patterns(p: &LoadedPolicy) -> Option<&crate::model::ProxyPolicy> {
    (p.policy.network == NetworkMode::Proxy).then_some(p.policy.proxy.as_ref())?
}

fn proxy_allows_any(p: &LoadedPolicy, e: &mut Emit<'_>) {
    let Some(proxy) = proxy_patterns(p) else {
        return;
    };
    for pattern in &proxy.allow {
        if let Ok(parsed) = crate::hosts::HostPattern::parse(pattern)
            && parsed.host == crate::hosts::HostMatch::Any
        {
            e.at("proxy.allow", format!("`{pattern}` allows every host"));
        }
    }
}

fn proxy_allows_nothing(p: &LoadedPolicy, e: &mut Emit<'_>) {
    if p.policy.network == NetworkMode::Proxy
        && proxy_patterns(p).is_none_or(|x| x.allow.is_empty())
    {
        e.at(
            "network",
            "`network = \"proxy\"` with no host in `proxy.allow`",
        );
    }
}

fn proxy_test_settings(p: &LoadedPolicy, e: &mut Emit<'_>) {
    let Some(proxy) = &p.policy.proxy else {
        return;
    };
    if proxy.test_allow_private {
        e.at(
            "proxy.test_allow_private",
            "loopback and private addresses are reachable through the proxy",
        );
    }
    if !proxy.test_hosts.is_empty() {
        e.at(
            "proxy.test_hosts",
            "names are resolved from the policy, not DNS",
        );
    }
}

fn missing_rlimits(p: &LoadedPolicy, e: &mut Emit<'_>) {
    let r = &p.policy.rlimits;
    let mut missing = Vec::new();
    if r.core.is_none_or(|c| c.0 > 0) {
        missing.push("core = 0");
    }
    if r.nofile.is_none() {
        missing.push("nofile");
    }
    if !missing.is_empty() {
        e.at(
            "rlimits",
            format!("not set: rlimits.{}", missing.join(", rlimits.")),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::{LoadOptions, load_builtin, load_str};
    use std::path::Path;

    /// A policy that extends the shipped worker with `body` on top.
    fn worker_with(body: &str) -> LoadedPolicy {
        let text = format!("version = 1\nextends = \"worker\"\n{body}\n");
        load_str(Path::new("t.toml"), &text, &LoadOptions::default())
            .unwrap_or_else(|e| panic!("{e}\n{text}"))
    }

    fn rule_ids(p: &LoadedPolicy) -> Vec<&'static str> {
        check_policy(p).iter().map(|f| f.rule_id).collect()
    }

    fn binds(list: &str) -> String {
        format!("[filesystem]\nbinds = [{{ source = \"${{WORKSPACE}}\", mode = \"rw\" }}, {list}]")
    }

    /// Rule, and a policy (on top of worker) that must trigger it.
    const TRIGGERS: &[(&str, &str)] = &[
        ("SBX001", "network = \"host\""),
        (
            "SBX002",
            "[filesystem]\nbinds = [{ source = \"/\", target = \"/host\", mode = \"rw\" }]",
        ),
        (
            "SBX003",
            "[filesystem]\nbinds = [{ source = \"${HOME}\", mode = \"rw\" }]",
        ),
        (
            "SBX004",
            "[filesystem]\nbinds = [{ source = \"/etc\", target = \"/mnt/etc\", mode = \"rw\" }]",
        ),
        (
            "SBX005",
            "@{ source = \"/var/run/docker.sock\", mode = \"ro\" }",
        ),
        ("SBX006", "@{ source = \"${HOME}/.ssh\", mode = \"ro\" }"),
        ("SBX007", "@{ source = \"/tmp/.X11-unix\", mode = \"ro\" }"),
        (
            "SBX008",
            "@{ source = \"/run/user/1000/bus\", mode = \"ro\" }",
        ),
        (
            "SBX009",
            "@{ source = \"${HOME}/.cursor/chats\", mode = \"rw\" }",
        ),
        ("SBX010", "[filesystem]\nprotected = [\".git\"]"),
        ("SBX011", "[filesystem]\nprotected = [\".cursor\"]"),
        ("SBX012", "[seccomp]\nprofile = \"unconfined\""),
        (
            "SBX013",
            "[seccomp]\nprofile = \"/PROFILES/allow-all.json\"",
        ),
        ("SBX014", "[seccomp]\nprofile = \"/PROFILES/ptrace.json\""),
        ("SBX015", "[seccomp]\nprofile = \"/PROFILES/clone3.json\""),
        ("SBX016", "landlock = \"off\""),
        ("SBX017", "landlock = \"best-effort\""),
        ("SBX018", "[namespaces]\nnested_userns = true"),
        ("SBX019", "[namespaces]\npid = false"),
        ("SBX020", "[cgroup]\npids_max = 1\n[cgroup.x]"),
        ("SBX021", "[cgroup]\nmemory_max = 1\n[cgroup.x]"),
        ("SBX022", "[cgroup]\ncpu_max = 1\n[cgroup.x]"),
        ("SBX023", "[env]\nallow = [\"GITHUB_TOKEN\"]"),
        ("SBX024", "[env]\nallow = [\"*\"]"),
        ("SBX025", "[mcp]\ncalls_per_minute = 1\n[mcp.x]"),
        ("SBX026", "[mcp]\ntool_cap = 41"),
        ("SBX027", "[mcp]\nmax_output_bytes = 1\n[mcp.x]"),
        ("SBX028", "[mcp]\ntool_steps_per_turn = 1\n[mcp.x]"),
        ("SBX029", "[mcp]\ninbox_depth = 1\n[mcp.x]"),
        ("SBX030", "[mcp]\nspawn_depth = 1\n[mcp.x]"),
        ("SBX031", "[tools]\nallow = [\"*\"]"),
        ("SBX032", "@{ source = \"/sys\", mode = \"ro\" }"),
        ("SBX033", "@{ source = \"/run\", mode = \"ro\" }"),
        ("SBX034", "@{ source = \"/home\", mode = \"ro\" }"),
        (
            "SBX035",
            "[filesystem]\nbinds = [{ source = \"/\", mode = \"ro\" }]",
        ),
        ("SBX036", "[rlimits]\ncore = \"1MiB\""),
        (
            "SBX037",
            "network = \"proxy\"\n[proxy]\nallow = [\"api.example.com\", \"*:443\"]",
        ),
        ("SBX038", "network = \"proxy\"\n[proxy]\nallow = []"),
        (
            "SBX039",
            "network = \"proxy\"\n[proxy]\nallow = [\"a.test\"]\ntest_allow_private = true",
        ),
    ];

    /// Writes the seccomp profiles the triggers name and returns their directory.
    fn profiles() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, json: &str| std::fs::write(dir.path().join(name), json).unwrap();
        write(
            "allow-all.json",
            r#"{"defaultAction":"SCMP_ACT_ALLOW","syscalls":[]}"#,
        );
        write(
            "ptrace.json",
            r#"{"defaultAction":"SCMP_ACT_ERRNO","syscalls":[{"names":["read","ptrace"],"action":"SCMP_ACT_ALLOW"}]}"#,
        );
        write(
            "clone3.json",
            r#"{"defaultAction":"SCMP_ACT_ERRNO","syscalls":[{"names":["read","clone3"],"action":"SCMP_ACT_ALLOW"}]}"#,
        );
        dir
    }

    /// `@{...}` stands for "the worker's workspace bind plus this bind".
    fn trigger_text(body: &str, dir: &Path) -> String {
        let body = body.replace("/PROFILES", &dir.display().to_string());
        if let Some(list) = body.strip_prefix('@') {
            return binds(list);
        }
        body.to_string()
    }

    #[test]
    fn shipped_worker_has_no_findings() {
        let worker = load_builtin("worker", &LoadOptions::default())
            .unwrap()
            .unwrap();
        assert_eq!(rule_ids(&worker), Vec::<&str>::new());
    }

    #[test]
    fn every_rule_triggers_on_its_example() {
        let dir = profiles();
        let tested: Vec<&str> = TRIGGERS.iter().map(|(id, _)| *id).collect();
        for rule in POLICY_RULES {
            assert!(
                tested.contains(&rule.info.id),
                "{} has no trigger test",
                rule.info.id
            );
        }
        for (id, body) in TRIGGERS {
            let text = trigger_text(body, dir.path());
            let policy = if text.contains("[cgroup.x]") || text.contains("[mcp.x]") {
                absent_key_policy(&text)
            } else {
                worker_with(&text)
            };
            let found = check_policy(&policy);
            let hit = found.iter().find(|f| f.rule_id == *id);
            assert!(
                hit.is_some(),
                "{id} did not trigger on:\n{text}\nfound {found:#?}"
            );
            let hit = hit.unwrap();
            assert_eq!(
                hit.severity,
                POLICY_RULES
                    .iter()
                    .find(|r| r.info.id == *id)
                    .unwrap()
                    .info
                    .severity
            );
            assert!(hit.location.line >= 1);
        }
    }

    /// For the rules about absent keys: a self-contained policy equal to the
    /// worker except that the named section lacks the key. The marker
    /// `[section.x]` says which section; the key written before it is the one
    /// to leave out.
    fn absent_key_policy(marker_text: &str) -> LoadedPolicy {
        let (section_line, rest) = marker_text.split_once('\n').unwrap();
        let key = rest.split_once(" =").unwrap().0;
        let worker = crate::builtin::policy("worker").unwrap();
        let mut out = String::new();
        let mut in_section = false;
        for line in worker.lines() {
            if line.starts_with('[') {
                in_section = line == section_line;
            }
            if in_section && line.starts_with(&format!("{key} ")) {
                continue;
            }
            out.push_str(line);
            out.push('\n');
        }
        load_str(Path::new("t.toml"), &out, &LoadOptions::default()).unwrap()
    }

    #[test]
    fn near_misses_do_not_trigger() {
        let clean = |body: &str| {
            let p = worker_with(body);
            let ids = rule_ids(&p);
            assert!(ids.is_empty(), "{body}\n-> {ids:?}");
        };
        // A proxy with named hosts is the intended use.
        clean(
            "network = \"proxy\"\n[proxy]\nallow = [\"api2.cursor.sh\", \"*.cursor.sh:443\"]\ndeny = [\"evil.cursor.sh\"]",
        );
        // Read-only system dirs and a per-agent chats dir are what the worker needs.
        clean(&binds("{ source = \"/etc/ssl/certs\", mode = \"ro\" }"));
        clean(&binds("{ source = \"/opt/tool\", mode = \"ro\" }"));
        clean(&binds(
            "{ source = \"${HOME}/.substrat/agents/${AGENT_ID}/chats\", target = \"${HOME}/.cursor/chats\", mode = \"rw\" }",
        ));
        clean(&binds(
            "{ source = \"/srv/cache\", target = \"/cache\", mode = \"rw\" }",
        ));
        clean(&binds("{ source = \"${HOME}/.cache/pip\", mode = \"ro\" }"));
        clean("[filesystem]\nprotected = [\".cursor/\", \".git\"]");
        clean("[env]\nallow = [\"LANG\", \"MONKEY_BUSINESS_LEVEL\"]\n");
        clean("[mcp]\ntool_cap = 40");
        assert!(
            looks_secret("AWS_SECRET_ACCESS_KEY")
                && looks_secret("GH_CREDENTIALS")
                && looks_secret("SECRET_*")
        );
        assert!(
            !looks_secret("KEYBOARD_LAYOUT") && !looks_secret("PATH") && !looks_secret("NPM_*")
        );
    }

    #[test]
    fn reviewer_and_strict_pass_fail_on_high() {
        for name in ["worker", "reviewer", "strict"] {
            let p = load_builtin(name, &LoadOptions::default())
                .unwrap()
                .unwrap();
            let worst = check_policy(&p).iter().map(|f| f.severity).max();
            assert!(
                worst.is_none_or(|s| s < Severity::High),
                "{name}: {:?}",
                check_policy(&p)
            );
        }
    }

    #[test]
    fn host_network_and_writable_home_both_found() {
        let p = worker_with(
            "network = \"host\"\n[filesystem]\nbinds = [{ source = \"${HOME}\", mode = \"rw\" }]",
        );
        let ids = rule_ids(&p);
        assert!(
            ids.contains(&"SBX001") && ids.contains(&"SBX003"),
            "{ids:?}"
        );
        let f = check_policy(&p);
        let home = f.iter().find(|f| f.rule_id == "SBX003").unwrap();
        assert_eq!(home.key_path, "filesystem.binds[0]");
        assert_eq!(
            (home.location.file.as_path(), home.location.line),
            (Path::new("t.toml"), 5)
        );
    }
}
