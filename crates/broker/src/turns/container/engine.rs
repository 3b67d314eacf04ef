//! One turn's container as each engine's command line: the same
//! container (the plan's binds and environment, the role's policy named
//! for substrat-oci, the daemon's labels) for podman and for containerd's
//! `ctr`. Pure: what is run and which files it needs, tested by comparing
//! whole outputs.

use std::path::{Path, PathBuf};

use substrat_policy::model::NetworkMode;
use substrat_sandbox::plan::{RlimitKind, RlimitSetting};

use super::{EngineKind, TurnError};

/// The labels every container of the daemon carries (what the sweep
/// finds them by).
pub const DAEMON_LABEL: &str = "io.substrat.daemon";
pub const AGENT_LABEL: &str = "io.substrat.agent";
pub const TURN_LABEL: &str = "io.substrat.turn";

/// The annotations substrat-oci reads (its `runtime_config`), named here
/// rather than linked: the broker does not depend on the runtime.
const POLICY_ANNOTATION: &str = "io.substrat.policy";
const WORKSPACE_ANNOTATION: &str = "io.substrat.workspace";

/// containerd's runc shim, whose runc binary substrat-oci is.
const CONTAINERD_RUNTIME: &str = "io.containerd.runc.v2";

/// The daemon's variables podman itself reads (the operator's container
/// configuration): the only ones it gets besides the plan's. `ctr` gets
/// PATH alone: its address and namespace are on its command line.
const PODMAN_ENV: [&str; 5] = [
    "PATH",
    "CONTAINERS_CONF",
    "CONTAINERS_STORAGE_CONF",
    "CONTAINERS_REGISTRIES_CONF",
    "XDG_RUNTIME_DIR",
];

/// A mount of the turn's plan as the engines take it (podman and
/// containerd make /dev, /proc and /sys; protected paths are the layer's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum EngineMount {
    Bind {
        source: PathBuf,
        target: PathBuf,
        read_only: bool,
    },
    Tmpfs {
        target: PathBuf,
        mode: u32,
        size: Option<u64>,
    },
}

/// The daemon's labels of one container.
#[derive(Debug, Clone, Copy)]
pub(super) struct Labels<'a> {
    pub daemon: &'a str,
    pub agent: &'a str,
    pub turn: &'a str,
}

impl Labels<'_> {
    fn pairs(&self) -> [String; 3] {
        [
            format!("{DAEMON_LABEL}={}", self.daemon),
            format!("{AGENT_LABEL}={}", self.agent),
            format!("{TURN_LABEL}={}", self.turn),
        ]
    }
}

/// One turn's container, whichever engine runs it.
#[derive(Debug)]
pub(super) struct TurnContainer<'a> {
    pub name: &'a str,
    pub labels: Labels<'a>,
    /// substrat-oci's configuration for the agent (`oci.toml`).
    pub runtime_config: &'a Path,
    /// The role's policy, as substrat-oci finds it.
    pub policy: &'a str,
    pub network: NetworkMode,
    pub workspace: &'a Path,
    /// The agent's empty root filesystem.
    pub root: &'a Path,
    /// The daemon's `--cgroup-parent`, relative to each hierarchy's root.
    pub cgroup_parent: Option<&'a Path>,
    /// The agent's container directory: the files `ctr` reads (the
    /// runtime with the agent's configuration, the environment).
    pub dir: &'a Path,
    pub mounts: &'a [EngineMount],
    /// The plan's working directory, environment, command and limits.
    pub cwd: &'a Path,
    /// The root filesystem read-only (the plan's `RootReadOnly`).
    pub read_only: bool,
    pub env: &'a [(String, String)],
    pub argv: &'a [String],
    pub rlimits: &'a [RlimitSetting],
}

/// A file the engine's command reads, written before it starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct EngineFile {
    pub path: PathBuf,
    pub text: String,
    pub mode: u32,
}

/// An engine's command: its program, arguments, environment (nothing of
/// the daemon's but `engine_env`'s) and the files it reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct EngineCommand {
    pub program: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub files: Vec<EngineFile>,
}

/// The daemon's variables an engine's client gets (`host` is the
/// daemon's environment).
pub(super) fn engine_env(kind: &EngineKind, host: &[(String, String)]) -> Vec<(String, String)> {
    let names: &[&str] = match kind {
        EngineKind::Podman => &PODMAN_ENV,
        EngineKind::Containerd { .. } => &["PATH"],
    };
    host.iter()
        .filter(|(name, _)| names.contains(&name.as_str()))
        .cloned()
        .collect()
}

/// The command that runs `run` through `engine` (`program` is podman or
/// ctr, `runtime` substrat-oci), in the foreground, removed when it ends.
pub(super) fn turn_command(
    kind: &EngineKind,
    program: &Path,
    runtime: &Path,
    run: &TurnContainer<'_>,
    engine_env: Vec<(String, String)>,
) -> Result<EngineCommand, TurnError> {
    match kind {
        EngineKind::Podman => podman(program, runtime, run, engine_env),
        EngineKind::Containerd { address, namespace } => {
            let at = Containerd { address, namespace };
            containerd(program, runtime, &at, run, engine_env)
        }
    }
}

