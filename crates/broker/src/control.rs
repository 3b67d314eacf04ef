//! The control protocol between the CLI and the daemon: one JSON request
//! per line on the control socket, one JSON response per line.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{LazyLock, Mutex};
use std::time::Instant;

use crate::broker::{Broker, CreateError, NewAgent};
use crate::locks::LockAnyway;
use crate::store::Agent;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Request {
    Create {
        name: String,
        role: String,
        parent: Option<String>,
        workspace: Option<String>,
        #[serde(default)]
        provider: Option<String>,
    },
    /// A root agent with a first turn.
    Spawn {
        name: String,
        role: String,
        workspace: String,
        model: Option<String>,
        #[serde(default)]
        provider: Option<String>,
        instructions: String,
        /// The role's arguments (`--arg k=v`), for its resolve.
        #[serde(default)]
        args: crate::roles::RoleArgs,
    },
    Suspend {
        name: String,
    },
    Resume {
        name: String,
    },
    Kill {
        name: String,
    },
    /// Upstream servers, their tools and pins.
    Tools,
    /// Pin a quarantined tool's current definition.
    ApproveTool {
        server: String,
        tool: String,
        /// The definition's hash as `tools list` shows it (12+ characters).
        hash: String,
    },
    /// Switch an upstream server on or off (`tools enable|disable`).
    SwitchServer {
        server: String,
        enabled: bool,
    },
    /// Begin `tools login SERVER` (OAuth): the URL to open.
    OauthLogin {
        server: String,
    },
    /// Wait for the end of the login begun.
    OauthLoginWait {
        server: String,
    },
    /// Revoke and delete a server's OAuth tokens.
    OauthLogout {
        server: String,
    },
    List,
    Inspect {
        name: String,
    },
    Send {
        name: String,
        text: String,
    },
    Remove {
        name: String,
    },
    /// A client certificate for the agent's relays on other hosts (mutual
    /// TLS); `replace` revokes its earlier ones.
    Cert {
        name: String,
        #[serde(default)]
        replace: bool,
    },
    /// The team's certificate authorities: `show`, `rotate` or `retire`.
    TeamCa {
        action: TeamCaAction,
    },
}

/// What `team ca` does.
#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TeamCaAction {
    Show,
    Rotate,
    Retire,
}

/// `{"ok": true, ...}` or `{"ok": false, "error": CODE, "message": ...}`.
pub fn ok(mut body: Value) -> Value {
    if let Value::Object(map) = &mut body {
        map.insert("ok".into(), Value::Bool(true));
    }
    body
}

pub fn refused(code: &str, message: impl Into<String>) -> Value {
    serde_json::json!({"ok": false, "error": code, "message": message.into()})
}

fn agent_json(broker: &Broker, agent: &Agent) -> Value {
    let parent = agent
        .parent_id
        .as_deref()
        .and_then(|id| broker.agent(id).ok().flatten())
        .map(|p| p.name);
    let status = broker.status(agent).ok();
    let usage = broker.store().model_usage(&agent.id).ok();
    // Its latest turn, without its texts (`inspect` has those): what the
    // live view shows as the turn it is in and for how long.
    let turn = broker
        .store()
        .recent_turns(&agent.id, 1)
        .ok()
        .and_then(|turns| turns.into_iter().next())
        .map(|t| {
            json!({"turn_id": t.id, "kind": t.kind, "status": t.status,
                   "queued_at_ms": t.created_at, "started_at_ms": t.started_at,
                   "finished_at_ms": t.finished_at, "error": t.error,
                   "failure": t.notes["failure"]["reason"], "model": t.notes["model"]})
        });
    // The model the agent asks for, else the one its CLI said it ran.
    let reported = agent.model.is_none();
    let model = agent
        .model
        .clone()
        .map(Value::String)
        .or_else(|| turn.as_ref().map(|t| t["model"].clone()))
        .unwrap_or(Value::Null);
    let reported = reported && !model.is_null();
    json!({
        "id": agent.id, "name": agent.name, "role": agent.role, "parent": parent,
        "workspace": agent.workspace, "depth": agent.depth, "model": model,
        "model_reported": reported,
        "provider": broker.provider_of(agent),
        "state": status.as_ref().map(|s| s.state.as_str()),
        "reason": status.as_ref().and_then(|s| s.reason.as_deref()),
        "session_id": status.as_ref().and_then(|s| s.session_id.as_deref()),
        "queued_turns": status.as_ref().map(|s| s.queued_turns),
        "socket": broker.socket_path(&agent.id),
        "model_usage": usage,
        "tokens_per_day": broker.policy_of(agent).and_then(|p| p.policy.model.tokens_per_day),
        "layer_bytes": layer_bytes(broker, agent),
        "turn": turn,
    })
}

