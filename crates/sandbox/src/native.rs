//! The native backend: the kernel's namespaces, applied by our own processes.
//!
//! ```text
//! launcher (host)      cgroups, seccomp compilation, signals, report
//!  └ holder            unshare(user, mnt, ipc, uts, net, pid) + id maps
//!     └ init (pid 1)   mounts, pivot_root, landlock, caps, no_new_privs,
//!        │             rlimits, seccomp; then reaps until the command ends
//!        └ command     setsid, fds above 2 closed, execve with the env
//! ```
//! Death travels down: the launcher dying kills the holder (parent-death
//! signal), which kills init, whose end kills every process of the pid
//! namespace, double-forked survivors included.

use std::fs;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};

use nix::sched::{CloneFlags, unshare};
use nix::sys::signal::Signal;
use nix::sys::wait::{WaitStatus, waitpid};
use nix::unistd::{ForkResult, Pid, getppid, pipe2, setsid};

use crate::cgroup;
use crate::hostid::SubordinateIds;
use crate::inside::{
    SetupError, apply_rlimits, drop_capabilities, enter_dir, errno, exec_command, setup_report,
};
use crate::landlock::RulePaths;
use crate::plan::LaunchPlan;
use crate::supervise::{
    Backend, BlockedSignals, Ended, LaunchError, RlimitFallback, RunOptions, RunOutcome,
    SETUP_FAILED, Status, abort, send,
};
use crate::sys;

/// Runs the plan's command in a native sandbox and waits for it.
///
/// The launcher works while the sandbox builds itself: after forking the
/// holder it makes the cgroups (the holder starts init only once it is
/// inside them) and compiles the seccomp filter, which init loads last.
pub fn run(plan: &LaunchPlan, options: &RunOptions) -> Result<RunOutcome, LaunchError> {
    sys::require_single_thread().map_err(LaunchError::Threads)?;
    // A warm sandbox ends each turn's processes with kill(-1) from init:
    // only inside a pid namespace of its own is that the sandbox alone.
    if options.turns.is_some() && !plan.namespaces.pid {
        return Err(LaunchError::Setup(crate::backend::TURNS_NEED_PID_NS.into()));
    }
    // Mount points in writable binds made on the host now and removed when
    // this function returns (the sandbox has ended on every path by then).
    let _mount_points = crate::mountpoints::prepare(plan, options.mount_point_record.as_deref())
        .map_err(|e| LaunchError::Setup(e.to_string()))?;
    let pipe = || pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| LaunchError::Sys("pipe", e));
    let (go_read, go_write) = go_socket()?;
    let (status_read, status_write) = pipe()?;
    let (filter_read, filter_write) = pipe()?;
    // Signals wait in a queue from here on; the launcher takes them with sigwait.
    let signals = BlockedSignals::block()?;
    let launcher = nix::unistd::getpid();

    let holder = match sys::fork().map_err(|e| LaunchError::Sys("fork", e))? {
        ForkResult::Child => {
            drop((go_write, status_read, filter_write));
            signals.restore_in_child();
            let ends = SandboxEnds {
                go: go_read,
                status: status_write,
                filter: filter_read,
            };
            let ids = options.host_ids.subordinate();
            let serving = Serving::of(options);
            let code = match holder_main(plan, ids, launcher, &ends, serving) {
                Ok(code) => code,
                Err(status) => {
                    send(&ends.status, &status);
                    SETUP_FAILED
                }
            };
            sys::exit_now(code)
        }
        ForkResult::Parent { child } => child,
    };
    drop((go_read, status_write, filter_read));
    let (groups, cgroup) = start_in_cgroups(plan, options, holder, go_write)?;

    let (programs, seccomp) = match crate::seccomp::export_plan(plan) {
        Ok(exported) => exported,
        Err(e) => return Err(abort(holder, e.to_string())),
    };
    // If init already failed the write fails too; its status says why.
    let _ = fs::File::from(filter_write).write_all(&frame_programs(&programs));

    // substrat-oci: the launcher in the sandbox's namespaces while it runs.
    let shared = std::cell::RefCell::new(None);
    let on_ready = || {
        if options.share_namespaces {
            let init = crate::share::first_child(holder);
            match init.and_then(|init| crate::share::enter(holder, init)) {
                Some(entered) => *shared.borrow_mut() = Some(entered),
                None => {
                    let _ = nix::sys::signal::kill(holder, Signal::SIGKILL);
                    return;
                }
            }
        }
        if let Some(ready) = &options.ready {
            let _ = nix::unistd::write(ready, b"ready\n");
        }
    };
    let on_end = || {
        if let Some(entered) = shared.borrow_mut().take() {
            crate::share::leave(entered);
        }
    };
    let hooks = crate::supervise::Hooks {
        on_ready: Some(&on_ready),
        on_end: Some(&on_end),
    };
    let (status, ended) = Ended::wait(
        holder,
        status_read,
        signals,
        groups,
        seccomp,
        cgroup,
        &hooks,
    );
    match status {
        Some(Status::Ready(mut setup)) => {
            if options.host_ids.subordinate().is_some() {
                crate::stage::report_host_paths(plan, &mut setup.mounts);
            }
            Ok(ended.into_outcome(Backend::Native, *setup))
        }
        Some(Status::Failed(message)) => Err(LaunchError::Setup(message)),
        Some(Status::UsernsUnavailable(message)) => Err(LaunchError::UsernsUnavailable(message)),
        None if ended.terminated_by.is_some() => Err(LaunchError::Terminated(
            ended.terminated_by.unwrap_or_default(),
        )),
        None => Err(LaunchError::Setup(format!(
            "the sandbox ended before it was ready (exit {})",
            ended.exit_code
        ))),
    }
}

