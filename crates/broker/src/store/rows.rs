//! The rows the store reads and writes, and how a row maps to each.

use serde::Serialize;

use super::StoreError;
use super::db::Row;

pub use super::states::{
    AgentState, MessageKind, MessageStatus, PinStatus, StoredState, TurnKind, TurnStatus,
};

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Agent {
    pub id: String,
    pub name: String,
    pub role: String,
    pub parent_id: Option<String>,
    pub workspace: Option<String>,
    /// 0 for a root agent, parent's depth + 1 below.
    pub depth: u32,
    pub created_at: i64,
    /// The model its turns ask for (`--model`); none: the provider's default.
    pub model: Option<String>,
    /// The agent CLI its turns run (`--provider`); none: the daemon's default.
    pub provider: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Message {
    pub id: String,
    pub from_id: String,
    pub from_name: String,
    pub to_id: String,
    pub text: String,
    pub sync: bool,
    pub kind: MessageKind,
    pub status: MessageStatus,
    pub created_at: i64,
    /// The id the sender was given: the message's own, or its broadcast's.
    pub thread: String,
}

/// Who sent a message: an agent, or the operator through the CLI.
#[derive(Debug, Clone)]
pub struct Sender<'a> {
    pub id: &'a str,
    pub name: &'a str,
}

/// What a new agent starts with (`Store::insert_new_agent`).
#[derive(Debug, Default)]
pub struct AgentStart<'a> {
    /// The dedupe key of the spawn_agent call that made it.
    pub created_by: Option<&'a str>,
    pub persona: Option<&'a str>,
    /// Its role's arguments, as JSON.
    pub role_args: Option<&'a str>,
    /// Its instructions, delivered as its first turn.
    pub first: Option<NewMessage<'a>>,
    /// Where the planner would run it (none: here, no reason recorded).
    pub placement: Option<&'a crate::placement::Plan>,
}

#[derive(Debug)]
pub struct NewMessage<'a> {
    pub from: Sender<'a>,
    pub to_id: &'a str,
    pub text: &'a str,
    pub sync: bool,
    pub kind: MessageKind,
    /// Where it goes: the recipient's inbox, or a turn of its own.
    pub delivery: Delivery,
    /// The id the sender knows it by, when not the message's own (broadcast).
    pub thread: Option<&'a str>,
    /// Sending again with the same key (a turn re-run after a crash) finds
    /// the first message instead of queueing a second one.
    pub dedupe_key: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// Waits for `check_inbox`.
    Inbox,
    /// Becomes the prompt of the recipient's next turn.
    Turn,
}

impl Delivery {
    pub(super) fn status(self) -> MessageStatus {
        match self {
            Self::Inbox => MessageStatus::Queued,
            Self::Turn => MessageStatus::Turn,
        }
    }
}

/// A turn taken from the queue to run now.
#[derive(Debug, Clone)]
pub struct ClaimedTurn {
    pub id: String,
    pub agent: Agent,
    /// The message the turn delivers (none: a `resume` turn with `prompt`).
    pub message: Option<Message>,
    pub prompt: Option<String>,
    /// The agent's session, continued with `--resume`.
    pub session_id: Option<String>,
    pub attempt: u32,
}

/// How a turn ended, to be recorded with what follows from it.
#[derive(Debug, Clone)]
pub struct TurnFinish<'a> {
    pub turn_id: &'a str,
    pub session_id: Option<&'a str>,
    pub outcome: TurnOutcome,
    /// JSON: the tool calls the broker saw, the stream's odd lines.
    pub tool_calls: String,
    pub notes: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TurnOutcome {
    /// The turn's answer.
    Done { result: String },
    /// The turn failed; the agent is marked failed with this reason.
    Failed { reason: String },
}

/// Whether an upstream tool may be offered: its definition is the one
/// approved, or it is held back (with why).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "state", content = "reason", rename_all = "lowercase")]
pub enum PinState {
    Approved,
    /// Not listed, calls refused, until `tools approve`.
    Quarantined(String),
}

/// Something a turn did that took effect (and that a re-run must not do
/// again).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TurnEffect {
    /// A message (or one recipient of a broadcast) sent.
    Message {
        kind: MessageKind,
        to: String,
        text: String,
    },
    /// An agent spawned.
    Spawned { name: String },
}

/// What `tools approve` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Approval {
    Approved,
    /// Never seen on that server.
    Unknown,
    /// The definition seen now has another hash (given in full).
    Mismatch(String),
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PinRow {
    pub server: String,
    pub tool: String,
    pub state: PinStatus,
    pub reason: Option<String>,
    pub approved_hash: Option<String>,
    pub seen_hash: String,
}

/// What an agent is doing, derived from its turns and stored state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AgentStatus {
    pub state: AgentState,
    pub reason: Option<String>,
    pub session_id: Option<String>,
    pub queued_turns: u32,
    pub awaiting_replies: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TurnRecord {
    pub id: String,
    pub kind: TurnKind,
    pub prompt: String,
    pub status: TurnStatus,
    pub attempts: u32,
    pub created_at: i64,
    pub started_at: Option<i64>,
    pub finished_at: Option<i64>,
    pub result: Option<String>,
    pub error: Option<String>,
    pub tool_calls: serde_json::Value,
    pub notes: serde_json::Value,
}

pub(super) fn agent_row(row: &Row) -> Result<Agent, StoreError> {
    Ok(Agent {
        id: row.get(0)?,
        name: row.get(1)?,
        role: row.get(2)?,
        parent_id: row.get(3)?,
        workspace: row.get(4)?,
        depth: row.get(5)?,
        created_at: row.get(6)?,
        model: row.get(7)?,
        provider: row.get(8)?,
    })
}

pub(super) fn message_row(row: &Row) -> Result<Message, StoreError> {
    Ok(Message {
        id: row.get(0)?,
        from_id: row.get(1)?,
        from_name: row.get(2)?,
        to_id: row.get(3)?,
        text: row.get(4)?,
        sync: row.get(5)?,
        kind: row.get(6)?,
        status: row.get(7)?,
        created_at: row.get(8)?,
        thread: row.get(9)?,
    })
}

/// How many columns `AGENT_COLUMNS` names (the next one's index).
pub(super) const AGENT_COLUMN_COUNT: usize = 9;
pub(super) const AGENT_COLUMNS: &str =
    "id, name, role, parent_id, workspace, depth, created_at, model, provider";
pub(super) const MESSAGE_COLUMNS: &str =
    "id, from_id, from_name, to_id, text, sync, kind, status, created_at, COALESCE(thread, id)";
