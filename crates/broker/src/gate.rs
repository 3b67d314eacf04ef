//! One agent connection: a line gate in front of rmcp.
//!
//! rmcp drops malformed lines without a word, which would leave a client
//! waiting forever. The gate reads every line first (bounded in size),
//! answers what must be refused with a JSON-RPC error, and passes the rest
//! to rmcp through an in-memory pipe. Identity is checked here too: the
//! connection's agent is fixed by the socket, and a request that names
//! another agent is refused and audited.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use rmcp::ServiceExt;
use rmcp::model::{ClientJsonRpcMessage, ClientRequest, JsonRpcMessage};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::{Notify, mpsc};

use crate::broker::Broker;
use crate::server::AgentHandler;

/// The relay's first line: which agent it was started for.
pub const RELAY_HELLO: &str = "notifications/substrat/relay";

#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    /// Longest accepted line; longer ones are answered with an error and
    /// discarded without being buffered.
    pub max_line: usize,
    /// A client that does not read its responses for this long is dropped.
    pub write_timeout: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self {
            max_line: substrat_mcp_server::GATE_MAX_LINE,
            write_timeout: Duration::from_secs(10),
        }
    }
}

pub fn error_line(id: &Value, code: i64, message: &str) -> Vec<u8> {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
        .to_string()
        .into_bytes()
}

pub(crate) const PARSE_ERROR: i64 = -32700;
pub(crate) const INVALID_REQUEST: i64 = -32600;
const NOT_INITIALIZED: i64 = -32002;
const INVALID_PARAMS: i64 = -32602;

/// The client requests rmcp knows, by its own method constants.
fn standard_method(method: &str) -> bool {
    use rmcp::model::*;
    [
        InitializeResultMethod::VALUE,
        PingRequestMethod::VALUE,
        DiscoverRequestMethod::VALUE,
        CompleteRequestMethod::VALUE,
        SetLevelRequestMethod::VALUE,
        GetPromptRequestMethod::VALUE,
        ListPromptsRequestMethod::VALUE,
        ListResourcesRequestMethod::VALUE,
        ListResourceTemplatesRequestMethod::VALUE,
        ReadResourceRequestMethod::VALUE,
        SubscriptionsListenRequestMethod::VALUE,
        SubscribeRequestMethod::VALUE,
        UnsubscribeRequestMethod::VALUE,
        CallToolRequestMethod::VALUE,
        ListToolsRequestMethod::VALUE,
        ListSkillsRequestMethod::VALUE,
        GetSkillRequestMethod::VALUE,
        ReadResourceDirectoryRequestMethod::VALUE,
    ]
    .contains(&method)
}

/// Serves one connection of `agent_id` until the client leaves or fails.
pub async fn serve_connection<S>(
    broker: Arc<Broker>,
    agent_id: String,
    stream: S,
    limits: ConnectionLimits,
    certificate: Option<String>,
) where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let (mut client_read, mut client_write) = tokio::io::split(stream);
    let (gate_end, rmcp_end) = tokio::io::duplex(1 << 20);
    let (rmcp_read, rmcp_write) = tokio::io::split(rmcp_end);
    let (from_rmcp, mut to_rmcp) = tokio::io::split(gate_end);
    let (out_tx, mut out_rx) = mpsc::channel::<Vec<u8>>(256);
    let closed = Arc::new(Notify::new());

    let handler = AgentHandler::new(broker.clone(), agent_id.clone());
    let rmcp_task = tokio::spawn(async move {
        if let Ok(service) = handler.serve((rmcp_read, rmcp_write)).await {
            let _ = service.waiting().await;
        }
    });
    let pump_tx = out_tx.clone();
    let pump = tokio::spawn(async move {
        let mut lines = BufReader::new(from_rmcp).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            if pump_tx.send(line.into_bytes()).await.is_err() {
                break;
            }
        }
    });
    let writer_closed = closed.clone();
    let writer = tokio::spawn(async move {
        while let Some(mut line) = out_rx.recv().await {
            line.push(b'\n');
            match tokio::time::timeout(limits.write_timeout, client_write.write_all(&line)).await {
                Ok(Ok(())) => {}
                // A client that does not read is dropped; others go on.
                _ => break,
            }
        }
        writer_closed.notify_one();
    });

    let mut gate = Gate::new(broker, agent_id);
    gate.certificate = certificate;
    gate.run(
        &mut client_read,
        &mut to_rmcp,
        &out_tx,
        &closed,
        limits.max_line,
    )
    .await;
    let _ = to_rmcp.shutdown().await;
    drop(out_tx);
    // Give rmcp a moment to answer what it already has.
    let mut pump = pump;
    if tokio::time::timeout(Duration::from_secs(2), &mut pump)
        .await
        .is_err()
    {
        pump.abort();
    }
    rmcp_task.abort();
    // Every sender is gone now: the writer ends once it has written what is
    // queued (a refusal the gate answered last, say), or gives up on a
    // client that does not read.
    let mut writer = writer;
    if tokio::time::timeout(limits.write_timeout, &mut writer)
        .await
        .is_err()
    {
        writer.abort();
    }
}