/// What the agent's workspace layer holds on the disk (overlay roles), or
/// null when it has none.
fn layer_bytes(broker: &Broker, agent: &Agent) -> Option<u64> {
    let dir = crate::turns::layer_dir(broker.state_dir(), &agent.id);
    layer_size(&dir, Instant::now(), SLOW_WALK)
}

/// How long a layer's size is shown before its layer is walked again,
/// when the walk was slow (SLOW_WALK or longer; a quick one is repeated).
const LAYER_SIZE_TTL: std::time::Duration = std::time::Duration::from_secs(30);
const SLOW_WALK: std::time::Duration = std::time::Duration::from_millis(50);

/// Layers' sizes from slow walks: (when, size), by layer directory.
type LayerSizes = HashMap<PathBuf, (Instant, Option<u64>)>;
static LAYER_SIZES: LazyLock<Mutex<LayerSizes>> = LazyLock::new(Mutex::default);

/// The size of the layer at `dir` as of `now`: a walk of every file in
/// it; one that took `slow` or longer is reused for LAYER_SIZE_TTL.
/// `agent list` is asked every second by `top`, and an agent's layer may
/// hold a million small files (300,000 took 1.2 s to walk here): that
/// must not keep the daemon's disk busy while top is open.
fn layer_size(dir: &Path, now: Instant, slow: std::time::Duration) -> Option<u64> {
    if let Some((at, size)) = LAYER_SIZES.lock_anyway().get(dir)
        && now.saturating_duration_since(*at) < LAYER_SIZE_TTL
    {
        return *size;
    }
    let walk = Instant::now();
    let size = substrat_layer::Layer::open(dir).and_then(|l| l.size()).ok();
    let mut sizes = LAYER_SIZES.lock_anyway();
    // Removed agents' layers go with their entries' age.
    sizes.retain(|_, (at, _)| now.saturating_duration_since(*at) < LAYER_SIZE_TTL);
    if walk.elapsed() >= slow {
        sizes.insert(dir.to_path_buf(), (now, size));
    }
    size
}

/// Carries out one control request against the broker.
pub fn handle(broker: &std::sync::Arc<Broker>, request: Request) -> Value {
    let result = match request {
        Request::Create {
            name,
            role,
            parent,
            workspace,
            provider,
        } => create(
            broker,
            parent,
            NewAgent {
                name,
                role,
                workspace,
                provider,
                ..NewAgent::default()
            },
        ),
        Request::Spawn {
            name,
            role,
            workspace,
            model,
            provider,
            instructions,
            args,
        } => match uncarried(crate::carried::spawn_refusal(
            Some(&instructions),
            model.as_deref(),
            &args,
        ))
        .and_then(|()| resolve_for_spawn(broker, &role, args))
        {
            Ok(persona) => spawn(
                broker,
                NewAgent {
                    name,
                    role,
                    model,
                    provider,
                    instructions: Some(instructions),
                    persona,
                    ..NewAgent::default()
                },
                &workspace,
            ),
            Err(refusal) => Err(refusal),
        },
        Request::Suspend { name } => suspend(broker, &name),
        Request::Resume { name } => resume(broker, &name),
        Request::Kill { name } => kill(broker, &name),
        Request::Tools => tools(broker),
        Request::ApproveTool { server, tool, hash } => approve_tool(broker, &server, &tool, &hash),
        Request::SwitchServer { server, enabled } => switch_server(broker, &server, enabled),
        Request::OauthLogin { server } => crate::control_oauth::login(broker, &server),
        Request::OauthLoginWait { server } => crate::control_oauth::login_wait(broker, &server),
        Request::OauthLogout { server } => crate::control_oauth::logout(broker, &server),
        Request::List => list(broker),
        Request::Inspect { name } => inspect(broker, &name),
        Request::Send { name, text } => send(broker, &name, &text),
        Request::Remove { name } => remove(broker, &name),
        Request::Cert { name, replace } => cert(broker, &name, replace),
        Request::TeamCa { action } => team_ca(broker, action),
    };
    result.unwrap_or_else(|refusal| refusal)
}

