//! The attacks of `check --prove`: the table the prover judges by (its
//! id, the `PRV` rule an escape is a finding of, what it tries, and the
//! errnos that prove a refusal) and that the probe's battery reports on.

/// One attack of the battery: its id, the prove rule an escape is a
/// finding of, and what it tries (docs/check.md lists them).
#[derive(Debug)]
pub struct AttackInfo {
    pub id: &'static str,
    pub rule: &'static str,
    pub tries: &'static str,
    /// The errnos that prove the sandbox (or the kernel's own policy)
    /// refused; empty for attacks judged by what they saw or the host saw.
    pub refused: &'static [&'static str],
}

macro_rules! attacks {
    ($(($id:literal, $rule:literal, $tries:literal $(, [$($errno:literal),*])?)),* $(,)?) => {
        pub const ATTACKS: &[AttackInfo] = &[$(AttackInfo {
            id: $id,
            rule: $rule,
            tries: $tries,
            refused: &[$($($errno),*)?],
        }),*];
    };
}

attacks![
    (
        "read-outside",
        "PRV010",
        "read a host file outside every bind",
        ["ENOENT", "EACCES", "EPERM"]
    ),
    (
        "write-outside",
        "PRV011",
        "create a file in a host directory outside every bind",
        ["ENOENT", "EACCES", "EPERM", "EROFS"]
    ),
    (
        "write-system",
        "PRV012",
        "create a file in /usr (a read-only bind)",
        ["EROFS", "EACCES", "EPERM", "ENOENT"]
    ),
    (
        "protected-write",
        "PRV013",
        "overwrite the workspace's .git/config"
    ),
    ("protected-create", "PRV013", "create .git/hooks/pre-commit"),
    (
        "protected-rename-over",
        "PRV013",
        "rename a file over .git/config"
    ),
    (
        "protected-symlink-swap",
        "PRV013",
        "move .git/hooks away (to put a link there)"
    ),
    ("mcp-config-write", "PRV013", "write .cursor/mcp.json"),
    (
        "unix-socket",
        "PRV014",
        "connect to a host Unix socket outside the binds",
        ["ENOENT", "EACCES", "EPERM", "ECONNREFUSED"]
    ),
    (
        "abstract-socket",
        "PRV015",
        "connect to a host abstract Unix socket",
        ["ECONNREFUSED", "EPERM", "EACCES"]
    ),
    (
        "tcp-host-loopback",
        "PRV016",
        "connect to a TCP server on the host's 127.0.0.1",
        [
            "ECONNREFUSED",
            "ENETUNREACH",
            "EHOSTUNREACH",
            "ETIMEDOUT",
            "EACCES",
            "EPERM"
        ]
    ),
    (
        "tcp-host-address",
        "PRV016",
        "connect to a TCP server on a host address",
        [
            "ECONNREFUSED",
            "ENETUNREACH",
            "EHOSTUNREACH",
            "ETIMEDOUT",
            "EACCES",
            "EPERM"
        ]
    ),
    (
        "socket-netlink",
        "PRV017",
        "open a netlink socket",
        ["EPERM", "EACCES", "EAFNOSUPPORT"]
    ),
    (
        "socket-packet",
        "PRV017",
        "open a raw packet socket",
        ["EPERM", "EACCES", "EAFNOSUPPORT"]
    ),
    (
        "socket-vsock",
        "PRV017",
        "open a vsock socket",
        ["EPERM", "EACCES", "EAFNOSUPPORT"]
    ),
    (
        "userns",
        "PRV018",
        "unshare a new user namespace",
        ["EPERM", "EACCES", "ENOSPC"]
    ),
    (
        "clone-newuser",
        "PRV018",
        "clone with CLONE_NEWUSER",
        ["EPERM", "EACCES", "ENOSPC"]
    ),
    ("mount", "PRV018", "mount a tmpfs", ["EPERM", "EACCES"]),
    (
        "capabilities",
        "PRV019",
        "hold any capability, or lack no_new_privs"
    ),
    (
        "ptrace",
        "PRV020",
        "ptrace-attach to a child process it started",
        ["EPERM", "EACCES"]
    ),
    (
        "process-vm-writev",
        "PRV020",
        "write a child process's memory at a valid address",
        ["EPERM", "EACCES"]
    ),
    (
        "process-visibility",
        "PRV021",
        "see a host process in /proc"
    ),
    (
        "signal-host",
        "PRV021",
        "signal a host process by its pid",
        ["ESRCH", "EPERM"]
    ),
    (
        "io-uring",
        "PRV022",
        "io_uring_setup",
        ["EPERM", "EACCES", "ENOSYS"]
    ),
    (
        "keyctl",
        "PRV022",
        "keyctl on the session keyring",
        ["EPERM", "EACCES", "ENOSYS"]
    ),
    (
        "bpf",
        "PRV022",
        "bpf (create an array map)",
        ["EPERM", "EACCES", "ENOSYS"]
    ),
    (
        "perf-event-open",
        "PRV022",
        "perf_event_open (its own CPU clock)",
        ["EPERM", "EACCES", "ENOSYS"]
    ),
    (
        "userfaultfd",
        "PRV022",
        "userfaultfd (user mode only)",
        ["EPERM", "EACCES", "ENOSYS"]
    ),
    (
        "tiocsti",
        "PRV023",
        "inject input (TIOCSTI) into a pty that is its controlling terminal",
        ["EPERM", "EACCES", "EIO"]
    ),
    (
        "tiocsetd",
        "PRV023",
        "change a pty's line discipline (TIOCSETD)",
        ["EPERM", "EACCES"]
    ),
    (
        "proc-secret",
        "PRV024",
        "find the launcher's secret in any /proc/N/environ or cmdline"
    ),
    (
        "proc-mem",
        "PRV024",
        "open pid 1's memory (/proc/1/mem)",
        ["EACCES", "EPERM"]
    ),
    (
        "setid-file",
        "PRV025",
        "make a set-id file (chmod, open, mknod...)"
    ),
    (
        "environment",
        "PRV027",
        "see variables the policy does not pass"
    ),
    ("limit-fsize", "PRV026", "write past the file size limit"),
    ("limit-memory", "PRV026", "allocate past the memory limit"),
    ("limit-pids", "PRV026", "fork past the process limit"),
];