struct Gate {
    broker: Arc<Broker>,
    agent_id: String,
    /// A relay over TLS: the SHA-256 of the certificate it showed, which
    /// must still be the agent's at every line (replaced, or the agent
    /// removed: the connection is closed).
    certificate: Option<String>,
    agent_name: String,
    initialized: bool,
    seen_ids: HashSet<String>,
}

enum Verdict {
    Forward,
    Reply(Vec<u8>),
    Ignore,
    /// Answer, then close the connection.
    Close(Vec<u8>),
}

impl Gate {
    fn new(broker: Arc<Broker>, agent_id: String) -> Self {
        let agent_name = broker
            .agent(&agent_id)
            .ok()
            .flatten()
            .map(|a| a.name)
            .unwrap_or_default();
        Self {
            broker,
            agent_id,
            certificate: None,
            agent_name,
            initialized: false,
            seen_ids: HashSet::new(),
        }
    }

    async fn run<R, W>(
        &mut self,
        client: &mut R,
        to_rmcp: &mut W,
        out: &mpsc::Sender<Vec<u8>>,
        closed: &Notify,
        max_line: usize,
    ) where
        R: AsyncRead + Unpin,
        W: AsyncWrite + Unpin,
    {
        let mut buf: Vec<u8> = Vec::new();
        let mut chunk = vec![0u8; 8 * 1024];
        let mut skipping = false;
        loop {
            while let Some(pos) = buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = buf.drain(..=pos).collect();
                if std::mem::take(&mut skipping) {
                    continue; // the tail of a line already refused as too long
                }
                let verdict = match self.revoked() {
                    Some(refusal) => refusal,
                    None => self.judge(&line[..line.len() - 1]),
                };
                let keep_going = match verdict {
                    Verdict::Forward => to_rmcp.write_all(&line).await.is_ok(),
                    Verdict::Reply(reply) => out.try_send(reply).is_ok(),
                    Verdict::Ignore => true,
                    Verdict::Close(reply) => {
                        let _ = out.try_send(reply);
                        false
                    }
                };
                if !keep_going {
                    return;
                }
            }
            if buf.len() > max_line {
                if !skipping
                    && out
                        .try_send(error_line(
                            &Value::Null,
                            INVALID_REQUEST,
                            &format!("line longer than {max_line} bytes refused"),
                        ))
                        .is_err()
                {
                    return;
                }
                self.broker
                    .audit_refusal(&self.agent_id, "(protocol)", "line_too_long");
                skipping = true;
                buf.clear();
            }
            let read = tokio::select! {
                read = client.read(&mut chunk) => read,
                _ = closed.notified() => return,
            };
            match read {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
    }

    /// The refusal for a relay whose certificate no longer speaks for its
    /// agent. `agent_id` is the one the certificate names (its URI SAN,
    /// checked at the handshake), so a row moved to another agent fails
    /// here too.
    fn revoked(&self) -> Option<Verdict> {
        let fingerprint = self.certificate.as_deref()?;
        if self.broker.agent_of_certificate(fingerprint).as_deref() == Some(&self.agent_id) {
            return None;
        }
        self.broker
            .audit_refusal(&self.agent_id, "(connect)", "certificate_revoked");
        Some(Verdict::Close(error_line(
            &Value::Null,
            -32000,
            "this certificate speaks for no agent: revoked, or its agent was removed",
        )))
    }

    fn judge(&mut self, raw: &[u8]) -> Verdict {
        let (text, value) = match parse_line(raw) {
            Ok(parsed) => parsed,
            Err(verdict) => return verdict,
        };
        let Value::Object(obj) = &value else {
            let message = if value.is_array() {
                "batch requests are not supported"
            } else {
                "a request must be a JSON object"
            };
            return Verdict::Reply(error_line(&Value::Null, INVALID_REQUEST, message));
        };
        let method = obj.get("method").and_then(Value::as_str);
        let id = obj.get("id");
        if method == Some(RELAY_HELLO) {
            return self.relay_hello(obj.get("params"));
        }
        // Forward only what rmcp will accept: it drops lines it cannot
        // parse as a client message (duplicate keys, a malformed `params`...)
        // without answering, which would leave a client waiting forever.
        let rmcp_accepts = serde_json::from_str::<ClientJsonRpcMessage>(text);
        let (Some(method), Some(id)) = (method, id) else {
            // Notifications and responses get no answer either way.
            return if rmcp_accepts.is_ok() {
                Verdict::Forward
            } else {
                Verdict::Ignore
            };
        };
        if let Some(refusal) = self.refusal(obj, method, id) {
            return refusal;
        }
        match rmcp_accepts {
            // rmcp files a standard method whose params do not fit under its
            // catch-all custom request, then answers without the id.
            Ok(JsonRpcMessage::Request(request))
                if matches!(&request.request, ClientRequest::CustomRequest(_))
                    && standard_method(method) =>
            {
                Verdict::Reply(error_line(
                    id,
                    INVALID_PARAMS,
                    &format!("invalid params for `{method}`"),
                ))
            }
            Ok(_) => Verdict::Forward,
            Err(e) => Verdict::Reply(error_line(
                id,
                INVALID_REQUEST,
                &format!("invalid request: {e}"),
            )),
        }
    }

    /// What refuses a request of this session, in order: an id that is
    /// neither a string nor an integer, a jsonrpc other than 2.0, an id
    /// used before, a call before `initialize`, params naming another
    /// agent (audited), params that are not an object.
    fn refusal(
        &mut self,
        obj: &serde_json::Map<String, Value>,
        method: &str,
        id: &Value,
    ) -> Option<Verdict> {
        if !(id.is_string() || id.is_i64() || id.is_u64()) {
            return Some(Verdict::Reply(error_line(
                &Value::Null,
                INVALID_REQUEST,
                "the id must be a string or an integer",
            )));
        }
        if obj.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
            return Some(Verdict::Reply(error_line(
                id,
                INVALID_REQUEST,
                "jsonrpc must be \"2.0\"",
            )));
        }
        if !self.seen_ids.insert(id.to_string()) {
            return Some(Verdict::Reply(error_line(
                id,
                INVALID_REQUEST,
                "duplicate request id in this session",
            )));
        }
        if !self.initialized && method != "initialize" && method != "ping" {
            return Some(Verdict::Reply(error_line(
                id,
                NOT_INITIALIZED,
                "send initialize first",
            )));
        }
        if method == "initialize" {
            self.initialized = true;
        }
        if let Some(claim) = foreign_identity(obj.get("params"), &self.agent_id, &self.agent_name) {
            self.broker
                .audit_refusal(&self.agent_id, method, &format!("identity_spoof: {claim}"));
            return Some(Verdict::Reply(error_line(
                id,
                INVALID_REQUEST,
                "requests act as the agent of this connection only; naming another agent is refused",
            )));
        }
        if obj.get("params").is_some_and(|p| !p.is_object()) {
            return Some(Verdict::Reply(error_line(
                id,
                INVALID_PARAMS,
                "params must be an object",
            )));
        }
        None
    }

