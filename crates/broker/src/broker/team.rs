//! The team's tools and rules: who may message whom, send_message,
//! broadcast, check_inbox, spawn_agent, inspect_agent.

use super::*;
use crate::store::MessageKind;

impl Broker {
    /// Parent, children and siblings: whom an agent may message.
    pub(super) fn may_message(from: &Agent, to: &Agent) -> bool {
        let parent = to.parent_id.as_deref() == Some(from.id.as_str())
            || from.parent_id.as_deref() == Some(to.id.as_str());
        let sibling =
            from.id != to.id && from.parent_id.is_some() && from.parent_id == to.parent_id;
        parent || sibling
    }

    /// Whether `boss` is an ancestor of `agent`.
    pub(super) fn is_subordinate(&self, boss: &Agent, agent: &Agent) -> Result<bool, BrokerError> {
        let store = self.store();
        let mut current = agent.parent_id.clone();
        while let Some(id) = current {
            if id == boss.id {
                return Ok(true);
            }
            current = store.agent_by_id(&id)?.and_then(|a| a.parent_id);
        }
        Ok(false)
    }

    pub(super) fn text_too_large(policy: &LoadedPolicy, text: &str) -> Option<ToolOutcome> {
        let limit = policy.policy.mcp.max_message_bytes?;
        (text.len() as u64 > limit.0).then(|| {
            error(
                "message_too_large",
                format!(
                    "the text is {} bytes; this role allows {}",
                    text.len(),
                    limit.0
                ),
            )
        })
    }

    pub(super) fn send_message(
        &self,
        agent: &Agent,
        policy: &LoadedPolicy,
        args: SendMessageArgs,
    ) -> Result<ToolOutcome, BrokerError> {
        if let Some(too_large) = Self::text_too_large(policy, &args.text) {
            return Ok(too_large);
        }
        if let Some(message) = crate::carried::refusal("the text", &args.text) {
            return Ok(error(crate::carried::CODE, message));
        }
        // One answer for "no such agent" and "not in your team": names of
        // other teams are not to be probed.
        let recipient = match self.agent_named(&args.recipient)? {
            Some(r) if Self::may_message(agent, &r) => r,
            _ => {
                return Ok(error(
                    "unknown_recipient",
                    format!(
                        "no agent `{}` in your team (parent, children, siblings)",
                        args.recipient
                    ),
                ));
            }
        };
        let depth = self
            .policy_of(&recipient)
            .and_then(|p| p.policy.mcp.inbox_depth);
        let from = Sender {
            id: &agent.id,
            name: &agent.name,
        };
        // A sync message is the recipient's next turn (its answer comes
        // back as the sender's); an async one waits for check_inbox.
        let message = NewMessage {
            from,
            to_id: &recipient.id,
            text: &args.text,
            sync: args.sync,
            kind: MessageKind::Message,
            delivery: if args.sync {
                Delivery::Turn
            } else {
                Delivery::Inbox
            },
            thread: None,
            dedupe_key: self.effect_key(
                &agent.id,
                &[
                    "send_message",
                    &args.recipient,
                    &args.text,
                    if args.sync { "sync" } else { "async" },
                ],
            ),
        };
        match self.store().send(&[message], depth)?.pop().flatten() {
            Some(id) => {
                self.wake.notify_one();
                Ok(ok(
                    json!({"status": "sent", "message_id": id, "waiting_for_reply": args.sync}),
                ))
            }
            None => Ok(error(
                "inbox_full",
                format!("the inbox of `{}` is full; try again later", recipient.name),
            )),
        }
    }

