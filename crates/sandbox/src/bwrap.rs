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

use std::ffi::OsString;
use std::fs;
use std::io::{Seek, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::fcntl::{FcntlArg, FdFlag, OFlag, fcntl};
use nix::sys::signal::Signal;
use nix::unistd::{ForkResult, pipe2};
use serde::{Deserialize, Serialize};

use crate::cgroup;
use crate::hostid::SubordinateIds;
use crate::inside::{apply_rlimits, exec_command, setup_report};
use crate::mounts::{
    MountError, MountReport, needs_bind, open_bind_source, open_plan_source, open_source,
    protected_outcome, resolve_protected,
};
use crate::plan::{Access, LandlockPlan, LaunchPlan, MountStep, RlimitSetting};
use crate::supervise::{
    Backend, BlockedSignals, LaunchError, RlimitFallback, RunOptions, RunOutcome, SETUP_FAILED,
    SetupReport, Status, abort, errno, read_status, send, wait_sandbox,
};
use crate::sys;

/// The helper's file name, looked up beside the launcher's own executable.
pub const HELPER_NAME: &str = "substrat-init";

/// The version both of the launcher/helper pair must have. Together with
/// the configuration's strict fields (an added or removed field fails to
/// parse), a helper from another build refuses instead of applying part of
/// a plan.
pub const HELPER_BUILD: &str = env!("CARGO_PKG_VERSION");

/// The helper's command line: `--status-fd FD --config-fd FD -- COMMAND...`,
/// exactly as `bwrap_argv` writes it. The configuration comes through a
/// descriptor, not an argument: bwrap's pid 1 shows its own command line,
/// the helper's included, to every process in the sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HelperArgs {
    pub status_fd: i32,
    pub config_fd: i32,
    pub command: Vec<String>,
}

impl HelperArgs {
    /// Parses the helper's arguments (without the program name). Strict:
    /// the launcher is the only caller, anything else is a mistake.
    pub fn parse(args: &[String]) -> Result<Self, String> {
        let number = |flag: &str, fd: &str| {
            fd.parse()
                .map_err(|_| format!("{flag}: `{fd}` is not a descriptor number"))
        };
        match args {
            [
                flag_status,
                status,
                flag_config,
                config,
                dashes,
                command @ ..,
            ] if flag_status == "--status-fd" && flag_config == "--config-fd" && dashes == "--" => {
                if command.is_empty() {
                    return Err("no command after `--`".into());
                }
                Ok(Self {
                    status_fd: number(flag_status, status)?,
                    config_fd: number(flag_config, config)?,
                    command: command.to_vec(),
                })
            }
            _ => Err("arguments are not `--status-fd FD --config-fd FD -- COMMAND...`".into()),
        }
    }
}

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

/// What the helper needs to do its part, passed as one JSON argument.
/// Strict both ways: the launcher and the helper are separate files, and a
/// helper from another build must refuse, not apply part of a plan.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HelperConfig {
    /// The launcher's `HELPER_BUILD`; the helper checks it is its own.
    pub build: String,
    pub landlock: LandlockPlan,
    pub rlimits: Vec<RlimitSetting>,
    /// Rlimits standing in for cgroup limits that could not be applied.
    pub fallback: RlimitFallback,
    /// bwrap was told to disable (and assert disabled) nested user
    /// namespaces; it does so in a parent namespace, so the sysctl inside
    /// does not show it.
    pub userns_disabled_by_bwrap: bool,
    /// Proxy mode: the bridge to start (bwrap has brought loopback up).
    #[serde(default)]
    pub proxy: Option<crate::plan::ProxyPlan>,
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
    //    session leaves no controlling terminal to push keystrokes into.
    push(&mut argv, &["--die-with-parent", "--new-session"]);
    // 3. Environment: nothing but the plan's.
    push(&mut argv, &["--clearenv"]);
    for (key, value) in &plan.env {
        push(&mut argv, &["--setenv", key, value]);
    }
    // 4. The mount view, in the plan's order: policy binds and tmpfs by
    //    depth, /dev, /proc, protected paths on top of writable binds.
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
            MountStep::Tmpfs { target, mode } => {
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
        }
    }
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