    fn relay_hello(&mut self, params: Option<&Value>) -> Verdict {
        let claimed = params
            .and_then(|p| p.get("agent_id"))
            .and_then(Value::as_str)
            .unwrap_or("");
        if claimed == self.agent_id {
            Verdict::Ignore
        } else {
            self.broker.audit_refusal(
                &self.agent_id,
                "(relay)",
                &format!("relay_agent_id_mismatch: {claimed}"),
            );
            Verdict::Close(error_line(
                &Value::Null,
                INVALID_REQUEST,
                "this socket belongs to another agent than the relay's --agent-id",
            ))
        }
    }
}

/// Keys that would let a request speak for an agent: in `_meta` and in tool
/// arguments. Returns what was claimed when it is not this agent.
pub(crate) fn foreign_identity(
    params: Option<&Value>,
    agent_id: &str,
    agent_name: &str,
) -> Option<String> {
    const KEYS: [&str; 6] = ["agent_id", "agentId", "agent", "from", "sender", "as"];
    let params = params?.as_object()?;
    let places = [params.get("_meta"), params.get("arguments")];
    for place in places.into_iter().flatten().filter_map(Value::as_object) {
        for key in KEYS {
            if let Some(claim) = place.get(key) {
                let mine = claim
                    .as_str()
                    .is_some_and(|c| c == agent_id || c == agent_name);
                if !mine {
                    return Some(format!("{key}={claim}"));
                }
            }
        }
    }
    None
}

/// A line as JSON (strict: no duplicate keys), with its text; blank lines
/// are ignored, and bytes that are not UTF-8 or JSON answered with a
/// parse error.
fn parse_line(raw: &[u8]) -> Result<(&str, Value), Verdict> {
    let raw = raw.strip_suffix(b"\r").unwrap_or(raw);
    if raw.iter().all(u8::is_ascii_whitespace) {
        return Err(Verdict::Ignore);
    }
    let Ok(text) = std::str::from_utf8(raw) else {
        return Err(Verdict::Reply(error_line(
            &Value::Null,
            PARSE_ERROR,
            "invalid UTF-8",
        )));
    };
    match crate::strict_json::from_str(text) {
        Ok(value) => Ok((text, value)),
        Err(e) => Err(Verdict::Reply(error_line(
            &Value::Null,
            PARSE_ERROR,
            &format!("parse error: {e}"),
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_claims_in_meta_and_arguments() {
        let p = |v: Value| foreign_identity(Some(&v), "id-1", "w1");
        assert!(p(json!({"_meta": {"agent_id": "id-2"}})).is_some());
        assert!(p(json!({"arguments": {"from": "lead", "recipient": "x"}})).is_some());
        assert!(p(json!({"_meta": {"agent_id": "id-1"}})).is_none());
        assert!(p(json!({"arguments": {"recipient": "x", "text": "t"}})).is_none());
        assert!(p(json!({"_meta": {"progressToken": 1}})).is_none());
    }
}
