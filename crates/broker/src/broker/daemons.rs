//! This daemon among the daemons of one database (store::daemons): its
//! heartbeat, the leases it fails, the agents it adopts, and which agents
//! it runs.

use std::time::Duration;

use crate::store::PlacedKind;

use super::*;

/// Where an agent runs, for `agent list` and refusals.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Placement {
    pub daemon_id: Option<String>,
    /// The daemon's name (host and state directory), when it registered.
    pub daemon: Option<String>,
    /// Whether it is this daemon.
    pub here: bool,
    /// Why it runs there (crate::placement's reason, or its adoption);
    /// none for agents made before placement was recorded.
    pub why: Option<String>,
    /// Its socket, in its daemon's state directory (on that daemon's
    /// host), when that daemon declared the directory.
    pub socket: Option<PathBuf>,
}

impl Broker {
    /// Registers this daemon under `name` (seen by operators).
    pub fn register_daemon(&self, name: &str) -> Result<(), BrokerError> {
        Ok(self.store().register_daemon(name)?)
    }

    /// One beat: this daemon is alive and its running turns' leases move
    /// on; up to `adopt` agents no daemon runs become this one's (their
    /// sockets are bound and announced). Only once its own beats have
    /// succeeded for a whole lease does it judge the others (fail the
    /// turns whose lease ran out, adopt the agents of daemons that
    /// stopped): after an outage of the database every daemon's heartbeat
    /// looks old, and the first one back must not take the team.
    /// The sockets of agents another daemon runs are released (a daemon
    /// that was stopped finds its agents adopted: it must not keep serving
    /// them beside their new daemon). Returns the agents adopted.
    pub fn keep_seat(&self, adopt: usize) -> Result<Vec<Agent>, BrokerError> {
        // Lock order: running, released, then the store.
        let running: Vec<String> = self.running().values().map(|t| t.turn_id.clone()).collect();
        let serving = self.events.lock_anyway().is_some();
        let (adopted, elsewhere, placed) = {
            let mut store = self.store();
            let lease = Duration::from_millis(u64::try_from(store.seat().lease_ms).unwrap_or(0));
            // Taken before the beat: the lease it sets starts no later.
            let attempted = Instant::now();
            // A gap of half a lease since the last beat that succeeded
            // (this daemon stopped, or held up) starts the judging over,
            // as a failed beat does: what held it up (its own sessions'
            // locks, kept while it was stopped) may have held the others'
            // beats up too, and their heartbeats look old for that reason.
            if self.last_beat.lock_anyway().elapsed() >= lease / 2 {
                *self.beating_since.lock_anyway() = None;
            }
            if let Err(e) = store.heartbeat(&running) {
                // A beat missed now and then does not stop the judging
                // for good; a gap of half a lease starts it over.
                if self.last_beat.lock_anyway().elapsed() >= lease / 2 {
                    *self.beating_since.lock_anyway() = None;
                }
                return Err(e.into());
            }
            *self.last_beat.lock_anyway() = attempted;
            let since = *self
                .beating_since
                .lock_anyway()
                .get_or_insert_with(Instant::now);
            store.prune_team_minutes()?;
            let judge = since.elapsed() >= lease;
            if judge {
                let expired = store.expire_leases()?;
                if expired > 0 {
                    tracing::warn!(
                        turns = expired,
                        "turns of a daemon that stopped failed: their lease ran out"
                    );
                }
            }
            let adopted = store.adopt_agents(adopt, judge)?;
            let (elsewhere, placed) = if serving {
                self.sockets_to_change(&store)?
            } else {
                Default::default()
            };
            (adopted, elsewhere, placed)
        };
        for agent in elsewhere {
            self.announce(AgentEvent::Released(agent));
        }
        for agent in &adopted {
            tracing::info!(agent = %agent.name, "agent adopted: its daemon stopped answering");
            if let Some(listener) = self.bind_socket_if_served(&agent.id)? {
                self.announce(AgentEvent::Created(agent.clone(), listener));
            }
        }
        self.serve_placed(&placed);
        if !adopted.is_empty() {
            self.wake.notify_one();
        }
        Ok(adopted)
    }

