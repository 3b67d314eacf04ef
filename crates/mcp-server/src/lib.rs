#![forbid(unsafe_code)]
//! The relay between an MCP client (stdio) and an agent's broker socket,
//! generic over the streams so it can be tested and fuzzed in one process.
//!
//! It first announces the agent id it was started with, then copies lines
//! from the client to the broker and bytes from the broker to the client.
//! When the broker cannot be reached, or goes away, every request still
//! gets an answer (a JSON-RPC error), so the client never waits forever.

pub mod failover;
pub mod remote;
pub mod strict;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::Mutex;

pub const RELAY_HELLO: &str = "notifications/substrat/relay";
/// Lines longer than this are not answered when the broker is gone.
pub const MAX_LINE: usize = 16 << 20;
/// The longest line the broker's gate reads (its newline not counted):
/// its `ConnectionLimits::max_line` by default. The failover relay
/// answers a longer client line itself and never sends it.
pub const GATE_MAX_LINE: usize = 4 << 20;

/// How a relay session ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RelayEnd {
    /// The client closed its input; the broker answered what it had.
    ClientDone,
    /// The broker was unreachable or went away; requests were answered with errors.
    BrokerGone,
}

/// The hello line the broker reads first.
pub fn hello_line(agent_id: &str) -> String {
    format!(
        "{}\n",
        json!({"jsonrpc": "2.0", "method": RELAY_HELLO, "params": {"agent_id": agent_id}})
    )
}

/// The error a request gets when there is no broker: `None` for lines that
/// are not requests (notifications, responses, garbage).
pub fn error_for(line: &[u8], reason: &str) -> Option<String> {
    if line.len() > MAX_LINE {
        return None;
    }
    let request = serde_json::from_slice::<Value>(line).ok()?;
    let (Some(id), Some(_)) = (request.get("id"), request.get("method")) else {
        return None;
    };
    Some(format!(
        "{}\n",
        json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32000, "message": reason}})
    ))
}

/// Reads one line (with its newline) into `line`; false at end of input.
async fn read_line<I: AsyncBufReadExt + Unpin>(
    input: &mut I,
    line: &mut Vec<u8>,
) -> std::io::Result<bool> {
    line.clear();
    let n = input.read_until(b'\n', line).await?;
    if n > 0 && !line.ends_with(b"\n") {
        line.push(b'\n');
    }
    Ok(n > 0)
}

async fn answer_rest<I, O>(input: &mut I, output: &Mutex<O>, pending: Option<&[u8]>, reason: &str)
where
    I: AsyncBufReadExt + Unpin,
    O: AsyncWrite + Unpin,
{
    let mut out = output.lock().await;
    if let Some(reply) = pending.and_then(|l| error_for(l, reason)) {
        let _ = out.write_all(reply.as_bytes()).await;
    }
    let mut line = Vec::new();
    while let Ok(true) = read_line(input, &mut line).await {
        if let Some(reply) = error_for(&line, reason) {
            let _ = out.write_all(reply.as_bytes()).await;
        }
    }
    let _ = out.flush().await;
}