/// The go byte comes with the cgroups' files attached: a socket pair.
fn go_socket() -> Result<(OwnedFd, OwnedFd), LaunchError> {
    rustix::net::socketpair(
        rustix::net::AddressFamily::UNIX,
        rustix::net::SocketType::STREAM,
        rustix::net::SocketFlags::CLOEXEC,
        None,
    )
    .map_err(|e| LaunchError::Sys("socketpair", nix::errno::Errno::from_raw(e.raw_os_error())))
}

/// The cgroups, made while the holder sets up, then the holder into the v2
/// ones and the go byte, with the v1 ones' files attached: the holder
/// enters those itself (`cgroup::CgroupEntry`) and only then starts init,
/// so everything init starts is inside. Limits the policy requires and the
/// host refused stop the launch before anything has started (the holder
/// waits for the go byte).
fn start_in_cgroups(
    plan: &LaunchPlan,
    options: &RunOptions,
    holder: Pid,
    go_write: OwnedFd,
) -> Result<(cgroup::SandboxCgroups, cgroup::CgroupReport), LaunchError> {
    let (mut groups, report) =
        cgroup::create_required(&plan.cgroup, &options.name, options.cgroup_parent.as_ref())
            .map_err(|unmet| abort(holder, unmet.to_string()))?;
    let started = crate::turns::announce_freezer(&mut groups, options).and_then(|()| {
        let entry = groups.entry().map_err(|e| e.to_string())?;
        entry
            .add_by_launcher(holder.as_raw())
            .map_err(|e| e.to_string())?;
        let fallback = RlimitFallback::for_report(&plan.cgroup, &report);
        entry
            .send_go(&go_write, fallback.go_byte())
            .map_err(|e| e.to_string())
    });
    match started {
        Ok(()) => Ok((groups, report)),
        Err(e) => {
            groups.cleanup();
            Err(abort(holder, e))
        }
    }
}

/// The sandbox's ends of the pipes to the launcher.
struct SandboxEnds {
    /// The launcher says go (once the holder is in its v2 cgroups), with
    /// the v1 ones' `tasks` files attached.
    go: OwnedFd,
    /// Setup report or failure, one JSON line.
    status: OwnedFd,
    /// The compiled seccomp programs, framed by `frame_programs`.
    filter: OwnedFd,
}

