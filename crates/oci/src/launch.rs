//! The commands' work: `create` checks the bundle and starts the launcher
//! (`launcher`), which builds the sandbox with the native backend and
//! waits for it; the others act on the records `state` keeps.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use nix::sys::signal::{Signal, kill as send_signal};
use nix::unistd::Pid;
use substrat_oci::host_paths::HostPathRules;
use substrat_oci::layer::{PolicyPaths, apply_policy, policy_names};
use substrat_oci::spec::ConsoleSize;
use substrat_oci::state::{self, Record, Status};
use substrat_oci::translate::{HostIds, Translated, translate};

use crate::argv::flag;
use crate::log::Logger;
use crate::operator::Operator;

#[derive(Debug, clap::Args)]
pub struct CreateArgs {
    /// The bundle: its `config.json` and root filesystem.
    #[arg(long, short, default_value = ".")]
    bundle: PathBuf,
    /// Where to write the container's pid.
    #[arg(long)]
    pid_file: Option<PathBuf>,
    /// A terminal for the container (`process.terminal`): its master is
    /// sent to this socket.
    #[arg(long)]
    console_socket: Option<PathBuf>,
    /// Refused: the sandbox always pivots into its root.
    #[arg(long)]
    no_pivot: bool,
    /// Accepted: the container gets no keyring of its own.
    #[arg(long)]
    no_new_keyring: bool,
    /// Refused when not 0: extra descriptors are not passed in.
    #[arg(long, default_value_t = 0)]
    preserve_fds: u32,
    id: String,
}

#[derive(Debug, clap::Args)]
pub struct LaunchArgs {
    #[arg(long)]
    pub bundle: PathBuf,
    /// The engine's console socket: the terminal made inside goes there.
    #[arg(long)]
    pub console_socket: Option<PathBuf>,
    /// The create watcher's pipe, inherited: the launcher names itself
    /// there first thing (`orphan`).
    #[arg(long, hide = true)]
    pub watch_fd: Option<i32>,
    pub id: String,
}

/// How long `create` waits for its launcher to connect.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// A bundle's plan, and the policies layered on it.
#[derive(Debug)]
pub(crate) struct Prepared {
    pub translated: Translated,
    /// What the launcher judges the opened bind sources against.
    pub rules: HostPathRules,
    /// The configuration's binds, (source, target), as the plan has them.
    pub host_binds: Vec<(PathBuf, PathBuf)>,
    pub policies: Vec<String>,
    pub console_size: Option<ConsoleSize>,
}

/// The bundle's configuration, translated for `ids`, with the operator's
/// policy and the container's `io.substrat.policy` on top. Its host binds
/// are judged when `judge` is (`create`); `exec` keeps what `create`
/// decided and never judges the filesystem as it stands later.
pub(crate) fn translated(
    root: &Path,
    bundle: &Path,
    id: &str,
    ids: HostIds,
    operator: &Operator,
    judge: bool,
) -> Result<Prepared> {
    let path = bundle.join("config.json");
    let bytes = std::fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
    let spec = substrat_oci::spec::parse(&bytes)?;
    let cgroups_path = spec.linux.as_ref().and_then(|l| l.cgroups_path.as_deref());
    let rules = HostPathRules::new(
        &operator.config.allow_host_paths,
        id,
        &spec.annotations,
        cgroups_path,
        Some(root),
    )
    .with_idmapped(&operator.config.idmap_host_paths)
    .with_sockets(&operator.config.agent_binds);
    if judge {
        substrat_oci::host_paths::refuse_protected_binds(&spec.mounts, &rules)?;
    }
    let mut translated = translate(&spec, bundle, ids)?;
    // The configuration's binds (the root filesystem aside), before any
    // policy adds its own: the launcher judges these as it opens them.
    let host_binds = translated
        .plan
        .mounts
        .iter()
        .skip(1)
        .filter_map(|step| match step {
            substrat_sandbox::plan::MountStep::Bind { source, target, .. } => {
                Some((source.clone(), target.clone()))
            }
            _ => None,
        })
        .collect();
    allow_granted_sockets(&mut translated.plan.mounts, &operator.config.agent_binds);
    if let Some(max) = operator.config.max_ptys {
        translated.plan.max_ptys = max;
    }
    let policies = policy_names(operator.config.policy.as_deref(), &spec);
    if !policies.is_empty() {
        let mut paths = PolicyPaths::of(&spec)?;
        paths.granted = operator.granted_binds();
        for policy in operator.policies(&policies)? {
            apply_policy(&mut translated, &policy, &paths)?;
        }
        // A file bound writable (podman's /etc/hostname, /run/.containerenv)
        // has no path inside it to protect.
        translated.plan.mounts.retain(|step| match step {
            substrat_sandbox::plan::MountStep::Protect { source, .. } => source.is_dir(),
            _ => true,
        });
    }
    translated.notes.extend(socket_notes(&translated.plan));
    Ok(Prepared {
        translated,
        rules,
        host_binds,
        policies,
        console_size: spec.process.as_ref().and_then(|p| p.console_size),
    })
}

