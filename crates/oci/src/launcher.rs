//! The launcher `create` starts (`launch`): it builds the container's
//! sandbox with the native backend, says `ready` to `create`, waits for the
//! sandbox to end, writes the run report and exits with the command's code.
//! Its pid is the container's.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context, Result};
use substrat_oci::state;
use substrat_oci::translate::HostIds;
use substrat_sandbox::RunOptions;
use substrat_sandbox::report::RunReport;

use crate::launch::{LaunchArgs, translated};
use crate::log::Logger;
use crate::operator::{ContainerReport, Operator};

/// The file `kill` leaves the signal it was asked for in.
pub(crate) const KILLED_BY: &str = "killed-by";

/// The launcher's stderr when the container has a terminal (the engine's
/// stdio is kept out of it): what its sandbox writes there (a layer not
/// kept, a panic) is relayed to the engine's log.
const STDERR: &str = "launcher-stderr";

/// The most of it relayed.
const MAX_RELAYED: u64 = 64 << 10;

/// `STDERR` in the container's directory, made empty, for `create`.
pub(crate) fn stderr_file(dir: &Path) -> Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(dir.join(STDERR))
        .context("cannot make the launcher's stderr")
}

/// Relays what `STDERR` holds to the log file (once: it is removed).
fn relay_stderr(dir: &Path, logger: &Logger) {
    use std::io::Read;
    let path = dir.join(STDERR);
    let Ok(file) = std::fs::File::open(&path) else {
        return;
    };
    let mut text = String::new();
    let _ = file.take(MAX_RELAYED).read_to_string(&mut text);
    let _ = std::fs::remove_file(&path);
    text.lines()
        .filter(|line| !line.trim().is_empty())
        .for_each(|line| logger.relay(line));
}

/// The launcher: builds the sandbox, says `ready`, waits for it to end and
/// exits with its command's code.
pub fn launch(root: &Path, args: &LaunchArgs, config: Option<&Path>, logger: &Logger) -> ExitCode {
    // Its own session: the engine's terminal signals are not the container's.
    let _ = nix::unistd::setsid();
    // An end asked (`kill`, the watcher of a `create` that died) waits
    // until the groups this joins are recorded for `delete`: killed
    // between making a level and recording it, it would leave the level.
    let _ = term_blocked(true);
    if let Some(fd) = args.watch_fd {
        crate::orphan::name_launcher(fd);
    }
    let connected = state::container_dir(root, &args.id)
        .map_err(anyhow::Error::from)
        .and_then(|dir| {
            Ok((
                substrat_oci::sockets::connect(&dir.join("notify.sock"))?,
                dir,
            ))
        });
    let (mut notify, dir) = match connected {
        Ok(pair) => pair,
        Err(e) => {
            logger.error(&format!("launcher: cannot reach create: {e:#}"));
            return ExitCode::from(125);
        }
    };
    let operator = match Operator::load(config) {
        Ok(operator) => operator,
        Err(e) => {
            let _ = writeln!(notify, "failed: {e:#}");
            logger.error(&format!("{e:#}"));
            return ExitCode::from(125);
        }
    };
    match run_container(&dir, args, &notify, &operator, logger) {
        Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(125)),
        Err(e) => {
            let _ = writeln!(notify, "failed: {e:#}");
            relay_stderr(&dir, logger);
            logger.error(&format!("{e:#}"));
            ExitCode::from(125)
        }
    }
}

