//! A turn as a container (`daemon --engine podman`): podman runs the
//! agent's provider with `substrat-oci` as its runtime, from the same plan
//! `substrat-run` would build (the role's binds, the agent's binds, its
//! home, its environment), and the role's policy on top of the container
//! (`io.substrat.policy`): its Landlock rules, seccomp filter, protected
//! paths and limits hold as under `substrat-run`, whatever podman adds.
//!
//! substrat-oci gets a runtime configuration of the agent's own
//! (`--runtime-flag config=...`): where the role's policy is, and the
//! agent's binds, which the policy's Landlock rules allow as under
//! substrat-run (without them they would deny the broker socket, the
//! relay, the home). The root filesystem is an empty directory of the
//! agent's: every path in it comes from a bind.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use serde::Serialize;
use substrat_policy::LoadedPolicy;
use substrat_policy::model::{NetworkMode, WorkspaceMode};
use substrat_provider::TurnRequest;
use substrat_sandbox::plan::{
    Access, AgentBind, AgentContext, HomeMount, MountStep, SocketUse, build_plan,
};
use substrat_sandbox::workspace_git::WorkspaceGit;
use tokio::process::Command;

use super::launch::{Launch, agent_binds};
use super::{TurnConfig, TurnError};
use crate::broker::Broker;

/// The container engine the daemon runs turns through.
#[derive(Debug, Clone)]
pub struct ContainerEngine {
    /// The podman program.
    pub podman: PathBuf,
    /// `substrat-oci`, podman's `--runtime`.
    pub runtime: PathBuf,
}

/// `podman run` for one turn (see the module's doc), and the git
/// repositories it looks after, whose `after_run` is due when it ends.
pub(super) fn container_command(
    broker: &Broker,
    config: &TurnConfig,
    engine: &ContainerEngine,
    launch: &Launch<'_>,
    request: &TurnRequest<'_>,
) -> Result<(Command, WorkspaceGit), TurnError> {
    let agent = launch.agent;
    let policy = broker
        .policy_of(agent)
        .ok_or_else(|| TurnError::NoPolicy(agent.role.clone()))?;
    let refused = |why: &str| Err(TurnError::Container(why.to_string()));
    if policy.policy.network == NetworkMode::Proxy {
        return refused("a role with network = \"proxy\" cannot run as a container yet");
    }
    if policy.policy.filesystem.workspace_mode == WorkspaceMode::Overlay {
        return refused("a role with workspace_mode = \"overlay\" cannot run as a container yet");
    }
    if launch.access.is_some() {
        return refused(
            "a provider that reaches its model through the gateway cannot run as a container yet",
        );
    }
    let binds: Vec<AgentBind> = agent_binds(broker, config, launch)
        .into_iter()
        .map(|(mode, source, target)| AgentBind {
            source,
            target,
            access: if mode == "rw" { Access::Rw } else { Access::Ro },
        })
        .collect();
    let provider_env = launch.provider.env(launch.setup);
    let mut ctx = AgentContext {
        workspace: launch.workspace.to_path_buf(),
        home: config.home.clone(),
        agent_id: agent.id.clone(),
        host_env: host_env(config, &provider_env),
        uid: 0,
        gid: 0,
        argv: launch.provider.argv(request, launch.setup),
        agent_binds: binds,
        pass_env: provider_env.iter().map(|(name, _)| name.clone()).collect(),
        home_mount: HomeMount::Bind(launch.files.home.clone()),
        terminal: false,
        workspace_layer: None,
        landlock_abi: substrat_sandbox::landlock::kernel_abi(),
    };
    let plan_of = |ctx: &AgentContext| {
        build_plan(policy, ctx).map_err(|e| TurnError::Container(format!("the plan: {e}")))
    };
    let mut plan = plan_of(&ctx)?;
    let agent_dir = broker.state_dir().join("agents").join(&agent.id);
    // Git repositories wherever the turn can write, as substrat-run looks
    // after them: the workspace's `.git` the agent's own, the others
    // read-only, new ones made inert after the turn (`after_run`).
    let git = WorkspaceGit::prepare(&agent_dir.join("git"), &plan, launch.workspace)
        .map_err(|e| TurnError::Container(e.to_string()))?;
    if !git.is_empty() {
        let mut binds = git.binds();
        binds.append(&mut ctx.agent_binds);
        ctx.agent_binds = binds;
        plan = plan_of(&ctx)?;
    }
    let dir = agent_dir.join("container");
    let (name, policy_dir) = policy_name(policy)?;
    let runtime_config =
        write_runtime_config(&dir, policy_dir, &ctx.agent_binds, &config.home, &plan)?;
    let run = PodmanRun {
        runtime_config: &runtime_config,
        cidfile: &cid_file(broker, &agent.id),
        policy: &name,
        network: policy.policy.network,
        workspace: launch.workspace,
        root: &empty_root(&dir)?,
        cgroup_parent: config.cgroup_parent.as_deref(),
    };
    Ok((podman_command(engine, &run, &plan)?, git))
}