/// Relays until the client is done or the broker is gone. `broker` is the
/// connected socket, or why there is none.
pub async fn relay<I, O, B>(
    input: I,
    output: O,
    broker: Result<B, String>,
    agent_id: &str,
) -> RelayEnd
where
    I: AsyncRead + Unpin,
    O: AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    let mut input = BufReader::new(input);
    let output = Mutex::new(output);
    let broker = match broker {
        Ok(b) => b,
        Err(reason) => {
            answer_rest(&mut input, &output, None, &reason).await;
            return RelayEnd::BrokerGone;
        }
    };
    let gone = "the broker closed the connection";
    let (mut broker_read, mut broker_write) = tokio::io::split(broker);
    if broker_write
        .write_all(hello_line(agent_id).as_bytes())
        .await
        .is_err()
    {
        answer_rest(&mut input, &output, None, gone).await;
        return RelayEnd::BrokerGone;
    }
    // Broker to client: copied as it comes.
    let to_client = async {
        let mut buf = vec![0u8; 8192];
        loop {
            match broker_read.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let mut out = output.lock().await;
                    if out.write_all(&buf[..n]).await.is_err() || out.flush().await.is_err() {
                        break;
                    }
                }
            }
        }
    };
    tokio::pin!(to_client);
    // Client to broker, line by line.
    let mut line = Vec::new();
    loop {
        tokio::select! {
            read = read_line(&mut input, &mut line) => match read {
                Ok(true) => {
                    if broker_write.write_all(&line).await.is_err() {
                        answer_rest(&mut input, &output, Some(&line), gone).await;
                        return RelayEnd::BrokerGone;
                    }
                }
                _ => {
                    // The client closed its input: let the broker answer what it has.
                    let _ = broker_write.shutdown().await;
                    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), &mut to_client).await;
                    return RelayEnd::ClientDone;
                }
            },
            _ = &mut to_client => {
                answer_rest(&mut input, &output, None, gone).await;
                return RelayEnd::BrokerGone;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn lines_go_through_after_the_hello() {
        let (relay_side, mut broker) = tokio::io::duplex(1 << 16);
        let input: &[u8] =
            b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}\nlast line without newline";
        let mut output = Vec::new();
        let broker_task = tokio::spawn(async move {
            let mut seen = Vec::new();
            broker
                .write_all(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\n")
                .await
                .unwrap();
            broker.read_to_end(&mut seen).await.unwrap();
            seen
        });
        let end = relay(input, &mut output, Ok(relay_side), "agent-1").await;
        assert_eq!(end, RelayEnd::ClientDone);
        let seen = broker_task.await.unwrap();
        let expected = format!(
            "{}{}\n",
            hello_line("agent-1"),
            String::from_utf8_lossy(input)
        );
        assert_eq!(String::from_utf8_lossy(&seen), expected);
        assert_eq!(output, b"{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\n");
    }

    #[tokio::test]
    async fn without_a_broker_every_request_is_answered() {
        let input: &[u8] = b"{\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"tools/list\"}\n{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}\ngarbage\n{\"jsonrpc\":\"2.0\",\"id\":\"x\",\"method\":\"ping\"}";
        let mut output = Vec::new();
        let end = relay(
            input,
            &mut output,
            Err::<tokio::io::DuplexStream, _>("no broker".into()),
            "a",
        )
        .await;
        assert_eq!(end, RelayEnd::BrokerGone);
        let lines: Vec<Value> = output.lines_vec();
        let ids: Vec<&Value> = lines.iter().map(|l| &l["id"]).collect();
        assert_eq!(ids, [&json!(7), &json!("x")]);
        assert!(lines.iter().all(|l| l["error"]["message"] == "no broker"));
    }

    #[tokio::test]
    async fn a_broker_that_goes_away_leaves_no_request_waiting() {
        let (relay_side, broker) = tokio::io::duplex(1 << 16);
        let (client_in, mut client_writer) = tokio::io::duplex(1 << 16);
        let mut output = Vec::new();
        let broker_task = tokio::spawn(async move {
            let mut reader = tokio::io::BufReader::new(broker);
            let mut hello = String::new();
            reader.read_line(&mut hello).await.unwrap();
            drop(reader); // the broker goes away after the hello
        });
        let writer = tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            client_writer
                .write_all(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}\n")
                .await
                .unwrap();
        });
        let end = relay(client_in, &mut output, Ok(relay_side), "a").await;
        broker_task.await.unwrap();
        writer.await.unwrap();
        assert_eq!(end, RelayEnd::BrokerGone);
        let lines = output.lines_vec();
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert_eq!(lines[0]["id"], 1);
    }

    trait Lines {
        fn lines_vec(&self) -> Vec<Value>;
    }

    impl Lines for Vec<u8> {
        fn lines_vec(&self) -> Vec<Value> {
            self.split(|&b| b == b'\n')
                .filter(|l| !l.is_empty())
                .map(|l| serde_json::from_slice(l).unwrap())
                .collect()
        }
    }
}
