//! Arbitrary bytes as the end of a daemon's audit log, as `top` reads it
//! (`audit::recent`): lines hold what agents chose (tool names, reasons),
//! and the tail may start inside a line. The first byte picks how many
//! decisions are asked for (0-15). Invariants, not only "no panic":
//! - at most that many, each about the agent asked for;
//! - the same as a forward reading of every line: the last matching
//!   entries, in the order the log has them.
#![no_main]

use libfuzzer_sys::fuzz_target;
use substrat_broker::audit::{Recorded, recent};

fn forward(tail: &[u8], agent_id: &str, n: usize) -> Vec<Recorded> {
    let all: Vec<Recorded> = tail
        .split(|&b| b == b'\n')
        .filter_map(|line| serde_json::from_slice::<Recorded>(line).ok())
        .filter(|r| r.agent_id == agent_id)
        .collect();
    all[all.len().saturating_sub(n)..].to_vec()
}

fuzz_target!(|data: &[u8]| {
    let Some((&pick, tail)) = data.split_first() else {
        return;
    };
    let n = usize::from(pick & 15);
    for agent_id in ["a", ""] {
        let got = recent(tail, agent_id, n);
        assert!(got.len() <= n);
        assert!(got.iter().all(|r| r.agent_id == agent_id));
        assert_eq!(got, forward(tail, agent_id, n));
    }
});
