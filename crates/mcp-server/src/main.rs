#![forbid(unsafe_code)]
//! substrat-mcp-server: the small MCP server cursor-agent starts inside the
//! sandbox. It relays MCP (JSON lines on stdio) to the agent's broker
//! socket, named by `SUBSTRAT_SOCKET`, and holds no policy: the broker
//! decides everything, by the socket the connection arrives on. The relay
//! itself is in the library (`substrat_mcp_server::relay`).

use std::process::ExitCode;

use substrat_mcp_server::{RelayEnd, relay};
use tokio::net::UnixStream;

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
    let end = runtime.block_on(async {
        let socket = std::path::PathBuf::from(socket);
        let broker = UnixStream::connect(&socket)
            .await
            .map_err(|e| format!("the broker is not reachable at {}: {e}", socket.display()));
        if let Err(reason) = &broker {
            eprintln!("substrat-mcp-server: {reason}");
        }
        relay(tokio::io::stdin(), tokio::io::stdout(), broker, &agent_id).await
    });
    match end {
        RelayEnd::ClientDone => ExitCode::SUCCESS,
        RelayEnd::BrokerGone => ExitCode::FAILURE,
    }
}
