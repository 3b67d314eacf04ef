//! Steps taken inside the sandbox, shared by the native init and the bwrap
//! backend's helper: rlimits, reading back what is in force, and starting
//! the command.

use std::ffi::CString;
use std::fs;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::landlock::LandlockReport;
use crate::mounts::MountReport;
use crate::plan::{RlimitKind, RlimitSetting};
use crate::supervise::{Capabilities, RlimitFallback, RlimitOutcome, SetupReport};
use crate::sys;

/// Why a step inside the sandbox failed before the command started (the
/// launcher reports the text and the launch fails).
#[derive(Debug, thiserror::Error)]
pub(crate) enum SetupError {
    #[error("{what}: {errno}")]
    Call {
        what: &'static str,
        errno: nix::errno::Errno,
    },
    #[error("cannot set user.max_user_namespaces = 0 inside the sandbox")]
    NestedUserns,
    #[error(transparent)]
    Mounts(#[from] crate::mounts::MountError),
    #[error(transparent)]
    Landlock(#[from] crate::landlock::LandlockError),
    #[error("bridge: listen on 127.0.0.1:{port}: {source}")]
    Bridge { port: u16, source: std::io::Error },
    #[error("{what} capabilities: {source}")]
    Capabilities {
        what: String,
        source: caps::errors::CapsError,
    },
    #[error("{what}: {source}")]
    Io {
        what: &'static str,
        source: std::io::Error,
    },
    #[error("seccomp program of {0} bytes refused")]
    SeccompTooLarge(usize),
    #[error("configuration descriptor {fd}: {errno}")]
    ConfigFd { fd: i32, errno: nix::errno::Errno },
    #[error("cannot read the helper configuration: {0}")]
    ReadConfig(#[source] std::io::Error),
    #[error("helper configuration: {source} (is {helper} from the same build as the launcher?)")]
    ConfigJson {
        helper: &'static str,
        source: serde_json::Error,
    },
    #[error(
        "{helper} is version {ours}, the launcher is version {theirs}: install both from one build"
    )]
    OtherBuild {
        helper: &'static str,
        ours: &'static str,
        theirs: String,
    },
}

/// A failed call named by what it was for (`map_err(errno("sethostname"))`).
pub(crate) fn errno(what: &'static str) -> impl Fn(nix::errno::Errno) -> SetupError {
    move |errno| SetupError::Call { what, errno }
}

pub(crate) fn drop_capabilities() -> Result<(), SetupError> {
    use caps::CapSet;
    for cap in caps::all() {
        caps::drop(None, CapSet::Bounding, cap).map_err(|source| SetupError::Capabilities {
            what: format!("drop {cap} from the bounding set:"),
            source,
        })?;
    }
    for set in [
        CapSet::Ambient,
        CapSet::Inheritable,
        CapSet::Effective,
        CapSet::Permitted,
    ] {
        caps::clear(None, set).map_err(|source| SetupError::Capabilities {
            what: format!("clear {set:?}"),
            source,
        })?;
    }
    Ok(())
}

pub(crate) fn apply_rlimits(
    settings: &[RlimitSetting],
    fallback: RlimitFallback,
) -> Vec<RlimitOutcome> {
    use nix::sys::resource::{Resource, setrlimit};
    let mut wanted: Vec<(RlimitSetting, Option<String>)> =
        settings.iter().map(|s| (*s, None)).collect();
    let stand_ins = [
        (
            fallback.nproc,
            RlimitKind::Nproc,
            "cgroup pids limit unavailable: RLIMIT_NPROC used instead (not enforced for host root)",
        ),
        (
            fallback.data,
            RlimitKind::Data,
            "cgroup memory limit unavailable: RLIMIT_DATA used instead (per process: heap and private writable mappings)",
        ),
    ];
    for (value, kind, note) in stand_ins {
        if let Some(value) = value
            && !settings.iter().any(|s| s.kind == kind)
        {
            wanted.push((RlimitSetting { kind, value }, Some(note.to_string())));
        }
    }
    wanted
        .into_iter()
        .map(|(setting, note)| {
            let resource = match setting.kind {
                RlimitKind::Nofile => Resource::RLIMIT_NOFILE,
                RlimitKind::Nproc => Resource::RLIMIT_NPROC,
                RlimitKind::Core => Resource::RLIMIT_CORE,
                RlimitKind::Fsize => Resource::RLIMIT_FSIZE,
                RlimitKind::AddressSpace => Resource::RLIMIT_AS,
                RlimitKind::Data => Resource::RLIMIT_DATA,
                RlimitKind::CpuSeconds => Resource::RLIMIT_CPU,
            };
            let result = setrlimit(resource, setting.value, setting.value);
            RlimitOutcome {
                name: setting.kind,
                value: setting.value,
                applied: result.is_ok(),
                note: result.err().map(|e| format!("setrlimit: {e}")).or(note),
            }
        })
        .collect()
}

/// What /proc/self/status says about this process once restricted.
struct StatusFields {
    capabilities: Capabilities,
    no_new_privs: bool,
    seccomp_mode: String,
    seccomp_filters: usize,
}

fn read_status_fields() -> StatusFields {
    let status = fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.trim().to_string())
            .unwrap_or_else(|| "unknown".into())
    };
    StatusFields {
        capabilities: Capabilities {
            effective: field("CapEff:"),
            permitted: field("CapPrm:"),
            inheritable: field("CapInh:"),
            bounding: field("CapBnd:"),
            ambient: field("CapAmb:"),
        },
        no_new_privs: field("NoNewPrivs:") == "1",
        seccomp_mode: field("Seccomp:"),
        seccomp_filters: field("Seccomp_filters:").parse().unwrap_or(0),
    }
}