    pub(super) fn broadcast(
        &self,
        agent: &Agent,
        policy: &LoadedPolicy,
        args: BroadcastArgs,
    ) -> Result<ToolOutcome, BrokerError> {
        if let Some(too_large) = Self::text_too_large(policy, &args.text) {
            return Ok(too_large);
        }
        if let Some(message) = crate::carried::refusal("the text", &args.text) {
            return Ok(error(crate::carried::CODE, message));
        }
        let siblings: Vec<Agent> = match &agent.parent_id {
            Some(parent) => self
                .store()
                .children(parent)?
                .into_iter()
                .filter(|a| a.id != agent.id)
                .collect(),
            // A root agent has no siblings: its team is its children.
            None => self.store().children(&agent.id)?,
        };
        if let Some(fanout) = policy.policy.mcp.broadcast_fanout
            && siblings.len() > fanout as usize
        {
            return Ok(error(
                "broadcast_fanout",
                format!(
                    "{} siblings; this role may broadcast to {fanout}",
                    siblings.len()
                ),
            ));
        }
        let from = Sender {
            id: &agent.id,
            name: &agent.name,
        };
        let key = self.effect_key(&agent.id, &["broadcast", &args.text]);
        let mut store = self.store();
        // A re-run finds its first run's broadcast id.
        let broadcast_id = match (&key, siblings.first()) {
            (Some(key), Some(first)) => store.thread_of(&format!("{key}/{}", first.id))?,
            _ => None,
        }
        .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
        let mut sent = 0;
        let mut undelivered = Vec::new();
        // Each recipient's own inbox depth applies.
        for sibling in &siblings {
            let depth = self
                .policy_of(sibling)
                .and_then(|p| p.policy.mcp.inbox_depth);
            // Each sibling answers in a turn of its own; each answer comes
            // back as its own reply.
            let message = NewMessage {
                from: from.clone(),
                to_id: &sibling.id,
                text: &args.text,
                sync: false,
                kind: MessageKind::Broadcast,
                delivery: Delivery::Turn,
                thread: Some(&broadcast_id),
                dedupe_key: key.as_ref().map(|k| format!("{k}/{}", sibling.id)),
            };
            match store.send(&[message], depth)?.pop().flatten() {
                Some(_) => sent += 1,
                None => undelivered.push(json!({"name": sibling.name, "reason": "inbox_full"})),
            }
        }
        drop(store);
        self.wake.notify_one();
        Ok(ok(
            json!({"status": "sent", "message_id": broadcast_id, "recipient_count": sent, "undelivered": undelivered}),
        ))
    }

    /// At most the role's list limit of messages: the rest stay queued for
    /// the next call, and the answer says how many.
    pub(super) fn check_inbox(
        &self,
        agent: &Agent,
        policy: &LoadedPolicy,
    ) -> Result<ToolOutcome, BrokerError> {
        let limit = policy.policy.mcp.list_entries();
        let (messages, left) = self.store().take_inbox(&agent.id, limit)?;
        let list: Vec<Value> = messages
            .iter()
            .map(|m| json!({"from": m.from_name, "text": m.text, "message_id": m.id}))
            .collect();
        if left > 0 {
            return Ok(ok(json!({"messages": list, "more_queued": left,
                "note": format!("{left} more message(s) queued (mcp.max_list_entries = {limit}): call check_inbox again")})));
        }
        Ok(ok(json!({"messages": list})))
    }