/// `podman run` of the turn under substrat-oci: its configuration as a
/// runtime flag, the plan's values in podman's environment (never on its
/// command line).
fn podman(
    program: &Path,
    runtime: &Path,
    run: &TurnContainer<'_>,
    mut env: Vec<(String, String)>,
) -> Result<EngineCommand, TurnError> {
    let mut args = vec![
        "--runtime".to_string(),
        text(runtime)?,
        "--runtime-flag".into(),
        format!("config={}", text(run.runtime_config)?),
        // substrat-oci refuses the systemd driver.
        "--cgroup-manager".into(),
        "cgroupfs".into(),
        "run".into(),
        "--rm".into(),
        // Neither the host's proxy variables nor its environment.
        "--http-proxy=false".into(),
        "--env-host=false".into(),
        "--name".into(),
        run.name.into(),
    ];
    for label in run.labels.pairs() {
        args.extend(["--label".into(), label]);
    }
    args.extend(["--network".into(), podman_network(run.network).into()]);
    args.extend(podman_limits(run.rlimits));
    args.push("--no-hosts".into());
    args.extend(annotations(run)?);
    args.extend(["--workdir".into(), text(run.cwd)?]);
    if run.read_only {
        // Without the writable tmpfs podman would add at /run, /tmp and
        // /var/tmp (the role's own tmpfs are in the plan's mounts).
        args.extend(["--read-only".into(), "--read-only-tmpfs=false".into()]);
    }
    if let Some(parent) = run.cgroup_parent {
        // Absolute: podman takes a relative one below its own group.
        args.extend([
            "--cgroup-parent".into(),
            text(&Path::new("/").join(parent))?,
        ]);
    }
    for mount in run.mounts {
        args.extend(["--mount".into(), podman_mount(mount)?]);
    }
    for (name, value) in run.env {
        // The value in podman's environment, not on its command line.
        args.extend(["--env".into(), name.clone()]);
        env.push((name.clone(), value.clone()));
    }
    args.extend(["--rootfs".into(), text(run.root)?]);
    args.extend(run.argv.iter().cloned());
    Ok(EngineCommand {
        program: program.to_path_buf(),
        args,
        env,
        files: Vec::new(),
    })
}

/// Where the daemon's containerd is.
struct Containerd<'a> {
    address: &'a Path,
    namespace: &'a str,
}

/// `ctr run` of the turn under substrat-oci as the runc shim's binary:
/// a script of the agent's that gives substrat-oci the agent's
/// configuration (the shim passes no flags of ours), the plan's
/// environment in a file (never on the command line).
fn containerd(
    program: &Path,
    runtime: &Path,
    at: &Containerd<'_>,
    run: &TurnContainer<'_>,
    env: Vec<(String, String)>,
) -> Result<EngineCommand, TurnError> {
    if run.network == NetworkMode::Host {
        return Err(TurnError::Container(
            "a role with network = \"host\" cannot run on containerd: `ctr` makes no network \
             but the host's, which substrat-oci never gives a container (use --engine podman)"
                .into(),
        ));
    }
    let wrapper = run.dir.join("substrat-oci");
    let env_file = run.dir.join("env");
    let mut args = vec![
        "--address".to_string(),
        text(at.address)?,
        "--namespace".into(),
        at.namespace.into(),
        "run".into(),
        "--rm".into(),
        "--rootfs".into(),
        "--runtime".into(),
        CONTAINERD_RUNTIME.into(),
        "--runc-binary".into(),
        text(&wrapper)?,
    ];
    for label in run.labels.pairs() {
        args.extend(["--label".into(), label]);
    }
    args.extend(annotations(run)?);
    args.extend(["--cwd".into(), text(run.cwd)?]);
    if run.read_only {
        args.push("--read-only".into());
    }
    if let Some(parent) = run.cgroup_parent {
        let group = Path::new("/").join(parent).join(run.name);
        args.extend(["--cgroup".into(), text(&group)?]);
    }
    for mount in run.mounts {
        args.extend(["--mount".into(), ctr_mount(mount)?]);
    }
    args.extend(["--env-file".into(), text(&env_file)?]);
    // Flags end here: the command's own arguments are never ctr's.
    args.extend(["--".into(), text(run.root)?, run.name.into()]);
    args.extend(run.argv.iter().cloned());
    let files = vec![
        EngineFile {
            path: wrapper,
            text: runtime_script(runtime, run.runtime_config)?,
            mode: 0o700,
        },
        EngineFile {
            path: env_file,
            text: env_lines(run.env)?,
            mode: 0o600,
        },
    ];
    Ok(EngineCommand {
        program: program.to_path_buf(),
        args,
        env,
        files,
    })
}

