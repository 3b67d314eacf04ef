//! Where a new agent runs (issue 42): the daemon with the most free slots
//! among the live daemons that reach its workspace, else the daemon where
//! it was made. Pure: the store gathers the candidates and acts on the
//! plan under its locks (`Store::insert_new_agent`).

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

/// A live daemon of the team as the planner sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub id: String,
    /// Host and state directory, for the reason shown to operators.
    pub name: String,
    /// The agents it offers to run (`daemon --max-agents`); none: it
    /// takes no agents made elsewhere.
    pub max_agents: Option<u32>,
    /// The agents it runs now.
    pub agents: u32,
    /// The directories it reaches as every other daemon declaring them
    /// does (`daemon --shared-path`), resolved at its start.
    pub shared_paths: Vec<PathBuf>,
    /// The roles it runs, each with the hash of its resolved policy
    /// (`policy_hash`), and the agent CLIs it runs.
    pub roles: BTreeMap<String, String>,
    pub providers: Vec<String>,
}

impl Candidate {
    /// Whether it runs `role` with the same policy (`hash`) and the
    /// agent's CLI (none: whichever is its default).
    pub fn runs(&self, role: &str, hash: &str, provider: Option<&str>) -> bool {
        runs_role(&self.roles, &self.providers, role, hash, provider)
    }

    /// Its free slots: none declared counts as none free.
    pub fn free(&self) -> u32 {
        self.max_agents
            .map_or(0, |max| max.saturating_sub(self.agents))
    }

    /// The shared paths of its that hold `workspace` (both resolved),
    /// compared by components: `/srv/shared-evil` is not under
    /// `/srv/shared`.
    fn reaching<'a>(&'a self, workspace: &'a Path) -> impl Iterator<Item = &'a Path> + 'a {
        self.shared_paths
            .iter()
            .map(PathBuf::as_path)
            .filter(move |shared| is_under(workspace, shared))
    }

    /// Which of `shared` (the maker's paths holding the workspace) it
    /// declares too, component for component: a daemon declaring `/` or
    /// a parent of the maker's path does not reach it by that.
    fn declaring<'a>(&self, shared: &[&'a Path]) -> Option<&'a Path> {
        shared
            .iter()
            .copied()
            .find(|mine| self.shared_paths.iter().any(|p| p.as_path() == *mine))
    }
}

/// Whether a daemon that declared `roles` (name to policy hash) and
/// `providers` runs an agent of `role` with the policy `hash` and the CLI
/// `provider` (none: whichever is its default). The one check of where an
/// agent may run: placement (planned, then under the chosen daemon's row
/// lock) and adoption.
pub fn runs_role(
    roles: &BTreeMap<String, String>,
    providers: &[String],
    role: &str,
    hash: &str,
    provider: Option<&str>,
) -> bool {
    roles.get(role).is_some_and(|h| h == hash)
        && provider.is_none_or(|p| providers.iter().any(|q| q == p))
}

/// Whether `adopter` may take over `agent` from the daemon that ran it
/// (`from`, as the daemons table holds it): it runs the agent's role with
/// the policy `from` ran it with and its CLI (`runs_role`, as placement),
/// and `from` reached the workspace under a shared path that `adopter`
/// declares too. When `from` declares no policy for the role (it
/// restarted without it, or a build from before declared none), the
/// agent is not adopted: it waits for its daemon, or for one that runs
/// the role with a policy declared. A workspace `from` did not share is
/// adopted only by a daemon on its host (`same_host`). The launch judges
/// an adopted agent's workspace again.
pub fn may_adopt(adopter: &Candidate, from: &Candidate, agent: &crate::store::Agent) -> bool {
    let Some(hash) = from.roles.get(&agent.role) else {
        return false;
    };
    if !adopter.runs(&agent.role, hash, agent.provider.as_deref()) {
        return false;
    }
    let Some(ws) = agent.workspace.as_deref().map(Path::new) else {
        return true;
    };
    let shared: Vec<&Path> = from.reaching(ws).collect();
    if shared.is_empty() {
        return same_host(adopter, from);
    }
    adopter.declaring(&shared).is_some()
}

/// Whether two daemons are on one host, by the host part of their names
/// (`HOST:DIR`): there a workspace is the same directory.
pub fn same_host(a: &Candidate, b: &Candidate) -> bool {
    let host = |c: &Candidate| c.name.split_once(':').map(|(h, _)| h.to_owned());
    host(a).is_some_and(|h| Some(h) == host(b))
}

/// Whether `agent` comes from `from` with a workspace `from` did not
/// share (adopted only on its host: `may_adopt`).
pub fn adopted_on_its_host(from: &Candidate, agent: &crate::store::Agent) -> bool {
    agent
        .workspace
        .as_deref()
        .is_some_and(|ws| from.reaching(Path::new(ws)).next().is_none())
}