fn run_container(
    dir: &Path,
    args: &LaunchArgs,
    notify: &UnixStream,
    operator: &Operator,
    logger: &Logger,
) -> Result<i32> {
    let host_ids = substrat_sandbox::hostid::for_this_launch()?;
    let ids = match host_ids.subordinate() {
        Some(ids) => HostIds {
            uid: ids.uid,
            gid: ids.gid,
        },
        None => HostIds {
            uid: nix::unistd::getuid().as_raw(),
            gid: nix::unistd::getgid().as_raw(),
        },
    };
    // The runtime's --root: the container's directory is below it.
    let root = dir.parent().unwrap_or(dir);
    let prepared = translated(root, &args.bundle, &args.id, ids, operator, true)?;
    substrat_oci::host_paths::test_exchange_after_check();
    let plan = &prepared.translated.plan;
    // Before anything of the container exists: it all starts below.
    let _engine_group = join_engine_group(&prepared, dir)?;
    // Recorded: an end asked meanwhile comes now (the default action;
    // `delete` removes what is recorded), and none of the sandbox's
    // processes inherits the block.
    term_blocked(false).context("cannot unblock SIGTERM")?;
    make_mount_points(plan)?;
    // The only umask the configuration may ask (checks), inherited by the
    // sandbox's processes whatever the engine's was.
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o022));
    let gate = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(state::fifo_path(dir))
        .context("cannot open the start gate")?;
    let options = RunOptions {
        name: args.id.clone(),
        // The engine's group: its limits above hold, its tools find the
        // container's usage there (the sandbox's groups are inside it).
        cgroup_parent: plan_cgroups_path(&prepared),
        mount_point_record: Some(dir.join("mountpoints")),
        host_ids,
        turns: None,
        ready: Some(notify.try_clone()?.into()),
        start_gate: Some(gate.into()),
        // The container's pid is the launcher's: its namespaces must be
        // the container's (a pod's containers are joined to them).
        share_namespaces: true,
        console: args
            .console_socket
            .as_deref()
            .map(|path| console(path, prepared.console_size.as_ref()))
            .transpose()?,
        bind_judge: Some(bind_judge(&prepared)),
    };
    let outcome = substrat_sandbox::native::run(plan, &options)?;
    relay_stderr(dir, logger);
    let _ = std::fs::remove_file(state::fifo_path(dir));
    let report = ContainerReport {
        container_id: &args.id,
        bundle: &args.bundle,
        policies: &prepared.policies,
        notes: &prepared.translated.notes,
        run: RunReport::new(plan, &outcome, "substrat-oci", &options.host_ids),
    };
    // The container ran: a report that cannot be written is said, and the
    // command's exit code still reaches the engine.
    if let Err(e) = operator.write_report(&args.id, &report) {
        logger.error(&format!("{}: {e:#}", args.id));
    }
    let asked = std::fs::read_to_string(dir.join(KILLED_BY)).ok();
    match (
        outcome.terminated_by,
        asked.and_then(|n| n.parse::<i32>().ok()),
    ) {
        (Some(_), Some(signal)) => Ok(128 + signal),
        _ => Ok(outcome.exit_code),
    }
}

/// Judges the configuration's binds as the sandbox opened them: the path
/// of the descriptor that is mounted, not the text `create` resolved
/// (which a writer above it could swap between the check and the mount).
fn bind_judge(prepared: &crate::launch::Prepared) -> substrat_sandbox::bind_judge::BindJudge {
    let rules = prepared.rules.clone();
    let binds = prepared.host_binds.clone();
    substrat_sandbox::bind_judge::BindJudge::new(move |bind| {
        let judged = binds
            .iter()
            .any(|(source, target)| source == bind.source && target == bind.target);
        if !judged {
            // The root filesystem and the policies' binds: the runtime's.
            return Ok(substrat_sandbox::bind_judge::BindView::Idmapped);
        }
        // A socket here was granted at its target (the sandbox refuses any
        // other): it must be the granted source's, as opened.
        if bind.socket
            && let Some(why) = rules.judge_socket(bind.target, bind.dev, bind.ino)
        {
            return Err(why);
        }
        // Judged on what the opened descriptor really is (its mount's
        // origin), not the path it was reached by.
        rules.judge_origins(bind.resolved, bind.origins, bind.read_only)
    })
}