/// Each program as a little-endian u32 length and its bytes; a zero length ends the list.
fn frame_programs(programs: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::new();
    for program in programs {
        out.extend_from_slice(&(program.len() as u32).to_le_bytes());
        out.extend_from_slice(program);
    }
    out.extend_from_slice(&0u32.to_le_bytes());
    out
}

fn read_programs(fd: &OwnedFd) -> Result<Vec<Vec<u8>>, SetupError> {
    let pipe = |what| move |source| SetupError::Io { what, source };
    let mut file = fs::File::from(fd.try_clone().map_err(pipe("seccomp pipe"))?);
    let mut programs = Vec::new();
    loop {
        let mut len = [0u8; 4];
        file.read_exact(&mut len)
            .map_err(pipe("the launcher sent no seccomp filter"))?;
        let len = u32::from_le_bytes(len) as usize;
        if len == 0 {
            return Ok(programs);
        }
        if len > 1 << 20 {
            return Err(SetupError::SeccompTooLarge(len));
        }
        let mut program = vec![0u8; len];
        file.read_exact(&mut program)
            .map_err(pipe("seccomp program cut short"))?;
        programs.push(program);
    }
}

/// The holder: enters the new namespaces, maps ids, starts init, and exits
/// with init's status.
fn holder_main(
    plan: &LaunchPlan,
    ids: Option<&SubordinateIds>,
    launcher: Pid,
    ends: &SandboxEnds,
    serving: Serving<'_>,
) -> Result<i32, Status> {
    let failed = |message: String| Status::Failed(message);
    // The host's namespaces to share, first: joining one owned by the
    // host's user namespace takes the capabilities the holder still has.
    crate::joined_ns::join_namespaces(plan)?;
    // The OOM killer's adjustment, inherited by init and all it starts;
    // while the holder's /proc files are its own (before it is no longer
    // dumpable).
    if let Some(adj) = plan.oom_score_adj {
        fs::write("/proc/self/oom_score_adj", adj.to_string())
            .map_err(|e| failed(format!("write /proc/self/oom_score_adj: {e}")))?;
    }
    // Launched by root: the binds staged (idmapped copies, made while root)
    // and root given up for the subordinate ids; before the parent-death
    // signal (a change of ids clears it) and before the user namespace
    // (whose owner must be the subordinate uid).
    let staged;
    let plan = match ids {
        Some(ids) => {
            staged = crate::stage::staged_plan(plan).map_err(|e| failed(e.to_string()))?;
            crate::stage::enter(plan, ids, serving.bind_judge())
                .map_err(|e| failed(e.to_string()))?;
            ids.become_them()
                .map_err(|e| failed(format!("cannot drop to the subordinate ids: {e}")))?;
            &staged
        }
        None => plan,
    };
    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)
        .map_err(|e| failed(format!("prctl(PR_SET_PDEATHSIG): {e}")))?;
    if getppid() != launcher {
        return Err(failed("the launcher exited during setup".into()));
    }
    enter_namespaces(plan)?;
    // A layer quota: the upper a tmpfs of its size, in our mount namespace.
    let quota_upper = match plan.overlay.as_ref().map(|o| (&o.dirs, o.dirs.quota)) {
        Some((dirs, Some(quota))) => Some(
            crate::layer_copy::mount_quota_upper(dirs, quota).map_err(|e| failed(e.to_string()))?,
        ),
        _ => None,
    };
    // Init is the first process of the sandbox: it may start only once we
    // are in the cgroups, so everything it starts is inside.
    let (go, tasks) = cgroup::receive_go(&ends.go)
        .map_err(|e| failed(format!("the launcher did not start the sandbox: {e}")))?;
    let fallback = RlimitFallback::from_go_byte(go, &plan.cgroup)
        .ok_or_else(|| failed(format!("the launcher sent an unknown go byte {go:#x}")))?;
    // Still one thread (a fork's child): the v1 groups take it whole, and
    // init is born inside them.
    cgroup::join_self_through(tasks).map_err(|e| failed(e.to_string()))?;
    match sys::fork().map_err(|e| failed(format!("fork: {e}")))? {
        ForkResult::Child => {
            let code = match init_main(plan, ends, fallback, serving) {
                Ok(code) => code,
                Err(e) => {
                    send(&ends.status, &Status::Failed(e.to_string()));
                    SETUP_FAILED
                }
            };
            sys::exit_now(code)
        }
        ForkResult::Parent { child } => {
            let _ = nix::unistd::close(ends.status.as_raw_fd());
            if let Serving::Turns(control) = serving {
                let _ = nix::unistd::close(control.as_raw_fd());
            }
            let code = wait_for(child);
            // Every process of the sandbox is gone with init: what the
            // command wrote is kept, or the launch says it was not.
            if let Some(upper) = quota_upper
                && let Err(e) = upper.keep()
            {
                // The error names a path the command chose.
                let e = substrat_policy::text::escape_text(&e);
                eprintln!("substrat: the command's writes could not be kept in its layer: {e}");
                return Ok(SETUP_FAILED);
            }
            Ok(code)
        }
    }
}

