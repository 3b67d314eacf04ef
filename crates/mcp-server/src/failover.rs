//! A relay on another host that follows its agent from daemon to daemon
//! (`SUBSTRAT_BROKER=tls://A:PORT,tls://B:PORT`): when the connection is
//! lost it connects again, to the first address that answers, with the
//! same certificate (every daemon of the team trusts the team's
//! authority), and opens the MCP session there as the client opened it
//! (its `initialize`, answered to the relay alone, and `initialized`).
//!
//! Every request still gets exactly one answer: the relay keeps the ids
//! of the requests the broker has not answered yet, and when the
//! connection is lost each of those gets a `-32000` error (the broker that
//! had it is gone: the request may or may not have taken effect). While
//! no daemon answers, each request gets a `-32000` error after one more
//! attempt to connect.

use std::collections::HashMap;
use std::future::Future;

use serde_json::{Value, json};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};

use crate::{GATE_MAX_LINE, MAX_LINE, RelayEnd, error_for, hello_line};

/// The id the relay gives the client's `initialize` when it replays it on
/// a new connection; its answer is the relay's, not the client's.
pub const REPLAY_ID: &str = "substrat-relay-reinitialize";

/// What a line the client sent is to the relay.
#[derive(Debug, Clone, PartialEq)]
pub enum ClientLine {
    /// A request: its id (as JSON text, the key the answer is matched by)
    /// and whether it is the `initialize`.
    Request { id: String, initialize: bool },
    /// A request whose id is neither a string nor an integer: the relay
    /// answers it (`-32600`, as the broker would) and forwards nothing, so
    /// no answer of the broker's could take it off the waiting ones.
    BadId,
    /// JSON with a key repeated in an object (`"id"` twice): the relay
    /// reads it one way and the gate refuses it, so it cannot be mirrored;
    /// the relay forwards nothing, and answers it (`-32600`, id null) when
    /// it is a request (it has both `method` and `id`): a notification or
    /// a client's answer is never answered (JSON-RPC).
    Ambiguous { request: bool },
    /// More values than the gate reads in one message
    /// (`strict::MAX_VALUES`): refused by the gate before it reads the id,
    /// so, as `Ambiguous`, never forwarded, answered when a request.
    TooManyValues { request: bool },
    /// `notifications/initialized`.
    Initialized,
    /// Anything else (other notifications, answers, garbage).
    Other,
}

/// Reads a client's line.
pub fn client_line(line: &[u8]) -> ClientLine {
    // As the gate: the values counted before anything is read.
    if crate::strict::value_count_over(line, crate::strict::MAX_VALUES) {
        // Only the top level's keys, its values skipped (not built).
        let keys = serde_json::from_slice::<HashMap<String, serde::de::IgnoredAny>>(line);
        let request = keys.is_ok_and(|k| k.contains_key("id") && k.contains_key("method"));
        return ClientLine::TooManyValues { request };
    }
    let Ok(Value::Object(message)) = serde_json::from_slice::<Value>(line) else {
        return ClientLine::Other;
    };
    if crate::strict::repeats_a_key(line) {
        let request = message.contains_key("id") && message.contains_key("method");
        return ClientLine::Ambiguous { request };
    }
    let method = message.get("method").and_then(Value::as_str);
    match (message.get("id"), method) {
        (Some(id), Some(_)) if !(id.is_string() || id.is_i64() || id.is_u64()) => ClientLine::BadId,
        (Some(id), Some(method)) => ClientLine::Request {
            id: id.to_string(),
            initialize: method == "initialize",
        },
        (None, Some("notifications/initialized")) => ClientLine::Initialized,
        _ => ClientLine::Other,
    }
}

/// The id of an answer the broker sent (as JSON text); None for its
/// requests and notifications to the client, and for anything not JSON.
pub fn answer_id(line: &[u8]) -> Option<String> {
    let Ok(Value::Object(message)) = serde_json::from_slice::<Value>(line) else {
        return None;
    };
    if message.contains_key("method") {
        return None;
    }
    message.get("id").map(Value::to_string)
}

/// The client's `initialize` with the relay's id, to replay.
fn replayed(initialize: &[u8]) -> Option<Vec<u8>> {
    let mut message = serde_json::from_slice::<Value>(initialize).ok()?;
    message
        .as_object_mut()?
        .insert("id".into(), json!(REPLAY_ID));
    let mut line = message.to_string().into_bytes();
    line.push(b'\n');
    Some(line)
}