/// What one `podman run` names besides the plan.
struct PodmanRun<'a> {
    runtime_config: &'a Path,
    cidfile: &'a Path,
    /// The role's policy, as substrat-oci finds it.
    policy: &'a str,
    network: NetworkMode,
    workspace: &'a Path,
    root: &'a Path,
    /// The daemon's `--cgroup-parent`, relative to each hierarchy's root.
    cgroup_parent: Option<&'a Path>,
}

/// `podman run` of `plan` under substrat-oci.
fn podman_command(
    engine: &ContainerEngine,
    run: &PodmanRun<'_>,
    plan: &substrat_sandbox::plan::LaunchPlan,
) -> Result<Command, TurnError> {
    // podman refuses a container id file that exists (a turn that ended).
    let _ = std::fs::remove_file(run.cidfile);
    let mut command = Command::new(&engine.podman);
    // podman gets none of the daemon's variables but its own
    // (`PODMAN_ENV`): the container's are the plan's (below), and nothing
    // else may reach them.
    command.env_clear();
    for name in PODMAN_ENV {
        if let Some(value) = std::env::var_os(name) {
            command.env(name, value);
        }
    }
    command
        .arg("--runtime")
        .arg(&engine.runtime)
        .arg("--runtime-flag")
        .arg(format!("config={}", run.runtime_config.display()))
        // substrat-oci refuses the systemd driver.
        .args(["--cgroup-manager", "cgroupfs", "run", "--rm"])
        // Neither the host's proxy variables nor its environment.
        .args(["--http-proxy=false", "--env-host=false"])
        .arg("--cidfile")
        .arg(run.cidfile)
        .args(["--network", network(run.network)])
        .args(limits(&plan.rlimits))
        .arg("--no-hosts")
        .arg("--annotation")
        .arg(format!(
            "{}={}",
            substrat_oci_annotation::POLICY,
            run.policy
        ))
        .arg("--annotation")
        .arg(format!(
            "{}={}",
            substrat_oci_annotation::WORKSPACE,
            run.workspace.display()
        ))
        .arg("--workdir")
        .arg(&plan.cwd)
        .args(read_only(plan));
    if let Some(parent) = run.cgroup_parent {
        // Absolute: podman takes a relative one below its own group.
        command
            .arg("--cgroup-parent")
            .arg(Path::new("/").join(parent));
    }
    for argument in mount_args(&plan.mounts)? {
        command.arg(argument);
    }
    for (name, value) in &plan.env {
        // The value in podman's environment, not on its command line.
        command.arg("--env").arg(name).env(name, value);
    }
    command
        .arg("--rootfs")
        .arg(run.root)
        .args(&plan.argv)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    Ok(command)
}

/// A read-only root as `substrat-run` makes it (the plan's last mount step,
/// `RootReadOnly`, which every role's plan has): podman's `--read-only`,
/// without the writable tmpfs it would add at /run, /tmp and /var/tmp (the
/// role's own tmpfs are in the plan's mounts).
fn read_only(plan: &substrat_sandbox::plan::LaunchPlan) -> &'static [&'static str] {
    let asked = plan
        .mounts
        .iter()
        .any(|m| matches!(m, substrat_sandbox::plan::MountStep::RootReadOnly));
    if asked {
        &["--read-only", "--read-only-tmpfs=false"]
    } else {
        &[]
    }
}

/// The daemon's variables podman itself reads (the operator's container
/// configuration): the only ones it gets besides the plan's.
const PODMAN_ENV: [&str; 5] = [
    "PATH",
    "CONTAINERS_CONF",
    "CONTAINERS_STORAGE_CONF",
    "CONTAINERS_REGISTRIES_CONF",
    "XDG_RUNTIME_DIR",
];

/// Where podman writes the turn's container id.
fn cid_file(broker: &Broker, agent_id: &str) -> PathBuf {
    broker
        .state_dir()
        .join("agents")
        .join(agent_id)
        .join("container/cid")
}