    pub(super) fn spawn_agent(
        &self,
        agent: &Agent,
        policy: &LoadedPolicy,
        args: SpawnAgentArgs,
    ) -> Result<ToolOutcome, BrokerError> {
        let mcp = &policy.policy.mcp;
        let depth = agent.depth + 1;
        if mcp.spawn_depth.is_some_and(|max| depth > max) {
            return Ok(error(
                "spawn_depth",
                format!(
                    "a child of this agent would be at depth {depth}; this role allows {}",
                    mcp.spawn_depth.unwrap_or(0)
                ),
            ));
        }
        let children = self.store().children(&agent.id)?.len();
        if mcp
            .children_per_agent
            .is_some_and(|max| children >= max as usize)
        {
            return Ok(error(
                "children_limit",
                format!("this agent has {children} children, the most its role allows"),
            ));
        }
        if let Some(too_large) = Self::text_too_large(policy, &args.instructions) {
            return Ok(too_large);
        }
        let role_args_json = serde_json::to_string(&args.role_args).unwrap_or_default();
        if let Some(too_large) = Self::text_too_large(policy, &role_args_json) {
            return Ok(too_large);
        }
        // Checked now against what the role declares; resolved at the
        // child's first turn (off this call).
        if !args.role_args.is_empty() || self.is_resolved_role(&args.role) {
            let declared = self
                .role_info(&args.role)
                .map(|info| info.arguments)
                .unwrap_or_default();
            if let Err(e) = crate::roles::check_args(&args.role, &declared, &args.role_args) {
                return Ok(error("role_args", e.to_string()));
            }
        }
        // The child's first turn evaluates its role: counted as the
        // parent's evaluation now, so spawning cannot outrun the cap.
        if self.is_resolved_role(&args.role)
            && let Err(retry_after_ms) = crate::roles::gate::charge(&agent.id)
        {
            return Ok(ToolOutcome::Result {
                body: json!({"status": "rate_limited", "retry_after_ms": retry_after_ms,
                    "message": "too many role evaluations by this agent (a child of a script role counts as one)"}),
                is_error: true,
            });
        }
        let workspace = match (&args.workspace_subdir, &agent.workspace) {
            (None, ws) => ws.clone(),
            (Some(_), None) => {
                return Ok(error(
                    "workspace",
                    "this agent has no workspace to take a subdirectory of",
                ));
            }
            (Some(sub), Some(ws)) => match resolve_subdir(Path::new(ws), sub) {
                Ok(path) => Some(path.display().to_string()),
                Err(e) => return Ok(error("workspace", e.to_string())),
            },
        };
        let mut effect = vec![
            "spawn_agent",
            &args.name,
            &args.role,
            args.workspace_subdir.as_deref().unwrap_or(""),
            args.provider.as_deref().unwrap_or(""),
            &args.instructions,
            &role_args_json,
        ];
        // Last and only when named: a spawn without one keys as before.
        if let Some(model) = &args.model {
            effect.push(model);
        }
        let key = self.effect_key(&agent.id, &effect);
        // A re-run of the turn that made this child finds it.
        if let Some(key) = &key
            && let Some(child) = self.store().agent_created_by(key)?
        {
            return Ok(ok(
                json!({"status": "created", "agent_id": child.id, "name": child.name}),
            ));
        }
        let model = self.child_model(agent, &args.role, args.model);
        let request = NewAgent {
            name: args.name,
            role: args.role,
            parent: Some(agent.clone()),
            workspace,
            model,
            // A child runs the CLI its parent runs unless told otherwise.
            provider: args.provider.or_else(|| agent.provider.clone()),
            instructions: Some(args.instructions),
            created_by: key,
            // A script role is resolved at the child's first turn, with
            // the child as the caller.
            persona: None,
            role_args: args.role_args,
        };
        match self.create_agent(request) {
            Ok(child) => Ok(ok(
                json!({"status": "created", "agent_id": child.id, "name": child.name}),
            )),
            Err(CreateError::Refused(code, message)) => Ok(error(code, message)),
            Err(CreateError::Broker(e)) => Err(e),
        }
    }

    /// The model a child of `role` asks for: the one named, else none
    /// when the role has a default (`create_agent` applies it), else its
    /// parent's (refused there when the role does not allow it).
    fn child_model(&self, parent: &Agent, role: &str, named: Option<String>) -> Option<String> {
        let role_default = self
            .roles
            .get(role)
            .and_then(|r| r.policy.model.default.as_ref());
        match (named, role_default) {
            (Some(model), _) => Some(model),
            (None, Some(_)) => None,
            (None, None) => parent.model.clone(),
        }
    }

    pub(super) fn inspect_agent(
        &self,
        agent: &Agent,
        args: InspectAgentArgs,
    ) -> Result<ToolOutcome, BrokerError> {
        let target = match self.agent_named(&args.name)? {
            Some(t) if self.is_subordinate(agent, &t)? => t,
            _ => {
                return Ok(error(
                    "unknown_subordinate",
                    format!("no subordinate named `{}`", args.name),
                ));
            }
        };
        Ok(ok(self.activity(&target)?))
    }

    /// What `inspect_agent` and `agent inspect` show: the state and the last
    /// messages the agent sent or received, newest first.
    pub fn activity(&self, target: &Agent) -> Result<Value, BrokerError> {
        let store = self.store();
        let recent = store.recent_messages(&target.id, RECENT_MESSAGES)?;
        let queued = store.queued_count(&target.id)?;
        let mut messages = Vec::new();
        for m in recent {
            let (direction, counterpart) = if m.to_id == target.id {
                ("in", m.from_name.clone())
            } else {
                (
                    "out",
                    store
                        .agent_by_id(&m.to_id)?
                        .map(|a| a.name)
                        .unwrap_or_else(|| "(removed)".into()),
                )
            };
            let text: String = m.text.chars().take(500).collect();
            messages.push(
                json!({"direction": direction, "counterpart": counterpart, "text": text,
                "message_id": m.id, "status": m.status, "kind": m.kind, "at_ms": m.created_at}),
            );
        }
        let status = store.agent_status(&target.id)?;
        let turns = store.recent_turns(&target.id, RECENT_TURNS)?;
        drop(store);
        let menu = self.menu(target);
        Ok(json!({
            "name": target.name, "role": target.role, "state": status.state,
            "reason": status.reason, "session_id": status.session_id,
            "queued_messages": queued, "queued_turns": status.queued_turns,
            "awaiting_replies": status.awaiting_replies,
            "recent_turns": turns.iter().map(turn_summary).collect::<Vec<_>>(),
            "recent_messages": messages,
            "tools": menu.entries.iter().map(|e| e.name.as_str()).collect::<Vec<_>>(),
            "dropped_tools": menu.dropped,
        }))
    }

