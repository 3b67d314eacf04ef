//! The bwrap backend: the same LaunchPlan, applied by bubblewrap.
//!
//! The launcher does everything that needs the host: it opens every bind
//! source as an O_PATH descriptor (bwrap binds the descriptors, so a path
//! cannot change meaning in between), resolves and creates protected paths,
//! compiles the seccomp filter to BPF in memfds, and makes the cgroups.
//! bwrap builds the namespaces and the mount view, drops capabilities and
//! loads the filters; then it runs our small helper binary (`substrat-init`,
//! from its inherited descriptor) that applies Landlock (after every mount)
//! and the rlimits, reports, and execs the command.

mod argv;
mod helper;
mod open;
#[cfg(test)]
mod tests;

pub use argv::{BwrapArgv, BwrapFds, BwrapFeatures, bwrap_argv};
pub use helper::{
    HELPER_BUILD, HELPER_NAME, HelperArgs, HelperConfig, helper_beside, helper_config, helper_main,
    is_executable_file,
};

use std::ffi::OsString;
use std::fs;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::fcntl::{FcntlArg, FdFlag, OFlag, fcntl};
use nix::sys::signal::Signal;
use nix::unistd::{ForkResult, pipe2};

use crate::cgroup;
use crate::hostid::SubordinateIds;
use crate::plan::LaunchPlan;
use crate::supervise::{
    Backend, BlockedSignals, Ended, LaunchError, RlimitFallback, RunOptions, RunOutcome,
    SETUP_FAILED, Status, abort, send,
};
use crate::sys;

use open::{Opened, memfd_with, open_helper_and_filters, open_mounts, open_mounts_staged};

/// The helper binary: `substrat-init` in the launcher's own directory.
fn helper_path() -> Result<PathBuf, LaunchError> {
    let exe = std::env::current_exe()
        .map_err(|e| LaunchError::Setup(format!("cannot find this program's directory: {e}")))?;
    Ok(helper_beside(&exe))
}

/// The helper must be an executable file, and a dynamically linked one
/// starts only where the view has its program interpreter: refuse a launch
/// where either fails, saying why (bwrap would only report a bare "No such
/// file or directory" or "Permission denied"). Checked through the opened
/// descriptor, so what is checked is what bwrap runs.
fn helper_can_start(plan: &LaunchPlan, helper: &Path, fd: i32) -> Result<(), LaunchError> {
    let opened = PathBuf::from(format!("/proc/self/fd/{fd}"));
    if !fs::metadata(&opened).is_ok_and(|m| is_executable_file(&m)) {
        return Err(LaunchError::Setup(format!(
            "the bwrap backend's helper {} is not an executable file",
            helper.display()
        )));
    }
    // Unreadable (mode --x): bwrap's exec will say so; there is no header to check.
    let Ok(Some(interp)) = crate::interp::program_interpreter(&opened) else {
        return Ok(());
    };
    if crate::interp::visible_in_view(&plan.mounts, &interp) {
        return Ok(());
    }
    Err(LaunchError::Setup(format!(
        "the bwrap backend's helper {} is dynamically linked and needs {} inside the \
         sandbox, which this policy's view lacks: bind the system's library directories \
         (as the shipped policies do: /usr, /lib, /lib64) or use the native backend",
        helper.display(),
        interp.display()
    )))
}