/// The next whole line into `line` (with its newline; one is added at the
/// end of input). Safe to cancel and call again: what was read stays in
/// `line`, which is cleared only by the caller. A line over `max` bytes
/// (its newline not counted) is read to its end and `Ok(Some(false))`:
/// dropped. `Ok(None)` at the end.
async fn next_line<R: AsyncBufRead + Unpin>(
    reader: &mut R,
    line: &mut Vec<u8>,
    overlong: &mut bool,
    max: usize,
) -> std::io::Result<Option<bool>> {
    loop {
        let available = reader.fill_buf().await?;
        if available.is_empty() {
            if line.is_empty() && !*overlong {
                return Ok(None);
            }
            line.push(b'\n');
            return Ok(Some(!std::mem::take(overlong)));
        }
        let (taken, ended) = match available.iter().position(|&b| b == b'\n') {
            Some(at) => (at + 1, true),
            None => (available.len(), false),
        };
        if !*overlong {
            line.extend_from_slice(&available[..taken]);
            if line.len() - usize::from(ended) > max {
                line.clear();
                *overlong = true;
            }
        }
        reader.consume(taken);
        if ended {
            return Ok(Some(!std::mem::take(overlong)));
        }
    }
}

/// The client's side: its input, where answers go, and what the relay
/// knows of its session.
struct Client<I, O> {
    input: BufReader<I>,
    output: O,
    line: Vec<u8>,
    overlong: bool,
    initialize: Option<Vec<u8>>,
    initialized: bool,
    /// Requests sent to the broker and not answered yet, by id (how many
    /// with that id: a client may reuse one).
    waiting: HashMap<String, usize>,
}

impl<I: AsyncRead + Unpin, O: AsyncWrite + Unpin> Client<I, O> {
    async fn write(&mut self, bytes: &[u8]) {
        let _ = self.output.write_all(bytes).await;
        let _ = self.output.flush().await;
    }

    /// Each request the broker had and did not answer: an error.
    async fn fail_waiting(&mut self, reason: &str) {
        let waiting: Vec<(String, usize)> = self.waiting.drain().collect();
        for (id, count) in waiting {
            let Ok(id) = serde_json::from_str::<Value>(&id) else {
                continue;
            };
            let request = json!({"jsonrpc": "2.0", "id": id, "method": "x"}).to_string();
            if let Some(reply) = error_for(request.as_bytes(), reason) {
                for _ in 0..count {
                    self.write(reply.as_bytes()).await;
                }
            }
        }
    }

    /// A line the relay cannot mirror (the gate refuses it before it
    /// reads the id: an id neither string nor integer, a repeated key,
    /// too many values) is never sent; a request of them is answered
    /// (`-32600`, id null): Some(true); the rest dropped: Some(false).
    /// None: the line may be sent.
    async fn refuse_unmirrorable(&mut self) -> Option<bool> {
        let (message, request) = match client_line(&self.line) {
            ClientLine::BadId => ("the id must be a string or an integer".to_string(), true),
            ClientLine::Ambiguous { request } => (
                "a key is repeated in an object: the line is ambiguous".to_string(),
                request,
            ),
            ClientLine::TooManyValues { request } => (
                format!(
                    "more than {} values in one message: not sent",
                    crate::strict::MAX_VALUES
                ),
                request,
            ),
            _ => return None,
        };
        if request {
            let reply = json!({"jsonrpc": "2.0", "id": null,
                "error": {"code": -32600, "message": message}});
            self.write(format!("{reply}\n").as_bytes()).await;
        }
        Some(request)
    }

    /// Answers a line over `GATE_MAX_LINE` (dropped, never sent: the gate
    /// would refuse it with id null): without an answer its client would
    /// wait for one for ever.
    async fn refuse_overlong(&mut self) {
        let message = format!("the line is over {GATE_MAX_LINE} bytes: not sent");
        let reply = json!({"jsonrpc": "2.0", "id": null,
            "error": {"code": -32600, "message": message}});
        self.write(format!("{reply}\n").as_bytes()).await;
    }

    /// Notes what the client sent; true for a request.
    fn note(&mut self) -> bool {
        match client_line(&self.line) {
            ClientLine::Request { id, initialize } => {
                if initialize {
                    self.initialize = Some(self.line.clone());
                }
                *self.waiting.entry(id).or_default() += 1;
                true
            }
            ClientLine::Initialized => {
                self.initialized = true;
                false
            }
            ClientLine::BadId
            | ClientLine::Ambiguous { .. }
            | ClientLine::TooManyValues { .. }
            | ClientLine::Other => false,
        }
    }
}

/// How one connection ended.
enum Ended {
    ClientDone,
    /// Whether the broker answered any request on it first.
    Lost {
        answered: bool,
    },
}

/// Relays until the client is done, connecting (again) with `connect`
/// whenever there is no connection.
pub async fn relay_with_failover<I, O, B, C, F>(
    input: I,
    output: O,
    mut connect: C,
    agent_id: &str,
) -> RelayEnd
where
    I: AsyncRead + Unpin,
    O: AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
    C: FnMut() -> F,
    F: Future<Output = Result<B, String>>,
{
    let mut client = Client {
        input: BufReader::new(input),
        output,
        line: Vec::new(),
        overlong: false,
        initialize: None,
        initialized: false,
        waiting: HashMap::new(),
    };
    // Losses in a row with nothing answered: a daemon that refuses this
    // relay (a revoked certificate) is not asked again at once.
    let mut barren = 0;
    let mut down: Option<String> = None;
    loop {
        if let Some(why) = down.take()
            && !answer_next(&mut client, &why).await
        {
            return RelayEnd::BrokerGone;
        }
        match connect().await {
            Ok(broker) => match serve(&mut client, broker, agent_id).await {
                Ended::ClientDone => return RelayEnd::ClientDone,
                Ended::Lost { answered } => {
                    client
                        .fail_waiting("the broker closed the connection; connecting again")
                        .await;
                    barren = if answered { 0 } else { barren + 1 };
                    if barren >= 2 {
                        barren = 0;
                        down = Some("the broker closes the connection at once".into());
                    }
                }
            },
            Err(reason) => down = Some(reason),
        }
    }
}