/// What a request answers: the reply, or the refusal to send instead.
type Reply = Result<Value, Value>;

fn find(broker: &Broker, name: &str) -> Result<crate::store::Agent, Value> {
    match broker.agent_named(name) {
        Ok(Some(agent)) => Ok(agent),
        Ok(None) => Err(refused("unknown_agent", format!("no agent named `{name}`"))),
        Err(e) => Err(refused("internal", e.to_string())),
    }
}

/// An agent this daemon runs: what changes an agent (suspend, resume,
/// kill, remove, a certificate of this daemon's authority) is done by the
/// daemon that runs it, which holds its turns, sockets and sessions.
fn find_here(broker: &Broker, name: &str) -> Result<crate::store::Agent, Value> {
    let agent = find(broker, name)?;
    let placements = broker.placements().map_err(internal)?;
    match placements.get(&agent.id) {
        Some(p) if p.here => Ok(agent),
        Some(p) => Err(refused(
            "elsewhere",
            format!(
                "`{name}` runs on daemon {}: ask that daemon",
                p.daemon
                    .as_deref()
                    .or(p.daemon_id.as_deref())
                    .unwrap_or("(none yet)")
            ),
        )),
        None => Err(refused("unknown_agent", format!("no agent named `{name}`"))),
    }
}

/// `new` below the agent named `parent`, in its workspace unless given.
fn create(broker: &Broker, parent: Option<String>, new: NewAgent) -> Reply {
    let parent = parent.as_deref().map(|p| find(broker, p)).transpose()?;
    let workspace = match new.workspace {
        Some(ws) => Some(
            std::fs::canonicalize(&ws)
                .map_err(|e| refused("workspace", format!("workspace {ws}: {e}")))?
                .display()
                .to_string(),
        ),
        None => parent.as_ref().and_then(|p| p.workspace.clone()),
    };
    let agent = broker
        .create_agent(NewAgent {
            parent,
            workspace,
            ..new
        })
        .map_err(create_refusal)?;
    Ok(ok(created_json(broker, &agent)))
}

/// A resolved role's system prompt for a new agent, with the operator's
/// arguments; a static role takes none (refused with the reason).
fn resolve_for_spawn(
    broker: &std::sync::Arc<Broker>,
    role: &str,
    args: crate::roles::RoleArgs,
) -> Result<Option<String>, Value> {
    if !broker.is_resolved_role(role) && args.is_empty() {
        return Ok(None);
    }
    if !broker.roles().contains_key(role) {
        return Err(refused("unknown_role", format!("no role `{role}`")));
    }
    let prompt = broker
        .resolve_role(role, args, None)
        .map_err(|e| refused("role", e.to_string()))?;
    Ok(Some(crate::roles::persona_text(&prompt)))
}

fn spawn(broker: &Broker, request: NewAgent, workspace: &str) -> Reply {
    let workspace = std::fs::canonicalize(workspace)
        .map_err(|e| refused("workspace", format!("workspace {workspace}: {e}")))?;
    if !workspace.is_dir() {
        return Err(refused(
            "workspace",
            format!("workspace {} is not a directory", workspace.display()),
        ));
    }
    let agent = broker
        .create_agent(NewAgent {
            workspace: Some(workspace.display().to_string()),
            ..request
        })
        .map_err(create_refusal)?;
    Ok(ok(created_json(broker, &agent)))
}

/// The agent's new certificate and key (PEM, to the operator on the
/// control socket; the key is not kept) and the authority's certificate.
fn cert(broker: &Broker, name: &str, replace: bool) -> Reply {
    let agent = find_here(broker, name)?;
    let issued = broker
        .agent_credentials(&agent, replace)
        .map_err(|e| refused("certificate", e.to_string()))?;
    let certificates = broker.store().agent_cert_count(&agent.id).ok();
    Ok(ok(json!({
        "name": agent.name, "id": agent.id, "fingerprint": issued.fingerprint,
        "cert": issued.cert, "key": issued.key, "ca": issued.ca,
        "certificates": certificates,
    })))
}