/// Runs the plan's command under bwrap (at `bwrap`) and waits for it.
pub fn run(
    plan: &LaunchPlan,
    options: &RunOptions,
    bwrap: &Path,
    features: BwrapFeatures,
) -> Result<RunOutcome, LaunchError> {
    sys::require_single_thread().map_err(LaunchError::Threads)?;
    if crate::rootfs::has_root_bind(plan) {
        return Err(LaunchError::Setup(
            "the bwrap backend does not run a root filesystem of its own (substrat-oci uses the native backend)".into(),
        ));
    }
    if options.console.is_some() {
        return Err(LaunchError::Setup(
            "the bwrap backend does not make a terminal for a console socket (substrat-oci uses the native backend)".into(),
        ));
    }
    if !plan.layers.is_empty() {
        return Err(LaunchError::Setup(
            "the bwrap backend does not layer a second policy on a plan (substrat-oci uses the native backend)".into(),
        ));
    }
    let (programs, seccomp) = match &plan.seccomp {
        Some(seccomp_plan) => crate::seccomp::export(seccomp_plan)
            .map(|(programs, report)| (programs, Some(report)))
            .map_err(|e| LaunchError::Setup(e.to_string()))?,
        None => (Vec::new(), None),
    };
    // Mount points in writable binds made on the host now and removed when
    // this function returns (bwrap has ended on every path by then).
    let _mount_points = crate::mountpoints::prepare(plan, options.mount_point_record.as_deref())
        .map_err(|e| LaunchError::Setup(e.to_string()))?;
    // Sources first (a missing required bind is the first thing to say),
    // then whether the helper can start in the view they make.
    let (mut opened, staged) = open_all(plan, options, &programs)?;
    let (groups, cgroup, entry) = make_cgroups(plan, options)?;
    let fallback = RlimitFallback::for_report(&plan.cgroup, &cgroup);
    // A warm sandbox: the control socket goes through bwrap to the helper.
    let mut config = helper_config(plan, features, fallback);
    if let Some(control) = &options.turns {
        let control = control
            .try_clone()
            .map_err(|e| LaunchError::Setup(format!("the control socket: {e}")))?;
        config.turns_fd = Some(control.as_raw_fd());
        opened.keep.push(control);
    }
    let config = serde_json::to_vec(&config).map_err(|e| LaunchError::Setup(e.to_string()))?;
    let config = memfd_with("substrat-init-config", &config)?;
    opened.fds.config = config.as_raw_fd();
    opened.keep.push(config);
    let pipe = || pipe2(OFlag::O_CLOEXEC).map_err(|e| LaunchError::Sys("pipe", e));
    let (go_read, go_write) = pipe()?;
    let (status_read, status_write) = pipe()?;
    opened.fds.status = status_write.as_raw_fd();
    if let Some((_, ids)) = &staged {
        opened.fds.sync = Some(ids.claim_fd().as_raw_fd());
    }
    let command_line = command_line(plan, &mut opened, features)?;
    let signals = BlockedSignals::block()?;

    let child = match sys::fork().map_err(|e| LaunchError::Sys("fork", e))? {
        ForkResult::Child => {
            drop((go_write, status_read));
            signals.restore_in_child();
            let message = start_bwrap(
                bwrap,
                &command_line,
                Start {
                    go: &go_read,
                    entry,
                },
                opened.keep.iter().chain([&status_write]),
                staged.as_ref().map(|(ns, ids)| (ns, *ids)),
            );
            send(&status_write, &Status::Failed(message));
            sys::exit_now(SETUP_FAILED)
        }
        ForkResult::Parent { child } => child,
    };
    drop((go_read, status_write));
    if let Err(e) = entry.add_by_launcher(child.as_raw()) {
        return Err(abort(child, e.to_string()));
    }
    let _ = nix::unistd::write(&go_write, &[fallback.go_byte()]);
    drop((go_write, entry));
    drop(opened.keep);

    let (status, ended) = Ended::wait(
        child,
        status_read,
        signals,
        groups,
        seccomp,
        cgroup,
        &Default::default(),
    );
    outcome(status, opened.mounts, ended)
}

/// The groups, made before bwrap's first process is forked (it inherits
/// the files it enters them by): it must be inside before it starts
/// anything. Limits the policy requires and the host refused: nothing has
/// started.
fn make_cgroups(
    plan: &LaunchPlan,
    options: &RunOptions,
) -> Result<
    (
        cgroup::SandboxCgroups,
        cgroup::CgroupReport,
        cgroup::CgroupEntry,
    ),
    LaunchError,
> {
    let (mut groups, report) =
        cgroup::create_required(&plan.cgroup, &options.name, options.cgroup_parent.as_ref())
            .map_err(|unmet| LaunchError::Setup(unmet.to_string()))?;
    // A warm sandbox's freezer, among the groups entered.
    let entry = crate::turns::announce_freezer(&mut groups, options)
        .and_then(|()| groups.entry().map_err(|e| e.to_string()));
    match entry {
        Ok(entry) => Ok((groups, report, entry)),
        Err(e) => {
            groups.cleanup();
            Err(LaunchError::Setup(e))
        }
    }
}

/// The run's outcome from the helper's status (none: bwrap failed first).
fn outcome(
    status: Option<Status>,
    mounts: crate::mounts::MountReport,
    ended: Ended,
) -> Result<RunOutcome, LaunchError> {
    match status {
        Some(Status::Ready(mut setup)) => {
            setup.mounts = mounts;
            Ok(ended.into_outcome(Backend::Bwrap, *setup))
        }
        Some(Status::Failed(message) | Status::UsernsUnavailable(message)) => {
            Err(LaunchError::Setup(message))
        }
        None if ended.terminated_by.is_some() => Err(LaunchError::Terminated(
            ended.terminated_by.unwrap_or_default(),
        )),
        None => Err(LaunchError::Setup(format!(
            "bwrap ended before the sandbox was ready (exit {}); its message is above \
             (the bwrap backend needs bubblewrap 0.8 or later; `check --host` shows the version)",
            ended.exit_code
        ))),
    }
}