    /// The agents other daemons run now, whose sockets this one may still
    /// serve (it made them, or ran them before another daemon adopted them
    /// while it was stopped or cut off); and those it runs without serving
    /// their sockets yet (placed here by another daemon, crate::placement).
    pub(super) fn sockets_to_change(
        &self,
        store: &Store,
    ) -> Result<(Vec<String>, Vec<Agent>), BrokerError> {
        let me = store.seat().daemon_id.clone();
        let (mut elsewhere, mut unserved) = (Vec::new(), Vec::new());
        for row in store.agent_daemons()? {
            match row.daemon_id {
                Some(d) if d != me => elsewhere.push(row.agent_id),
                Some(_) => unserved.push(row.agent_id),
                None => {}
            }
        }
        let serving = self.serving.lock_anyway().clone();
        let mut placed = Vec::new();
        for id in unserved.into_iter().filter(|id| !serving.contains(id)) {
            placed.extend(store.agent_by_id(&id)?);
        }
        Ok((elsewhere, placed))
    }

    /// This daemon's id in the state database.
    pub fn daemon_id(&self) -> String {
        self.store().seat().daemon_id.clone()
    }

    /// The agents this daemon runs (their sockets are its to serve).
    pub fn own_agents(&self) -> Result<Vec<Agent>, BrokerError> {
        let placements = self.placements()?;
        Ok(self
            .agents()?
            .into_iter()
            .filter(|a| placements.get(&a.id).is_some_and(|p| p.here))
            .collect())
    }

    /// Where each agent runs, by agent id.
    pub fn placements(&self) -> Result<HashMap<String, Placement>, BrokerError> {
        let store = self.store();
        let me = store.seat().daemon_id.clone();
        let names: HashMap<String, String> = store
            .daemons()?
            .into_iter()
            .map(|d| (d.id, d.name))
            .collect();
        let dirs: HashMap<String, PathBuf> = store.daemon_socket_dirs()?.into_iter().collect();
        Ok(store
            .agent_daemons()?
            .into_iter()
            .map(|row| {
                let socket = match row.daemon_id.as_deref() {
                    Some(d) if d == me => Some(self.socket_path(&row.agent_id)),
                    Some(d) => dirs
                        .get(d)
                        .map(|dir| dir.join("agents").join(&row.agent_id).join("broker.sock")),
                    None => None,
                };
                let placement = Placement {
                    daemon: row.daemon_id.as_ref().and_then(|d| names.get(d).cloned()),
                    here: row.daemon_id.as_deref() == Some(me.as_str()),
                    daemon_id: row.daemon_id,
                    why: row.why,
                    socket,
                };
                (row.agent_id, placement)
            })
            .collect())
    }

    /// Where a new agent with `workspace` should run (PostgreSQL, where
    /// other daemons may run it; none with SQLite: here).
    pub(super) fn plan_placement(
        &self,
        workspace: Option<&str>,
        role: &str,
        provider: Option<&str>,
    ) -> Result<Option<crate::placement::Plan>, BrokerError> {
        // PostgreSQL only (as for the counts: other daemons may be there).
        if !self.counts_in_store {
            return Ok(None);
        }
        let me = self.daemon_id();
        let stay = |reason: String| {
            Ok(Some(crate::placement::Plan {
                daemon_id: me.clone(),
                here: true,
                reason,
                policy_hash: String::new(),
            }))
        };
        // The path judged is the path stored and launched: a workspace
        // whose text is not its own resolved path (a link on its way, put
        // there since it was checked) stays here, where the launch refuses
        // it again.
        let resolved = match workspace {
            None => None,
            Some(ws) => match crate::placement::resolve_workspace(ws) {
                Some(path) if path == Path::new(ws) => Some(path),
                Some(_) => return stay("here: workspace changed while judged".into()),
                None => return stay(format!("here: workspace {ws} cannot be resolved")),
            },
        };
        let Some(policy) = self.roles.get(role) else {
            return stay(format!("here: no role {role}"));
        };
        let hash = crate::placement::policy_hash(&policy.policy);
        let mut daemons = self.store().live_daemons()?;
        let first = crate::placement::plan(&me, resolved.as_deref(), &daemons);
        // Only daemons that run the role with the same policy, and the
        // CLI, take it (checked again under the chosen one's row lock).
        daemons.retain(|d| d.id == me || d.runs(role, &hash, provider));
        let mut plan = crate::placement::plan(&me, resolved.as_deref(), &daemons);
        if plan.here && !first.here {
            plan.reason = format!(
                "here: no other live daemon with a free slot runs role {role} as here{}",
                provider.map(|p| format!(" with {p}")).unwrap_or_default()
            );
        }
        plan.policy_hash = hash;
        Ok(Some(plan))
    }

