//! `spawn_agent`'s `model`: within the child's role's `model.models`,
//! else refused by name (and audited); the role's default, else the
//! parent's, when none is named. On a broker over a real store.

use super::tests::*;
use super::*;
use crate::store::testdb::TestDb;

/// A role whose agents may use two models, one by default.
const PINNED: &str = r#"version = 1
extends = "worker"
[model]
models = ["claude-sonnet-*", "gpt-5-mini"]
default = "claude-sonnet-4"
"#;

fn broker_with_pinned(db: &TestDb) -> Broker {
    let dir = db.path();
    let mut roles = Roles::new();
    let worker = substrat_policy::load_builtin("worker", &Default::default())
        .unwrap()
        .unwrap();
    roles.insert("worker".into(), worker);
    let pinned =
        substrat_policy::load_str(Path::new("pinned.toml"), PINNED, &Default::default()).unwrap();
    roles.insert("pinned".into(), pinned);
    let audit = Audit::open(&dir.join("audit.log")).unwrap();
    Broker::new(db.open(), roles, dir.to_path_buf(), audit)
}

fn spawn(broker: &Broker, parent: &Agent, name: &str, role: &str, model: Value) -> (Value, bool) {
    let args = json!({"name": name, "instructions": "go", "role": role, "model": model});
    call(broker, parent, "spawn_agent", args)
}

#[test]
fn a_spawned_agents_model_is_within_its_roles_allowance() {
    TestDb::each(
        "a_spawned_agents_model_is_within_its_roles_allowance",
        a_spawned_agents_model_is_within_its_roles_allowance_on,
    );
}

fn a_spawned_agents_model_is_within_its_roles_allowance_on(db: &TestDb) {
    let b = broker_with_pinned(db);
    let lead = b
        .create_agent(NewAgent {
            name: "lead".into(),
            role: "worker".into(),
            model: Some("claude-opus-5".into()),
            ..NewAgent::default()
        })
        .unwrap();
    let model_of = |name: &str| b.agent_named(name).unwrap().unwrap().model;
    // Named and allowed: the child's CLI is started with it.
    let (body, is_error) = spawn(&b, &lead, "w1", "pinned", json!("claude-sonnet-5"));
    assert!(!is_error, "{body}");
    assert_eq!(model_of("w1").as_deref(), Some("claude-sonnet-5"));
    // Outside the allowance: refused, the patterns named, no agent made.
    let (body, is_error) = spawn(&b, &lead, "w2", "pinned", json!("claude-opus-5"));
    assert!(is_error);
    assert_eq!(
        body,
        json!({"status": "error", "error": "model_not_allowed", "message":
            "the role `pinned` does not allow the model `claude-opus-5` \
             (its model.models: `claude-sonnet-*`, `gpt-5-mini`)"})
    );
    assert!(b.agent_named("w2").unwrap().is_none());
    // Not a model name at all (it goes on a command line).
    let (body, _) = spawn(&b, &lead, "w3", "pinned", json!("--dangerous"));
    assert_eq!(body["error"], "invalid_model", "{body}");
    // None named: the role's default, not the parent's (not allowed).
    let (body, is_error) = spawn(&b, &lead, "w4", "pinned", Value::Null);
    assert!(!is_error, "{body}");
    assert_eq!(model_of("w4").as_deref(), Some("claude-sonnet-4"));
    // A role without models: the parent's, as before; any named.
    spawn(&b, &lead, "w5", "worker", Value::Null);
    assert_eq!(model_of("w5").as_deref(), Some("claude-opus-5"));
    spawn(&b, &lead, "w6", "worker", json!("anything-at-all"));
    assert_eq!(model_of("w6").as_deref(), Some("anything-at-all"));
    // The operator's spawn is held to the same allowance.
    let refused = b.create_agent(NewAgent {
        name: "op".into(),
        role: "pinned".into(),
        model: Some("gpt-5".into()),
        ..NewAgent::default()
    });
    assert!(
        matches!(&refused, Err(CreateError::Refused("model_not_allowed", m)) if m.contains("`gpt-5`")),
        "{refused:?}"
    );
    // Each refusal is audited as denied with its code.
    let audit = std::fs::read_to_string(db.path().join("audit.log")).unwrap();
    let denied: Vec<Value> = audit
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|l| l["tool"] == "spawn_agent" && l["decision"] == "denied")
        .collect();
    let reasons: Vec<&str> = denied.iter().filter_map(|l| l["reason"].as_str()).collect();
    assert_eq!(reasons, ["model_not_allowed", "invalid_model"], "{audit}");
}