/// The mount points missing in the root filesystem, made now by the
/// launcher (root, the owner of an engine's image) with the same walk the
/// sandbox uses (links resolved inside the tree, nothing followed out):
/// inside, the container's ids may not be allowed to write the image. A
/// target below another mount of the container (a tmpfs, /dev, /proc) is
/// made inside that one instead, by the sandbox.
fn make_mount_points(plan: &substrat_sandbox::plan::LaunchPlan) -> Result<()> {
    use substrat_sandbox::plan::MountStep;
    let Some(MountStep::Bind { source: rootfs, .. }) = plan.mounts.first() else {
        return Ok(());
    };
    let mut filesystems: Vec<&Path> = Vec::new();
    for step in &plan.mounts[1..] {
        let (target, dir) = match step {
            MountStep::Bind { source, target, .. } => (target, source.is_dir()),
            MountStep::Tmpfs { target, .. }
            | MountStep::Dev { target }
            | MountStep::Proc { target }
            | MountStep::Sysfs { target }
            | MountStep::Mqueue { target }
            | MountStep::Empty { target } => (target, true),
            _ => continue,
        };
        if filesystems.iter().any(|fs| target.starts_with(fs)) {
            continue;
        }
        substrat_sandbox::rootfs::resolve_in_root(rootfs, target, dir)
            .with_context(|| format!("mount point {} in the root filesystem", target.display()))?;
        if !matches!(step, MountStep::Bind { .. }) {
            filesystems.push(target);
        }
    }
    Ok(())
}

/// The engine's console socket, connected, for the terminal the sandbox
/// makes (`create` and `exec --console-socket`).
pub(crate) fn console(
    path: &Path,
    size: Option<&substrat_oci::spec::ConsoleSize>,
) -> Result<substrat_sandbox::console::Console> {
    let stream = substrat_oci::sockets::connect(path)
        .with_context(|| format!("cannot connect to the console socket {}", path.display()))?;
    // Checked to fit when the configuration was translated.
    let size = size.map(|s| {
        let fit = |n: u32| u16::try_from(n).unwrap_or(u16::MAX);
        (fit(s.height), fit(s.width))
    });
    Ok(substrat_sandbox::console::Console {
        socket: stream.into(),
        size,
    })
}

/// The launcher in the engine's group (`engine_cgroup`); left and
/// removed when dropped, after the sandbox removed its own groups.
fn join_engine_group(
    prepared: &crate::launch::Prepared,
    dir: &Path,
) -> Result<Option<substrat_oci::engine_cgroup::EngineGroup>> {
    use substrat_oci::engine_cgroup::{EngineGroup, hierarchies, to_join};
    let Some(path) = &prepared.translated.cgroups_path else {
        return Ok(None);
    };
    let limits = &prepared.translated.plan.cgroup;
    let has_limits =
        limits.pids_max.is_some() || limits.memory_max.is_some() || limits.cpu_max.is_some();
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")?;
    let joined = EngineGroup::join(path, &to_join(&hierarchies(&mountinfo), has_limits))
        .with_context(|| format!("linux.cgroupsPath {path}"))?;
    crate::lifecycle::test_death("launch-joined");
    // For `delete`, should this launcher be killed before it leaves.
    joined
        .record(path, dir)
        .context("cannot record the container's cgroups")?;
    Ok(Some(joined))
}

fn plan_cgroups_path(
    prepared: &crate::launch::Prepared,
) -> Option<substrat_sandbox::cgroup::CgroupParent> {
    let path = prepared.translated.cgroups_path.as_ref()?;
    Some(substrat_sandbox::cgroup::CgroupParent::Engine(path.into()))
}

/// Blocks (or unblocks) SIGTERM for this thread.
fn term_blocked(blocked: bool) -> nix::Result<()> {
    use nix::sys::signal::{SigSet, SigmaskHow, Signal, sigprocmask};
    let mut set = SigSet::empty();
    set.add(Signal::SIGTERM);
    let how = if blocked {
        SigmaskHow::SIG_BLOCK
    } else {
        SigmaskHow::SIG_UNBLOCK
    };
    sigprocmask(how, Some(&set), None)
}
