//! Placement in the database: what each daemon offers (its free slots,
//! the paths it shares with the others), the live daemons as the planner
//! (crate::placement) sees them, and a new agent handed to the daemon the
//! planner chose, under that daemon's row lock so that it is neither full
//! nor silent when it gets the agent.

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::db::{Db, Engine, args};
use super::{Store, StoreError};
use crate::placement::{Candidate, Plan};

/// What this daemon offers the team's other daemons.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Offer {
    /// The agents it runs at most, counting those made elsewhere; none:
    /// it takes none made elsewhere.
    pub max_agents: Option<u32>,
    /// Directories it reaches as the other daemons declaring them do
    /// (resolved at start).
    pub shared_paths: Vec<PathBuf>,
    /// Its state directory, where its agents' sockets are unless it has
    /// a runtime directory.
    pub state_dir: Option<PathBuf>,
    /// Its runtime directory (`daemon --runtime-dir`), where its agents'
    /// sockets are when it has one.
    pub runtime_dir: Option<PathBuf>,
}

/// How an agent came to the daemon that runs it (`agents.placed_kind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlacedKind {
    /// Made on the daemon that runs it.
    Here,
    /// Made by another daemon and placed on this one.
    Placed,
    /// Taken over from a daemon that stopped answering (or from none).
    Adopted,
    /// Taken over from one on the same host, with a workspace it did not
    /// share: the same directory there, judged at launch only for links.
    AdoptedOnItsHost,
}

impl PlacedKind {
    pub fn as_str(self) -> &'static str {
        match self {
            PlacedKind::Here => "here",
            PlacedKind::Placed => "placed",
            PlacedKind::Adopted => "adopted",
            PlacedKind::AdoptedOnItsHost => "adopted-on-its-host",
        }
    }

    /// A kind as stored; anything else (a database writer's) is judged
    /// as the strictest, placed.
    fn parse(text: &str) -> PlacedKind {
        match text {
            "here" => PlacedKind::Here,
            "adopted" => PlacedKind::Adopted,
            "adopted-on-its-host" => PlacedKind::AdoptedOnItsHost,
            _ => PlacedKind::Placed,
        }
    }
}

/// Where and why an agent runs, as the database records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentDaemon {
    pub agent_id: String,
    pub daemon_id: Option<String>,
    /// Why it runs there (`placed: ...`, `here: ...`, `adopted ...`);
    /// none for agents made before placement.
    pub why: Option<String>,
}

impl Store {
    /// Records the roles this daemon runs (name to `policy_hash`) and
    /// its agent CLIs: only an agent of such a role and CLI is placed
    /// here.
    pub fn declare_runs(
        &self,
        roles: &BTreeMap<String, String>,
        providers: &[String],
    ) -> Result<(), StoreError> {
        let roles = serde_json::to_string(roles).unwrap_or_else(|_| "{}".into());
        let providers = serde_json::to_string(providers).unwrap_or_else(|_| "[]".into());
        self.db.execute(
            "UPDATE daemons SET roles = ?2, providers = ?3 WHERE id = ?1",
            args![self.seat.daemon_id, roles, providers],
        )?;
        Ok(())
    }

    /// Records what this daemon offers (after `register_daemon`).
    pub fn declare_offer(&self, offer: &Offer) -> Result<(), StoreError> {
        let paths: Vec<String> = offer
            .shared_paths
            .iter()
            .map(|p| p.display().to_string())
            .collect();
        let paths = serde_json::to_string(&paths).unwrap_or_else(|_| "[]".into());
        let state_dir = offer.state_dir.as_ref().map(|d| d.display().to_string());
        let runtime_dir = offer.runtime_dir.as_ref().map(|d| d.display().to_string());
        self.db.execute(
            "UPDATE daemons SET max_agents = ?2, shared_paths = ?3, state_dir = ?4, runtime_dir = ?5
             WHERE id = ?1",
            args![
                self.seat.daemon_id,
                offer.max_agents.map(i64::from),
                paths,
                state_dir,
                runtime_dir
            ],
        )?;
        Ok(())
    }

    /// The daemons whose heartbeat is younger than the lease (and not
    /// beyond now plus a lease: a heartbeat set in the future would keep
    /// a daemon alive forever), with the active agents each runs, by id.
    pub fn live_daemons(&self) -> Result<Vec<Candidate>, StoreError> {
        let now = self.db.now_ms()?;
        let rows = self.db.rows(
            &format!(
                "SELECT d.id, d.name, d.max_agents, d.shared_paths, ({ACTIVE_AGENTS_OF} = d.id),
                        d.roles, d.providers
                 FROM daemons d WHERE d.heartbeat_at >= ?1 AND d.heartbeat_at <= ?2 ORDER BY d.id"
            ),
            args![now - self.seat.lease_ms, now + self.seat.lease_ms],
        )?;
        rows.iter()
            .map(|r| {
                let paths: String = r.get(3)?;
                let paths: Vec<String> = serde_json::from_str(&paths).unwrap_or_default();
                let (roles, providers) = runs(&r.get::<String>(5)?, &r.get::<String>(6)?);
                Ok(Candidate {
                    roles,
                    providers,
                    id: r.get(0)?,
                    name: r.get(1)?,
                    max_agents: r.get::<Option<i64>>(2)?.map(slots),
                    agents: slots(r.get::<i64>(4)?),
                    // Another daemon wrote them: only plain absolute paths.
                    shared_paths: paths
                        .iter()
                        .filter_map(|p| crate::placement::valid_declared_path(p))
                        .collect(),
                })
            })
            .collect()
    }

