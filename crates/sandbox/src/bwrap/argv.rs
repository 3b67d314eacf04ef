//! The bwrap command line for a plan: a pure function, tested as a whole.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use crate::mounts::needs_bind;
use crate::plan::{Access, LaunchPlan, MountStep};

/// What the installed bwrap supports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BwrapFeatures {
    /// `--disable-userns` (bubblewrap 0.8.0 and later).
    pub disable_userns: bool,
}

/// Descriptors the launcher opened, as bwrap will see them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BwrapFds {
    /// One entry per plan mount step: the source of a `Bind` that exists;
    /// `None` for other steps and for absent optional sources.
    pub binds: Vec<Option<i32>>,
    /// One entry per plan mount step: for a `Protect`, each component on the
    /// way (relative path, descriptor, whether it is the protected leaf).
    pub protected: Vec<Vec<(PathBuf, i32, bool)>>,
    pub helper: i32,
    /// BPF programs, in load order.
    pub seccomp: Vec<i32>,
    /// Where the helper writes its report.
    pub status: i32,
    /// Where the helper reads its configuration (`HelperConfig` as JSON).
    pub config: i32,
    /// Held open by bwrap's pid 1 for as long as the sandbox lives
    /// (`--sync-fd`): the claim of a launch by root's subordinate ids.
    pub sync: Option<i32>,
}

/// bwrap's command line in two parts: the options, which bwrap reads from
/// a descriptor (`--args FD`) so that its pid 1, which every process in the
/// sandbox can see, does not show the view, the environment or the helper's
/// descriptors; and the command (the helper, then the policy's command),
/// which bwrap only takes from its real command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BwrapArgv {
    pub options: Vec<OsString>,
    pub command: Vec<OsString>,
}

impl BwrapArgv {
    /// The options as `--args` reads them: each followed by a NUL.
    pub fn options_file(&self) -> Vec<u8> {
        use std::os::unix::ffi::OsStrExt;
        let mut out = Vec::new();
        for option in &self.options {
            out.extend_from_slice(option.as_bytes());
            out.push(0);
        }
        out
    }
}

fn push(argv: &mut Vec<OsString>, items: &[&str]) {
    argv.extend(items.iter().map(OsString::from));
}

fn path_arg(path: &Path) -> OsString {
    path.as_os_str().to_os_string()
}

