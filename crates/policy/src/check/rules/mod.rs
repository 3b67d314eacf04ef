//! The policy rules. Each is a small function over a loaded policy that
//! reports findings at key paths; the table below is the catalog that the
//! text, JSON and SARIF outputs and docs/check.md describe.

mod agent;
pub(crate) mod filesystem;
mod kernel;
mod network;
mod role;
pub(crate) mod secrets;
#[cfg(test)]
mod secrets_tests;
mod sockets;
#[cfg(test)]
mod sockets_tests;
#[cfg(test)]
mod tests;
mod upstream;

use agent::*;
use filesystem::*;
use kernel::*;
use network::*;
use secrets::*;
use sockets::*;

pub use role::{ROLE_RULES, script_role_broken, script_tools_out_of_scope};
pub use sockets::LANDLOCK_UNIX_CONNECT_ABI;
pub use upstream::{UPSTREAM_RULES, menu_over_cap};

use std::path::{Path, PathBuf};

use super::{Finding, RuleInfo, Severity};
use crate::load::LoadedPolicy;

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
pub(super) struct Emit<'a> {
    policy: &'a LoadedPolicy,
    info: &'a RuleInfo,
    findings: &'a mut Vec<Finding>,
    /// Each bind's source as the launch resolves it on this host (by
    /// index; `None` where unresolved): judged beside the text.
    resolved: &'a [Option<PathBuf>],
    /// This kernel's Landlock ABI, when `check` knows the host.
    landlock_abi: Option<u32>,
}

impl Emit<'_> {
    pub(super) fn resolved(&self, index: usize) -> Option<&Path> {
        self.resolved.get(index)?.as_deref()
    }

    pub(super) fn landlock_abi(&self) -> Option<u32> {
        self.landlock_abi
    }

    pub(super) fn at(&mut self, key_path: &str, message: impl Into<String>) {
        let mut message = message.into();
        // A bind judged as written and as resolved: one finding.
        let bind = key_path.starts_with("filesystem.binds[");
        if bind
            && self
                .findings
                .iter()
                .any(|f| f.rule_id == self.info.id && f.key_path == key_path)
        {
            return;
        }
        let index = key_path
            .strip_prefix("filesystem.binds[")
            .and_then(|rest| rest.strip_suffix(']'))
            .and_then(|i| i.parse::<usize>().ok());
        let written = index.and_then(|i| self.policy.policy.filesystem.binds.get(i));
        if let (Some(i), Some(b)) = (index, written)
            && let Some(r) = self.resolved(i)
            && r != Path::new(b.source.as_str())
        {
            message.push_str(&format!(
                " (source `{}` resolves to `{}` here)",
                b.source,
                r.display()
            ));
        }
        self.findings.push(Finding {
            rule_id: self.info.id,
            severity: self.info.severity,
            message,
            remediation: self.info.remediation,
            key_path: key_path.to_string(),
            location: self.policy.locate(key_path),
        });
    }
}

pub fn check_policy(policy: &LoadedPolicy) -> Vec<Finding> {
    check_policy_resolved(policy, &[])
}

/// `check_policy` judging each bind also by its source as the launch
/// resolves it on this host (`resolved[i]` for bind `i`: symlinks, `..` in
/// their targets and mount points followed), so that `/tmp/link` -> `/etc`
/// is judged as `/etc`.
pub fn check_policy_resolved(policy: &LoadedPolicy, resolved: &[Option<PathBuf>]) -> Vec<Finding> {
    check_policy_on(policy, resolved, None)
}