/// The staged mount namespace bwrap starts in, and the ids it runs as.
type Staged<'a> = (OwnedFd, &'a SubordinateIds);

/// Everything bwrap gets as a descriptor: the mounts (through the staged
/// namespace for a launch by root, which bwrap then starts in), the
/// helper, the seccomp programs. Sources first (a missing required bind is
/// the first thing to say), then whether the helper can start in the view
/// they make.
fn open_all<'a>(
    plan: &LaunchPlan,
    options: &'a RunOptions,
    programs: &[Vec<u8>],
) -> Result<(Opened, Option<Staged<'a>>), LaunchError> {
    let helper = helper_path()?;
    let (mut opened, staged) = match options.host_ids.subordinate() {
        None => (open_mounts(plan)?, None),
        Some(ids) => {
            let (opened, staged_ns) = open_mounts_staged(plan, ids)?;
            (opened, Some((staged_ns, ids)))
        }
    };
    open_helper_and_filters(&mut opened, programs, &helper)?;
    helper_can_start(plan, &helper, opened.fds.helper)?;
    Ok((opened, staged))
}

/// bwrap's command line: its options from a memfd (`--args`, kept in
/// `opened`), then the helper and the command.
fn command_line(
    plan: &LaunchPlan,
    opened: &mut Opened,
    features: BwrapFeatures,
) -> Result<Vec<OsString>, LaunchError> {
    let argv = bwrap_argv(plan, &opened.fds, features);
    let options = memfd_with("substrat-bwrap-args", &argv.options_file())?;
    let line = [
        OsString::from("--args"),
        OsString::from(options.as_raw_fd().to_string()),
        OsString::from("--"),
    ]
    .into_iter()
    .chain(argv.command)
    .collect();
    opened.keep.push(options);
    Ok(line)
}

/// When bwrap may start, and how it enters its cgroups.
struct Start<'a> {
    /// The launcher's go byte: the v2 groups hold this process.
    go: &'a OwnedFd,
    entry: cgroup::CgroupEntry,
}

/// In the forked child: wait for the go byte, enter the cgroups, let bwrap
/// inherit the descriptors, exec it. Returns only on failure, with the
/// reason.
fn start_bwrap<'a>(
    bwrap: &Path,
    argv: &[OsString],
    mut start: Start<'_>,
    inherit: impl Iterator<Item = &'a OwnedFd>,
    staged: Option<(&OwnedFd, &SubordinateIds)>,
) -> String {
    // Launched by root: bwrap runs in the staged namespace, where its
    // descriptors were opened, and as the subordinate ids; before the
    // parent-death signal, which a change of ids clears.
    if let Some((staged_ns, ids)) = staged {
        if let Err(e) = nix::sched::setns(staged_ns, nix::sched::CloneFlags::CLONE_NEWNS) {
            return format!("cannot enter the staged mount namespace: {e}");
        }
        if let Err(e) = ids.become_them() {
            return format!("cannot drop to the subordinate ids: {e}");
        }
        // bwrap's pid 1 holds the ids' claim as long as the sandbox lives
        // (`--sync-fd`; the helper closes it before the command starts).
        if let Err(e) = fcntl(ids.claim_fd(), FcntlArg::F_SETFD(FdFlag::empty())) {
            return format!("cannot pass the ids' claim to bwrap: {e}");
        }
    }
    if let Err(e) = nix::sys::prctl::set_pdeathsig(Signal::SIGKILL) {
        return format!("prctl(PR_SET_PDEATHSIG): {e}");
    }
    let mut byte = [0u8; 1];
    if nix::unistd::read(start.go, &mut byte) != Ok(1) {
        return "the launcher did not start the sandbox".into();
    }
    // Still one thread (a fork's child): the v1 groups take it whole.
    if let Err(e) = cgroup::join_self_through(start.entry.take_files()) {
        return e.to_string();
    }
    for fd in inherit {
        if let Err(e) = fcntl(fd.as_fd(), FcntlArg::F_SETFD(FdFlag::empty())) {
            return format!("cannot pass a descriptor to bwrap: {e}");
        }
    }
    // bwrap gets no environment: it needs none (--clearenv, --setenv give
    // the command its own), and its pid 1 would hold the launcher's.
    let err = std::os::unix::process::CommandExt::exec(
        std::process::Command::new(bwrap).env_clear().args(argv),
    );
    format!("cannot run {}: {err}", bwrap.display())
}