/// `team ca show|rotate|retire`; each answers the authorities after it.
fn team_ca(broker: &Broker, action: TeamCaAction) -> Reply {
    let refuse = |e: crate::BrokerError| refused("team_ca", e.to_string());
    let done = match action {
        TeamCaAction::Show => json!({}),
        TeamCaAction::Rotate => {
            json!({"rotated_to": broker.rotate_team_authority().map_err(refuse)?})
        }
        TeamCaAction::Retire => {
            let (authorities, certificates) = broker.retire_team_authorities().map_err(refuse)?;
            json!({"retired": authorities, "certificates_revoked": certificates})
        }
    };
    let Some(rows) = broker.team_authorities().map_err(refuse)? else {
        return Err(refused(
            "team_ca",
            "this daemon has no team authority: start it with --team-key FILE",
        ));
    };
    let authorities: Vec<Value> = rows
        .iter()
        .map(
            |r| json!({"generation": r.generation, "fingerprint": r.fingerprint, "state": r.state}),
        )
        .collect();
    let mut body = done;
    body["authorities"] = Value::Array(authorities);
    Ok(ok(body))
}

fn suspend(broker: &Broker, name: &str) -> Reply {
    let agent = find_here(broker, name)?;
    let stopped = broker.suspend(&agent).map_err(internal)?;
    Ok(ok(
        json!({"suspended": agent.name, "stopped_running_turn": stopped}),
    ))
}

fn resume(broker: &Broker, name: &str) -> Reply {
    let agent = find_here(broker, name)?;
    let continued = broker.resume(&agent).map_err(create_refusal)?;
    Ok(ok(
        json!({"resumed": agent.name, "continue_turn_queued": continued}),
    ))
}

fn kill(broker: &Broker, name: &str) -> Reply {
    let agent = find_here(broker, name)?;
    let stopped = broker.kill(&agent).map_err(internal)?;
    Ok(ok(
        json!({"killed": agent.name, "stopped_running_turn": stopped}),
    ))
}

fn tools(broker: &Broker) -> Reply {
    let pins = broker.pins().map_err(internal)?;
    Ok(ok(
        json!({"servers": broker.upstreams().report(), "pins": pins}),
    ))
}

fn switch_server(broker: &Broker, server: &str, on: bool) -> Reply {
    use crate::broker::SwitchError;
    use crate::upstream::error::UpstreamError;
    match broker.switch_server(server, on) {
        Ok(changed) => Ok(ok(
            json!({"server": server, "enabled": on, "changed": changed}),
        )),
        Err(SwitchError::Upstream(e @ UpstreamError::Core(_))) => {
            Err(refused("core_server", e.to_string()))
        }
        Err(SwitchError::Upstream(e)) => Err(refused("unknown_server", e.to_string())),
        Err(SwitchError::Broker(e)) => Err(internal(e)),
    }
}

fn approve_tool(broker: &Broker, server: &str, tool: &str, hash: &str) -> Reply {
    match broker.approve_pin(server, tool, hash).map_err(internal)? {
        crate::store::Approval::Approved => Ok(ok(json!({"approved": format!("{server}_{tool}")}))),
        crate::store::Approval::Unknown => Err(refused(
            "unknown_tool",
            format!("no tool `{tool}` has been seen on server `{server}`"),
        )),
        crate::store::Approval::Mismatch(seen) => Err(refused(
            "hash_mismatch",
            format!(
                "the definition of `{tool}` seen now has hash {seen}, not {hash}: review it again (`tools list`)"
            ),
        )),
    }
}

fn list(broker: &Broker) -> Reply {
    let agents = broker.agents().map_err(internal)?;
    let placements = broker.placements().map_err(internal)?;
    let listed: Vec<Value> = agents
        .iter()
        .map(|a| placed_json(broker, a, placements.get(&a.id)))
        .collect();
    Ok(ok(json!({"agents": listed})))
}

/// The agent with where it runs and why; its socket is its daemon's (in
/// that daemon's state directory, on that daemon's host).
fn placed_json(
    broker: &Broker,
    agent: &Agent,
    placement: Option<&crate::broker::Placement>,
) -> Value {
    let mut entry = agent_json(broker, agent);
    entry["daemon"] = json!(placement);
    if let Some(p) = placement {
        entry["socket"] = json!(p.socket);
    }
    entry
}

