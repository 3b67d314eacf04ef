//! Probing what this host can enforce, for `check --host` and backend choice.
//! Whatever changes process state (creating a user namespace, dropping to
//! nobody) is attempted in a fresh child process, never in the caller.

use std::fs;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use nix::sched::{CloneFlags, unshare};
use nix::unistd::{Gid, Uid, geteuid, setgid, setgroups, setuid};
use substrat_policy::check::{
    BwrapInfo, CgroupInfo, CgroupVersion, HostFacts, IdmapProbe, Probe, RootLaunches,
};

use crate::cgroupfs::{CgroupMount, parse_cgroup_mounts};
use crate::sys;

/// The unprivileged identity probes drop to when run as root.
const NOBODY: u32 = 65534;

#[derive(Debug, Clone)]
pub struct ProbeOptions {
    /// A binary whose `__probe-userns` subcommand runs `userns_probe_child`
    /// (the substrat-sandbox binary itself); the bwrap backend's helper is
    /// looked for beside it.
    pub probe_exe: PathBuf,
}

pub fn probe_host(options: &ProbeOptions) -> HostFacts {
    let running_as_root = geteuid().is_root();
    let userns_for_invoker = run_userns_probe(&options.probe_exe, false);
    let userns_unprivileged = if running_as_root {
        run_userns_probe(&options.probe_exe, true)
    } else {
        userns_for_invoker.clone()
    };
    let (seccomp_filter, seccomp_actions) = seccomp_support();
    HostFacts {
        kernel_release: read_trimmed("/proc/sys/kernel/osrelease")
            .unwrap_or_else(|| "unknown".into()),
        running_as_root,
        userns_for_invoker,
        userns_unprivileged,
        landlock_abi: sys::landlock_abi_version().unwrap_or(0),
        seccomp_filter,
        seccomp_actions,
        bwrap: find_bwrap(),
        bwrap_helper: probe_bwrap_helper(&options.probe_exe),
        cgroup: probe_cgroups(),
        root_launches: running_as_root.then(|| probe_root_launches(&options.probe_exe)),
    }
}

/// What launches by root would run as, and whether the places a workspace
/// usually is (and /usr, which every shipped policy binds) can be idmapped.
fn probe_root_launches(exe: &Path) -> RootLaunches {
    let subordinate_slots = substrat_policy::subid::RootSubordinates::read()
        .map(|subs| subs.slots())
        .unwrap_or(0);
    let mut paths: Vec<PathBuf> = Vec::new();
    for path in [
        std::env::current_dir().ok(),
        Some(std::env::temp_dir()),
        std::env::var_os("HOME").map(PathBuf::from),
        Some(PathBuf::from("/usr")),
    ]
    .into_iter()
    .flatten()
    {
        if !paths.contains(&path) {
            paths.push(path);
        }
    }
    let idmap = paths
        .into_iter()
        .map(|path| {
            let mut cmd = Command::new(exe);
            cmd.arg("__probe-idmap").arg(&path);
            IdmapProbe {
                path: path.display().to_string(),
                probe: run_probe(cmd),
            }
        })
        .collect();
    RootLaunches {
        subordinate_slots,
        idmap,
    }
}

fn read_trimmed(path: &str) -> Option<String> {
    fs::read_to_string(path).ok().map(|s| s.trim().to_string())
}

fn run_userns_probe(exe: &Path, as_nobody: bool) -> Probe {
    let mut cmd = Command::new(exe);
    cmd.arg("__probe-userns");
    if as_nobody {
        cmd.arg("--as-nobody");
    }
    run_probe(cmd)
}

/// Runs a probe child: success, or the reason it printed.
fn run_probe(mut cmd: Command) -> Probe {
    let output = cmd.stdin(Stdio::null()).stderr(Stdio::null()).output();
    match output {
        Ok(out) if out.status.success() => Probe::Yes,
        Ok(out) => Probe::No {
            reason: non_empty(String::from_utf8_lossy(&out.stdout).trim())
                .unwrap_or_else(|| format!("probe exited with {}", out.status)),
        },
        Err(err) => Probe::No {
            reason: format!("cannot run probe {}: {err}", cmd.get_program().display()),
        },
    }
}

fn non_empty(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_string())
}

/// Runs in a fresh child process (`substrat-sandbox __probe-userns`): drops
/// to nobody if asked and running as root, then tries to create a user
/// namespace. Returns a one-line reason on failure.
pub fn userns_probe_child(as_nobody: bool) -> Result<(), UsernsProbeError> {
    let failed = |step| move |errno| UsernsProbeError::Drop { step, errno };
    if as_nobody && geteuid().is_root() {
        // Order matters: groups and gid first, while we may still change them.
        setgroups(&[]).map_err(failed("setgroups"))?;
        setgid(Gid::from_raw(NOBODY)).map_err(failed("setgid(nobody)"))?;
        setuid(Uid::from_raw(NOBODY)).map_err(failed("setuid(nobody)"))?;
    }
    unshare(CloneFlags::CLONE_NEWUSER).map_err(|errno| UsernsProbeError::Unshare {
        errno,
        hint: userns_hint(),
    })
}

/// Why the user namespace probe could not make one.
#[derive(Debug, thiserror::Error)]
pub enum UsernsProbeError {
    #[error("{step}: {errno}")]
    Drop {
        step: &'static str,
        errno: nix::errno::Errno,
    },
    #[error("unshare(CLONE_NEWUSER): {errno}{hint}")]
    Unshare {
        errno: nix::errno::Errno,
        hint: String,
    },
}