/// What the launcher opened for bwrap; kept alive until bwrap has started.
struct Opened {
    fds: BwrapFds,
    /// Owners of every descriptor in `fds` (bwrap inherits them).
    keep: Vec<OwnedFd>,
    mounts: MountReport,
}

/// The bind sources and protected paths of `plan`.
fn open_mounts(plan: &LaunchPlan) -> Result<Opened, LaunchError> {
    let mut opened = Opened {
        fds: BwrapFds::default(),
        keep: Vec::new(),
        mounts: MountReport::default(),
    };
    let setup = |e: MountError| LaunchError::Setup(e.to_string());
    for step in &plan.mounts {
        let mut bind_fd = None;
        let mut protected = Vec::new();
        match step {
            MountStep::Bind {
                source,
                optional,
                access,
                ..
            } => match open_plan_source(plan, source, *access).map_err(setup)? {
                Some(src) => {
                    bind_fd = Some(src.fd.as_raw_fd());
                    opened.keep.push(src.fd);
                    opened.mounts.binds += 1;
                }
                None if *optional => opened
                    .mounts
                    .skipped_optional
                    .push(source.display().to_string()),
                None => {
                    return Err(setup(MountError::MissingSource {
                        path: source.clone(),
                    }));
                }
            },
            MountStep::Protect {
                source,
                target,
                relative,
                dir,
            } => {
                if let Some(root) = open_bind_source(source, Access::Rw).map_err(setup)? {
                    let (steps, created) =
                        resolve_protected(&root.fd, source, relative, *dir).map_err(setup)?;
                    for step in steps {
                        protected.push((step.relative, step.fd.as_raw_fd(), step.leaf));
                        opened.keep.push(step.fd);
                    }
                    opened
                        .mounts
                        .protected
                        .push(protected_outcome(target, relative, created));
                }
            }
            _ => {}
        }
        opened.fds.binds.push(bind_fd);
        opened.fds.protected.push(protected);
    }
    Ok(opened)
}

/// `open_mounts` for a sandbox that runs as subordinate ids: in the staged
/// namespace (`stage`), as those ids (a protected path created there must
/// be created by an id the idmapped copy maps to its owner).
fn open_mounts_staged(
    plan: &LaunchPlan,
    ids: &SubordinateIds,
) -> Result<(Opened, OwnedFd), LaunchError> {
    let staged = crate::stage::staged_plan(plan);
    let open_as_ids = || {
        let uid = nix::unistd::setfsuid(nix::unistd::Uid::from_raw(ids.uid));
        let gid = nix::unistd::setfsgid(nix::unistd::Gid::from_raw(ids.gid));
        let opened = open_mounts(&staged);
        nix::unistd::setfsgid(gid);
        nix::unistd::setfsuid(uid);
        opened
    };
    let (opened, staged_ns) = crate::stage::open_in_staged(plan, ids, open_as_ids)
        .map_err(|e| LaunchError::Setup(e.to_string()))?;
    let mut opened = opened?;
    crate::stage::report_host_paths(plan, &mut opened.mounts);
    Ok((opened, staged_ns))
}

/// Adds what bwrap runs to `opened`: the helper and the seccomp programs.
fn open_helper_and_filters(
    opened: &mut Opened,
    programs: &[Vec<u8>],
    helper_path: &Path,
) -> Result<(), LaunchError> {
    let setup = |e: MountError| LaunchError::Setup(e.to_string());
    let helper = open_source(helper_path).map_err(setup)?.ok_or_else(|| {
        LaunchError::Setup(format!(
            "the bwrap backend's helper {} is missing: install it beside this launcher \
             (`cargo build --release` builds both)",
            helper_path.display()
        ))
    })?;
    opened.fds.helper = helper.fd.as_raw_fd();
    opened.keep.push(helper.fd);
    for program in programs {
        let memfd = memfd_with("substrat-seccomp", program)?;
        opened.fds.seccomp.push(memfd.as_raw_fd());
        opened.keep.push(memfd);
    }
    Ok(())
}