    pub fn status(&self, agent: &Agent) -> Result<AgentStatus, BrokerError> {
        Ok(self.store().agent_status(&agent.id)?)
    }
}

/// A turn as `agent inspect` shows it: prompt and result cut to 500 chars.
pub(super) fn turn_summary(t: &TurnRecord) -> Value {
    let cut = |s: &str| -> String { s.chars().take(500).collect() };
    json!({
        "turn_id": t.id, "kind": t.kind, "status": t.status, "attempts": t.attempts,
        "prompt": cut(&t.prompt), "result": t.result.as_deref().map(cut),
        "error": t.error, "tool_calls": t.tool_calls, "stream_notes": t.notes,
        "queued_at_ms": t.created_at, "started_at_ms": t.started_at, "finished_at_ms": t.finished_at,
    })
}

/// A subdirectory of `workspace`: relative, no `..`, and reached without
/// following any symlink (a link planted on the way is refused, nothing is
/// created outside). Missing components are created.
pub(super) fn resolve_subdir(workspace: &Path, subdir: &str) -> Result<PathBuf, SubdirError> {
    use nix::fcntl::{AT_FDCWD, OFlag, OpenHow, ResolveFlag, openat, openat2};
    use nix::sys::stat::{Mode, mkdirat};
    let relative = Path::new(subdir);
    let refuse = |why| SubdirError::Refused {
        subdir: subdir.to_string(),
        why,
    };
    let fail = |action, errno| SubdirError::Failed {
        subdir: subdir.to_string(),
        action,
        errno,
    };
    if relative.is_absolute() || subdir.is_empty() {
        return Err(refuse("must be a relative path inside your workspace"));
    }
    if relative
        .components()
        .any(|c| !matches!(c, Component::Normal(_)))
    {
        return Err(refuse("may not contain `.` or `..`"));
    }
    let flags = OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_RDONLY;
    let how = OpenHow::new()
        .flags(flags)
        .resolve(ResolveFlag::RESOLVE_NO_SYMLINKS);
    let mut dir = openat2(AT_FDCWD, workspace, how).map_err(|errno| SubdirError::Workspace {
        workspace: workspace.to_path_buf(),
        errno,
    })?;
    for component in relative.components() {
        let name = component.as_os_str();
        dir = match openat(&dir, name, flags, Mode::empty()) {
            Ok(next) => next,
            Err(nix::errno::Errno::ENOENT) => {
                mkdirat(&dir, name, Mode::from_bits_truncate(0o755))
                    .map_err(|e| fail("cannot create", e))?;
                openat(&dir, name, flags, Mode::empty()).map_err(|e| fail("cannot open", e))?
            }
            Err(nix::errno::Errno::ELOOP | nix::errno::Errno::ENOTDIR) => {
                return Err(refuse(
                    "leads outside your workspace (a symlink or a file on the way)",
                ));
            }
            Err(e) => return Err(fail("cannot open", e)),
        };
    }
    Ok(workspace.join(relative))
}

/// Why a `workspace_subdir` cannot be the child's workspace (the spawning
/// agent reads this text).
#[derive(Debug, thiserror::Error)]
pub(super) enum SubdirError {
    #[error("workspace_subdir `{subdir}` {why}")]
    Refused { subdir: String, why: &'static str },
    #[error("your workspace {}: {}", workspace.display(), errno.desc())]
    Workspace {
        workspace: PathBuf,
        errno: nix::errno::Errno,
    },
    #[error("{action} `{subdir}`: {}", errno.desc())]
    Failed {
        subdir: String,
        action: &'static str,
        errno: nix::errno::Errno,
    },
}
