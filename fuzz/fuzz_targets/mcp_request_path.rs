//! Arbitrary bytes as the lines an agent sends on its socket, through the
//! same code path as a real connection (gate, rmcp, broker, SQLite), after
//! a valid initialize. Invariants, not only "no panic":
//! - every output line is a JSON-RPC 2.0 object;
//! - every request line with a string or integer id gets exactly one
//!   response with that id (unless cancelled, or the connection is closed
//!   by a relay hello naming another agent);
//! - no inbox holds more than its depth;
//! - every message in `w`'s inbox comes from `lead`, the fuzzed agent.
#![no_main]

mod common;

use std::collections::HashMap;
use std::sync::OnceLock;
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use substrat_broker::gate::{ConnectionLimits, RELAY_HELLO, serve_connection};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const MAX_LINE: usize = 64 * 1024;
const INIT: &[u8] = b"{\"jsonrpc\":\"2.0\",\"id\":\"init\",\"method\":\"initialize\",\"params\":{\"protocolVersion\":\"2025-06-18\",\"capabilities\":{},\"clientInfo\":{\"name\":\"fuzz\",\"version\":\"1\"}}}\n{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}\n";

struct State {
    runtime: tokio::runtime::Runtime,
    fixture: common::Fixture,
}

fn state() -> &'static State {
    static STATE: OnceLock<State> = OnceLock::new();
    STATE.get_or_init(|| State {
        runtime: tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime"),
        fixture: common::fixture(),
    })
}

/// Request ids the output must answer exactly once each, or None when the
/// input makes that unknowable (cancellation, a closing relay hello).
fn expected_ids(input: &[u8]) -> Option<HashMap<String, usize>> {
    let mut ids = HashMap::new();
    for line in input.split(|&b| b == b'\n') {
        if line.len() > MAX_LINE {
            continue;
        }
        // Judged as the gate judges: duplicate keys make a line malformed.
        let Ok(text) = std::str::from_utf8(line) else { continue };
        let Ok(Value::Object(obj)) = substrat_broker::strict_json::from_str(text) else { continue };
        let method = obj.get("method").and_then(Value::as_str);
        if method == Some(RELAY_HELLO) || method == Some("notifications/cancelled") {
            return None;
        }
        if let (Some(_), Some(id)) = (method, obj.get("id")) {
            if id.is_string() || id.is_i64() || id.is_u64() {
                *ids.entry(id.to_string()).or_default() += 1;
            }
        }
    }
    Some(ids)
}

fuzz_target!(|data: &[u8]| {
    let state = state();
    let fixture = &state.fixture;
    let output = state.runtime.block_on(async {
        let (client, server) = tokio::io::duplex(1 << 16);
        let limits = ConnectionLimits { max_line: MAX_LINE, write_timeout: Duration::from_secs(5) };
        let server = tokio::spawn(serve_connection(fixture.broker.clone(), fixture.lead_id.clone(), server, limits, None));
        let (mut read, mut write) = tokio::io::split(client);
        let writer = async {
            let _ = write.write_all(INIT).await;
            let _ = write.write_all(data).await;
            let _ = write.write_all(b"\n").await;
            let _ = write.shutdown().await;
        };
        let mut out = Vec::new();
        let reader = read.read_to_end(&mut out);
        let (_, _) = tokio::join!(writer, reader);
        let _ = server.await;
        out
    });
    let mut answered: HashMap<String, usize> = HashMap::new();
    for line in output.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
        let value: Value = serde_json::from_slice(line).expect("every output line is JSON");
        assert_eq!(value["jsonrpc"], "2.0", "{value}");
        if !value["id"].is_null() {
            *answered.entry(value["id"].to_string()).or_default() += 1;
        }
    }
    if let Some(mut expected) = expected_ids(data) {
        *expected.entry("\"init\"".into()).or_default() += 1;
        assert_eq!(answered, expected, "each request answered exactly once");
    }
    let broker = &fixture.broker;
    let w = broker.agent(&fixture.w_id).expect("store").expect("w exists");
    let activity = broker.activity(&w).expect("activity");
    assert!(activity["queued_messages"].as_u64().unwrap_or(0) <= u64::from(common::INBOX_DEPTH));
    for m in activity["recent_messages"].as_array().into_iter().flatten() {
        if m["direction"] == "in" {
            assert_eq!(m["counterpart"], "lead", "only the fuzzed agent speaks: {m}");
        }
    }
});