    /// The daemon that runs each agent and why.
    pub fn agent_daemons(&self) -> Result<Vec<AgentDaemon>, StoreError> {
        let rows = self
            .db
            .rows("SELECT id, daemon_id, placed FROM agents ORDER BY id", &[])?;
        rows.iter()
            .map(|r| {
                Ok(AgentDaemon {
                    agent_id: r.get(0)?,
                    daemon_id: r.get(1)?,
                    why: r.get(2)?,
                })
            })
            .collect()
    }

    /// Why one agent runs where it does (none: no such agent, or made
    /// before placement).
    pub fn agent_placement(&self, id: &str) -> Result<Option<String>, StoreError> {
        let row = self
            .db
            .row("SELECT placed FROM agents WHERE id = ?1", args![id])?;
        Ok(match row {
            Some(r) => r.get(0)?,
            None => None,
        })
    }

    /// How one agent came to the daemon that runs it (none: no such
    /// agent, or made before placement).
    pub fn agent_placed_kind(&self, id: &str) -> Result<Option<PlacedKind>, StoreError> {
        let row = self
            .db
            .row("SELECT placed_kind FROM agents WHERE id = ?1", args![id])?;
        Ok(match row {
            Some(r) => r.get::<Option<String>>(0)?.map(|k| PlacedKind::parse(&k)),
            None => None,
        })
    }

    /// The daemon that runs one agent (none: no such agent, or none runs
    /// it).
    pub fn agent_daemon(&self, id: &str) -> Result<Option<String>, StoreError> {
        let row = self
            .db
            .row("SELECT daemon_id FROM agents WHERE id = ?1", args![id])?;
        Ok(match row {
            Some(r) => r.get(0)?,
            None => None,
        })
    }

    /// The directory each daemon's agents' sockets are under, by id: its
    /// runtime directory if it declared one, else its state directory
    /// (each used only when it is a plain absolute path without control
    /// characters: a runtime directory that is not is not replaced by the
    /// state directory, where its sockets are not).
    pub fn daemon_socket_dirs(&self) -> Result<Vec<(String, PathBuf)>, StoreError> {
        let rows = self.db.rows(
            "SELECT id, COALESCE(runtime_dir, state_dir) FROM daemons
             WHERE state_dir IS NOT NULL OR runtime_dir IS NOT NULL",
            &[],
        )?;
        let mut dirs = Vec::new();
        for r in &rows {
            let dir: String = r.get(1)?;
            if let Some(dir) = crate::placement::valid_declared_path(&dir) {
                dirs.push((r.get(0)?, dir));
            }
        }
        Ok(dirs)
    }
}

/// The agents that hold a slot of the daemon compared with (`... = id`):
/// not failed (a killed or failed agent runs no turns; a removed one has
/// no row). A suspended agent keeps its slot: it may be resumed.
const ACTIVE_AGENTS_OF: &str =
    "SELECT COUNT(*) FROM agents a WHERE a.state <> 'failed' AND a.daemon_id";

/// Of the agents a daemon may adopt (`found`: each with the daemon that
/// ran it, none for never assigned; `silent`: whether each such daemon is
/// still silent, its row locked), the first `limit` that `me` can run
/// (crate::placement::may_adopt); the others wait for a daemon that can.
/// An agent of a daemon without a row declared no policy: not adopted.
/// An agent no daemon ran is taken by a daemon that runs its role. A
/// daemon without a row of its own adopts nothing.
pub(super) fn adoptable(
    tx: &Db,
    me: &str,
    found: Vec<(super::Agent, Option<String>)>,
    silent: &std::collections::HashMap<String, bool>,
    limit: usize,
) -> Result<Vec<(super::Agent, Option<String>, PlacedKind)>, StoreError> {
    let Some(here) = daemon_row(tx, me)? else {
        return Ok(Vec::new());
    };
    let mut judged = std::collections::HashMap::new();
    for old in silent.keys() {
        judged.insert(old.clone(), daemon_row(tx, old)?);
    }
    let unknown = Candidate {
        id: String::new(),
        name: String::new(),
        max_agents: None,
        agents: 0,
        shared_paths: Vec::new(),
        roles: BTreeMap::new(),
        providers: Vec::new(),
    };
    // An agent no daemon runs (from before placement, or a database
    // writer's NULL) has no policy to compare: taken only by a daemon
    // that runs its role at all, and its CLI.
    let can_run = |agent: &super::Agent, from: &Option<String>| match from {
        None => {
            here.roles.contains_key(&agent.role)
                && agent
                    .provider
                    .as_deref()
                    .is_none_or(|p| here.providers.iter().any(|q| q == p))
        }
        Some(old) if silent.get(old) != Some(&true) => false,
        Some(old) => {
            let from = judged.get(old).and_then(Option::as_ref).unwrap_or(&unknown);
            crate::placement::may_adopt(&here, from, agent)
        }
    };
    let kind = |agent: &super::Agent, from: &Option<String>| {
        let from = from
            .as_ref()
            .and_then(|old| judged.get(old))
            .and_then(Option::as_ref);
        match from {
            Some(from) if crate::placement::adopted_on_its_host(from, agent) => {
                PlacedKind::AdoptedOnItsHost
            }
            _ => PlacedKind::Adopted,
        }
    };
    Ok(found
        .into_iter()
        .filter(|(agent, from)| can_run(agent, from))
        .take(limit)
        .map(|(agent, from)| {
            let kind = kind(&agent, &from);
            (agent, from, kind)
        })
        .collect())
}