/// The holder's own namespaces, its one-id maps, and then no longer
/// dumpable.
fn enter_namespaces(plan: &LaunchPlan) -> Result<(), Status> {
    let ns = &plan.namespaces;
    let mut flags = CloneFlags::CLONE_NEWUSER | CloneFlags::CLONE_NEWNS;
    for (on, flag) in [
        (ns.pid, CloneFlags::CLONE_NEWPID),
        (ns.ipc, CloneFlags::CLONE_NEWIPC),
        (ns.uts, CloneFlags::CLONE_NEWUTS),
        (ns.net, CloneFlags::CLONE_NEWNET),
    ] {
        if on {
            flags |= flag;
        }
    }
    unshare(flags).map_err(|e| {
        Status::UsernsUnavailable(format!(
            "unshare: {e} (user namespaces may be disabled here; see `check --host`)"
        ))
    })?;
    // A single-id map works unprivileged; setgroups must be denied first.
    fs::write("/proc/self/setgroups", "deny").map_err(|e| format!("write setgroups: {e}"))?;
    fs::write(
        "/proc/self/uid_map",
        format!("{} {} 1", plan.uid_map.inside, plan.uid_map.outside),
    )
    .map_err(|e| format!("write uid_map: {e}"))?;
    fs::write(
        "/proc/self/gid_map",
        format!("{} {} 1", plan.gid_map.inside, plan.gid_map.outside),
    )
    .map_err(|e| format!("write gid_map: {e}"))?;
    // The maps written, the holder needs its /proc files no more: not
    // dumpable, so a command that could see it (a policy without a pid
    // namespace) cannot ptrace it or read its memory, though its ids match.
    nix::sys::prctl::set_dumpable(false).map_err(|e| format!("prctl(PR_SET_DUMPABLE): {e}"))?;
    Ok(())
}

fn wait_for(pid: Pid) -> i32 {
    loop {
        match waitpid(pid, None) {
            Ok(WaitStatus::Exited(_, code)) => return code,
            Ok(WaitStatus::Signaled(_, signal, _)) => return 128 + signal as i32,
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => {}
            Err(_) => return SETUP_FAILED,
        }
    }
}

