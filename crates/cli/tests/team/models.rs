//! `spawn_agent`'s `model` with Claude Code against the scripted model:
//! a child's CLI asks for the model it was given (or its role's default),
//! a model outside the child's role's `model.models` is refused at the
//! spawn, and every request the gateway forwards names an allowed model.

use super::clis::{Model, clis_available, daemon_with_policies};
use super::*;

#[test]
fn a_spawned_agents_cli_asks_for_the_model_it_was_given() {
    let test = "a_spawned_agents_cli_asks_for_the_model_it_was_given";
    if !clis_available(test, "claude") {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let ws = root.path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    let policies = root.path().join("policies");
    std::fs::create_dir(&policies).unwrap();
    let role = |name: &str, body: &str| {
        let text = format!("version = 1\nextends = \"worker\"\n{body}");
        std::fs::write(policies.join(format!("{name}.toml")), text).unwrap();
    };
    role("lead", "[model]\nmodels = [\"claude-opus-*\"]\n");
    role(
        "pinned",
        "[model]\nmodels = [\"claude-sonnet-*\"]\ndefault = \"claude-sonnet-4\"\n",
    );
    let spawn = |name: &str, model: Value| {
        json!({"tool": "spawn_agent", "args": {"name": name, "role": "pinned", "model": model,
            "instructions": format!("{} START", name.to_uppercase())}})
    };
    let model = Model::start(
        root.path(),
        &json!([
            {"when": "LEAD START", "calls": [
                spawn("w1", json!("claude-sonnet-5")),
                spawn("w2", json!("claude-opus-5")),
                spawn("w3", Value::Null)
            ], "final": "lead done"},
            {"when": "W1 START", "final": "w1 done"},
            {"when": "W3 START", "final": "w3 done"}
        ]),
    );
    let real = format!("sk-REAL-models-{}", std::process::id());
    let child = daemon_with_policies(root.path(), "claude", &real, model.port, &policies);
    let team = Team {
        root,
        backend: "native",
        policies,
        child,
        extra: Vec::new(),
    };
    let ws_arg = ws.to_str().unwrap();
    team.agent(&[
        "spawn",
        "lead",
        "--role",
        "lead",
        "--model",
        "claude-opus-5",
        "--workspace",
        ws_arg,
        "LEAD START",
    ]);
    wait_until("the team settles", 180, || {
        team.settled() && team.turns("w1").len() == 1 && team.turns("w3").len() == 1
    });
    let lead = team.turns("lead");
    assert_eq!(lead[0].status, "done", "{lead:#?}");
    // The model each agent's CLI asked for, by the script's rule it hit.
    let requests = model.requests();
    let asked = |rule: &str| -> Vec<String> {
        requests
            .iter()
            .filter(|r| r["text"].as_str().is_some_and(|t| t.starts_with(rule)))
            .map(|r| r["model"].as_str().unwrap_or("").to_string())
            .collect()
    };
    assert_eq!(asked("w1 done"), ["claude-sonnet-5"], "{requests:#?}");
    assert_eq!(asked("w3 done"), ["claude-sonnet-4"], "the role's default");
    assert!(
        asked("lead done").iter().all(|m| m == "claude-opus-5"),
        "{requests:#?}"
    );
    // No request of any agent named a model outside its role's allowance.
    let gateway = std::fs::read_to_string(team.state().join("gateway.log")).unwrap();
    assert!(
        gateway
            .lines()
            .all(|l| l.contains("\"decision\":\"forwarded\"")),
        "{gateway}"
    );
    // w2 was refused by name; the refusal is in the audit log.
    let inspect = team.agent(&["inspect", "lead"]);
    let text = inspect.to_string();
    assert!(
        text.contains("the role `pinned` does not allow the model `claude-opus-5`"),
        "{text}"
    );
    let audit = std::fs::read_to_string(team.state().join("audit.log")).unwrap();
    assert!(
        audit
            .lines()
            .any(|l| l.contains("\"decision\":\"denied\"") && l.contains("model_not_allowed")),
        "{audit}"
    );
    // `agent list` shows each agent's model.
    let listed = team.agent(&["list"]);
    let model_of = |name: &str| {
        listed["agents"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["name"] == name)
            .map(|a| a["model"].clone())
    };
    assert_eq!(model_of("w1"), Some(json!("claude-sonnet-5")));
    assert_eq!(model_of("w2"), None);
    assert_eq!(model_of("w3"), Some(json!("claude-sonnet-4")));
}
