#![forbid(unsafe_code)]
//! substrat-mcp-server: the small MCP server cursor-agent starts inside the
//! sandbox. It relays MCP (JSON lines on stdio) to the agent's broker
//! socket, named by `SUBSTRAT_SOCKET`, and holds no policy: the broker
//! decides everything, by the socket the connection arrives on.
//!
//! It first announces the `--agent-id` it was started with, so the broker
//! can refuse a relay pointed at another agent's socket. When the broker
//! cannot be reached, or goes away, every request still gets an answer (a
//! JSON-RPC error), so the client never waits forever.

use std::process::ExitCode;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;

const RELAY_HELLO: &str = "notifications/substrat/relay";
/// Lines longer than this are not read whole when the broker is gone.
const MAX_LINE: usize = 16 << 20;

fn usage() -> ExitCode {
    eprintln!(
        "usage: substrat-mcp-server --agent-id ID   (with SUBSTRAT_SOCKET set to the agent's broker socket)"
    );
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let agent_id = match args.as_slice() {
        [flag, id] if flag == "--agent-id" && !id.is_empty() => id.clone(),
        [flag] if flag == "--version" => {
            println!("substrat-mcp-server {}", env!("CARGO_PKG_VERSION"));
            return ExitCode::SUCCESS;
        }
        _ => return usage(),
    };
    let Some(socket) = std::env::var_os("SUBSTRAT_SOCKET") else {
        eprintln!("substrat-mcp-server: SUBSTRAT_SOCKET is not set");
        return ExitCode::from(2);
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("substrat-mcp-server: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(relay(agent_id, std::path::PathBuf::from(socket)))
}

async fn relay(agent_id: String, socket: std::path::PathBuf) -> ExitCode {
    let mut stdin = BufReader::new(tokio::io::stdin());
    let mut stdout = tokio::io::stdout();
    let stream = match UnixStream::connect(&socket).await {
        Ok(s) => s,
        Err(e) => {
            let reason = format!("the broker is not reachable at {}: {e}", socket.display());
            eprintln!("substrat-mcp-server: {reason}");
            answer_all(&mut stdin, &mut stdout, &reason).await;
            return ExitCode::FAILURE;
        }
    };
    let (broker_read, mut broker_write) = stream.into_split();
    let hello = json!({"jsonrpc": "2.0", "method": RELAY_HELLO, "params": {"agent_id": agent_id}});
    if broker_write
        .write_all(format!("{hello}\n").as_bytes())
        .await
        .is_err()
    {
        answer_all(&mut stdin, &mut stdout, "the broker closed the connection").await;
        return ExitCode::FAILURE;
    }
    // Broker to client: copied as is.
    let mut to_client = tokio::spawn(async move {
        let mut broker_read = broker_read;
        let mut out = tokio::io::stdout();
        let _ = tokio::io::copy(&mut broker_read, &mut out).await;
        let _ = out.flush().await;
    });
    // Client to broker, line by line, until the client is done or the broker is gone.
    let mut line = Vec::new();
    loop {
        line.clear();
        tokio::select! {
            read = read_line(&mut stdin, &mut line) => {
                match read {
                    Ok(true) => {
                        if broker_write.write_all(&line).await.is_err() {
                            answer(&mut stdout, &line, "the broker closed the connection").await;
                            answer_all(&mut stdin, &mut stdout, "the broker closed the connection").await;
                            return ExitCode::FAILURE;
                        }
                    }
                    _ => {
                        // The client closed stdin: let the broker answer what it has.
                        let _ = broker_write.shutdown().await;
                        let _ = tokio::time::timeout(std::time::Duration::from_secs(5), &mut to_client).await;
                        return ExitCode::SUCCESS;
                    }
                }
            }
            _ = &mut to_client => {
                answer_all(&mut stdin, &mut stdout, "the broker closed the connection").await;
                return ExitCode::FAILURE;
            }
        }
    }
}

/// Reads one line (with its newline) into `line`; false at end of input.
async fn read_line(
    stdin: &mut BufReader<tokio::io::Stdin>,
    line: &mut Vec<u8>,
) -> std::io::Result<bool> {
    let n = stdin.read_until(b'\n', line).await?;
    if n > 0 && !line.ends_with(b"\n") {
        line.push(b'\n');
    }
    Ok(n > 0)
}

/// Without a broker: answer each request on stdin with an error, until EOF.
async fn answer_all(
    stdin: &mut BufReader<tokio::io::Stdin>,
    stdout: &mut tokio::io::Stdout,
    reason: &str,
) {
    let mut line = Vec::new();
    loop {
        line.clear();
        match read_line(stdin, &mut line).await {
            Ok(true) if line.len() <= MAX_LINE => answer(stdout, &line, reason).await,
            Ok(true) => {}
            _ => return,
        }
    }
}

async fn answer(stdout: &mut tokio::io::Stdout, line: &[u8], reason: &str) {
    let Ok(request) = serde_json::from_slice::<Value>(line) else {
        return;
    };
    let (Some(id), Some(_)) = (request.get("id"), request.get("method")) else {
        return;
    };
    let reply = json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32000, "message": reason}});
    let _ = stdout.write_all(format!("{reply}\n").as_bytes()).await;
    let _ = stdout.flush().await;
}
