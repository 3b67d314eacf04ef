//! The warm pool (`daemon --warm --warm-pool ROLE=COUNT`): sandboxes built
//! ahead for agents not made yet, so a new agent's first turn is warm too.
//!
//! A sandbox binds its agent's workspace at its start, and a new agent
//! takes the workspace of the agent that spawns it (or a subdirectory):
//! so the pool is kept per role and per workspace in use. When an agent's
//! turn starts, up to COUNT sandboxes of each pooled role are built for
//! its workspace, CLI and model, each under an id reserved for an agent
//! to come: its directories, its broker socket (bound, not yet served),
//! its configuration files (with an empty persona) and the very launcher
//! command line its first turn would have. A new agent of that kind takes
//! one (`Broker::create_agent`): the reserved id becomes its id, and its
//! first turn finds the sandbox (`WarmSandboxes::sandbox_for`), which is
//! used only if the turn's own command line is the same (else it is
//! released and a sandbox built for the turn). The confinement is the
//! launcher's, from the same command line: nothing is added afterwards.
//!
//! A reserved agent's directory holds a `pooled` marker until an agent
//! takes it: what a daemon left behind (killed) is removed at its next
//! start. Sandboxes nobody took are released after the warm idle time.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use substrat_provider::TurnRequest;

use super::launch::{Prepared, turn_command};
use super::warm::{Warm, WarmLaunch, WarmSandboxes};
use super::{TurnConfig, TurnError, TurnRunner};
use crate::broker::{Broker, PoolWanted, Reserved, SpawnPool};
use crate::store::Agent;

/// The marker of a reserved agent's directory.
const MARKER: &str = "pooled";

/// The kind of agent a sandbox is built for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct PoolKey {
    role: String,
    workspace: String,
    /// The CLI by name (the daemon's default for an agent naming none).
    provider: String,
    model: Option<String>,
}

#[derive(Debug)]
struct Pooled {
    key: PoolKey,
    id: String,
    /// The reserved agent's directory.
    dir: PathBuf,
    warm: Warm,
    listener: Option<std::os::unix::net::UnixListener>,
    built: Instant,
}

/// The pool's sandboxes: ready, being built, and taken by an agent whose
/// first turn has not started yet.
#[derive(Debug, Default)]
pub struct WarmPool {
    /// How many sandboxes to keep per role (and workspace).
    sizes: BTreeMap<String, usize>,
    /// At most this many sandboxes ready or being built in all.
    most: usize,
    default_provider: String,
    ready: Mutex<Vec<Pooled>>,
    building: Mutex<HashMap<PoolKey, usize>>,
    claimed: Mutex<HashMap<String, Warm>>,
    /// Kinds whose last build failed, and when: not tried again for a
    /// while (a launcher that refuses would be started on every turn).
    failed: Mutex<HashMap<PoolKey, Instant>>,
    /// Reserved ids that will never be agents': their gateway sockets are
    /// for the scheduler to forget (it holds the gateway).
    forgotten: Mutex<Vec<String>>,
    /// The daemon's state directory (the reserved directories' parent).
    state_dir: Option<PathBuf>,
}

/// How long a kind whose build failed is left alone.
const RETRY_AFTER: std::time::Duration = std::time::Duration::from_secs(60);

fn locked<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

impl WarmPool {
    /// `sizes`: COUNT per role; `most`: the bound on all of them.
    pub fn new(
        sizes: BTreeMap<String, usize>,
        most: usize,
        default_provider: &str,
        state_dir: &Path,
    ) -> Self {
        Self {
            sizes,
            most,
            default_provider: default_provider.to_string(),
            state_dir: Some(state_dir.to_path_buf()),
            ..Self::default()
        }
    }

    /// The pool's sandboxes ready and being built.
    pub fn counts(&self) -> (usize, usize) {
        let ready = locked(&self.ready).len();
        (ready, locked(&self.building).values().sum())
    }

    /// Sandboxes taken by agents whose first turn has not started yet.
    pub fn claimed_count(&self) -> usize {
        locked(&self.claimed).len()
    }

    pub fn is_empty(&self) -> bool {
        self.sizes.values().all(|&n| n == 0)
    }