/// `check_policy_resolved` knowing this kernel's Landlock ABI too (what
/// a socket in the view means depends on it).
pub fn check_policy_on(
    policy: &LoadedPolicy,
    resolved: &[Option<PathBuf>],
    landlock_abi: Option<u32>,
) -> Vec<Finding> {
    let mut findings = Vec::new();
    for rule in POLICY_RULES {
        let mut emit = Emit {
            policy,
            info: &rule.info,
            findings: &mut findings,
            resolved,
            landlock_abi,
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
        "`test_allow_private` lets agents reach loopback, private ranges and cloud metadata (169.254.169.254); `test_hosts` replaces DNS with fixed addresses. Both exist for tests only: every launch refuses a policy that sets either.",
        "Remove `proxy.test_allow_private` and `proxy.test_hosts`.",
        proxy_test_settings
    ),
    rule!(
        "SBX040",
        "proxy-allows-private-name",
        Medium,
        "The proxy allows a name of a private endpoint",
        "Names such as `localhost`, `*.internal` (cloud metadata: `metadata.google.internal`), `*.local`, `*.lan` or `*.home.arpa` lead to the host or its private network. The proxy refuses their private addresses whatever the policy says; only the operator can name such an endpoint (`--destinations`), so the entry either does nothing or asks for what a role should not decide.",
        "Remove the entry; for a private mirror or model server, ask the operator to name it in the daemon's destinations file.",
        proxy_allows_private_name
    ),
    rule!(
        "SBX041",
        "workspace-risk-allowed",
        Medium,
        "The policy runs in workspaces that expose more than a project",
        "With `filesystem.allow_workspace_risk` the launcher no longer refuses a workspace that is `/`, a home directory or a system directory, or that holds SSH keys, cloud credentials or shell startup files: the agent can read those and, where the workspace is writable, plant what the host runs later.",
        "Remove `allow_workspace_risk`; run agents in project directories, and pass `--allow-workspace-risk` for the one run that needs it.",
        workspace_risk_allowed
    ),
    rule!(
        "SBX042",
        "credentials-or-startup-files",
        High,
        "Credentials or shell startup files are visible",
        "Cloud logins, registry and forge tokens (~/.aws, ~/.kube, ~/.docker/config.json, ~/.config/gh, ~/.netrc...) let the agent act as the user elsewhere; a writable shell startup file (~/.bashrc, ~/.profile) runs what the agent writes in the user's next shell.",
        "Remove the bind; give agents scoped credentials through the broker or the model gateway, never the user's own.",
        credentials_or_startup_files
    ),
    rule!(
        "SBX043",
        "model-hosted-tools",
        Medium,
        "The role's model may use tools its provider runs",
        "`model.hosted_tools` lets the agent's model search the web, fetch URLs, run code or reach MCP servers on the model provider's side: a way out that neither the sandbox's network policy nor the broker sees, and the CLI's own web tools built on them are left on.",
        "Remove `model.hosted_tools`, or keep only the tools the role needs; give the agent what it must reach through the proxy's allowlist or an upstream MCP server instead.",
        hosted_tools
    ),
    rule!(
        "SBX044",
        "host-secret-keys",
        Critical,
        "The host's password hashes or private keys are visible",
        "/etc/shadow and gshadow hold password hashes to crack offline; SSH host keys, the Kerberos keytab and TLS private keys let the agent pose as the host.",
        "Bind only the files tools need (`/etc/ssl/certs`, never `/etc`, `/etc/ssh` or `/`).",
        host_secret_keys
    ),
    rule!(
        "SBX045",
        "host-service-credentials",
        High,
        "Cloud, cluster or container credentials of the host are visible",
        "/etc/kubernetes, the kubelet's keys, /run/secrets, k3s tokens, Docker's TLS keys and root's cloud logins give whoever reads them the cluster or the cloud account.",
        "Remove the bind; give the agent scoped credentials through the broker or the model gateway.",
        host_service_credentials
    ),
    rule!(
        "SBX046",
        "host-privilege-config",
        Medium,
        "Who may become root on the host is visible",
        "sudoers and doas.conf tell an attacker which accounts and commands lead to root.",
        "Bind only the files tools need, never `/etc` or `/etc/sudoers.d`.",
        host_privilege_config
    ),
    rule!(
        "SBX047",
        "socket-bind-unmarked",
        High,
        "A bind's source is a Unix socket the policy does not mark",
        "Landlock before ABI 9 cannot stop a connect(2) to a pathname socket: a socket in the view is reachable whatever the rules say, so the launch refuses a bind of one unless the bind says `socket = true`.",
        "Remove the bind, or mark it `socket = true` if the command must reach that service.",
        socket_bind_unmarked
    ),
    rule!(
        "SBX048",
        "socket-bind-reachable",
        Low,
        "A bind marked `socket = true` lets the command reach a host service",
        "The command can connect to the service behind the socket and do whatever it allows its clients (the Docker engine's is root on the host).",
        "Keep the mark only where the command needs the service; prefer a broker tool or a narrower socket.",
        socket_bind_reachable
    ),
    rule!(
        "SBX049",
        "bind-holds-sockets",
        Medium,
        "A bound directory holds host Unix sockets",
        "Sockets below a bound directory are in the view; before Landlock ABI 9 nothing stops the command from connecting to them (ABI 9's ruleset denies it).",
        "Bind only the files needed, not a directory that holds sockets; or mark the bind `socket = true` if the command must reach them.",
        bind_holds_sockets
    ),
    rule!(
        "SBX050",
        "model-any",
        Info,
        "The role's model allowance matches every model",
        "A `model.models` pattern that matches every name (`*`, `?*`, `*?*`...) lets an agent of the role ask for any model its provider serves (through `spawn_agent`'s `model` or its CLI's requests): the most expensive, or one its team did not choose. (Without `model.models` a role allows any model too, as before the key existed; `check` does not report that.)",
        "List the models the role may use, as glob patterns: `[model] models = [\"claude-sonnet-*\"]` (and `default` for a spawn that names none).",
        model_any
    ),
];
