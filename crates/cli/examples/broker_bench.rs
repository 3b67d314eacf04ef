//! Broker benchmark (docs/benchmarks.md): starts a daemon in a temporary
//! state directory and measures
//! - check_inbox round trips through substrat-mcp-server and the broker,
//!   p50/p99, with 1 and with 100 agents calling at once, and calls/s;
//! - the same over MCP streamable HTTP on the agents' sockets (issue 41),
//!   and, beside it, over the line protocol with the same async client: 1
//!   agent, 100 in a closed loop, and 100 in an open loop at offered rates
//!   (each agent calling at a fixed interval); with the daemon's CPU time
//!   per call;
//! - durable send_message/s (each acknowledged after its commit);
//! - the daemon's RSS with 1,000 registered agents and 100 connected.
//!
//! Run: `cargo run --release --example broker_bench` (scripts/bench-broker).
//! With `BENCH_STATE=postgres://...` the daemon keeps its state there
//! (`--state`) instead of its SQLite file. `BENCH_ONLY=http` runs only
//! the direct-socket line and the async clients' lines (after registering
//! the agents).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "common/mod.rs"]
mod common;
#[path = "mcp_clients/mod.rs"]
mod mcp_clients;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use common::{control, target_dir};
use mcp_clients::Speaks;

/// An MCP client speaking to the broker through a relay process.
struct Client {
    _relay: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    id: u64,
}

impl Client {
    fn new(agent: &Value) -> Self {
        let mut relay = Command::new(target_dir().join("substrat-mcp-server"))
            .args(["--agent-id", agent["id"].as_str().unwrap()])
            .env("SUBSTRAT_SOCKET", agent["socket"].as_str().unwrap())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = relay.stdin.take().unwrap();
        let stdout = BufReader::new(relay.stdout.take().unwrap());
        let mut c = Client {
            _relay: relay,
            stdin,
            stdout,
            id: 0,
        };
        c.call("initialize", json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}}));
        c.stdin
            .write_all(b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}\n")
            .unwrap();
        c
    }

    fn call(&mut self, method: &str, params: Value) -> Value {
        self.id += 1;
        let line = format!(
            "{}\n",
            json!({"jsonrpc": "2.0", "id": self.id, "method": method, "params": params})
        );
        self.stdin.write_all(line.as_bytes()).unwrap();
        let mut reply = String::new();
        self.stdout.read_line(&mut reply).unwrap();
        serde_json::from_str(&reply).unwrap()
    }

    fn tool(&mut self, name: &str, args: Value) -> Value {
        let reply = self.call("tools/call", json!({"name": name, "arguments": args}));
        assert!(reply["result"]["isError"] == false, "{reply}");
        reply
    }
}

fn percentile(sorted: &[Duration], q: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize].as_secs_f64() * 1e6
}

/// The CPU time `pid` has used (user and system), in µs.
fn cpu_us(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // After the command's name in parentheses: utime and stime are the
    // 12th and 13th fields, in clock ticks (100 a second on Linux).
    let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    ticks * 1e4
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .unwrap()
        .trim()
        .trim_end_matches(" kB")
        .trim()
        .parse()
        .unwrap()
}

fn inbox_rounds(agents: &[Value], calls_each: usize) -> (Vec<Duration>, Duration) {
    let start = Instant::now();
    let handles: Vec<_> = agents
        .iter()
        .cloned()
        .map(|agent| {
            std::thread::spawn(move || {
                let mut c = Client::new(&agent);
                let mut times = Vec::with_capacity(calls_each);
                for _ in 0..calls_each {
                    let t = Instant::now();
                    c.tool("check_inbox", json!({}));
                    times.push(t.elapsed());
                }
                times
            })
        })
        .collect();
    let mut all: Vec<Duration> = handles
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    let elapsed = start.elapsed();
    all.sort();
    (all, elapsed)
}

const INITIALIZE: &[u8] = b"{\"jsonrpc\":\"2.0\",\"id\":0,\"method\":\"initialize\",\"params\":{\"protocolVersion\":\"2025-06-18\",\"capabilities\":{},\"clientInfo\":{\"name\":\"b\",\"version\":\"1\"}}}\n{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}\n";

/// The daemon over `state`, with the benchmark's roles, once it listens.
fn start_daemon(state: &Path) -> Child {
    let policies = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/broker/policies");
    let mut command = Command::new(target_dir().join("substrat-sandbox"));
    command
        .args(["daemon", "--policies"])
        .arg(&policies)
        .arg("--state-dir")
        .arg(state)
        .env("SUBSTRAT_LOG", "error");
    if let Ok(database) = std::env::var("BENCH_STATE") {
        command.env("SUBSTRAT_STATE", database);
    }
    let daemon = command.spawn().unwrap();
    while !state.join("control.sock").exists() {
        std::thread::sleep(Duration::from_millis(10));
    }
    daemon
}

