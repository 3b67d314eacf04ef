//! Arbitrary bytes as a control-socket request line, carried out against a
//! broker with a temporary store. Invariants: the answer is an object with
//! a boolean `ok`; refusals carry an error code; agents keep valid names;
//! no inbox exceeds its depth.
#![no_main]

#[allow(dead_code)]
mod common;

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use substrat_broker::control::{Request, handle};

fn fixture() -> &'static common::Fixture {
    static FIXTURE: OnceLock<common::Fixture> = OnceLock::new();
    FIXTURE.get_or_init(common::fixture)
}

fuzz_target!(|data: &[u8]| {
    let Ok(request) = serde_json::from_slice::<Request>(data) else { return };
    let fixture = fixture();
    let answer = handle(&fixture.broker, request);
    let ok = answer["ok"].as_bool().expect("ok is a boolean");
    if !ok {
        assert!(answer["error"].is_string() && answer["message"].is_string(), "{answer}");
    }
    for agent in fixture.broker.agents().expect("agents") {
        assert!(!agent.name.is_empty() && agent.name.len() <= 64 && !agent.name.contains('/'), "{agent:?}");
        let activity = fixture.broker.activity(&agent).expect("activity");
        let depth = fixture.broker.policy_of(&agent).and_then(|p| p.policy.mcp.inbox_depth).map_or(u64::MAX, u64::from);
        assert!(activity["queued_messages"].as_u64().unwrap_or(0) <= depth);
    }
    let _: Value = answer;
});