/// Removes the agent's turn container (a turn timed out: its podman
/// client is gone, conmon keeps the container).
pub(super) async fn remove(engine: &ContainerEngine, broker: &Broker, agent: &crate::store::Agent) {
    let cidfile = cid_file(broker, &agent.id);
    if !cidfile.exists() {
        return;
    }
    let removed = Command::new(&engine.podman)
        .args(["rm", "--force", "--time", "0", "--cidfile"])
        .arg(&cidfile)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .await;
    if !removed.is_ok_and(|s| s.success()) {
        tracing::warn!(agent = %agent.name, "the timed-out turn's container could not be removed");
    }
}

/// The annotations substrat-oci reads (its `runtime_config`), named here
/// rather than linked: the broker does not depend on the runtime.
mod substrat_oci_annotation {
    pub const POLICY: &str = "io.substrat.policy";
    pub const WORKSPACE: &str = "io.substrat.workspace";
}

/// The environment `substrat-run` would have been started with: the
/// daemon's without its keys, the provider's variables, HOME.
fn host_env(config: &TurnConfig, provider_env: &[(String, String)]) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = std::env::vars_os()
        .filter_map(|(name, value)| Some((name.into_string().ok()?, value.into_string().ok()?)))
        .filter(|(name, _)| !config.secret_env.contains(name) && name != "HOME")
        .collect();
    env.extend(provider_env.iter().cloned());
    env.push(("HOME".into(), config.home.display().to_string()));
    env
}