/// A bind at a target the operator's configuration grants as a socket
/// (`agent_binds`, `socket = true`: the daemon's broker socket for its
/// agent) may connect; every other socket source stays refused.
fn allow_granted_sockets(
    mounts: &mut [substrat_sandbox::plan::MountStep],
    granted: &[substrat_oci::runtime_config::GrantedBind],
) {
    use substrat_sandbox::plan::{MountStep, SocketUse};
    for step in mounts {
        if let MountStep::Bind { target, socket, .. } = step
            && *socket == SocketUse::Refuse
            && granted.iter().any(|g| g.socket && &g.target == target)
        {
            *socket = SocketUse::Connect;
        }
    }
}

/// A note for each bind from the host (the root filesystem aside) that is,
/// or holds, a Unix socket: the container can connect to it, since
/// Landlock before ABI 9 has no right to stop that. Scanned within bounds
/// (`substrat_sandbox::sockets`): a socket deeper is not reported.
fn socket_notes(plan: &substrat_sandbox::plan::LaunchPlan) -> Vec<String> {
    use substrat_sandbox::plan::MountStep;
    let mut notes = Vec::new();
    for step in &plan.mounts {
        let MountStep::Bind { source, target, .. } = step else {
            continue;
        };
        if target == Path::new("/") {
            continue;
        }
        let scan = substrat_sandbox::sockets::unix_sockets_at(source);
        if let Some(first) = scan.sockets.first() {
            notes.push(format!(
                "{}: holds {} host Unix socket(s) ({}): the container can connect to those \
                 its ids may write (idmapped: as host root; else as a stranger) (no Landlock \
                 right stops connect(2) to a socket on this kernel)",
                target.display(),
                scan.sockets.len(),
                first.display()
            ));
        }
    }
    notes
}

pub fn create(
    root: &Path,
    args: &CreateArgs,
    systemd_cgroup: bool,
    operator: &Operator,
    logger: &Logger,
) -> Result<()> {
    if systemd_cgroup {
        bail!(
            "--systemd-cgroup: the systemd cgroup driver is not supported; set the engine's cgroup manager to cgroupfs"
        );
    }
    if args.no_pivot {
        bail!("--no-pivot: the sandbox always pivots into its root filesystem");
    }
    if args.preserve_fds > 0 {
        bail!("--preserve-fds: extra descriptors are not passed into the container");
    }
    let bundle = std::fs::canonicalize(&args.bundle)
        .with_context(|| format!("bundle {}", args.bundle.display()))?;
    // Checked here so that the engine gets the error from `create` itself;
    // the launcher translates again with the ids it claims.
    let checked = translated(
        root,
        &bundle,
        &args.id,
        HostIds { uid: 0, gid: 0 },
        operator,
        true,
    )?;
    match (&args.console_socket, checked.translated.plan.terminal) {
        (Some(_), true) | (None, false) => {}
        (Some(_), false) => bail!("--console-socket: the container's process.terminal is false"),
        (None, true) => bail!(
            "process.terminal: the container wants a terminal, and no --console-socket was given"
        ),
    }
    let first = first_record(&bundle, &args.id, &checked)?;
    let dir = state::make_dir(root, &args.id, &first)?;
    crate::lifecycle::test_death("create-dir");
    let watch = match crate::orphan::spawn_watch(root, &args.id) {
        Ok(watch) => std::fs::File::from(watch),
        Err(e) => {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(e);
        }
    };
    let launcher = Launcher {
        root,
        dir: &dir,
        bundle: &bundle,
        id: &args.id,
        config: operator.path.as_deref(),
        console_socket: args.console_socket.as_deref(),
        logger,
        record: first,
        watch: &watch,
    };
    match start_launcher(launcher) {
        Ok(record) => {
            for note in &record.notes {
                logger.info(&format!("{}: {note}", args.id));
            }
            if let Some(pid_file) = &args.pid_file {
                write_pid_file(pid_file, record.pid)?;
            }
            // The container is the engine's only now: a `create` that
            // dies before this line (or fails) leaves a watcher that ends
            // the launcher (`orphan`), and a record that says `stopped`
            // for `delete` to remove.
            (&watch)
                .write_all(crate::orphan::SAVED)
                .context("cannot tell the create watcher")?;
            Ok(())
        }
        Err(e) => {
            // The launcher is gone: what it made of the engine's groups too.
            substrat_oci::engine_cgroup::remove_recorded(&dir, &args.id);
            let _ = std::fs::remove_dir_all(&dir);
            Err(e)
        }
    }
}