/// Reads client lines until a request, which gets the error `reason`;
/// false at the end of the client's input.
async fn answer_next<I: AsyncRead + Unpin, O: AsyncWrite + Unpin>(
    client: &mut Client<I, O>,
    reason: &str,
) -> bool {
    loop {
        client.line.clear();
        let read = next_line(
            &mut client.input,
            &mut client.line,
            &mut client.overlong,
            GATE_MAX_LINE,
        );
        match read.await {
            Ok(Some(true)) => {
                match client.refuse_unmirrorable().await {
                    Some(true) => {
                        client.line.clear();
                        return true;
                    }
                    Some(false) => continue,
                    None => {}
                }
                let request = client.note();
                client.waiting.clear();
                if let Some(reply) = error_for(&client.line, reason) {
                    client.write(reply.as_bytes()).await;
                }
                if request {
                    client.line.clear();
                    return true;
                }
            }
            Ok(Some(false)) => client.refuse_overlong().await,
            Ok(None) | Err(_) => return false,
        }
    }
}

/// One connection: the hello, the session replayed if the client opened
/// one before, then lines both ways.
async fn serve<I, O, B>(client: &mut Client<I, O>, broker: B, agent_id: &str) -> Ended
where
    I: AsyncRead + Unpin,
    O: AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    let (broker_read, mut broker_write) = tokio::io::split(broker);
    let mut broker_read = BufReader::new(broker_read);
    let mut opening = hello_line(agent_id).into_bytes();
    if let Some(initialize) = client.initialize.as_deref().and_then(replayed) {
        opening.extend_from_slice(&initialize);
        if client.initialized {
            opening.extend_from_slice(
                format!(
                    "{}\n",
                    json!({"jsonrpc": "2.0", "method": "notifications/initialized"})
                )
                .as_bytes(),
            );
        }
    }
    if broker_write.write_all(&opening).await.is_err() {
        return Ended::Lost { answered: false };
    }
    let mut answered = false;
    let replay = json!(REPLAY_ID).to_string();
    let (mut answer, mut answer_overlong) = (Vec::new(), false);
    loop {
        tokio::select! {
            read = next_line(&mut client.input, &mut client.line, &mut client.overlong, GATE_MAX_LINE) => match read {
                Ok(Some(whole)) => {
                    if !whole {
                        client.refuse_overlong().await;
                    } else if client.refuse_unmirrorable().await.is_none() {
                        client.note();
                        if broker_write.write_all(&client.line).await.is_err() {
                            client.line.clear();
                            return Ended::Lost { answered };
                        }
                    }
                    client.line.clear();
                }
                Ok(None) | Err(_) => {
                    // The client is done: let the broker answer what it has.
                    let _ = broker_write.shutdown().await;
                    let rest = async {
                        while !client.waiting.is_empty() {
                            answer.clear();
                            match next_line(&mut broker_read, &mut answer, &mut answer_overlong, MAX_LINE).await {
                                Ok(Some(true)) => {
                                    forward(client, &answer, &replay).await;
                                }
                                Ok(Some(false)) => {}
                                Ok(None) | Err(_) => break,
                            }
                        }
                    };
                    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), rest).await;
                    client.fail_waiting("the broker closed the connection").await;
                    return Ended::ClientDone;
                }
            },
            read = next_line(&mut broker_read, &mut answer, &mut answer_overlong, MAX_LINE) => {
                match read {
                    Ok(Some(true)) => answered |= forward(client, &answer, &replay).await,
                    Ok(Some(false)) => {}
                    Ok(None) | Err(_) => return Ended::Lost { answered },
                }
                answer.clear();
            }
        }
    }
}

/// A broker's line to the client, unless it answers the replayed
/// `initialize`; an answer takes its request off the waiting ones. True
/// when it answered a request (the relay's or the client's).
async fn forward<I: AsyncRead + Unpin, O: AsyncWrite + Unpin>(
    client: &mut Client<I, O>,
    line: &[u8],
    replay: &str,
) -> bool {
    let mut answered = false;
    if let Some(id) = answer_id(line) {
        if id == replay {
            return true;
        }
        if let Some(count) = client.waiting.get_mut(&id) {
            answered = true;
            *count -= 1;
            if *count == 0 {
                client.waiting.remove(&id);
            }
        }
    }
    client.write(line).await;
    answered
}

#[cfg(test)]
#[path = "failover_tests.rs"]
mod tests;