/// Init: builds the sandbox around itself in the required order, reports,
/// starts the command and reaps until it ends.
fn init_main(
    plan: &LaunchPlan,
    ends: &SandboxEnds,
    fallback: RlimitFallback,
    serving: Serving<'_>,
) -> Result<i32, SetupError> {
    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(errno("prctl(PR_SET_PDEATHSIG)"))?;
    // 0. Init is pid 1 of the command's view and a copy of the launcher:
    //    its memory holds the launcher's whole environment (host secrets the
    //    policy filtered out) and its command line. Not dumpable, so the
    //    command cannot read or write it through /proc/1/{environ,mem};
    //    arguments and environment blanked, since /proc/1/cmdline is
    //    readable by all. First, before anything is forked from init (the
    //    proxy bridge inherits both).
    sys::conceal_process().map_err(errno("hide init from the sandbox"))?;
    // 0b. A cgroup namespace rooted here, in the sandbox's groups (init is
    //     started once the holder is in them).
    if plan.namespaces.cgroup {
        unshare(CloneFlags::CLONE_NEWCGROUP).map_err(errno("unshare the cgroup namespace"))?;
    }
    let kernel_abi = sys::landlock_abi_version().unwrap_or(0);
    // 1. No user namespaces below this one: the limit lives in our own
    //    namespace and needs CAP_SYS_RESOURCE, which goes in step 4. Set
    //    through the /proc we start with, before the mounts: without a pid
    //    namespace the view gets the host's /proc, read-only.
    let nested_userns_blocked = !plan.namespaces.nested_userns
        && fs::write("/proc/sys/user/max_user_namespaces", "0").is_ok();
    if !plan.namespaces.nested_userns && !nested_userns_blocked {
        return Err(SetupError::NestedUserns);
    }
    // 2. Mounts and pivot_root, while we hold capabilities in the namespace.
    // Sources opened inside the new mount namespace (a bind's source must be
    // a mount of the caller's namespace), while the host tree is in place.
    let opened = crate::mounts::open_for(plan, serving.bind_judge())?;
    let mounts = crate::mounts::build_root(plan, &opened)?;
    if plan.namespaces.uts {
        nix::unistd::sethostname(&plan.hostname).map_err(errno("sethostname"))?;
    }
    // 2a. The command's terminal from the sandbox's own devpts, now that
    //     /dev is mounted (substrat-oci's console socket).
    if let Serving::Command {
        console: Some(console),
        ..
    } = serving
    {
        crate::console::take_terminal(console)?;
    }
    // 2b. The namespace's own loopback up while CAP_NET_ADMIN is held (test
    //     servers on 127.0.0.1; bwrap does the same), and the bridges' (the
    //     proxy's, the gateway's) listeners made before the command starts,
    //     so their ports are theirs.
    if plan.namespaces.net {
        sys::loopback_up().map_err(errno("bring loopback up"))?;
    }
    let bridges = plan
        .bridges()
        .map(|b| Ok((crate::bridge::listen(b)?, b.socket.clone())))
        .collect::<Result<Vec<_>, SetupError>>()?;
    // 2c. A warm sandbox's mqueue filesystem, mounted nowhere, opened
    //     while capabilities are held: the turn server lists the queues a
    //     turn left there, to remove them.
    let mqueue = match serving {
        Serving::Turns(_) if plan.namespaces.ipc => Some(
            sys::open_detached_mqueue()
                .map_err(errno("open the ipc namespace's mqueue filesystem"))?,
        ),
        _ => None,
    };
    // 3. Landlock after every mount: a Landlocked task may not mount.
    //    A policy layered on top adds its ruleset after the plan's own,
    //    its paths never through a link (the tree is not its author's).
    let landlock = crate::landlock::apply(&plan.landlock, kernel_abi)?;
    for layer in &plan.layers {
        crate::landlock::apply_with(&layer.landlock, kernel_abi, RulePaths::NoLinks)?;
    }
    // 4. Capabilities: the bounding set first, while CAP_SETPCAP is held.
    drop_capabilities()?;
    // 5. no_new_privs: exec can never raise privileges again.
    nix::sys::prctl::set_no_new_privs().map_err(errno("prctl(PR_SET_NO_NEW_PRIVS)"))?;
    let rlimits = apply_rlimits(&plan.rlimits, fallback);
    // 6. Seccomp last: everything above needed syscalls it denies.
    let programs = read_programs(&ends.filter)?;
    let spec_allow = plan.seccomp_spec_allow();
    for program in &programs {
        sys::load_seccomp_program(program, spec_allow).map_err(errno("seccomp: load filter"))?;
    }
    let setup = setup_report(mounts, landlock, nested_userns_blocked, rlimits);
    send(&ends.status, &Status::Ready(Box::new(setup)));
    let _ = nix::unistd::close(ends.status.as_raw_fd());
    // A warm sandbox: the turns' commands and bridges, confined as the
    // command below would be (they are forked from this init too).
    match serving {
        Serving::Turns(control) => {
            let context = crate::turns::TurnContext::of(plan, mqueue);
            return Ok(crate::turns::serve(control, &context, &bridges));
        }
        // Built and reported; the command waits for `substrat-oci start`.
        Serving::Command {
            start_gate: Some(gate),
            ..
        } => {
            if !wait_for_start(gate) {
                return Ok(NOT_STARTED);
            }
        }
        Serving::Command {
            start_gate: None, ..
        } => {}
    }
    // The bridges start after every restriction, so they are as confined
    // as the command, and before it, so the ports answer from the start.
    for (listener, socket) in bridges {
        if let ForkResult::Child = sys::fork().map_err(errno("fork"))? {
            crate::bridge::run(listener, socket, true)
        }
    }
    let command = match sys::fork().map_err(errno("fork"))? {
        ForkResult::Child => command_main(plan),
        ForkResult::Parent { child } => child,
    };
    Ok(reap_until(command))
}