pub(crate) fn write_pid_file(path: &Path, pid: i32) -> Result<()> {
    let partial = path.with_extension("substrat-partial");
    std::fs::write(&partial, pid.to_string())
        .and_then(|()| std::fs::rename(&partial, path))
        .with_context(|| format!("cannot write the pid file {}", path.display()))
}

/// What `create` starts its launcher with.
struct Launcher<'a> {
    root: &'a Path,
    dir: &'a Path,
    bundle: &'a Path,
    id: &'a str,
    /// The operator's configuration file, when given.
    config: Option<&'a Path>,
    /// Where the container's terminal goes (`--console-socket`).
    console_socket: Option<&'a Path>,
    /// The engine's log, forwarded to the launcher.
    logger: &'a Logger,
    /// The record as first saved, without a pid.
    record: Record,
    /// The pipe to the watcher (`orphan`): told the launcher's pid.
    watch: &'a std::fs::File,
}

/// The record saved with the container's directory, without a pid. It has
/// the policies and notes from the first: an `update` or `exec` during
/// `create` is judged against the policies, never against none.
fn first_record(bundle: &Path, id: &str, checked: &Prepared) -> Result<Record> {
    let spec_bytes = std::fs::read(bundle.join("config.json"))?;
    let annotations = substrat_oci::spec::parse(&spec_bytes)?.annotations;
    Ok(Record {
        id: id.to_string(),
        bundle: bundle.to_path_buf(),
        pid: 0,
        pid_start: 0,
        created: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        annotations,
        notes: checked.translated.notes.clone(),
        policies: checked.policies.clone(),
    })
}

/// Starts the launcher and waits until it says the sandbox is built. The
/// record is saved first without a pid (a `create` killed then leaves a
/// container that is `stopped`), then with the launcher's as soon as it
/// runs (killed then, the watcher ends the launcher: `orphan`).
fn start_launcher(launcher: Launcher<'_>) -> Result<Record> {
    let Launcher {
        root,
        dir,
        bundle,
        id,
        config,
        console_socket,
        logger,
        mut record,
        watch,
    } = launcher;
    let socket = dir.join("notify.sock");
    let listener =
        substrat_oci::sockets::bind(&socket).context("cannot listen for the launcher")?;
    let exe = std::env::current_exe().context("cannot find this program")?;
    // The launcher keeps this program's stdio: it is the container's (but
    // for a terminal, which the sandbox makes).
    // Each option and its value one argument (`crate::argv`).
    let mut command = std::process::Command::new(exe);
    if let Some(config) = config {
        command.arg(flag("--config", config));
    }
    command.arg(flag("--root", root)).args(logger.forward());
    command.arg("launch");
    if let Some(socket) = console_socket {
        command.arg(flag("--console-socket", socket));
        // Nothing of the engine's stdio stays open in the launcher:
        // containerd's shim reads create's output to its end before it
        // takes the terminal's master (`crate::exec_cmd` does the same).
        // Its stderr is a file the launcher relays to the log.
        command
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(crate::launcher::stderr_file(dir)?);
    }
    // The watcher's pipe goes to the launcher too, which names itself on
    // it: a `create` killed before it could never leaves a launcher nobody
    // ends. Inheritable for this spawn only.
    use nix::fcntl::{FcntlArg, FdFlag, fcntl};
    use std::os::fd::AsRawFd;
    fcntl(watch, FcntlArg::F_SETFD(FdFlag::empty())).context("the watcher's pipe")?;
    let spawned = command
        .arg(format!("--watch-fd={}", watch.as_raw_fd()))
        .arg(flag("--bundle", bundle))
        .arg("--")
        .arg(id)
        .spawn();
    let _ = fcntl(watch, FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC));
    let mut child = spawned.context("cannot start the launcher")?;
    crate::lifecycle::test_death("create-forked");
    let pid = i32::try_from(child.id()).context("pid out of range")?;
    if let Some((start, _)) = state::process_start(pid) {
        record.pid = pid;
        record.pid_start = start;
        // The watcher first: a record saved and this killed before the
        // line would leave a launcher nothing ends.
        let line = crate::orphan::launcher_line(pid, start);
        if let Err(e) = { watch }.write_all(line.as_bytes()) {
            let _ = child.kill();
            let _ = child.wait();
            return Err(e).context("cannot tell the create watcher");
        }
        state::save(dir, &record)?;
    }
    crate::lifecycle::test_death("create-spawned");
    let answer = wait_for_answer(&listener, &mut child);
    let _ = std::fs::remove_file(&socket);
    match answer {
        Ok(line) if line == "ready" => {}
        other => {
            let _ = child.kill();
            let _ = child.wait();
            match other {
                Ok(line) => bail!("{}", line.strip_prefix("failed: ").unwrap_or(&line)),
                Err(e) => return Err(e),
            }
        }
    }
    crate::lifecycle::test_death("create-ready");
    if record.pid == 0 {
        bail!("the launcher ended at once");
    }
    Ok(record)
}