/// A close-on-exec memfd holding `bytes`, read from its start.
fn memfd_with(name: &str, bytes: &[u8]) -> Result<OwnedFd, LaunchError> {
    let memfd = nix::sys::memfd::memfd_create(name, nix::sys::memfd::MFdFlags::MFD_CLOEXEC)
        .map_err(|e| LaunchError::Sys("memfd_create", e))?;
    let mut file = fs::File::from(memfd);
    file.write_all(bytes)
        .and_then(|_| file.rewind())
        .map_err(|e| LaunchError::Setup(format!("memfd {name}: {e}")))?;
    Ok(OwnedFd::from(file))
}

/// The helper's configuration for `plan`: what it needs to do its part.
pub fn helper_config(
    plan: &LaunchPlan,
    features: BwrapFeatures,
    fallback: RlimitFallback,
) -> HelperConfig {
    HelperConfig {
        build: HELPER_BUILD.into(),
        landlock: plan.landlock.clone(),
        rlimits: plan.rlimits.clone(),
        fallback,
        userns_disabled_by_bwrap: !plan.namespaces.nested_userns && features.disable_userns,
        proxy: plan.proxy.clone(),
    }
}

/// The helper binary: `substrat-init` in the launcher's own directory.
fn helper_path() -> Result<PathBuf, LaunchError> {
    let exe = std::env::current_exe()
        .map_err(|e| LaunchError::Setup(format!("cannot find this program's directory: {e}")))?;
    Ok(helper_beside(&exe))
}

/// Where the helper of the launcher at `program` is (`check --host` looks
/// there too).
pub fn helper_beside(program: &Path) -> PathBuf {
    program.with_file_name(HELPER_NAME)
}

