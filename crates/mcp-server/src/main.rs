#![forbid(unsafe_code)]
//! substrat-mcp-server: the small MCP server cursor-agent starts inside the
//! sandbox. It relays MCP (JSON lines on stdio) to the agent's broker
//! socket, named by `SUBSTRAT_SOCKET`, and holds no policy: the broker
//! decides everything, by the socket the connection arrives on. The relay
//! itself is in the library (`substrat_mcp_server::relay`).

use std::process::ExitCode;

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::FileTypeExt;
use std::pin::Pin;

use substrat_mcp_server::{RelayEnd, relay};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::UnixStream;
use tokio::net::unix::pipe;

/// The broker's end: the agent's socket, or a TLS stream to a remote one.
trait Broker: AsyncRead + AsyncWrite {}
impl<T: AsyncRead + AsyncWrite> Broker for T {}

/// A stdio stream the runtime can serve in its own event loop.
enum Evented {
    Pipe(OwnedFd),
    Socket(UnixStream),
}

/// fd 0 or 1 as a pipe or a socket (as every MCP client starts us: a pipe,
/// or a socket pair from libuv), a duplicate so the original stays; None
/// for anything else.
fn evented(fd: BorrowedFd<'_>) -> Option<Evented> {
    let file = std::fs::File::from(fd.try_clone_to_owned().ok()?);
    let kind = file.metadata().ok()?.file_type();
    if kind.is_fifo() {
        return Some(Evented::Pipe(file.into()));
    }
    if kind.is_socket() {
        let socket = std::os::unix::net::UnixStream::from(OwnedFd::from(file));
        socket.set_nonblocking(true).ok()?;
        return UnixStream::from_std(socket).ok().map(Evented::Socket);
    }
    None
}

/// The client's requests. tokio's stdin, the fallback, reads on a blocking
/// thread: a thread handoff per line, half the relay's latency.
fn client_input() -> Pin<Box<dyn AsyncRead>> {
    match evented(std::io::stdin().as_fd()) {
        Some(Evented::Pipe(fd)) => match pipe::Receiver::from_owned_fd(fd) {
            Ok(pipe) => Box::pin(pipe),
            Err(_) => Box::pin(tokio::io::stdin()),
        },
        Some(Evented::Socket(socket)) => Box::pin(socket),
        None => Box::pin(tokio::io::stdin()),
    }
}

/// Where the answers go, chosen the same way.
fn client_output() -> Pin<Box<dyn AsyncWrite>> {
    match evented(std::io::stdout().as_fd()) {
        Some(Evented::Pipe(fd)) => match pipe::Sender::from_owned_fd(fd) {
            Ok(pipe) => Box::pin(pipe),
            Err(_) => Box::pin(tokio::io::stdout()),
        },
        Some(Evented::Socket(socket)) => Box::pin(socket),
        None => Box::pin(tokio::io::stdout()),
    }
}

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
    // A relay on another host: the broker over mutual TLS.
    let remote = match std::env::var("SUBSTRAT_BROKER") {
        Ok(url) => match std::env::var_os("SUBSTRAT_TLS_DIR") {
            Some(dir) if !dir.is_empty() => Some((url, std::path::PathBuf::from(dir))),
            _ => {
                eprintln!(
                    "substrat-mcp-server: SUBSTRAT_BROKER needs SUBSTRAT_TLS_DIR (agent.crt, agent.key, ca.crt)"
                );
                return ExitCode::from(2);
            }
        },
        Err(_) => None,
    };
    let socket = std::env::var_os("SUBSTRAT_SOCKET");
    if remote.is_none() && socket.is_none() {
        eprintln!("substrat-mcp-server: SUBSTRAT_SOCKET (or SUBSTRAT_BROKER) is not set");
        return ExitCode::from(2);
    }
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
    let end = runtime.block_on(async {
        if let Some((urls, dir)) = &remote {
            // The team's daemons: connected again whenever lost, to
            // whichever answers (crate::failover).
            let connect = || async move {
                let urls = substrat_mcp_server::remote::parse_addresses(urls)?;
                let stream = substrat_mcp_server::remote::connect_any(&urls, dir).await;
                if let Err(reason) = &stream {
                    eprintln!("substrat-mcp-server: {reason}");
                }
                stream
            };
            return substrat_mcp_server::failover::relay_with_failover(
                client_input(),
                client_output(),
                connect,
                &agent_id,
            )
            .await;
        }
        let broker: Result<Pin<Box<dyn Broker>>, String> = match socket {
            Some(socket) => {
                let socket = std::path::PathBuf::from(socket);
                UnixStream::connect(&socket)
                    .await
                    .map(|s| Box::pin(s) as Pin<Box<dyn Broker>>)
                    .map_err(|e| {
                        format!("the broker is not reachable at {}: {e}", socket.display())
                    })
            }
            None => Err("no broker".into()),
        };
        if let Err(reason) = &broker {
            eprintln!("substrat-mcp-server: {reason}");
        }
        relay(client_input(), client_output(), broker, &agent_id).await
    });
    match end {
        RelayEnd::ClientDone => ExitCode::SUCCESS,
        RelayEnd::BrokerGone => ExitCode::FAILURE,
    }
}