/// The launcher's one line: `ready`, or `failed: why`.
pub(crate) fn wait_for_answer(
    listener: &UnixListener,
    child: &mut std::process::Child,
) -> Result<String> {
    listener.set_nonblocking(true)?;
    let deadline = Instant::now() + CONNECT_TIMEOUT;
    let stream = loop {
        match listener.accept() {
            Ok((stream, _)) => break stream,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e).context("accept the launcher"),
        }
        if let Some(status) = child.try_wait()? {
            bail!("the launcher ended before it built the container ({status})");
        }
        if Instant::now() > deadline {
            bail!(
                "the launcher did not connect within {} s",
                CONNECT_TIMEOUT.as_secs()
            );
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    stream.set_nonblocking(false)?;
    let mut line = String::new();
    BufReader::new(stream).read_line(&mut line)?;
    match line.trim_end() {
        "" => bail!("the launcher ended before the container was built"),
        text => Ok(text.to_string()),
    }
}

pub fn start(root: &Path, id: &str) -> Result<()> {
    let (dir, record) = state::load(root, id)?;
    let status = state::status(&dir, &record);
    if status != Status::Created {
        bail!("container `{id}` is {}, not created", status_name(status));
    }
    let fifo = state::fifo_path(&dir);
    let mut gate = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&fifo)
        .with_context(|| format!("container `{id}`: nothing waits at its start gate"))?;
    // Removed before the byte goes: a `start` killed midway leaves either
    // a started container or, its end of the gate closed with nothing
    // written, one whose init gives up (stopped); never a gate that says
    // `created` of a running container. The launcher may have removed it
    // already (a container that ended at once).
    match std::fs::remove_file(&fifo) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(e).context("cannot remove the start gate");
        }
        _ => {}
    }
    crate::lifecycle::test_death("start");
    gate.write_all(&[1]).context("cannot open the start gate")
}

fn status_name(status: Status) -> &'static str {
    match status {
        Status::Created => "created",
        Status::Running => "running",
        Status::Paused => "paused",
        Status::Stopped => "stopped",
    }
}

pub fn state(root: &Path, id: &str) -> Result<()> {
    let (dir, record) = state::load(root, id)?;
    let state = state::oci_state(&record, state::status(&dir, &record));
    println!("{}", serde_json::to_string_pretty(&state)?);
    Ok(())
}

/// SIGTERM to the launcher: it kills every process of the sandbox and
/// removes its cgroups before it exits (a SIGKILL would leave them). A
/// paused container is thawed, so that its launcher can.
pub(crate) fn end(dir: &Path, record: &Record) {
    let _ = send_signal(Pid::from_raw(record.pid), Signal::SIGTERM);
    substrat_oci::freeze::thaw_for_end(dir);
}

