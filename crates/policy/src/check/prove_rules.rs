//! The rules of `check --prove`: one per family of attacks the battery
//! runs inside a real sandbox on this host (substrat-probe battery). An
//! escaped attack is a finding of its rule at the rule's severity when a
//! static finding explains it (the policy asked for it), and critical when
//! none does (the static audit believed it held).

use super::{RuleInfo, Severity};

#[derive(Debug)]
pub struct ProveRule {
    pub info: RuleInfo,
    /// Static rules whose findings explain an escape of this family.
    pub explained_by: &'static [&'static str],
}

macro_rules! prove_rule {
    ($id:literal, $name:literal, $sev:ident, $title:literal, $desc:literal, $fix:literal, [$($by:literal),*]) => {
        ProveRule {
            info: RuleInfo {
                id: $id,
                name: $name,
                severity: Severity::$sev,
                title: $title,
                description: $desc,
                remediation: $fix,
            },
            explained_by: &[$($by),*],
        }
    };
}

pub static PROVE_RULES: &[ProveRule] = &[
    prove_rule!(
        "PRV000",
        "prove-error",
        Critical,
        "An attack could not be run, so nothing is known of it",
        "The probe did not start, did not finish or answered something unexpected. A check that did not run is never counted as held.",
        "Read the message; make substrat-probe available beside substrat-sandbox and runnable in the policy's view.",
        []
    ),
    prove_rule!(
        "PRV001",
        "refused-to-launch",
        Medium,
        "This host refused to build the policy's sandbox",
        "The launcher stopped before running anything (a required feature such as Landlock or a cgroup limit is missing here). Nothing runs under this policy on this host: safe, but not proven.",
        "Read the launcher's reason; give the host the feature (a delegated cgroup, a kernel with Landlock) or use another backend.",
        []
    ),
    prove_rule!(
        "PRV010",
        "read-outside-binds",
        Critical,
        "A host file outside every bind was read",
        "The sandbox's view holds more of the host than the policy's binds.",
        "Bind only what the agent needs; never `/` or a home directory.",
        ["SBX002", "SBX035", "SBX034", "SBX003"]
    ),
    prove_rule!(
        "PRV011",
        "write-outside-binds",
        Critical,
        "A host path outside every writable bind was written",
        "The agent can change host files the policy did not give it.",
        "Make every bind but the workspace read-only.",
        ["SBX002", "SBX003", "SBX004"]
    ),
    prove_rule!(
        "PRV012",
        "write-read-only-bind",
        Critical,
        "A read-only bind was written",
        "Read-only binds (/usr...) were writable: programs the host runs could be replaced.",
        "Use a kernel and backend that enforce read-only binds; report it.",
        ["SBX004"]
    ),
    prove_rule!(
        "PRV013",
        "protected-paths",
        High,
        "A protected path of the host workspace was changed",
        "Writes, creations, renames over or swaps of .git/config, .git/hooks or .cursor reached the host: host git or the next turn would run what the agent wrote.",
        "Keep `.git/hooks/`, `.git/config` and `.cursor/` in `filesystem.protected`.",
        ["SBX010", "SBX011"]
    ),
    prove_rule!(
        "PRV014",
        "host-unix-socket",
        High,
        "A host Unix socket outside the binds was reached",
        "Host services listening on Unix sockets (container runtimes, D-Bus, agents) act outside the sandbox.",
        "Do not bind host socket directories (/run, /var/run, /tmp).",
        ["SBX005", "SBX006", "SBX008", "SBX033"]
    ),
    prove_rule!(
        "PRV015",
        "abstract-socket",
        High,
        "A host abstract Unix socket was reached",
        "Abstract sockets are not files: only a network namespace or Landlock scoping keeps them out of reach.",
        "Use `network = \"none\"` or `\"proxy\"`, and Landlock on a kernel with ABI 6.",
        ["SBX001"]
    ),
    prove_rule!(
        "PRV016",
        "host-network",
        High,
        "A TCP service of the host was reached directly",
        "The host's loopback services or its addresses were reachable without the proxy.",
        "Use `network = \"none\"` or `network = \"proxy\"`.",
        ["SBX001"]
    ),
    prove_rule!(
        "PRV017",
        "socket-families",
        High,
        "A denied socket family was opened",
        "Netlink, packet or vsock sockets reach kernel interfaces and other hosts.",
        "Use a seccomp profile that denies them (the default does).",
        ["SBX012", "SBX013"]
    ),
    prove_rule!(
        "PRV018",
        "namespaces",
        Critical,
        "A user or mount namespace could be created, or a mount made",
        "New namespaces open kernel attack surface and let the agent rearrange its view.",
        "Keep `nested_userns = false` and the default seccomp profile.",
        ["SBX018", "SBX012", "SBX013", "SBX015"]
    ),
    prove_rule!(
        "PRV019",
        "capabilities",
        Critical,
        "The command holds capabilities or can gain privileges",
        "Effective, permitted, bounding or ambient capabilities, or no_new_privs off.",
        "Report it: the launcher drops every capability.",
        []
    ),
    prove_rule!(
        "PRV020",
        "ptrace",
        Critical,
        "Another process could be traced or its memory written",
        "ptrace and process_vm_writev reach into other processes.",
        "Use the default seccomp profile.",
        ["SBX012", "SBX013", "SBX014"]
    ),
    prove_rule!(
        "PRV021",
        "host-processes",
        High,
        "A host process could be seen or signalled",
        "Process listings and signals beyond the sandbox leak what the host runs and can disturb it.",
        "Keep the pid namespace (`namespaces.pid = true`).",
        ["SBX019"]
    ),
    prove_rule!(
        "PRV022",
        "seccomp-denied-calls",
        High,
        "A system call the profile should deny went through",
        "io_uring, keyctl, bpf, perf_event_open and userfaultfd are kernel attack surface agents do not need.",
        "Use the default seccomp profile, or deny these calls in yours.",
        ["SBX012", "SBX013", "SBX014"]
    ),
    prove_rule!(
        "PRV023",
        "terminal-injection",
        Critical,
        "TIOCSTI or TIOCSETD went through",
        "Injected terminal input runs commands in the user's shell after the agent ends.",
        "Use the default seccomp profile.",
        ["SBX012", "SBX013"]
    ),
    prove_rule!(
        "PRV024",
        "proc-leak",
        Critical,
        "A secret of the launcher's environment was readable inside",
        "/proc of a helper process (init, bwrap, a bridge) showed the launcher's environment or command line.",
        "Report it: helper processes are hidden and blanked.",
        ["SBX024"]
    ),
    prove_rule!(
        "PRV025",
        "set-id-files",
        High,
        "A set-user-id or set-group-id file could be made",
        "A set-id file in a shared tree runs with its owner's ids when someone else starts it.",
        "Use the default seccomp profile.",
        ["SBX012", "SBX013"]
    ),
    prove_rule!(
        "PRV026",
        "limits",
        Medium,
        "A resource limit of the policy did not hold",
        "More processes, memory or file size than the policy allows: the host's other users pay for it.",
        "Give the launcher a cgroup (a delegated one) and keep `enforcement = \"required\"`.",
        ["SBX020", "SBX021", "SBX036"]
    ),
    prove_rule!(
        "PRV027",
        "environment",
        High,
        "The environment inside is not the policy's",
        "Variables the policy does not pass (a token of the launching shell) reached the command.",
        "Keep `env.allow` to what the agent needs.",
        ["SBX023", "SBX024"]
    ),
    prove_rule!(
        "PRV028",
        "warm-turn-state",
        High,
        "Something of one turn lasted into the next other than the docs say",
        "A warm sandbox serves an agent's turns one after another: what one turn leaves (files of its tmpfs mounts) may reach the next only as docs/check.md lists, and between cold launches nothing may last.",
        "Report it: the turn server removes what is not listed (processes, System V IPC objects) after every turn.",
        []
    ),
];