/// What bwrap can exec: a regular file with an execute bit.
pub fn is_executable_file(metadata: &fs::Metadata) -> bool {
    use std::os::unix::fs::PermissionsExt;
    metadata.is_file() && metadata.permissions().mode() & 0o111 != 0
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
    let (programs, seccomp) = match &plan.seccomp {
        Some(seccomp_plan) => {
            let (programs, report) = crate::seccomp::export(seccomp_plan)
                .map_err(|e| LaunchError::Setup(e.to_string()))?;
            (programs, Some(report))
        }
        None => (Vec::new(), None),
    };
    // Mount points in writable binds made on the host now and removed when
    // this function returns (bwrap has ended on every path by then).
    let _mount_points = crate::mountpoints::prepare(plan, options.mount_point_record.as_deref())
        .map_err(|e| LaunchError::Setup(e.to_string()))?;
    // Sources first (a missing required bind is the first thing to say),
    // then whether the helper can start in the view they make.
    let helper = helper_path()?;
    let (mut opened, staged) = match options.host_ids.subordinate() {
        None => (open_mounts(plan)?, None),
        Some(ids) => {
            let (opened, staged_ns) = open_mounts_staged(plan, ids)?;
            (opened, Some((staged_ns, ids)))
        }
    };
    open_helper_and_filters(&mut opened, &programs, &helper)?;
    helper_can_start(plan, &helper, opened.fds.helper)?;
    // bwrap's first process must be in the cgroups before it starts anything.
    let (mut groups, cgroup) = cgroup::create(
        &plan.cgroup,
        &options.name,
        options.cgroup_parent.as_deref(),
    );
    // Limits the policy requires and the host refused: nothing has started.
    if let Some(message) = cgroup::unmet_requirement(&plan.cgroup, &cgroup) {
        groups.cleanup();
        return Err(LaunchError::Setup(message));
    }
    let fallback = RlimitFallback::for_report(&plan.cgroup, &cgroup);
    let config = serde_json::to_vec(&helper_config(plan, features, fallback))
        .map_err(|e| LaunchError::Setup(e.to_string()))?;
    let config = memfd_with("substrat-init-config", &config)?;
    opened.fds.config = config.as_raw_fd();
    opened.keep.push(config);
    let pipe = || pipe2(OFlag::O_CLOEXEC).map_err(|e| LaunchError::Sys("pipe", e));
    let (go_read, go_write) = pipe()?;
    let (status_read, status_write) = pipe()?;
    opened.fds.status = status_write.as_raw_fd();
    let argv = bwrap_argv(plan, &opened.fds, features);
    let options = memfd_with("substrat-bwrap-args", &argv.options_file())?;
    let command_line = [
        OsString::from("--args"),
        OsString::from(options.as_raw_fd().to_string()),
        OsString::from("--"),
    ]
    .into_iter()
    .chain(argv.command)
    .collect::<Vec<_>>();
    opened.keep.push(options);
    let signals = BlockedSignals::block()?;

    let child = match sys::fork().map_err(|e| LaunchError::Sys("fork", e))? {
        ForkResult::Child => {
            drop((go_write, status_read));
            signals.restore_in_child();
            let message = start_bwrap(
                bwrap,
                &command_line,
                &go_read,
                opened.keep.iter().chain([&status_write]),
                staged.as_ref().map(|(ns, ids)| (ns, *ids)),
            );
            send(&status_write, &Status::Failed(message));
            sys::exit_now(SETUP_FAILED)
        }
        ForkResult::Parent { child } => child,
    };
    drop((go_read, status_write));
    if let Err(message) = groups.add(child.as_raw()) {
        return Err(abort(child, message));
    }
    let _ = nix::unistd::write(&go_write, &[fallback.go_byte()]);
    drop(go_write);
    drop(opened.keep);

    let status = read_status(status_read);
    let (exit_code, terminated_by) = wait_sandbox(child, &signals.set);
    groups.cleanup();
    drop(signals);
    match status {
        Some(Status::Ready(mut setup)) => {
            setup.mounts = opened.mounts;
            Ok(RunOutcome {
                backend: Backend::Bwrap,
                setup: *setup,
                seccomp,
                cgroup,
                exit_code,
                terminated_by,
            })
        }
        Some(Status::Failed(message) | Status::UsernsUnavailable(message)) => {
            Err(LaunchError::Setup(message))
        }
        None => Err(LaunchError::Setup(format!(
            "bwrap ended before the sandbox was ready (exit {exit_code}); its message is above \
             (the bwrap backend needs bubblewrap 0.8 or later; `check --host` shows the version)"
        ))),
    }
}