pub fn delete(root: &Path, id: &str, force: bool) -> Result<()> {
    let (dir, record) = match state::load(root, id) {
        // As runc: forcing the delete of what is gone already is done. A
        // directory without a record (left by an older `create` killed
        // midway; this one renames it into place whole) goes with it.
        Err(state::StateError::NotFound(_)) if force => {
            let dir = state::container_dir(root, id)?;
            return match std::fs::remove_dir_all(&dir) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    Err(e).with_context(|| format!("cannot remove {}", dir.display()))
                }
                _ => Ok(()),
            };
        }
        other => other?,
    };
    let status = state::status(&dir, &record);
    if status != Status::Stopped {
        if !force {
            bail!(
                "container `{id}` is {}: kill it first, or delete --force",
                status_name(status)
            );
        }
        end(&dir, &record);
        let deadline = Instant::now() + Duration::from_secs(10);
        while state::alive(&record) {
            if Instant::now() > deadline {
                let _ = send_signal(Pid::from_raw(record.pid), Signal::SIGKILL);
                bail!("container `{id}`: its launcher did not end within 10 s; killed");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    // A launcher killed (SIGKILL) could not remove the container's groups.
    substrat_oci::engine_cgroup::remove_recorded(&dir, id);
    std::fs::remove_dir_all(&dir).with_context(|| format!("cannot remove {}", dir.display()))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PsFormat {
    Table,
    Json,
}

/// The host pids of every process in the container's pid namespace (the
/// one its holder, the launcher's child, made for its children).
pub fn ps(root: &Path, id: &str, format: PsFormat) -> Result<()> {
    let (dir, record) = state::load(root, id)?;
    if state::status(&dir, &record) == Status::Stopped {
        bail!("container `{id}` is not running");
    }
    let holder = state::first_child(record.pid)
        .with_context(|| format!("container `{id}`: its launcher has no sandbox"))?;
    let namespace = std::fs::read_link(format!("/proc/{holder}/ns/pid_for_children"))
        .context("cannot read the container's pid namespace")?;
    let mut pids: Vec<i32> = std::fs::read_dir("/proc")?
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read_link(format!("/proc/{pid}/ns/pid")).is_ok_and(|ns| ns == namespace)
        })
        .collect();
    pids.sort_unstable();
    match format {
        PsFormat::Json => println!("{}", serde_json::to_string(&pids)?),
        PsFormat::Table => {
            println!("PID");
            pids.iter().for_each(|pid| println!("{pid}"));
        }
    }
    Ok(())
}

pub fn features() -> Result<()> {
    let features = serde_json::json!({
        "ociVersionMin": "1.0.0",
        "ociVersionMax": state::OCI_VERSION,
        "hooks": [],
        "mountOptions": ["bind", "rbind", "ro", "rw", "nosuid", "nodev", "noexec", "private",
            "rprivate", "slave", "rslave", "relatime", "norelatime", "noatime", "strictatime",
            "defaults", "mode", "size"],
        "linux": {
            "namespaces": ["pid", "network", "mount", "ipc", "uts", "user", "cgroup"],
            "capabilities": [],
            "cgroup": {"v1": true, "v2": true, "systemd": false, "systemdUser": false},
            "seccomp": {"enabled": true},
            "apparmor": {"enabled": false},
            "selinux": {"enabled": false},
            "intelRdt": {"enabled": false}
        },
        "annotations": {"io.substrat.runtime": "substrat-oci"}
    });
    println!("{}", serde_json::to_string_pretty(&features)?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use substrat_oci::runtime_config::{GrantedBind, GrantedMode};
    use substrat_sandbox::plan::{Access, MountStep, SocketUse};

    fn bind(target: &str) -> MountStep {
        MountStep::Bind {
            source: "/host/s".into(),
            target: target.into(),
            access: Access::Ro,
            optional: false,
            socket: SocketUse::Refuse,
        }
    }

    fn granted(target: &str, socket: bool) -> GrantedBind {
        GrantedBind {
            target: target.into(),
            mode: GrantedMode::Ro,
            socket,
            source: None,
            source_inode: None,
        }
    }

    #[test]
    fn only_a_target_granted_as_a_socket_may_connect() {
        let mut mounts = vec![
            bind("/run/substrat/broker.sock"),
            bind("/run/x.sock"),
            bind("/home"),
        ];
        let grants = [
            granted("/run/substrat/broker.sock", true),
            granted("/home", false),
        ];
        super::allow_granted_sockets(&mut mounts, &grants);
        let uses: Vec<SocketUse> = mounts
            .iter()
            .map(|m| match m {
                MountStep::Bind { socket, .. } => *socket,
                _ => unreachable!(),
            })
            .collect();
        assert_eq!(
            uses,
            [SocketUse::Connect, SocketUse::Refuse, SocketUse::Refuse]
        );
    }
}