    fn key(&self, wanted: &PoolWanted<'_>) -> Option<PoolKey> {
        Some(PoolKey {
            role: wanted.role.to_string(),
            workspace: wanted.workspace?.to_string(),
            provider: wanted
                .provider
                .unwrap_or(&self.default_provider)
                .to_string(),
            model: wanted.model.map(str::to_string),
        })
    }

    /// Counts a build of `key` as started, if the pool wants one more.
    fn start_build(&self, key: &PoolKey) -> bool {
        {
            let mut failed = locked(&self.failed);
            failed.retain(|_, when| when.elapsed() < RETRY_AFTER);
            if failed.contains_key(key) {
                return false;
            }
        }
        let ready = locked(&self.ready);
        let mut building = locked(&self.building);
        let of_key = ready.iter().filter(|p| &p.key == key).count()
            + building.get(key).copied().unwrap_or(0);
        // Taken ones wait for their agent's first turn: counted too.
        let all = ready.len() + building.values().sum::<usize>() + locked(&self.claimed).len();
        let size = self.sizes.get(&key.role).copied().unwrap_or(0);
        if of_key >= size || all >= self.most {
            return false;
        }
        *building.entry(key.clone()).or_default() += 1;
        true
    }

    fn end_build(&self, key: &PoolKey, built: Option<Pooled>) {
        match &built {
            None => locked(&self.failed).insert(key.clone(), Instant::now()),
            Some(_) => locked(&self.failed).remove(key),
        };
        let mut ready = locked(&self.ready);
        let mut building = locked(&self.building);
        if let Some(n) = building.get_mut(key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                building.remove(key);
            }
        }
        ready.extend(built);
    }

    /// The sandbox an agent took, for its first turn.
    pub(super) fn take_claimed(&self, agent_id: &str) -> Option<Warm> {
        locked(&self.claimed).remove(agent_id)
    }

    /// The reserved ids given up since the last call (released, or
    /// their agent not made after all).
    pub(super) fn take_forgotten(&self) -> Vec<String> {
        std::mem::take(&mut *locked(&self.forgotten))
    }

    /// Releases the sandboxes taken by agents whose first turn has not
    /// come within `idle` (suspended, say): it builds a new one.
    pub(super) fn release_idle_claimed(&self, idle: std::time::Duration) {
        locked(&self.claimed).retain(|_, warm| !warm.idle_for(idle));
    }

    /// Releases the sandboxes nobody took within `idle`, and their
    /// reserved directories; their ids are returned.
    pub(super) fn release_idle(&self, idle: std::time::Duration) -> Vec<String> {
        let mut ids = self.release_unclaimed(idle);
        ids.extend(self.take_forgotten());
        ids
    }

    fn release_unclaimed(&self, idle: std::time::Duration) -> Vec<String> {
        let old: Vec<Pooled> = {
            let mut ready = locked(&self.ready);
            let (old, kept) = ready.drain(..).partition(|p| p.built.elapsed() >= idle);
            *ready = kept;
            old
        };
        old.into_iter()
            .map(|p| {
                let Pooled { id, dir, warm, .. } = p;
                // The directory goes once the launcher has ended (it
                // writes there on its way out: the agent's git state).
                tokio::spawn(async move {
                    warm.end().await;
                    let _ = std::fs::remove_dir_all(&dir);
                });
                id
            })
            .collect()
    }
}

impl SpawnPool for WarmSandboxes {
    fn claim(&self, wanted: &PoolWanted<'_>) -> Option<Reserved> {
        let pool = &self.pool;
        let key = pool.key(wanted)?;
        // Moved from ready to claimed under the ready lock (the order
        // `start_build` takes them in), so no count misses it between.
        let mut ready = locked(&pool.ready);
        let at = ready.iter().position(|p| p.key == key)?;
        let Pooled {
            id,
            mut warm,
            listener,
            ..
        } = ready.remove(at);
        // Idle from now: its agent's first turn is on its way.
        warm.touch();
        locked(&pool.claimed).insert(id.clone(), warm);
        Some(Reserved { id, listener })
    }

