//! Found by review: a server switched off and on again before its
//! supervisor ran stayed enabled with no connection. A tiny HTTP+SSE MCP
//! server (one tool `t`, its GETs counted) stands in for a remote one.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use super::*;
use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;

/// A tiny HTTP+SSE MCP server: one tool `t`. Counts GETs.
async fn fake_server(gets: Arc<AtomicUsize>) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let current: Arc<std::sync::Mutex<Option<mpsc::UnboundedSender<String>>>> = Default::default();
    tokio::spawn(async move {
        loop {
            let (sock, _) = listener.accept().await.unwrap();
            let (current, gets) = (current.clone(), gets.clone());
            tokio::spawn(async move {
                let mut reader = BufReader::new(sock);
                let mut first = String::new();
                reader.read_line(&mut first).await.unwrap();
                let mut len = 0usize;
                loop {
                    let mut h = String::new();
                    reader.read_line(&mut h).await.unwrap();
                    if h == "\r\n" || h.is_empty() {
                        break;
                    }
                    let l = h.to_ascii_lowercase();
                    if let Some(v) = l.strip_prefix("content-length:") {
                        len = v.trim().parse().unwrap();
                    }
                }
                if first.starts_with("GET") {
                    gets.fetch_add(1, Ordering::SeqCst);
                    let mut sock = reader.into_inner();
                    sock.write_all(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\nevent: endpoint\ndata: /msg\n\n").await.unwrap();
                    let (tx, mut rx) = mpsc::unbounded_channel::<String>();
                    *current.lock().unwrap() = Some(tx);
                    while let Some(m) = rx.recv().await {
                        if sock
                            .write_all(format!("event: message\ndata: {m}\n\n").as_bytes())
                            .await
                            .is_err()
                        {
                            return;
                        }
                    }
                } else {
                    let mut body = vec![0; len];
                    reader.read_exact(&mut body).await.unwrap();
                    let v: Value = serde_json::from_slice(&body).unwrap();
                    let id = v.get("id").cloned();
                    let method = v["method"].as_str().unwrap_or("");
                    if let Some(id) = id {
                        let result = match method {
                            "initialize" => {
                                serde_json::json!({"protocolVersion": "2024-11-05", "capabilities": {"tools": {}}, "serverInfo": {"name": "f", "version": "1"}})
                            }
                            "tools/list" => {
                                serde_json::json!({"tools": [{"name": "t", "inputSchema": {"type": "object"}}]})
                            }
                            "tools/call" => {
                                serde_json::json!({"content": [{"type": "text", "text": "hi"}]})
                            }
                            _ => serde_json::json!({}),
                        };
                        let tx = current.lock().unwrap().clone().unwrap();
                        let _ = tx.send(
                            serde_json::json!({"jsonrpc": "2.0", "id": id, "result": result})
                                .to_string(),
                        );
                    }
                    let mut sock = reader.into_inner();
                    let _ = sock.write_all(b"HTTP/1.1 202 Accepted\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").await;
                }
            });
        }
    });
    port
}

#[tokio::test(flavor = "current_thread")]
async fn a_quick_off_and_on_restarts_the_server() {
    let dir = tempfile::tempdir().unwrap();
    let gets = Arc::new(AtomicUsize::new(0));
    let port = fake_server(gets.clone()).await;
    let store = crate::store::Store::open(&dir.path().join("state.db")).unwrap();
    let audit = crate::audit::Audit::open(&dir.path().join("audit.log")).unwrap();
    let roles = ["worker"]
        .iter()
        .map(|n| {
            (
                n.to_string(),
                substrat_policy::load_builtin(n, &Default::default())
                    .unwrap()
                    .unwrap(),
            )
        })
        .collect();
    let config = crate::upstream::config::parse(&format!(
        r#"{{"mcpServers": {{"r": {{"url": "http://127.0.0.1:{port}/sse", "transport": "sse"}}}}}}"#
    ))
    .unwrap();
    let broker =
        Arc::new(Broker::new(store, roles, dir.path().to_path_buf(), audit).with_upstreams(config));
    let launch = Arc::new(UpstreamLaunch {
        launcher: "/bin/false".into(),
        backend: "x".into(),
        state_dir: dir.path().into(),
        destinations: None,
        cgroup_parent: None,
        secret_env: Default::default(),
    });
    spawn_all(&broker, &launch);
    let slot = &broker.upstreams().slots[0];
    for _ in 0..100 {
        if slot.read().peer.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        slot.read().status,
        ServerStatus::Up {
            pid: None,
            protocol_version: "2024-11-05".into()
        }
    );
    let before = broker.upstreams().call("r", "t", Default::default()).await;
    assert!(before.is_ok(), "{before:?}");
    // Off and on again before the supervisor runs: it still restarts.
    broker.switch_server("r", false).unwrap();
    broker.switch_server("r", true).unwrap();
    for _ in 0..100 {
        if gets.load(Ordering::SeqCst) >= 2 && slot.read().peer.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(gets.load(Ordering::SeqCst), 2, "a new event stream");
    assert_eq!(
        slot.read().status,
        ServerStatus::Up {
            pid: None,
            protocol_version: "2024-11-05".into()
        }
    );
    let after = broker.upstreams().call("r", "t", Default::default()).await;
    assert!(after.is_ok(), "{:?}", after.map_err(|e| e.to_string()));
}
