//! Arbitrary bytes as what an MCP client writes to substrat-mcp-server.
//! The first byte picks the broker: present (reads everything, answers
//! nothing), unreachable, or gone right after the hello. Invariants:
//! - present: the broker receives the hello and then exactly the client's
//!   bytes, every line ending in a newline;
//! - unreachable: each request line gets exactly one error, with its id,
//!   in order, and nothing else is written;
//! - gone: no request is answered twice, and every answer is an error.
//!
//! - failover (a remote relay, `substrat_mcp_server::failover`) with no
//!   daemon answering: as unreachable, each request line gets exactly one
//!   error, in order, and nothing else is written; a request it cannot
//!   mirror (an id neither string nor integer, a key repeated in an
//!   object, more values than the gate reads) gets its one error with id
//!   null; a notification or answer of those gets none.
//!
//! The same bytes as a line a daemon sends to a failover relay, and as one
//! a client sends: reading them never panics, an id read is JSON, and a
//! line with a repeated key or more values than the gate reads (which the
//! gate refuses) is never read as a request to mirror.
//!
//! The same bytes as a remote relay's `SUBSTRAT_BROKER` (`tls://HOST:PORT`):
//! parsing never panics; an accepted address has a host of letters, digits,
//! dots, dashes and colons only and a port above 0, and reads back the same
//! from `tls://HOST:PORT` (HOST bracketed when it has a colon).
#![no_main]

use std::collections::HashMap;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use substrat_mcp_server::{RelayEnd, error_for, hello_line, relay};
use tokio::io::{AsyncBufReadExt, AsyncReadExt};

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime"))
}

fn lines(bytes: &[u8]) -> Vec<&[u8]> {
    let mut out: Vec<&[u8]> = bytes.split(|&b| b == b'\n').collect();
    if out.last().is_some_and(|l| l.is_empty()) {
        out.pop();
    }
    out
}

fn output_ids(output: &[u8]) -> Vec<Value> {
    lines(output)
        .into_iter()
        .map(|l| {
            let v: Value = serde_json::from_slice(l).expect("the relay writes JSON");
            assert!(v["error"].is_object(), "{v}");
            v["id"].clone()
        })
        .collect()
}

fn broker_address(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok((host, port)) = substrat_mcp_server::remote::parse_address(text) else { return };
    assert!(port > 0 && !host.is_empty());
    assert!(host.chars().all(|c| c.is_ascii_alphanumeric() || ".-:".contains(c)), "{host}");
    let again = if host.contains(':') {
        format!("tls://[{host}]:{port}")
    } else {
        format!("tls://{host}:{port}")
    };
    assert_eq!(substrat_mcp_server::remote::parse_address(&again), Ok((host, port)));
}

fn failover_lines(data: &[u8]) {
    use substrat_mcp_server::failover::{ClientLine, answer_id, client_line};
    if let Some(id) = answer_id(data) {
        serde_json::from_str::<Value>(&id).expect("an answer's id is JSON");
    }
    let read = client_line(data);
    if let ClientLine::Request { id, .. } = &read {
        serde_json::from_str::<Value>(id).expect("a request's id is JSON");
    }
    let refused = matches!(read, ClientLine::Ambiguous { .. } | ClientLine::TooManyValues { .. });
    if substrat_mcp_server::strict::repeats_a_key(data) {
        assert!(refused, "a repeated key is never mirrored: {read:?}");
    }
    if substrat_mcp_server::strict::value_count_over(data, substrat_mcp_server::strict::MAX_VALUES) {
        assert!(matches!(read, ClientLine::TooManyValues { .. }), "too many values: {read:?}");
    }
}

/// The id of the one error the failover relay writes for a client's line
/// when no daemon answers (none: the line gets none).
fn failover_error_id(line: &[u8]) -> Option<Value> {
    use substrat_mcp_server::failover::{ClientLine, client_line};
    match client_line(line) {
        ClientLine::BadId
        | ClientLine::Ambiguous { request: true }
        | ClientLine::TooManyValues { request: true } => Some(Value::Null),
        ClientLine::Ambiguous { .. } | ClientLine::TooManyValues { .. } => None,
        _ => error_for(line, "none").map(|reply| serde_json::from_str::<Value>(&reply).expect("json")["id"].clone()),
    }
}

fuzz_target!(|data: &[u8]| {
    broker_address(data);
    failover_lines(data);
    let Some((&mode, input)) = data.split_first() else { return };
    runtime().block_on(async {
        let mut output = Vec::new();
        match mode % 4 {
            0 => {
                let (relay_side, mut broker) = tokio::io::duplex(1 << 20);
                let collect = async move {
                    let mut seen = Vec::new();
                    let _ = broker.read_to_end(&mut seen).await;
                    drop(broker); // hang up, as a broker does when the client is done
                    seen
                };
                let (end, seen) = tokio::join!(relay(input, &mut output, Ok(relay_side), "fuzz"), collect);
                assert_eq!(end, RelayEnd::ClientDone);
                let mut expected = hello_line("fuzz").into_bytes();
                expected.extend_from_slice(input);
                if !input.is_empty() && !input.ends_with(b"\n") {
                    expected.push(b'\n');
                }
                assert_eq!(seen, expected);
                assert!(output.is_empty());
            }
            3 => {
                let connect = || async { Err::<tokio::io::DuplexStream, String>("none".into()) };
                let end = substrat_mcp_server::failover::relay_with_failover(input, &mut output, connect, "fuzz").await;
                assert_eq!(end, RelayEnd::BrokerGone);
                let expected: Vec<Value> = lines(input).into_iter().filter_map(failover_error_id).collect();
                assert_eq!(output_ids(&output), expected);
            }
            1 => {
                let end = relay(input, &mut output, Err::<tokio::io::DuplexStream, _>("none".into()), "fuzz").await;
                assert_eq!(end, RelayEnd::BrokerGone);
                let expected: Vec<Value> = lines(input)
                    .into_iter()
                    .filter_map(|l| error_for(l, "none"))
                    .map(|reply| serde_json::from_str::<Value>(&reply).expect("json")["id"].clone())
                    .collect();
                assert_eq!(output_ids(&output), expected);
            }
            _ => {
                let (relay_side, broker) = tokio::io::duplex(1 << 20);
                let close = async move {
                    let mut reader = tokio::io::BufReader::new(broker);
                    let mut hello = String::new();
                    let _ = reader.read_line(&mut hello).await;
                };
                let (end, ()) = tokio::join!(relay(input, &mut output, Ok(relay_side), "fuzz"), close);
                let _ = end;
                let mut requests: HashMap<String, usize> = HashMap::new();
                for l in lines(input) {
                    if let Some(reply) = error_for(l, "x") {
                        *requests.entry(serde_json::from_str::<Value>(&reply).expect("json")["id"].to_string()).or_default() += 1;
                    }
                }
                let mut answered: HashMap<String, usize> = HashMap::new();
                for id in output_ids(&output) {
                    *answered.entry(id.to_string()).or_default() += 1;
                }
                for (id, n) in answered {
                    assert!(n <= requests.get(&id).copied().unwrap_or(0), "{id} answered {n} times");
                }
            }
        }
    });
});
