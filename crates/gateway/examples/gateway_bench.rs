//! The model gateway's overhead per request (docs/benchmarks.md): the same
//! streamed answer from a local model server, asked directly over TCP and
//! through the gateway (an agent's Unix socket, key check, budget, the
//! real key added, the answer streamed back and its tokens read), one
//! request at a time, alternating. Prints p50 and p99 of each and of the
//! difference. `cargo run --release --example gateway_bench -p substrat-gateway`
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use substrat_gateway::{Api, Budget, Gateway, GatewayConfig, Secret, Upstream};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};

const SSE: &str = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"model\":\"m\",\"usage\":{\"input_tokens\":12,\"output_tokens\":1}}}\n\nevent: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"hello\"}}\n\nevent: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":7}}\n\n";

/// A model server answering every request with `SSE`, closing after.
async fn model_server() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let (socket, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                let mut reader = BufReader::new(socket);
                let mut length = 0usize;
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).await.unwrap_or(0) == 0 || line == "\r\n" {
                        break;
                    }
                    if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                        length = v.trim().parse().unwrap_or(0);
                    }
                }
                let mut body = vec![0u8; length];
                let _ = reader.read_exact(&mut body).await;
                let out = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n{SSE}"
                );
                let _ = reader.get_mut().write_all(out.as_bytes()).await;
            });
        }
    });
    port
}

fn request(key: &str) -> String {
    let body = r#"{"model":"m","stream":true,"max_tokens":64,"messages":[{"role":"user","content":"hi"}]}"#;
    format!(
        "POST /v1/messages HTTP/1.1\r\nhost: 127.0.0.1\r\nx-api-key: {key}\r\nanthropic-version: 2023-06-01\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
}

async fn ask<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(mut stream: S, key: &str) {
    stream.write_all(request(key).as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.unwrap();
    assert!(
        answer.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&answer)
    );
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index].as_secs_f64() * 1e6
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let rounds: usize = std::env::var("ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(2000);
    let port = model_server().await;
    let upstream = Upstream::new(
        Api::Anthropic,
        &format!("http://127.0.0.1:{port}"),
        Secret::new("sk-real".into()),
        &[],
    )
    .unwrap();
    let config = GatewayConfig {
        upstreams: HashMap::from([(Api::Anthropic, upstream)]),
        team: Budget::default(),
        spool: Default::default(),
    };
    let gateway = Arc::new(Gateway::new(config, Box::new(std::io::sink()), None).unwrap());
    let placeholder = gateway.register(
        "a1",
        substrat_gateway::ModelAccess {
            api: Api::Anthropic,
            budget: Budget::default(),
            hosted_tools: Default::default(),
            models: None,
        },
    );
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("a1.sock");
    let listener = UnixListener::bind(&socket).unwrap();
    tokio::spawn(gateway.clone().serve_agent(listener, "a1".into()));
    let (mut direct, mut via) = (Vec::new(), Vec::new());
    for round in 0..rounds + 100 {
        let start = Instant::now();
        ask(
            TcpStream::connect(("127.0.0.1", port)).await.unwrap(),
            "sk-real",
        )
        .await;
        let d = start.elapsed();
        let start = Instant::now();
        ask(UnixStream::connect(&socket).await.unwrap(), &placeholder).await;
        let g = start.elapsed();
        if round >= 100 {
            direct.push(d);
            via.push(g);
        }
    }
    let mut overhead: Vec<Duration> = via
        .iter()
        .zip(&direct)
        .map(|(g, d)| g.saturating_sub(*d))
        .collect();
    for v in [&mut direct, &mut via, &mut overhead] {
        v.sort();
    }
    println!("{rounds} requests each, alternating, after 100 warm-up rounds; µs");
    println!("| path | p50 | p99 |");
    println!("|---|---|---|");
    for (name, v) in [
        ("model server directly (TCP)", &direct),
        ("through the gateway (agent socket)", &via),
        ("difference, pairwise", &overhead),
    ] {
        println!(
            "| {name} | {:.0} | {:.0} |",
            percentile(v, 0.5),
            percentile(v, 0.99)
        );
    }
}