/// An agent's socket with an initialized MCP session on it (no relay).
fn connect(agent: &Value) -> UnixStream {
    let s = UnixStream::connect(agent["socket"].as_str().unwrap()).unwrap();
    let mut w = s.try_clone().unwrap();
    w.write_all(INITIALIZE).unwrap();
    let mut line = String::new();
    BufReader::new(s.try_clone().unwrap())
        .read_line(&mut line)
        .unwrap();
    s
}

/// Memory before any load: idle connected agents, each an initialized MCP
/// session. The first connection also faults in code and runtime state
/// once; the cost per agent is measured from the 2nd to the 101st.
fn memory(daemon: &Child, agents: &[Value], rss_start: u64, rss_registered: u64) {
    let mut connected: Vec<UnixStream> = vec![connect(&agents[0])];
    std::thread::sleep(Duration::from_millis(300));
    let rss_first = rss_kib(daemon.id());
    connected.extend(agents[1..101].iter().map(connect));
    std::thread::sleep(Duration::from_millis(300));
    let rss_connected = rss_kib(daemon.id());
    println!(
        "| daemon RSS | start {rss_start} KiB | 1,000 agents registered {rss_registered} KiB | first connected {rss_first} KiB | 101 connected {rss_connected} KiB | {:.1} KiB per further connected agent |",
        (rss_connected.saturating_sub(rss_first)) as f64 / 100.0
    );
}

fn print_rounds(what: &str, times: &[Duration], elapsed: Duration) {
    println!(
        "| check_inbox via relay, {what} | p50 {:.0} µs | p99 {:.0} µs | {:.0} calls/s |",
        percentile(times, 0.5),
        percentile(times, 0.99),
        times.len() as f64 / elapsed.as_secs_f64()
    );
}

/// The broker alone: 100 clients on the sockets directly, 500 calls each.
fn direct_sockets(daemon: u32, agents: &[Value]) {
    let cpu = cpu_us(daemon);
    let start = Instant::now();
    let handles: Vec<_> = agents
        .iter()
        .cloned()
        .map(|agent| {
            std::thread::spawn(move || {
                let s = connect(&agent);
                let mut reader = BufReader::new(s.try_clone().unwrap());
                let mut w = s;
                let mut line = String::new();
                let mut times = Vec::with_capacity(500);
                for i in 1..=500 {
                    line.clear();
                    let call = Instant::now();
                    w.write_all(format!("{{\"jsonrpc\":\"2.0\",\"id\":{i},\"method\":\"tools/call\",\"params\":{{\"name\":\"check_inbox\",\"arguments\":{{}}}}}}\n").as_bytes()).unwrap();
                    reader.read_line(&mut line).unwrap();
                    times.push(call.elapsed());
                }
                times
            })
        })
        .collect();
    let mut times = Vec::new();
    for h in handles {
        times.extend(h.join().unwrap());
    }
    let elapsed = start.elapsed();
    let cpu = cpu_us(daemon) - cpu;
    times.sort();
    println!(
        "| check_inbox on the sockets directly, 100 agents at once | p50 {:.0} µs | p99 {:.0} µs | {:.0} calls/s | daemon CPU {:.0} µs/call |",
        percentile(&times, 0.5),
        percentile(&times, 0.99),
        times.len() as f64 / elapsed.as_secs_f64(),
        cpu / times.len() as f64,
    );
}