fn network(mode: NetworkMode) -> &'static str {
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
/// limits hold through the layer anyway.
fn limits(rlimits: &[substrat_sandbox::plan::RlimitSetting]) -> Vec<String> {
    use substrat_sandbox::plan::RlimitKind;
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

/// A policy's bind of a Unix socket not marked `socket = true` is refused,
/// as substrat-run refuses it (the engine would follow links the same way).
fn refuse_socket(source: &std::path::Path, socket: SocketUse) -> Result<(), TurnError> {
    use std::os::unix::fs::FileTypeExt;
    let is_socket = std::fs::metadata(source).is_ok_and(|m| m.file_type().is_socket());
    if socket == SocketUse::Refuse && is_socket {
        return Err(TurnError::Container(format!(
            "bind source {} is a Unix socket, which the command could connect to; refusing. \
             If the command should reach the service behind it, mark the bind `socket = true` in the policy",
            source.display()
        )));
    }
    Ok(())
}

/// `--mount` for every bind and tmpfs of the plan (podman makes /dev and
/// /proc; protected paths are the layer's). An optional bind whose source
/// is absent is left out, as the sandbox skips it.
fn mount_args(mounts: &[MountStep]) -> Result<Vec<String>, TurnError> {
    let mut out = Vec::new();
    for step in mounts {
        let spec = match step {
            MountStep::Bind {
                source,
                target,
                access,
                optional,
                socket,
            } => {
                if *optional && !source.exists() {
                    continue;
                }
                refuse_socket(source, *socket)?;
                let ro = if *access == Access::Ro {
                    ",ro=true"
                } else {
                    ""
                };
                format!(
                    "type=bind,source={},target={}{ro}",
                    field(source)?,
                    field(target)?
                )
            }
            MountStep::Tmpfs { target, mode, size } => {
                let size = size.map(|s| format!(",tmpfs-size={s}")).unwrap_or_default();
                format!(
                    "type=tmpfs,target={},tmpfs-mode={mode:o}{size},notmpcopyup",
                    field(target)?
                )
            }
            _ => continue,
        };
        out.push("--mount".into());
        out.push(spec);
    }
    Ok(out)
}

/// A path as one field of podman's `--mount` (commas separate fields).
fn field(path: &Path) -> Result<String, TurnError> {
    let text = path
        .to_str()
        .ok_or_else(|| TurnError::Container(format!("{} is not UTF-8", path.display())))?;
    if text.contains([',', '=', '\n']) {
        return Err(TurnError::Container(format!(
            "{text}: a path with `,` or `=` cannot be given to podman's --mount"
        )));
    }
    Ok(text.to_string())
}

/// The agent's empty root filesystem (the mount points substrat-oci makes
/// there are the only entries).
fn empty_root(dir: &Path) -> Result<PathBuf, TurnError> {
    let root = dir.join("root");
    std::fs::create_dir_all(&root).map_err(|source| TurnError::File {
        action: "create",
        path: root.clone(),
        source,
    })?;
    Ok(root)
}

#[derive(Serialize)]
struct RuntimeFile {
    /// Where the role's policy file is (none for a built-in one).
    #[serde(skip_serializing_if = "Option::is_none")]
    policy_dir: Option<PathBuf>,
    /// A run report per container (`reports/ID.json`).
    report_dir: PathBuf,
    agent_binds: Vec<GrantedBind>,
    /// The host places this turn's plan binds (its sockets, home, chats,
    /// git dirs, workspace, the role's binds), resolved: substrat-oci
    /// refuses binds of system and engine places (`/var/lib`, `/run`)
    /// unless allowed, and the daemon's own state and runtime directories
    /// are there. The plan is the daemon's, as substrat-run would run it.
    allow_host_paths: Vec<PathBuf>,
    /// The same places, idmapped: the agent acts on its workspace, home,
    /// chats and broker socket as under substrat-run (substrat-oci shows
    /// any other host path as it is, the container a stranger there).
    idmap_host_paths: Vec<PathBuf>,
}

#[derive(Serialize)]
struct GrantedBind {
    target: PathBuf,
    mode: &'static str,
    /// The agent's broker socket: substrat-oci refuses any other socket.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    socket: bool,
    /// The socket granted at `target` (substrat-oci checks the bound one
    /// is this one: its device and inode).
    #[serde(skip_serializing_if = "Option::is_none")]
    source: Option<PathBuf>,
}

/// The name substrat-oci finds the role's policy by, and the directory it
/// is in (none for a built-in policy).
fn policy_name(policy: &LoadedPolicy) -> Result<(String, Option<PathBuf>), TurnError> {
    if substrat_policy::builtin::is_builtin_label(&policy.path) {
        return Ok((policy.name.clone(), None));
    }
    // substrat-oci loads the policy again by name: it must be the file the
    // daemon loaded (an inline role's is the one written in the state
    // directory).
    if !policy.path.is_file() {
        return Err(TurnError::Container(format!(
            "the role's policy is not a file substrat-oci can load ({})",
            policy.path.display()
        )));
    }
    let stem = policy
        .path
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("");
    let dir = policy.path.parent().map(Path::to_path_buf);
    if !substrat_policy::valid_role_name(stem) || dir.is_none() {
        return Err(TurnError::Container(format!(
            "the role's policy {} is not NAME.toml with a plain name",
            policy.path.display()
        )));
    }
    Ok((stem.to_string(), dir))
}

/// Writes `DIR/oci.toml`, substrat-oci's configuration for this agent's
/// containers: where the role's policy is, where reports go, and the
/// agent's binds and home, which the policy's Landlock rules allow as
/// under substrat-run; returns its path.
fn write_runtime_config(
    dir: &Path,
    policy_dir: Option<PathBuf>,
    binds: &[AgentBind],
    home: &Path,
    plan: &substrat_sandbox::plan::LaunchPlan,
) -> Result<PathBuf, TurnError> {
    let mode = |access: Access| if access == Access::Rw { "rw" } else { "ro" };
    let mut agent_binds = vec![GrantedBind {
        target: home.to_path_buf(),
        mode: "rw",
        socket: false,
        source: None,
    }];
    agent_binds.extend(binds.iter().map(|b| {
        let socket = std::fs::metadata(&b.source)
            .is_ok_and(|m| std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()));
        GrantedBind {
            target: b.target.clone(),
            mode: mode(b.access),
            socket,
            source: socket.then(|| b.source.clone()),
        }
    }));
    // Exactly the sources of the plan's binds, as they resolve now (the
    // launcher judges each again on the descriptor it mounts).
    let allow_host_paths: Vec<PathBuf> = plan
        .mounts
        .iter()
        .filter_map(|step| match step {
            MountStep::Bind { source, .. } => source.canonicalize().ok(),
            _ => None,
        })
        .collect();
    let file = RuntimeFile {
        policy_dir,
        report_dir: dir.join("reports"),
        agent_binds,
        idmap_host_paths: allow_host_paths.clone(),
        allow_host_paths,
    };
    let path = dir.join("oci.toml");
    let text =
        toml::to_string(&file).map_err(|e| TurnError::Container(format!("oci.toml: {e}")))?;
    std::fs::create_dir_all(dir)
        .and_then(|()| std::fs::write(&path, text))
        .map_err(|source| TurnError::File {
            action: "write",
            path: path.clone(),
            source,
        })?;
    Ok(path)
}