/// Names the host setting that most likely refused the namespace.
fn userns_hint() -> String {
    let settings = [
        ("/proc/sys/kernel/unprivileged_userns_clone", "0"),
        ("/proc/sys/user/max_user_namespaces", "0"),
        (
            "/proc/sys/kernel/apparmor_restrict_unprivileged_userns",
            "1",
        ),
    ];
    settings
        .iter()
        .filter(|(path, bad)| read_trimmed(path).as_deref() == Some(*bad))
        .map(|(path, bad)| {
            format!(
                " ({} = {bad})",
                path.trim_start_matches("/proc/sys/").replace('/', ".")
            )
        })
        .collect()
}

fn seccomp_support() -> (bool, Vec<String>) {
    match fs::read_to_string("/proc/sys/kernel/seccomp/actions_avail") {
        Ok(actions) => (
            true,
            actions.split_whitespace().map(str::to_string).collect(),
        ),
        Err(_) => (false, Vec::new()),
    }
}

/// Where bwrap is on PATH, without running it.
pub fn bwrap_path() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join("bwrap"))
        .find(|p| p.is_file())
}

/// bwrap on PATH, with its version and the features we use (runs it twice).
pub fn find_bwrap() -> Option<BwrapInfo> {
    let exe = bwrap_path()?;
    let version = Command::new(&exe)
        .arg("--version")
        .stdin(Stdio::null())
        .output()
        .ok()?;
    let version = String::from_utf8_lossy(&version.stdout);
    let version = version
        .trim()
        .trim_start_matches("bubblewrap")
        .trim()
        .to_string();
    let help = Command::new(&exe)
        .arg("--help")
        .stdin(Stdio::null())
        .output()
        .ok()?;
    let help =
        String::from_utf8_lossy(&help.stdout).into_owned() + &String::from_utf8_lossy(&help.stderr);
    Some(BwrapInfo {
        path: exe.display().to_string(),
        version,
        disable_userns: help.contains("--disable-userns"),
        fd_binds: help.contains("--ro-bind-fd") && help.contains("--add-seccomp-fd"),
    })
}

/// The bwrap backend's helper beside `program` (this installation's
/// substrat-sandbox): what the launcher looks for before every bwrap launch.
fn probe_bwrap_helper(program: &Path) -> Probe {
    use crate::bwrap::{helper_beside, is_executable_file};
    let helper = helper_beside(program);
    match fs::metadata(&helper) {
        Ok(m) if is_executable_file(&m) => Probe::Yes,
        Ok(_) => Probe::No {
            reason: format!("{} is not an executable file", helper.display()),
        },
        Err(e) if e.kind() == ErrorKind::NotFound => Probe::No {
            reason: format!("{} is missing", helper.display()),
        },
        Err(e) => Probe::No {
            reason: format!("{}: {e}", helper.display()),
        },
    }
}

fn probe_cgroups() -> CgroupInfo {
    let mounts = fs::read_to_string("/proc/self/mountinfo")
        .map(|text| parse_cgroup_mounts(&text))
        .unwrap_or_default();
    let has_v1 = mounts.iter().any(|m| !m.v2);
    let has_v2 = mounts.iter().any(|m| m.v2);
    let version = match (has_v1, has_v2) {
        (true, true) => CgroupVersion::Hybrid,
        (true, false) => CgroupVersion::V1,
        (false, true) => CgroupVersion::V2,
        (false, false) => CgroupVersion::None,
    };
    let own = fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let limits = [
        ("pids", "pids.max", "512"),
        ("memory", "memory.limit_in_bytes", "1073741824"),
        ("cpu", "cpu.cfs_quota_us", "100000"),
    ];
    let [pids, memory, cpu] = limits
        .map(|(controller, v1_file, value)| probe_limit(&mounts, &own, controller, v1_file, value));
    CgroupInfo {
        version,
        pids,
        memory,
        cpu,
    }
}

/// Tries to create a child group where `controller` applies and set a limit
/// in it, then removes the group. v1 hierarchies are preferred where they
/// hold the controller (hybrid hosts put the controllers there).
fn probe_limit(
    mounts: &[CgroupMount],
    own_cgroups: &str,
    controller: &str,
    v1_file: &str,
    value: &str,
) -> Probe {
    if let Some(mount) = mounts
        .iter()
        .find(|m| !m.v2 && m.controllers.iter().any(|c| c == controller))
    {
        return try_child_group(&mount.mount_point, v1_file, value);
    }
    let Some(mount) = mounts.iter().find(|m| m.v2) else {
        return Probe::No {
            reason: format!("no cgroup hierarchy has the {controller} controller"),
        };
    };
    let own = own_cgroups
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .unwrap_or("/")
        .trim_start_matches('/');
    let parent = mount.mount_point.join(own);
    let enabled = fs::read_to_string(parent.join("cgroup.subtree_control")).unwrap_or_default();
    if !enabled.split_whitespace().any(|c| c == controller) {
        return Probe::No {
            reason: format!(
                "the {controller} controller is not delegated to {} (cgroup.subtree_control)",
                parent.display()
            ),
        };
    }
    let (file, value) = match controller {
        "pids" => ("pids.max", "512"),
        "memory" => ("memory.max", "1073741824"),
        _ => ("cpu.max", "100000 100000"),
    };
    try_child_group(&parent, file, value)
}

fn try_child_group(parent: &Path, file: &str, value: &str) -> Probe {
    let group = parent.join(format!("substrat-probe-{}", std::process::id()));
    if let Err(err) = fs::create_dir(&group)
        && err.kind() != ErrorKind::AlreadyExists
    {
        return Probe::No {
            reason: format!("cannot create {}: {err}", group.display()),
        };
    }
    let result = fs::write(group.join(file), value);
    let _ = fs::remove_dir(&group);
    match result {
        Ok(()) => Probe::Yes,
        Err(err) => Probe::No {
            reason: format!("cannot write {file} in {}: {err}", group.display()),
        },
    }
}