/// check_inbox with async clients on the agents' sockets (400 agents:
/// each run on sessions of its own), over MCP streamable HTTP or the line
/// protocol: 1 agent and 100 at once in a closed loop, then 100 in an open
/// loop at offered rates (an agent team's real load is far below the
/// closed loop's).
fn async_clients(daemon: u32, agents: &[Value], speaks: Speaks) {
    let sockets: Vec<String> = agents
        .iter()
        .map(|a| a["socket"].as_str().unwrap().to_string())
        .collect();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let over = match speaks {
        Speaks::Http => "over streamable HTTP",
        Speaks::Lines => "on the sockets, lines, async client",
    };
    let line = |what: &str, times: &[Duration], elapsed: Duration, cpu: f64, more: &str| {
        println!(
            "| check_inbox {over}, {what} | p50 {:.0} µs | p99 {:.0} µs | {:.0} calls/s | daemon CPU {:.0} µs/call{more} |",
            percentile(times, 0.5),
            percentile(times, 0.99),
            times.len() as f64 / elapsed.as_secs_f64(),
            cpu / times.len() as f64,
        );
    };
    let connect = |sockets: &[String]| runtime.block_on(mcp_clients::connect_all(sockets, speaks));
    let agents = connect(&sockets[..1]);
    let cpu = cpu_us(daemon);
    let (one, elapsed) = runtime.block_on(mcp_clients::closed_loop(agents, 5000));
    line("1 agent", &one, elapsed, cpu_us(daemon) - cpu, "");
    let agents = connect(&sockets[..100]);
    let cpu = cpu_us(daemon);
    let (many, elapsed) = runtime.block_on(mcp_clients::closed_loop(agents, 500));
    let cpu = cpu_us(daemon) - cpu;
    line("100 agents at once, closed loop", &many, elapsed, cpu, "");
    for (i, offered) in [200.0, 2000.0, 5000.0].into_iter().enumerate() {
        let agents = connect(&sockets[100 * (i + 1)..100 * (i + 2)]);
        let cpu = cpu_us(daemon);
        let run = runtime.block_on(mcp_clients::open_loop(
            agents,
            offered,
            Duration::from_secs(10),
        ));
        let cpu = cpu_us(daemon) - cpu;
        line(
            &format!("100 agents, open loop, {offered:.0} calls/s offered"),
            &run.times,
            run.elapsed,
            cpu,
            &format!(" | {} due while the last was out", run.late),
        );
    }
}

/// Durable sends, each sender to its own child, one message at a time per
/// sender: every message acknowledged only once committed.
fn durable_sends(pairs: &[(Value, String)], each: usize) -> f64 {
    let start = Instant::now();
    let handles: Vec<_> = pairs
        .iter()
        .cloned()
        .map(|(lead, child)| {
            std::thread::spawn(move || {
                let mut c = Client::new(&lead);
                for i in 0..each {
                    c.tool(
                        "send_message",
                        json!({"recipient": child, "text": format!("message {i}"), "sync": false}),
                    );
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    (pairs.len() * each) as f64 / start.elapsed().as_secs_f64()
}

fn main() {
    let dir = tempfile::tempdir().unwrap();
    // BENCH_DAEMONS=2 (with BENCH_STATE): a second daemon on the same
    // database; agents alternate between the two.
    let daemons: usize = std::env::var("BENCH_DAEMONS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1);
    let states: Vec<PathBuf> = (0..daemons.max(1))
        .map(|i| dir.path().join(format!("state{i}")))
        .collect();
    let mut children: Vec<Child> = states.iter().map(|s| start_daemon(s)).collect();
    let create = |i: usize, name: String, parent: Option<&str>| {
        control(
            &states[i % states.len()],
            json!({"op": "create", "name": name, "role": "bulk", "parent": parent, "workspace": null}),
        )
    };
    let daemon = &children[0];
    let rss_start = rss_kib(daemon.id());
    let agents: Vec<Value> = (0..1000)
        .map(|i| create(i, format!("a{i}"), None))
        .collect();
    let rss_registered = rss_kib(daemon.id());
    if std::env::var("BENCH_ONLY").as_deref() == Ok("http") {
        direct_sockets(daemon.id(), &agents[100..200]);
        async_clients(daemon.id(), &agents[200..600], Speaks::Http);
        async_clients(daemon.id(), &agents[600..1000], Speaks::Lines);
        for child in &mut children {
            let _ = child.kill();
            let _ = child.wait();
        }
        return;
    }
    if states.len() == 1 {
        memory(daemon, &agents, rss_start, rss_registered);
    }
    let (one, elapsed) = inbox_rounds(&agents[..1], 5000);
    print_rounds("1 agent", &one, elapsed);
    let (many, elapsed) = inbox_rounds(&agents[..100], 500);
    print_rounds("100 agents at once", &many, elapsed);
    direct_sockets(daemon.id(), &agents[100..200]);
    async_clients(daemon.id(), &agents[200..600], Speaks::Http);
    async_clients(daemon.id(), &agents[600..1000], Speaks::Lines);
    let pairs: Vec<(Value, String)> = (0..10)
        .map(|i| {
            let lead = create(i, format!("lead{i}"), None);
            create(i, format!("w{i}"), Some(&format!("lead{i}")));
            (lead, format!("w{i}"))
        })
        .collect();
    let one = durable_sends(&pairs[..1], 5000);
    println!("| durable send_message, 1 agent | {one:.0} messages/s |");
    let ten = durable_sends(&pairs, 1000);
    println!("| durable send_message, 10 agents at once | {ten:.0} messages/s |");
    for child in &mut children {
        let _ = child.kill();
        let _ = child.wait();
    }
}
