//! Arbitrary bytes as a turn request packet read by a warm sandbox's init
//! (substrat_sandbox::turns). Invariants: parsing never panics; an accepted
//! request has a command, no NUL anywhere, fits the limit, and survives a
//! round trip; the turn's environment has exactly the plan's names (a
//! request never adds one), with the request's values, and a refused name
//! is one the plan does not pass. The same bytes as the launcher's first
//! packet (`Hello`, read by the daemon): parsing never panics, an accepted
//! one survives a round trip, and `checked` accepts only an absolute path
//! and keeps it as given.
#![no_main]

use libfuzzer_sys::fuzz_target;
use substrat_sandbox::turns::{Hello, MAX_REQUEST, RequestError, parse_request, turn_env};

fuzz_target!(|data: &[u8]| {
    hello(data);
    let Ok(request) = parse_request(data) else { return };
    assert!(data.len() <= MAX_REQUEST);
    assert!(!request.argv.is_empty() && !request.argv[0].is_empty());
    let strings = request.argv.iter().chain(request.env.iter().flat_map(|(k, v)| [k, v]));
    assert!(strings.into_iter().all(|s| !s.contains('\0')));
    let again = serde_json::to_vec(&request).expect("serializes");
    assert_eq!(parse_request(&again).ok(), Some(request.clone()));

    let plan: Vec<(String, String)> =
        ["PATH", "HOME", "TERM"].iter().map(|n| (n.to_string(), "plan".to_string())).collect();
    match turn_env(&plan, &request) {
        Ok(env) => {
            let names: Vec<&str> = env.iter().map(|(k, _)| k.as_str()).collect();
            assert_eq!(names, ["PATH", "HOME", "TERM"]);
            for (name, value) in &env {
                let last = request.env.iter().rev().find(|(k, _)| k == name);
                assert_eq!(value, last.map_or("plan", |(_, v)| v.as_str()));
            }
        }
        Err(RequestError::NotPassed(name)) => {
            assert!(!plan.iter().any(|(k, _)| *k == name));
            assert!(request.env.iter().any(|(k, _)| *k == name));
        }
        Err(other) => panic!("turn_env refused with {other}"),
    }
});

fn hello(data: &[u8]) {
    let Ok(hello) = serde_json::from_slice::<Hello>(data) else { return };
    let again = serde_json::to_vec(&hello).expect("serializes");
    assert_eq!(serde_json::from_slice::<Hello>(&again).ok(), Some(hello.clone()));
    if let Hello::Freezer(freezer) = hello {
        let group = freezer.group.clone();
        if let Ok(kept) = freezer.checked() {
            assert!(group.is_absolute(), "{group:?}");
            assert_eq!(kept.group, group);
        }
    }
}