/// A daemon's row as placement and adoption judge it, alive or not
/// (none: no such row). Its agents are not counted.
pub(super) fn daemon_row(tx: &Db, id: &str) -> Result<Option<Candidate>, StoreError> {
    let row = tx.row(
        "SELECT name, max_agents, shared_paths, roles, providers FROM daemons WHERE id = ?1",
        args![id],
    )?;
    let Some(r) = row else {
        return Ok(None);
    };
    let paths: Vec<String> = serde_json::from_str(&r.get::<String>(2)?).unwrap_or_default();
    let (roles, providers) = runs(&r.get::<String>(3)?, &r.get::<String>(4)?);
    Ok(Some(Candidate {
        id: id.to_owned(),
        name: r.get(0)?,
        max_agents: r.get::<Option<i64>>(1)?.map(slots),
        agents: 0,
        shared_paths: paths
            .iter()
            .filter_map(|p| crate::placement::valid_declared_path(p))
            .collect(),
        roles,
        providers,
    }))
}

/// The roles and providers a daemon declared (unreadable: none).
fn runs(roles: &str, providers: &str) -> (BTreeMap<String, String>, Vec<String>) {
    (
        serde_json::from_str(roles).unwrap_or_default(),
        serde_json::from_str(providers).unwrap_or_default(),
    )
}

/// A count or a declared maximum as slots: a negative one is none.
fn slots(n: i64) -> u32 {
    u32::try_from(n.max(0)).unwrap_or(u32::MAX)
}

/// Inside the new agent's transaction: the daemon it goes to and why. The
/// planner's choice holds only if, under its row's lock, that daemon is
/// still alive (a lease's worth of heartbeat) and has a free slot; an
/// adoption of its agents takes the same lock, and so do other daemons
/// placing on it at once, which then count this agent. Otherwise the
/// agent stays on `me`, saying why.
pub(super) fn settle(
    tx: &Db,
    me: &str,
    lease_ms: i64,
    agent: &super::Agent,
    plan: Option<&Plan>,
) -> Result<(String, Option<String>), StoreError> {
    let Some(plan) = plan else {
        return Ok((me.to_owned(), None));
    };
    if plan.here {
        return Ok((me.to_owned(), Some(plan.reason.clone())));
    }
    let lock = match tx.engine() {
        Engine::Postgres => " FOR UPDATE",
        Engine::Sqlite => "",
    };
    let target = tx.row(
        &format!(
            "SELECT heartbeat_at, max_agents, name, roles, providers FROM daemons WHERE id = ?1{lock}"
        ),
        args![plan.daemon_id],
    )?;
    let Some(target) = target else {
        return Ok((
            me.to_owned(),
            Some("here: the daemon chosen is gone".into()),
        ));
    };
    let (beat, max, name): (i64, Option<i64>, String) =
        (target.get(0)?, target.get(1)?, target.get(2)?);
    let (roles, providers) = runs(&target.get::<String>(3)?, &target.get::<String>(4)?);
    let runs_it = crate::placement::runs_role(
        &roles,
        &providers,
        &agent.role,
        &plan.policy_hash,
        agent.provider.as_deref(),
    );
    if !runs_it {
        return Ok((
            me.to_owned(),
            Some(format!(
                "here: daemon {name}, chosen, does not run role {} as here",
                agent.role
            )),
        ));
    }
    let now = tx.now_ms()?;
    if beat < now - lease_ms || beat > now + lease_ms {
        return Ok((
            me.to_owned(),
            Some(format!("here: daemon {name}, chosen, stopped answering")),
        ));
    }
    let agents: i64 = tx
        .one(&format!("{ACTIVE_AGENTS_OF} = ?1"), args![plan.daemon_id])?
        .get(0)?;
    if max.is_none_or(|max| agents >= max.max(0)) {
        return Ok((
            me.to_owned(),
            Some(format!("here: daemon {name}, chosen, was full by then")),
        ));
    }
    Ok((plan.daemon_id.clone(), Some(plan.reason.clone())))
}