/// In the forked child: wait to be inside the cgroups, let bwrap inherit
/// the descriptors, exec it. Returns only on failure, with the reason.
fn start_bwrap<'a>(
    bwrap: &Path,
    argv: &[OsString],
    go: &OwnedFd,
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
    }
    if let Err(e) = nix::sys::prctl::set_pdeathsig(Signal::SIGKILL) {
        return format!("prctl(PR_SET_PDEATHSIG): {e}");
    }
    let mut byte = [0u8; 1];
    if nix::unistd::read(go, &mut byte) != Ok(1) {
        return "the launcher did not start the sandbox".into();
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

/// The helper inside the bwrap sandbox (`substrat-init`):
/// Landlock after bwrap's mounts, no_new_privs, rlimits, a report to the
/// launcher, then the command. Never returns.
pub fn helper_main(args: &HelperArgs) -> ! {
    // Run as /proc/self/fd/N, the process would be named "N" in ps (and so
    // would the proxy bridge forked from it).
    let _ = nix::sys::prctl::set_name(c"substrat-init");
    // The command's environment (bwrap set it) is taken first: with a proxy
    // bridge, setup blanks this process's environment in memory.
    let env: Vec<(String, String)> = std::env::vars().collect();
    // The configuration is read before the descriptors are closed; an
    // error is reported once the status pipe is ours.
    let config = read_helper_config(args.config_fd);
    // Then keep nothing but the status pipe: the descriptor this helper
    // was run from (a host file) and anything else bwrap passed on must
    // reach neither the proxy bridge forked below nor the command.
    let status_fd = args.status_fd;
    if let Err(e) = sys::close_fds_except(Some(status_fd)) {
        eprintln!("substrat-init: cannot close inherited descriptors: {e}");
        sys::exit_now(SETUP_FAILED)
    }
    let status = match sys::inherited_fd(status_fd) {
        Ok(fd) => fd,
        Err(e) => {
            eprintln!("substrat-init: status descriptor {status_fd}: {e}");
            sys::exit_now(SETUP_FAILED)
        }
    };
    let _ = fcntl(status.as_fd(), FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC));
    let bridge = match config.and_then(|config| helper_setup(&config)) {
        Ok((setup, bridge)) => {
            send(&status, &Status::Ready(Box::new(setup)));
            bridge
        }
        Err(message) => {
            send(&status, &Status::Failed(message));
            sys::exit_now(SETUP_FAILED)
        }
    };
    drop(status);
    // The bridge after Landlock (bwrap applied seccomp before us), forked
    // twice so the command does not find an unknown child of its own: the
    // bridge is reparented to bwrap's pid 1 and ends with the namespace.
    if let Some((listener, socket)) = bridge {
        use nix::unistd::ForkResult;
        match sys::fork() {
            Ok(ForkResult::Child) => match sys::fork() {
                Ok(ForkResult::Child) => crate::bridge::run(listener, socket, false),
                _ => sys::exit_now(0),
            },
            Ok(ForkResult::Parent { child }) => {
                let _ = nix::sys::wait::waitpid(child, None);
            }
            Err(e) => {
                eprintln!("substrat-init: proxy bridge: fork: {e}");
                sys::exit_now(SETUP_FAILED)
            }
        }
    }
    exec_command(&args.command, &env)
}

/// The configuration from its descriptor (at most 1 MiB: the launcher
/// writes a few kilobytes).
fn read_helper_config(fd: i32) -> Result<String, String> {
    use std::io::Read;
    let fd = sys::inherited_fd(fd).map_err(|e| format!("configuration descriptor {fd}: {e}"))?;
    let mut config = String::new();
    fs::File::from(fd)
        .take(1 << 20)
        .read_to_string(&mut config)
        .map_err(|e| format!("cannot read the helper configuration: {e}"))?;
    Ok(config)
}

type Bridge = Option<(std::net::TcpListener, std::path::PathBuf)>;

/// The helper's configuration, refused when it comes from another build.
fn parse_helper_config(config: &str) -> Result<HelperConfig, String> {
    let config: HelperConfig = serde_json::from_str(config).map_err(|e| {
        format!("helper configuration: {e} (is {HELPER_NAME} from the same build as the launcher?)")
    })?;
    if config.build != HELPER_BUILD {
        return Err(format!(
            "{HELPER_NAME} is version {HELPER_BUILD}, the launcher is version {}: install both from one build",
            config.build
        ));
    }
    Ok(config)
}