    fn forget(&self, agent_id: &str) {
        locked(&self.pool.claimed).remove(agent_id);
        locked(&self.pool.forgotten).push(agent_id.to_string());
    }

    fn stored(&self, agent_id: &str) {
        // The directory is the agent's from here; a marker left by a crash
        // before this is harmless (the start keeps an agent's directory).
        if let Some(dir) = self.pool.state_dir.as_ref() {
            let _ = std::fs::remove_file(agent_dir(dir, agent_id).join(MARKER));
        }
    }
}

/// The daemon's warm sandboxes (`daemon --warm`), with their pool: the
/// pooled roles checked (one nobody can have is a mistake to say at
/// start), what a killed daemon's pool left removed, and the pool given
/// to the broker for new agents to claim.
pub(super) fn warm_sandboxes(
    config: &TurnConfig,
    broker: &Arc<Broker>,
) -> std::io::Result<Option<Arc<WarmSandboxes>>> {
    for role in config.warm_pool.keys() {
        let Some(policy) = broker.roles().get(role) else {
            return Err(std::io::Error::other(format!(
                "--warm-pool {role}: no role of that name (see `role list`)"
            )));
        };
        if !super::launch::warm_eligible(config, &policy.policy) {
            return Err(std::io::Error::other(format!(
                "--warm-pool {role}: this role's turns cannot run warm (it needs a pid namespace and a direct workspace)"
            )));
        }
    }
    let Some(idle) = config.warm_idle else {
        return Ok(None);
    };
    // At most as many sandboxes waiting in the pool as turns run at once
    // (and at least one of each role asked for).
    let most = config.slots.max(config.warm_pool.len());
    let pool = WarmPool::new(
        config.warm_pool.clone(),
        most,
        config.providers.default_name(),
        broker.state_dir(),
    );
    let warm = Arc::new(WarmSandboxes::new(idle, pool));
    // A directory whose agent exists is never touched, marker or not.
    sweep(broker.state_dir(), broker.runtime_dir(), |id| {
        !matches!(broker.agent(id), Ok(None))
    });
    if !warm.pool.is_empty() {
        broker.set_spawn_pool(warm.clone());
    }
    Ok(Some(warm))
}

/// Builds what the pool lacks for agents that `near` may spawn (its
/// workspace, CLI and model), in the background.
pub(super) fn refill_near(broker: &Arc<Broker>, runner: &Arc<TurnRunner>, near: &Agent) {
    let Some(warm) = runner.warm.as_ref() else {
        return;
    };
    if warm.pool.is_empty() {
        return;
    }
    let Some(workspace) = near.workspace.clone() else {
        return;
    };
    // Only for an agent that can spawn: a pool built near every agent
    // would mostly wait for nothing.
    if !can_spawn(broker, near) {
        return;
    }
    for role in warm.pool.sizes.keys() {
        let wanted = PoolWanted {
            role,
            workspace: Some(&workspace),
            provider: near.provider.as_deref(),
            model: near.model.as_deref(),
        };
        let Some(key) = warm.pool.key(&wanted) else {
            continue;
        };
        if !warm.pool.start_build(&key) {
            continue;
        }
        let (broker, runner) = (broker.clone(), runner.clone());
        // Spawned from a runtime worker thread, which lives as long as the
        // daemon: the launcher's parent-death signal follows it.
        tokio::spawn(async move {
            let built = build(&broker, &runner, &key).await;
            let pooled = match built {
                Ok(pooled) => Some(pooled),
                Err(why) => {
                    tracing::warn!(role = %key.role, workspace = %key.workspace, reason = %why, "the warm pool could not build a sandbox");
                    None
                }
            };
            if let Some(warm) = runner.warm.as_ref() {
                warm.pool.end_build(&key, pooled);
            }
        });
    }
}

/// Whether `agent` may spawn a child now: its role shows it spawn_agent
/// and its depth is within the role's `spawn_depth` (the children limit is
/// left to the call: a spare sandbox costs less than a count per turn).
fn can_spawn(broker: &Broker, agent: &Agent) -> bool {
    let within_depth = broker.policy_of(agent).is_some_and(|policy| {
        policy
            .policy
            .mcp
            .spawn_depth
            .is_none_or(|most| agent.depth < most)
    });
    within_depth && broker.sees_builtin(agent, "spawn_agent")
}