/// The script the runc shim runs as its runc binary: substrat-oci with
/// the agent's configuration, every argument of the shim's after it.
fn runtime_script(runtime: &Path, config: &Path) -> Result<String, TurnError> {
    Ok(format!(
        "#!/bin/sh\n# substrat-sandbox daemon: substrat-oci with this agent's configuration.\n\
         exec {} --config {} \"$@\"\n",
        quoted(runtime)?,
        quoted(config)?
    ))
}

/// A path in single quotes for sh (one with a quote is refused).
fn quoted(path: &Path) -> Result<String, TurnError> {
    let text = text(path)?;
    if text.contains(['\'', '\n']) {
        return Err(TurnError::Container(format!(
            "{text}: a path with a quote or a newline cannot be given to containerd's shim"
        )));
    }
    Ok(format!("'{text}'"))
}

/// `ctr run --env-file`: one NAME=VALUE a line, as ctr reads it (a line
/// of at most 64 KiB, no newline or carriage return in a value).
fn env_lines(env: &[(String, String)]) -> Result<String, TurnError> {
    let mut out = String::new();
    for (name, value) in env {
        let line = format!("{name}={value}");
        if line.contains(['\n', '\r']) || line.len() >= 64 * 1024 {
            return Err(TurnError::Container(format!(
                "the variable {name} has a newline or is 64 KiB long: containerd's environment \
                 file cannot hold it"
            )));
        }
        out.push_str(&line);
        out.push('\n');
    }
    Ok(out)
}

/// The role's policy and the workspace, for substrat-oci.
fn annotations(run: &TurnContainer<'_>) -> Result<Vec<String>, TurnError> {
    Ok(vec![
        "--annotation".into(),
        format!("{POLICY_ANNOTATION}={}", run.policy),
        "--annotation".into(),
        format!("{WORKSPACE_ANNOTATION}={}", text(run.workspace)?),
    ])
}

fn podman_network(mode: NetworkMode) -> &'static str {
    match mode {
        // The layer gives the container its own namespace with only a
        // loopback in any case; podman then makes none of its own.
        NetworkMode::None | NetworkMode::Proxy => "none",
        // podman's own network (CNI), which the layer leaves as it is.
        NetworkMode::Host => "bridge",
    }
}

/// `--ulimit` for the descriptors and processes: podman's defaults are
/// above what a host without CAP_SYS_RESOURCE may set; the policy's lower
/// limits hold through the layer anyway. (ctr's default spec asks 1,024
/// descriptors and nothing else.)
fn podman_limits(rlimits: &[RlimitSetting]) -> Vec<String> {
    let of = |kind: RlimitKind| {
        rlimits
            .iter()
            .find(|r| r.kind == kind)
            .map_or(1024, |r| r.value)
    };
    vec![
        "--ulimit".into(),
        format!("nofile={0}:{0}", of(RlimitKind::Nofile)),
        "--ulimit".into(),
        format!("nproc={0}:{0}", of(RlimitKind::Nproc)),
    ]
}

/// podman's `--mount` of one mount.
fn podman_mount(mount: &EngineMount) -> Result<String, TurnError> {
    Ok(match mount {
        EngineMount::Bind {
            source,
            target,
            read_only,
        } => {
            let ro = if *read_only { ",ro=true" } else { "" };
            format!(
                "type=bind,source={},target={}{ro}",
                field(source)?,
                field(target)?
            )
        }
        EngineMount::Tmpfs { target, mode, size } => {
            let size = size.map(|s| format!(",tmpfs-size={s}")).unwrap_or_default();
            format!(
                "type=tmpfs,target={},tmpfs-mode={mode:o}{size},notmpcopyup",
                field(target)?
            )
        }
    })
}

/// ctr's `--mount` of one mount (its options separated by `:`).
fn ctr_mount(mount: &EngineMount) -> Result<String, TurnError> {
    Ok(match mount {
        EngineMount::Bind {
            source,
            target,
            read_only,
        } => {
            let access = if *read_only { "ro" } else { "rw" };
            format!(
                "type=bind,src={},dst={},options=rbind:{access}",
                field(source)?,
                field(target)?
            )
        }
        EngineMount::Tmpfs { target, mode, size } => {
            let size = size.map(|s| format!(":size={s}")).unwrap_or_default();
            format!(
                "type=tmpfs,src=tmpfs,dst={},options=nosuid:nodev:mode={mode:o}{size}",
                field(target)?
            )
        }
    })
}

/// A path as one field of a `--mount` (commas separate fields, and ctr
/// reads them as CSV).
fn field(path: &Path) -> Result<String, TurnError> {
    let text = text(path)?;
    if text.contains([',', '=', '"', '\n']) {
        return Err(TurnError::Container(format!(
            "{text}: a path with `,`, `=` or `\"` cannot be given to an engine's --mount"
        )));
    }
    Ok(text)
}

fn text(path: &Path) -> Result<String, TurnError> {
    path.to_str()
        .map(str::to_string)
        .ok_or_else(|| TurnError::Container(format!("{} is not UTF-8", path.display())))
}

#[cfg(test)]
#[path = "engine_tests.rs"]
mod tests;
