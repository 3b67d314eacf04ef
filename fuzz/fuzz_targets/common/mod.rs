//! A broker in this process with a temporary SQLite store: a `lead` agent
//! (the one the fuzzer speaks as) and its child `w`.

use std::path::Path;
use std::sync::Arc;

use substrat_broker::audit::Audit;
use substrat_broker::store::Store;
use substrat_broker::{Broker, NewAgent, Roles};
use substrat_policy::{LoadOptions, load_builtin, load_str};

/// High limits so the fuzzer reaches the tools rather than the rate limiter.
const FUZZ_ROLE: &str = r#"
version = 1
extends = "worker"
[mcp]
calls_per_minute = 60000
burst = 10000
per_tool_calls_per_minute = 60000
per_tool_burst = 10000
tool_steps_per_turn = 10000
inbox_depth = 50
"#;

pub const INBOX_DEPTH: u32 = 50;

pub struct Fixture {
    pub broker: Arc<Broker>,
    pub lead_id: String,
    pub w_id: String,
    _dir: tempfile::TempDir,
}

pub fn fixture() -> Fixture {
    let dir = tempfile::tempdir().expect("tempdir");
    let options = LoadOptions::default();
    let mut roles = Roles::new();
    roles.insert("worker".into(), load_builtin("worker", &options).expect("builtin").expect("loads"));
    roles.insert("fuzz".into(), load_str(Path::new("fuzz.toml"), FUZZ_ROLE, &options).expect("fuzz role loads"));
    let store = Store::open(&dir.path().join("state.db")).expect("store");
    let audit = Audit::open(&dir.path().join("audit.log")).expect("audit");
    let broker = Arc::new(Broker::new(store, roles, dir.path().to_path_buf(), audit));
    let new = |name: &str, parent| NewAgent { name: name.into(), role: "fuzz".into(), parent, ..NewAgent::default() };
    let lead = broker.create_agent(new("lead", None)).expect("lead");
    let w = broker.create_agent(new("w", Some(lead.clone()))).expect("w");
    Fixture { broker, lead_id: lead.id, w_id: w.id, _dir: dir }
}