/// One sandbox for an agent of `key`'s kind, under a new reserved id.
async fn build(broker: &Arc<Broker>, runner: &TurnRunner, key: &PoolKey) -> Result<Pooled, String> {
    let agent = Agent {
        id: uuid::Uuid::new_v4().to_string(),
        name: "(warm pool)".into(),
        role: key.role.clone(),
        parent_id: None,
        workspace: Some(key.workspace.clone()),
        depth: 0,
        created_at: 0,
        model: key.model.clone(),
        provider: Some(key.provider.clone()),
    };
    let dir = agent_dir(broker.state_dir(), &agent.id);
    let made = reserve(broker, runner, &agent, &dir).await;
    match made {
        Ok((warm, listener)) => Ok(Pooled {
            key: key.clone(),
            id: agent.id,
            dir,
            warm,
            listener,
            built: Instant::now(),
        }),
        Err(why) => {
            let _ = std::fs::remove_dir_all(&dir);
            if let Some(models) = &runner.models {
                models.forget(&agent.id);
            }
            Err(why)
        }
    }
}

fn agent_dir(state_dir: &Path, id: &str) -> PathBuf {
    state_dir.join("agents").join(id)
}

/// The reserved agent's directory (marked), socket, files and sandbox.
async fn reserve(
    broker: &Arc<Broker>,
    runner: &TurnRunner,
    agent: &Agent,
    dir: &Path,
) -> Result<(Warm, Option<std::os::unix::net::UnixListener>), String> {
    let config = &runner.config;
    let policy = broker
        .policy_of(agent)
        .ok_or_else(|| format!("no role {}", agent.role))?;
    if !super::launch::warm_eligible(config, &policy.policy) {
        return Err(
            "the role's turns cannot run warm (no pid namespace, or an overlay workspace)".into(),
        );
    }
    // A workspace the role would be refused at creation: no agent could
    // take the sandbox.
    let workspace = agent.workspace.as_deref().unwrap_or_default();
    if let Some(refused) = crate::broker::workspace_refusal(Path::new(workspace), policy) {
        return Err(refused);
    }
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    std::fs::write(dir.join(MARKER), b"").map_err(|e| format!("{}: {e}", dir.display()))?;
    let listener = broker
        .bind_socket_if_served(&agent.id)
        .map_err(|e| e.to_string())?;
    // The persona is the new agent's own, written before its first turn:
    // a script role's is resolved then; an empty one stands in for it
    // (the same files, so the same command line).
    let persona = match broker.is_resolved_role(&agent.role) {
        true => Some(String::new()),
        false => policy.policy.persona.system_prompt.clone(),
    };
    let prepared = Prepared::of(broker, runner, agent, Some(persona))
        .await
        .map_err(|e: TurnError| e.to_string())?;
    let setup = prepared.setup(agent, config);
    let files = prepared
        .files(broker, agent, config, &setup)
        .map_err(|e| e.to_string())?;
    let request = TurnRequest {
        model: agent.model.as_deref(),
        workspace: &prepared.workspace,
        resume: None,
        prompt: "",
    };
    let launch = prepared.launch(agent, &files, &setup);
    let command = turn_command(broker, config, &launch, &request).map_err(|e| e.to_string())?;
    let bound = files.configs.iter().map(|(host, _)| host.clone()).collect();
    let split = WarmLaunch::from_command(&command, bound)
        .ok_or("the launcher's command line is not text")?;
    // Not frozen while it waits: no turn has run in it, so nothing of
    // one can run on; and `Hello` comes before init has finished the
    // sandbox, which a freeze now would stop half-built (its launcher
    // then waits for it past a SIGTERM).
    let socket = super::warm::turns_socket(broker.state_dir(), &agent.id);
    let warm = Warm::start(&split, &socket).await?;
    Ok((warm, listener))
}