/// The bwrap command line for `plan`: a pure function, tested as a whole.
/// bwrap applies options in order; the numbers below are that order.
pub fn bwrap_argv(plan: &LaunchPlan, fds: &BwrapFds, features: BwrapFeatures) -> BwrapArgv {
    let mut argv: Vec<OsString> = Vec::new();
    // 1. Namespaces: the plan's own list (not --unshare-all, which would add
    //    a cgroup namespace the native backend does not make). Root inside
    //    maps to the invoking user, as in the native backend.
    push(&mut argv, &["--unshare-user", "--uid", "0", "--gid", "0"]);
    let ns = &plan.namespaces;
    for (on, flag) in [
        (ns.pid, "--unshare-pid"),
        (ns.ipc, "--unshare-ipc"),
        (ns.uts, "--unshare-uts"),
        (ns.net, "--unshare-net"),
    ] {
        if on {
            push(&mut argv, &[flag]);
        }
    }
    if !ns.nested_userns && features.disable_userns {
        push(&mut argv, &["--disable-userns", "--assert-userns-disabled"]);
    }
    if ns.uts {
        push(&mut argv, &["--hostname", &plan.hostname]);
    }
    // 2. Lifetime and terminal: the tree dies with the launcher; a new
    //    session leaves no controlling terminal to push keystrokes into;
    //    the ids' claim lives as long as the sandbox.
    push(&mut argv, &["--die-with-parent", "--new-session"]);
    if let Some(fd) = fds.sync {
        push(&mut argv, &["--sync-fd", &fd.to_string()]);
    }
    // 3. Environment: nothing but the plan's.
    push(&mut argv, &["--clearenv"]);
    for (key, value) in &plan.env {
        push(&mut argv, &["--setenv", key, value]);
    }
    // 4. The mount view, in the plan's order: policy binds and tmpfs by
    //    depth, /dev, /proc, protected paths on top of writable binds.
    argv.extend(mount_options(plan, fds));
    // 5. The root read-only (last mount step, as native).
    if plan.mounts.contains(&MountStep::RootReadOnly) {
        push(&mut argv, &["--remount-ro", "/"]);
    }
    // 6. No capabilities in any set.
    push(&mut argv, &["--cap-drop", "ALL"]);
    // 7. Seccomp: bwrap loads the programs just before it runs the helper.
    for fd in &fds.seccomp {
        push(&mut argv, &["--add-seccomp-fd", &fd.to_string()]);
    }
    // 8. Start in the workspace, run the helper, which runs the command.
    //    The helper is run from its inherited descriptor through the
    //    sandbox's own /proc (the plan always mounts it), so it needs no
    //    mount of its own and is not in the view; it closes the descriptor
    //    before the command starts.
    push(&mut argv, &["--chdir"]);
    argv.push(path_arg(&plan.cwd));
    let mut command: Vec<OsString> = Vec::new();
    push(
        &mut command,
        &[
            &format!("/proc/self/fd/{}", fds.helper),
            "--status-fd",
            &fds.status.to_string(),
            "--config-fd",
            &fds.config.to_string(),
            "--",
        ],
    );
    command.extend(plan.argv.iter().map(OsString::from));
    BwrapArgv {
        options: argv,
        command,
    }
}

/// The mount options for `plan.mounts`, in order.
fn mount_options(plan: &LaunchPlan, fds: &BwrapFds) -> Vec<OsString> {
    let mut argv: Vec<OsString> = Vec::new();
    let mut pinned = std::collections::HashSet::new();
    for (i, step) in plan.mounts.iter().enumerate() {
        match step {
            MountStep::Bind { target, access, .. } => {
                if let Some(fd) = fds.binds.get(i).copied().flatten() {
                    let flag = if *access == Access::Rw {
                        "--bind-fd"
                    } else {
                        "--ro-bind-fd"
                    };
                    push(&mut argv, &[flag, &fd.to_string()]);
                    argv.push(path_arg(target));
                }
            }
            MountStep::Tmpfs { target, mode, size } => {
                if let Some(size) = size {
                    push(&mut argv, &["--size", &size.to_string()]);
                }
                push(&mut argv, &["--perms", &format!("{mode:o}"), "--tmpfs"]);
                argv.push(path_arg(target));
            }
            MountStep::Dev { target } => {
                push(&mut argv, &["--dev"]);
                argv.push(path_arg(target));
            }
            MountStep::Proc { target } => {
                push(&mut argv, &["--proc"]);
                argv.push(path_arg(target));
            }
            MountStep::Protect { target, .. } => {
                // Directories on the way are bound onto themselves (pinned),
                // the protected path itself read-only.
                for (relative, fd, leaf) in fds.protected.get(i).map(Vec::as_slice).unwrap_or(&[]) {
                    let dest = target.join(relative);
                    if !needs_bind(&mut pinned, &dest, *leaf) {
                        continue;
                    }
                    let flag = if *leaf { "--ro-bind-fd" } else { "--bind-fd" };
                    push(&mut argv, &[flag, &fd.to_string()]);
                    argv.push(path_arg(&dest));
                }
            }
            MountStep::RootReadOnly => {}
            // Only under a root filesystem, which the bwrap backend refuses
            // before it builds any command line (bwrap::run).
            MountStep::Sysfs { .. }
            | MountStep::Mqueue { .. }
            | MountStep::Mask { .. }
            | MountStep::Empty { .. }
            | MountStep::ReadOnly { .. } => {}
        }
    }
    argv
}