/// A new agent as `create` and `spawn` answer it: where it went and why.
fn created_json(broker: &Broker, agent: &Agent) -> Value {
    let placement = broker
        .placements()
        .ok()
        .and_then(|mut p| p.remove(&agent.id));
    placed_json(broker, agent, placement.as_ref())
}

fn inspect(broker: &Broker, name: &str) -> Reply {
    let agent = find(broker, name)?;
    let activity = broker.activity(&agent).map_err(internal)?;
    // The system prompt its role resolved to (script roles), once resolved.
    let persona = broker.agent_persona(&agent.id);
    let placement = broker
        .placements()
        .ok()
        .and_then(|mut p| p.remove(&agent.id));
    Ok(ok(
        json!({"agent": placed_json(broker, &agent, placement.as_ref()), "activity": activity,
               "persona": persona, "daemon": placement}),
    ))
}

/// A text no launch can carry, refused (`carried`).
fn uncarried(refusal: Option<String>) -> Result<(), Value> {
    match refusal {
        Some(message) => Err(refused(crate::carried::CODE, message)),
        None => Ok(()),
    }
}

fn send(broker: &Broker, name: &str, text: &str) -> Reply {
    uncarried(crate::carried::refusal("the text", text))?;
    let agent = find(broker, name)?;
    match broker.operator_send(&agent, text).map_err(internal)? {
        Some(id) => Ok(ok(json!({"message_id": id}))),
        None => Err(refused(
            "inbox_full",
            format!("the inbox of `{name}` is full"),
        )),
    }
}

fn remove(broker: &Broker, name: &str) -> Reply {
    let agent = find_here(broker, name)?;
    broker.remove_agent(&agent).map_err(create_refusal)?;
    Ok(ok(json!({"removed": agent.name})))
}

fn internal(e: crate::BrokerError) -> Value {
    match e {
        // Adopted by another daemon since `find_here` looked.
        crate::BrokerError::Store(crate::store::StoreError::Elsewhere(_)) => {
            refused("elsewhere", e.to_string())
        }
        e => refused("internal", e.to_string()),
    }
}

fn create_refusal(e: CreateError) -> Value {
    match e {
        CreateError::Refused(code, message) => refused(code, message),
        CreateError::Broker(e) => internal(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    /// `agent list` is asked every second by `top`, and an agent's layer
    /// may hold a million small files (300,000 took `du` 1.2 s here,
    /// warm): a slow walk is made at most once in LAYER_SIZE_TTL, its size
    /// shown meanwhile (every walk counts as slow here); a quick one is
    /// made at each list, so small layers' sizes stay exact.
    #[test]
    fn a_layer_is_walked_once_in_a_while_not_at_every_list() {
        let dir = tempfile::tempdir().unwrap();
        let (layer_dir, workspace) = (dir.path().join("layer"), dir.path().join("ws"));
        std::fs::create_dir(&workspace).unwrap();
        let layer = substrat_layer::Layer::open_or_create(&layer_dir, &workspace).unwrap();
        let lock = layer.lock().unwrap();
        let turn = layer.begin_turn(&lock).unwrap();
        let upper = layer.upper(turn.number);
        std::fs::write(upper.join("a"), vec![1u8; 64 << 10]).unwrap();
        layer.finish_turn(&turn, &lock).unwrap();
        let start = Instant::now();
        // A quick walk is not kept: the next list walks again.
        let fresh = layer_size(&layer_dir, start, Duration::MAX).unwrap();
        assert!(fresh >= 64 << 10, "{fresh}");
        std::fs::write(upper.join("b"), vec![1u8; 1 << 20]).unwrap();
        let first = layer_size(&layer_dir, start, Duration::ZERO).unwrap();
        assert!(first >= fresh + (1 << 20), "{first}");
        // A slow one is, for LAYER_SIZE_TTL.
        std::fs::write(upper.join("c"), vec![1u8; 1 << 20]).unwrap();
        let soon = start + Duration::from_secs(1);
        assert_eq!(layer_size(&layer_dir, soon, Duration::ZERO), Some(first));
        let later = layer_size(&layer_dir, start + LAYER_SIZE_TTL, Duration::ZERO).unwrap();
        assert!(later >= first + (1 << 20), "{later}");
    }
}