fn helper_setup(config: &str) -> Result<(SetupReport, Bridge), String> {
    let config = parse_helper_config(config)?;
    let kernel_abi = sys::landlock_abi_version().unwrap_or(0);
    // The bridge's listener before Landlock, which forbids TCP binds.
    let bridge = match &config.proxy {
        Some(proxy) => Some((crate::bridge::listen(proxy)?, proxy.socket.clone())),
        None => None,
    };
    // The bridge must be out of the command's reach from its first
    // instruction: this process hides itself before forking it (the exec
    // of the command makes it an ordinary process again). Here, before the
    // report, so a failure is a failed setup.
    if bridge.is_some() {
        sys::conceal_process().map_err(errno("hide the helper and its proxy bridge"))?;
    }
    // Landlock after every mount: bwrap has made them all.
    let landlock =
        crate::landlock::apply(&config.landlock, kernel_abi).map_err(|e| e.to_string())?;
    nix::sys::prctl::set_no_new_privs().map_err(errno("prctl(PR_SET_NO_NEW_PRIVS)"))?;
    let rlimits = apply_rlimits(&config.rlimits, config.fallback);
    let nested_userns_blocked = config.userns_disabled_by_bwrap
        || fs::read_to_string("/proc/sys/user/max_user_namespaces").is_ok_and(|v| v.trim() == "0");
    // The launcher fills in the mounts: it made them, bwrap applied them.
    let report = setup_report(
        MountReport::default(),
        landlock,
        nested_userns_blocked,
        rlimits,
    );
    Ok((report, bridge))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{AgentContext, build_plan};
    use substrat_policy::{LoadOptions, load_str};

    /// A small policy so the whole argv fits on a page.
    fn plan() -> LaunchPlan {
        let text = r#"
version = 1
network = "none"
[filesystem]
binds = [
  { source = "/usr", mode = "ro" },
  { source = "/lib64", mode = "ro", optional = true },
  { source = "${WORKSPACE}", mode = "rw" },
]
protected = [".git/hooks/", ".git/config"]
[env]
set = { PATH = "/usr/bin" }
[rlimits]
core = 0
"#;
        let policy = load_str(Path::new("p.toml"), text, &LoadOptions::default()).unwrap();
        let ctx = AgentContext {
            workspace: "/ws".into(),
            home: "/home/a".into(),
            agent_id: "a1".into(),
            host_env: vec![],
            uid: 1000,
            gid: 1000,
            argv: vec!["make".into(), "test".into()],
            agent_binds: vec![],
            pass_env: vec![],
        };
        build_plan(&policy, &ctx).unwrap()
    }

    #[test]
    fn argv_as_a_whole() {
        let plan = plan();
        // Mount steps: /usr, /lib64, /ws, /tmp (one depth: binds in policy
        // order, then tmpfs), /dev, /proc, protect hooks, protect config, root ro.
        let fds = BwrapFds {
            binds: vec![Some(3), None, Some(4), None, None, None, None, None, None],
            protected: vec![
                vec![],
                vec![],
                vec![],
                vec![],
                vec![],
                vec![],
                vec![(".git".into(), 5, false), (".git/hooks".into(), 6, true)],
                vec![(".git".into(), 7, false), (".git/config".into(), 8, true)],
                vec![],
            ],
            helper: 9,
            seccomp: vec![10, 11],
            status: 12,
            config: 13,
        };
        let argv = bwrap_argv(
            &plan,
            &fds,
            BwrapFeatures {
                disable_userns: true,
            },
        );
        let strings = |v: &[OsString]| -> Vec<String> {
            v.iter().map(|a| a.to_string_lossy().into_owned()).collect()
        };
        let expected_options: Vec<&str> = vec![
            "--unshare-user",
            "--uid",
            "0",
            "--gid",
            "0",
            "--unshare-pid",
            "--unshare-ipc",
            "--unshare-uts",
            "--unshare-net",
            "--disable-userns",
            "--assert-userns-disabled",
            "--hostname",
            "substrat",
            "--die-with-parent",
            "--new-session",
            "--clearenv",
            "--setenv",
            "PATH",
            "/usr/bin",
            "--ro-bind-fd",
            "3",
            "/usr",
            // /lib64 is absent and optional: no argument at all.
            "--bind-fd",
            "4",
            "/ws",
            "--perms",
            "1777",
            "--tmpfs",
            "/tmp",
            "--dev",
            "/dev",
            "--proc",
            "/proc",
            // .git pinned once (fd 7 is not used), then both protected paths.
            "--bind-fd",
            "5",
            "/ws/.git",
            "--ro-bind-fd",
            "6",
            "/ws/.git/hooks",
            "--ro-bind-fd",
            "8",
            "/ws/.git/config",
            "--remount-ro",
            "/",
            "--cap-drop",
            "ALL",
            "--add-seccomp-fd",
            "10",
            "--add-seccomp-fd",
            "11",
            "--chdir",
            "/ws",
        ];
        assert_eq!(strings(&argv.options), expected_options);
        // The command: the helper with its descriptors, then the policy's.
        let expected_command = vec![
            "/proc/self/fd/9",
            "--status-fd",
            "12",
            "--config-fd",
            "13",
            "--",
            "make",
            "test",
        ];
        assert_eq!(strings(&argv.command), expected_command);
        // What `--args` reads: the options, each ended by a NUL.
        let file = argv.options_file();
        // (\x30 is the uid, "0".)
        assert!(file.starts_with(b"--unshare-user\0--uid\0\x30\0"));
        assert!(file.ends_with(b"--chdir\0/ws\0"));
        assert_eq!(
            file.iter().filter(|&&b| b == 0).count(),
            expected_options.len()
        );
    }

    #[test]
    fn helper_arguments_are_exactly_what_the_argv_writes() {
        // What bwrap_argv puts after the helper's path parses back whole.
        let fds = BwrapFds {
            helper: 9,
            status: 12,
            config: 13,
            ..BwrapFds::default()
        };
        let features = BwrapFeatures {
            disable_userns: true,
        };
        let command: Vec<String> = bwrap_argv(&plan(), &fds, features)
            .command
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            HelperArgs::parse(&command[1..]),
            Ok(HelperArgs {
                status_fd: 12,
                config_fd: 13,
                command: vec!["make".into(), "test".into()],
            })
        );
        let args = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        for bad in [
            &["--status-fd", "x", "--config-fd", "13", "--", "make"][..],
            &["--status-fd", "12", "--config-fd", "{}", "--", "make"][..],
            &["--status-fd", "12", "--config-fd", "13", "--"][..],
            &["--config-fd", "13", "--status-fd", "12", "--", "make"][..],
            &["--status-fd", "12", "--config-fd", "13", "make"][..],
            &["--status-fd", "12", "--config", "{}", "--", "make"][..],
            &[][..],
        ] {
            assert!(HelperArgs::parse(&args(bad)).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_configuration_from_another_build_is_refused() {
        let features = BwrapFeatures {
            disable_userns: true,
        };
        let config = helper_config(&plan(), features, RlimitFallback::default());
        let json = serde_json::to_value(&config).unwrap();
        assert!(parse_helper_config(&json.to_string()).is_ok());
        let mut other = json.clone();
        other["build"] = "0.0.1".into();
        let err = parse_helper_config(&other.to_string()).unwrap_err();
        assert!(err.contains("install both from one build"), "{err}");
        // A field this build does not know, at the top or inside the plan.
        for pointer in ["", "/landlock", "/landlock/rules/0"] {
            let mut newer = json.clone();
            newer.pointer_mut(pointer).unwrap()["added_later"] = true.into();
            let err = parse_helper_config(&newer.to_string()).unwrap_err();
            assert!(
                err.contains("unknown field `added_later`"),
                "{pointer}: {err}"
            );
        }
    }

    #[test]
    fn old_bwrap_and_nested_userns_leave_userns_flags_out() {
        let plan = plan();
        let argv = bwrap_argv(
            &plan,
            &BwrapFds::default(),
            BwrapFeatures {
                disable_userns: false,
            },
        );
        assert!(!argv.options.iter().any(|a| a == "--disable-userns"));
    }
}