/// What init does once the sandbox is built.
#[derive(Clone, Copy)]
enum Serving<'a> {
    /// Runs the plan's command, at once or once the gate opens.
    Command {
        start_gate: Option<&'a OwnedFd>,
        /// Where to send the terminal made inside (`console`).
        console: Option<&'a crate::console::Console>,
        /// Judges the binds' opened sources (`RunOptions::bind_judge`).
        bind_judge: Option<&'a crate::bind_judge::BindJudge>,
    },
    /// Serves turns on this control socket (a warm sandbox).
    Turns(&'a OwnedFd),
}

impl<'a> Serving<'a> {
    fn of(options: &'a RunOptions) -> Self {
        match &options.turns {
            Some(control) => Serving::Turns(control),
            None => Serving::Command {
                start_gate: options.start_gate.as_ref(),
                console: options.console.as_ref(),
                bind_judge: options.bind_judge.as_ref(),
            },
        }
    }

    fn bind_judge(&self) -> Option<&'a crate::bind_judge::BindJudge> {
        match self {
            Serving::Command { bind_judge, .. } => *bind_judge,
            Serving::Turns(_) => None,
        }
    }
}

/// Exit code of init when the gate closed without starting the command.
const NOT_STARTED: i32 = 126;

/// Waits for the start byte on the gate (a FIFO read end): true once it
/// came, false when its writer closed without one. A FIFO that never had a
/// writer polls neither readable nor hung up, so this blocks until `start`.
fn wait_for_start(gate: &OwnedFd) -> bool {
    use rustix::event::{PollFd, PollFlags, poll};
    loop {
        let mut fds = [PollFd::new(gate, PollFlags::IN)];
        match poll(&mut fds, None) {
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => continue,
            Err(_) => return false,
        }
        let mut byte = [0u8; 1];
        match nix::unistd::read(gate, &mut byte) {
            Ok(1) => return true,
            Err(nix::errno::Errno::EAGAIN) | Err(nix::errno::Errno::EINTR) => {}
            _ => return false,
        }
    }
}

/// Init's loop: reap every child; when the command ends, so does init, and
/// with it every process left in the pid namespace.
fn reap_until(command: Pid) -> i32 {
    loop {
        match waitpid(None::<Pid>, None) {
            Ok(WaitStatus::Exited(pid, code)) if pid == command => return code,
            Ok(WaitStatus::Signaled(pid, signal, _)) if pid == command => {
                return 128 + signal as i32;
            }
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(_) => return SETUP_FAILED,
        }
    }
}

/// The command: a new session (no controlling terminal, so no TIOCSTI into
/// the launcher's terminal), only fds 0-2, the plan's environment.
fn command_main(plan: &LaunchPlan) -> ! {
    let _ = setsid();
    enter_dir(&plan.cwd);
    exec_command(&plan.argv, &plan.env, plan.terminal, None)
}