/// The report of a finished setup: what the steps returned, and what
/// /proc/self/status says is now in force (capabilities, no_new_privs,
/// seccomp), read back rather than assumed.
pub(crate) fn setup_report(
    mounts: MountReport,
    landlock: LandlockReport,
    nested_userns_blocked: bool,
    rlimits: Vec<RlimitOutcome>,
) -> SetupReport {
    let fields = read_status_fields();
    SetupReport {
        mounts,
        landlock,
        seccomp_filters_loaded: fields.seccomp_filters,
        seccomp_mode: fields.seccomp_mode,
        nested_userns_blocked,
        capabilities: fields.capabilities,
        no_new_privs: fields.no_new_privs,
        rlimits,
    }
}

/// Starts the command: only fds 0-2 (and `report`) stay open, SIGPIPE
/// has its default action and no signal is blocked (as std's `Command`
/// starts a program), `env` is its whole environment, a name without `/`
/// is looked up in env's PATH; with `terminal`, stdin (a pseudo-terminal
/// the launcher made) becomes the controlling terminal of this session,
/// for job control. Never returns: on failure prints why and exits 127
/// (not found) or 126; the reason also goes to `report`, when given (a
/// close-on-exec pipe: its end of file says the program runs, so an exec
/// that never started is an error for its caller, as runc's).
pub(crate) fn exec_command(
    argv: &[String],
    env: &[(String, String)],
    terminal: bool,
    report: Option<BorrowedFd<'_>>,
) -> ! {
    let fail = |code: i32, message: String| -> ! {
        eprintln!("substrat-sandbox: {message}");
        if let Some(fd) = report {
            let _ = nix::unistd::write(fd, message.as_bytes());
        }
        sys::exit_now(code)
    };
    let keep: Vec<i32> = report.iter().map(|fd| fd.as_raw_fd()).collect();
    if let Err(e) = sys::close_fds_except(&keep) {
        fail(126, format!("cannot close inherited descriptors: {e}"));
    }
    // A session of its own first: under bwrap, pid 1 made the session and
    // the command is not its leader (natively it already is: EPERM, fine).
    if terminal {
        let _ = nix::unistd::setsid();
    }
    if terminal && let Err(e) = rustix::process::ioctl_tiocsctty(std::io::stdin()) {
        fail(126, format!("cannot take the terminal (TIOCSCTTY): {e}"));
    }
    if let Err(e) = sys::default_signals(terminal) {
        fail(126, format!("cannot reset the signal state: {e}"));
    }
    let env_c: Vec<CString> = env
        .iter()
        .filter_map(|(k, v)| CString::new(format!("{k}={v}")).ok())
        .collect();
    let argv_c: Vec<CString> = argv
        .iter()
        .filter_map(|a| CString::new(a.as_bytes()).ok())
        .collect();
    let name = argv.first().cloned().unwrap_or_default();
    if argv_c.len() != argv.len() || argv_c.is_empty() {
        fail(126, format!("{name}: argument contains a NUL byte"));
    }
    let path_var = env
        .iter()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| v.as_str());
    let mut denied = false;
    for candidate in candidates(&name, path_var) {
        let Ok(path) = CString::new(candidate.as_os_str().as_bytes()) else {
            continue;
        };
        match nix::unistd::execve(&path, &argv_c, &env_c) {
            Err(nix::errno::Errno::ENOENT | nix::errno::Errno::ENOTDIR) => {}
            Err(nix::errno::Errno::EACCES) => denied = true,
            Err(e) => fail(126, format!("{name}: {e}")),
            Ok(never) => match never {},
        }
    }
    if denied {
        fail(126, format!("{name}: permission denied"));
    }
    // The words engines read as "not found" (podman: exit code 127).
    match name.contains('/') {
        true => fail(
            127,
            format!("{name}: command not found (no such file or directory)"),
        ),
        false => fail(
            127,
            format!("{name}: command not found (executable file not found in PATH)"),
        ),
    }
}

/// Where to look for the command: as given when it has a `/`, else in PATH
/// (or the usual directories when there is none).
fn candidates(name: &str, path_var: Option<&str>) -> Vec<PathBuf> {
    if name.contains('/') {
        return vec![PathBuf::from(name)];
    }
    let path = path_var.unwrap_or("/usr/local/bin:/usr/bin:/bin");
    path.split(':')
        .filter(|d| !d.is_empty())
        .map(|d| Path::new(d).join(name))
        .collect()
}

/// Changes to `dir`, or to `/` when it is not there.
pub(crate) fn enter_dir(dir: &Path) {
    if nix::unistd::chdir(dir).is_err() {
        let _ = nix::unistd::chdir("/");
    }
}