/// The planner's answer: the daemon chosen and why, in words an operator
/// reads in `agent list`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub daemon_id: String,
    pub here: bool,
    pub reason: String,
    /// The hash of the agent's role's policy here: the daemon chosen
    /// must run the role with the same (checked under its row lock).
    pub policy_hash: String,
}

/// The hash of a role's resolved policy, as daemons compare them: a
/// daemon runs an agent placed on it only with the very policy the maker
/// judged it with.
pub fn policy_hash(policy: &substrat_policy::model::Policy) -> String {
    use sha2::Digest;
    // A Value's maps are sorted: the same policy hashes the same.
    let text = serde_json::to_value(policy)
        .map(|v| v.to_string())
        .unwrap_or_default();
    let digest = sha2::Sha256::digest(text.as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// The workspace as the daemons compare it: symlinks and `..` resolved
/// (the path must exist); none when it cannot be resolved, which keeps
/// the agent where it is made.
pub fn resolve_workspace(workspace: &str) -> Option<PathBuf> {
    std::fs::canonicalize(workspace).ok()
}

/// A path read from the daemons table (another daemon wrote it): used
/// only when absolute, free of `.`/`..` and of control characters.
pub fn valid_declared_path(text: &str) -> Option<PathBuf> {
    if text.chars().any(char::is_control) {
        return None;
    }
    let path = PathBuf::from(text);
    let plain = path.is_absolute()
        && path
            .components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
    plain.then_some(path)
}

/// Whether `path` is `dir` or below it, both absolute and resolved, by
/// whole components; a path with `..` or `.` left in it is never under.
pub fn is_under(path: &Path, dir: &Path) -> bool {
    let plain = |p: &Path| {
        p.is_absolute()
            && p.components()
                .all(|c| matches!(c, Component::RootDir | Component::Normal(_)))
    };
    plain(path) && plain(dir) && path.starts_with(dir)
}

/// Chooses the daemon for a new agent made on `here`, whose workspace is
/// `workspace` (resolved; none: it has none), among the live `daemons`
/// (`here` among them when it is registered). A daemon other than `here`
/// is chosen only when it has a free slot and the workspace is under a
/// path both it and `here` declare shared, the same path on both (so it
/// is the same directory there); of those, the one with the most free slots, ties broken by
/// name then id. `here` keeps the agent when it has as many free slots
/// as the best of them.
pub fn plan(here: &str, workspace: Option<&Path>, daemons: &[Candidate]) -> Plan {
    let stay = |reason: String| Plan {
        daemon_id: here.to_owned(),
        here: true,
        reason,
        policy_hash: String::new(),
    };
    let me = daemons.iter().find(|d| d.id == here);
    let my_free = me.map_or(0, Candidate::free);
    // The paths declared here that hold the workspace (none: no
    // workspace).
    let shared_here: Option<(&Path, Vec<&Path>)> = match workspace {
        None => None,
        Some(ws) => {
            let shared: Vec<&Path> = me.map(|m| m.reaching(ws).collect()).unwrap_or_default();
            if shared.is_empty() {
                return stay(format!("here: workspace {} not shared", ws.display()));
            }
            Some((ws, shared))
        }
    };
    let mut best: Option<(&Candidate, Option<&Path>)> = None;
    for d in daemons.iter().filter(|d| d.id != here && d.free() > 0) {
        let reach = match &shared_here {
            None => None,
            Some((_, shared)) => match d.declaring(shared) {
                Some(path) => Some(path),
                None => continue,
            },
        };
        let better = best.is_none_or(|(b, _)| {
            (d.free(), std::cmp::Reverse((&d.name, &d.id)))
                > (b.free(), std::cmp::Reverse((&b.name, &b.id)))
        });
        if better {
            best = Some((d, reach));
        }
    }
    let Some((chosen, reach)) = best else {
        return stay(match &shared_here {
            None => "here: no other live daemon has a free slot".into(),
            Some((ws, _)) => format!(
                "here: no other live daemon with a free slot reaches workspace {}",
                ws.display()
            ),
        });
    };
    if my_free >= chosen.free() {
        let max = me.and_then(|m| m.max_agents).unwrap_or(0);
        return stay(format!("here: most free slots ({my_free} of {max})"));
    }
    let slots = format!(
        "most free slots ({} of {})",
        chosen.free(),
        chosen.max_agents.unwrap_or(0)
    );
    Plan {
        daemon_id: chosen.id.clone(),
        here: false,
        reason: match reach {
            Some(path) => format!(
                "placed: {slots} and workspace under shared path {}",
                path.display()
            ),
            None => format!("placed: {slots}, no workspace"),
        },
        policy_hash: String::new(),
    }
}

#[cfg(test)]
#[path = "placement_tests.rs"]
mod tests;