    /// Why a turn of `agent` may not launch here: it was placed here by
    /// another daemon (crate::placement) or adopted from one (the kind
    /// kept in its own column, not read from the words of why), and its
    /// workspace is no longer its own resolved path, or is not under a
    /// path this daemon declared shared (the maker judged it as the
    /// directory under the same path there). None: it may.
    pub fn placed_workspace_refusal(&self, agent: &Agent) -> Result<Option<String>, BrokerError> {
        let Some(ws) = agent.workspace.as_deref() else {
            return Ok(None);
        };
        let kind = self.store().agent_placed_kind(&agent.id)?;
        if !matches!(
            kind,
            Some(PlacedKind::Placed | PlacedKind::Adopted | PlacedKind::AdoptedOnItsHost)
        ) {
            return Ok(None);
        }
        let resolved = crate::placement::resolve_workspace(ws);
        if resolved.as_deref() != Some(Path::new(ws)) {
            return Ok(Some(format!(
                "workspace {ws}, judged by the daemon that placed the agent here, \
                 no longer resolves to itself here; the turn is refused"
            )));
        }
        if kind == Some(PlacedKind::AdoptedOnItsHost) {
            return Ok(None);
        }
        let shared = self.shared_paths.read().unwrap_or_else(|p| p.into_inner());
        if !shared
            .iter()
            .any(|s| crate::placement::is_under(Path::new(ws), s))
        {
            return Ok(Some(format!(
                "workspace {ws} of an agent placed or adopted here is not under a path this daemon \
                 declares shared; the turn is refused"
            )));
        }
        Ok(None)
    }

    /// Binds and announces the sockets of agents this daemon runs now but
    /// does not serve yet (placed here by another daemon). A turn of
    /// theirs claimed here needs its socket before it launches. A socket
    /// that cannot be bound (a full disk) is logged and tried again at
    /// the next beat or claim; the turn launched meanwhile fails as any
    /// launch without its socket does.
    /// An agent removed (or moved) between the beat that found it and its
    /// binding is not served: its row is read again once its socket is
    /// bound, and the socket taken down if it no longer runs here.
    pub(super) fn serve_placed(&self, agents: &[Agent]) {
        for agent in agents {
            match self.bind_socket_if_served(&agent.id) {
                Ok(Some(listener)) if !self.still_runs_here(&agent.id) => {
                    drop(listener);
                    self.serving.lock_anyway().remove(&agent.id);
                    let _ = std::fs::remove_file(self.socket_path(&agent.id));
                    tracing::info!(agent = %agent.name, "placed agent gone before its socket was served");
                }
                Ok(Some(listener)) => {
                    tracing::info!(agent = %agent.name, "agent placed here by another daemon");
                    self.announce(AgentEvent::Created(agent.clone(), listener));
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::error!(agent = %agent.name, error = %e, "cannot open the agent socket")
                }
            }
        }
    }

    /// Whether the agent's row still names this daemon (an error reading
    /// it counts as no: the next beat tries again).
    fn still_runs_here(&self, agent_id: &str) -> bool {
        let store = self.store();
        let me = store.seat().daemon_id.clone();
        matches!(store.agent_daemon(agent_id), Ok(Some(d)) if d == me)
    }

    /// Where other daemons may take its turns (PostgreSQL): once no beat
    /// has succeeded for two thirds of the lease, this daemon stops its
    /// running turns (they go back to the queue) before another daemon
    /// fails them and adopts their agents. Takes no store lock: a beat
    /// blocked on the database must not delay it.
    pub fn stop_turns_if_cut_off(&self, lease: Duration) -> usize {
        if self.last_beat.lock_anyway().elapsed() < lease * 2 / 3 {
            return 0;
        }
        self.stop_all_turns(StopReason::LeaseLost)
    }
}