/// Removes what a daemon killed with sandboxes in its pool left: reserved
/// directories nobody took (marked, and no agent of that id).
pub fn sweep(state_dir: &Path, runtime_dir: &Path, is_agent: impl Fn(&str) -> bool) {
    let Ok(entries) = std::fs::read_dir(state_dir.join("agents")) else {
        return;
    };
    for entry in entries.flatten() {
        let dir = entry.path();
        // symlink_metadata: a link is never followed here.
        let is_dir = std::fs::symlink_metadata(&dir).is_ok_and(|m| m.is_dir());
        let marked = is_dir && std::fs::symlink_metadata(dir.join(MARKER)).is_ok();
        let id = entry.file_name().to_string_lossy().into_owned();
        if marked && !is_agent(&id) {
            let _ = std::fs::remove_dir_all(&dir);
            // Its sockets: broker (when not in `dir`) and gateway
            // (turns::model), if it was served.
            if runtime_dir != state_dir {
                let _ = std::fs::remove_dir_all(runtime_dir.join("agents").join(&id));
            }
            let gateway = super::model::gateway_dir(runtime_dir);
            let _ = std::fs::remove_file(super::model::gateway_socket(&gateway, &id));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wanted<'a>(role: &'a str, workspace: &'a str, provider: Option<&'a str>) -> PoolWanted<'a> {
        PoolWanted {
            role,
            workspace: Some(workspace),
            provider,
            model: None,
        }
    }

    #[test]
    fn builds_stop_at_each_roles_count_and_at_the_bound() {
        let sizes = [("worker".to_string(), 2), ("reviewer".to_string(), 1)].into();
        let pool = WarmPool::new(sizes, 4, "cursor", Path::new("/nonexistent"));
        let key = |role, ws| pool.key(&wanted(role, ws, None)).unwrap();
        // An agent naming the default CLI wants what one naming none does.
        assert_eq!(
            pool.key(&wanted("worker", "/ws", Some("cursor"))),
            Some(key("worker", "/ws"))
        );
        assert_ne!(
            pool.key(&wanted("worker", "/ws", Some("claude"))),
            Some(key("worker", "/ws"))
        );
        // No workspace: nothing to build for.
        let none = PoolWanted {
            role: "worker",
            workspace: None,
            provider: None,
            model: None,
        };
        assert_eq!(pool.key(&none), None);
        let started: Vec<bool> = [
            ("worker", "/a"),
            ("worker", "/a"),
            ("worker", "/a"),
            ("reviewer", "/a"),
            ("reviewer", "/a"),
            ("nobody", "/a"),
            ("worker", "/b"),
            ("worker", "/b"),
        ]
        .iter()
        .map(|(role, ws)| pool.start_build(&key(role, ws)))
        .collect();
        // Two workers and a reviewer for /a; an unpooled role never; one
        // worker for /b before the bound of four.
        assert_eq!(
            started,
            [true, true, false, true, false, false, true, false]
        );
        // A build that failed makes room again, and its kind waits.
        pool.end_build(&key("worker", "/a"), None);
        assert!(!pool.start_build(&key("worker", "/a")));
        assert!(pool.start_build(&key("worker", "/b")));
    }

    #[test]
    fn a_start_removes_only_reserved_directories_left_behind() {
        let state = tempfile::tempdir().unwrap();
        let agents = state.path().join("agents");
        for (id, marked) in [("left", true), ("agent", false), ("kept", true)] {
            std::fs::create_dir_all(agents.join(id).join("home")).unwrap();
            if marked {
                std::fs::write(agents.join(id).join(MARKER), b"").unwrap();
            }
        }
        // A link to a marked directory elsewhere is not followed.
        let elsewhere = tempfile::tempdir().unwrap();
        std::fs::write(elsewhere.path().join(MARKER), b"").unwrap();
        std::os::unix::fs::symlink(elsewhere.path(), agents.join("link")).unwrap();
        // "kept": an agent's, though its marker stayed (a crash in its claim).
        sweep(state.path(), state.path(), |id| id == "kept");
        assert!(!agents.join("left").exists());
        assert!(agents.join("kept/home").is_dir());
        assert!(agents.join("agent/home").is_dir());
        assert!(elsewhere.path().join(MARKER).exists());
        assert!(agents.join("link").symlink_metadata().is_ok());
    }
}
