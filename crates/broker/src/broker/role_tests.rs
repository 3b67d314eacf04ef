//! Roles seen from the call path: compiled roles listed and resolved with
//! the caller's team, role arguments checked at spawn, a role's context.
//! On a broker over a real store, on each engine (store::testdb).

use super::tests::*;
use super::*;
use crate::store::testdb::TestDb;

/// A role compiled in (seed 004 §3.3): registered under a policy's name,
/// listed with its arguments, resolved with the caller's team.
struct DbExpert;

impl crate::roles::Role for DbExpert {
    fn name(&self) -> &str {
        "worker"
    }
    fn description(&self) -> &str {
        "Answers database questions"
    }
    fn tools(&self) -> Vec<String> {
        vec!["send_message".into()]
    }
    fn arguments(&self) -> Vec<crate::roles::RoleArgument> {
        vec![crate::roles::RoleArgument {
            name: "database".into(),
            description: "Which database".into(),
            required: false,
        }]
    }
    fn resolve(
        &self,
        args: &crate::roles::RoleArgs,
        context: Arc<dyn crate::roles::TeamContext>,
    ) -> Result<crate::roles::RolePrompt, crate::roles::RoleError> {
        let db = args.get("database").map_or("main", String::as_str);
        let team = context.team();
        let names: Vec<&str> = team
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|a| a["name"].as_str())
            .collect();
        Ok(crate::roles::RolePrompt {
            system: format!("You know the {db} database; ask {}.", names.join(" or ")),
            tools: self.tools(),
            messages: Vec::new(),
        })
    }
}

#[test]
fn a_compiled_role_is_listed_and_resolved_with_the_callers_team() {
    TestDb::each(
        "a_compiled_role_is_listed_and_resolved_with_the_callers_team",
        a_compiled_role_is_listed_and_resolved_with_the_callers_team_on,
    );
}

fn a_compiled_role_is_listed_and_resolved_with_the_callers_team_on(dir: &TestDb) {
    let mut b = broker(dir);
    b.register_role(Arc::new(DbExpert)).unwrap();
    let b = Arc::new(b);
    let lead = create(&b, "lead", None);
    let w1 = create(&b, "w1", Some(&lead));
    create(&b, "w2", Some(&lead));
    let info = b.role_info("worker").unwrap();
    assert_eq!(info.source, crate::roles::RoleSource::Rust);
    assert_eq!(info.arguments.len(), 1);
    // The declared tools narrow the policy's scope.
    let menu: Vec<String> = b
        .menu_for_role("worker")
        .entries
        .iter()
        .map(|e| e.name.clone())
        .collect();
    assert_eq!(menu, ["send_message"]);
    let args: crate::roles::RoleArgs = [("database".to_string(), "billing".to_string())].into();
    let prompt = b.resolve_role("worker", args, Some(w1)).unwrap();
    // w1 may message its parent and its sibling.
    assert_eq!(
        prompt.system,
        "You know the billing database; ask lead or w2."
    );
    let unknown: crate::roles::RoleArgs = [("db".to_string(), "x".to_string())].into();
    let err = b.resolve_role("worker", unknown, None).unwrap_err();
    assert_eq!(
        err.to_string(),
        "role `worker` takes no argument `db` (it takes: database)"
    );
    // A role with no policy of its name is refused.
    struct Stray;
    impl crate::roles::Role for Stray {
        fn name(&self) -> &str {
            "stray"
        }
        fn description(&self) -> &str {
            ""
        }
        fn tools(&self) -> Vec<String> {
            Vec::new()
        }
        fn resolve(
            &self,
            _: &crate::roles::RoleArgs,
            _: Arc<dyn crate::roles::TeamContext>,
        ) -> Result<crate::roles::RolePrompt, crate::roles::RoleError> {
            unreachable!()
        }
    }
    let other = TestDb::new(dir.engine()).unwrap();
    let mut lone = broker(&other);
    assert!(lone.register_role(Arc::new(Stray)).is_err());
}

/// A compiled role that keeps its policy's scope and needs an argument.
struct Analyst;

impl crate::roles::Role for Analyst {
    fn name(&self) -> &str {
        "strict"
    }
    fn description(&self) -> &str {
        "Analyses one topic"
    }
    fn tools(&self) -> Vec<String> {
        Vec::new()
    }
    fn arguments(&self) -> Vec<crate::roles::RoleArgument> {
        vec![crate::roles::RoleArgument {
            name: "topic".into(),
            description: String::new(),
            required: true,
        }]
    }
    fn resolve(
        &self,
        args: &crate::roles::RoleArgs,
        _: Arc<dyn crate::roles::TeamContext>,
    ) -> Result<crate::roles::RolePrompt, crate::roles::RoleError> {
        Ok(crate::roles::RolePrompt {
            system: format!("Analyse {}.", args["topic"]),
            tools: Vec::new(),
            messages: Vec::new(),
        })
    }
}

#[test]
fn spawn_agent_checks_role_arguments_now_and_keeps_them_for_the_first_turn() {
    TestDb::each(
        "spawn_agent_checks_role_arguments_now_and_keeps_them_for_the_first_turn",
        spawn_agent_checks_role_arguments_now_and_keeps_them_for_the_first_turn_on,
    );
}

fn spawn_agent_checks_role_arguments_now_and_keeps_them_for_the_first_turn_on(dir: &TestDb) {
    let mut b = broker_with(dir, &["worker", "strict", "reviewer"]);
    b.register_role(Arc::new(Analyst)).unwrap();
    let lead = create(&b, "lead", None);
    let spawn = |args: Value| {
        let mut request = json!({"name": "w1", "role": "strict", "instructions": "go"});
        request["role_args"] = args;
        call(&b, &lead, "spawn_agent", request)
    };
    let (body, is_error) = spawn(json!({"topic": "x", "subject": "x"}));
    assert!(is_error, "{body}");
    assert_eq!(body["error"], "role_args");
    assert_eq!(
        body["message"],
        "role `strict` takes no argument `subject` (it takes: topic)"
    );
    let (body, is_error) = spawn(json!({}));
    assert!(
        is_error && body["message"] == "role `strict`: argument `topic` is required",
        "{body}"
    );
    let (body, is_error) = spawn(json!({"topic": "billing"}));
    assert!(!is_error, "{body}");
    let child = b.agent_named("w1").unwrap().unwrap();
    assert_eq!(
        b.agent_role_args(&child.id).as_deref(),
        Some(r#"{"topic":"billing"}"#)
    );
    // A role without arguments refuses any.
    let (body, is_error) = call(
        &b,
        &lead,
        "spawn_agent",
        json!({"name": "r1", "role": "reviewer", "instructions": "go", "role_args": {"x": "1"}}),
    );
    assert!(is_error && body["error"] == "role_args", "{body}");
}

/// A role that shows what its context gave it.
struct Echo;

impl crate::roles::Role for Echo {
    fn name(&self) -> &str {
        "worker"
    }
    fn description(&self) -> &str {
        ""
    }
    fn tools(&self) -> Vec<String> {
        Vec::new()
    }
    fn resolve(
        &self,
        _: &crate::roles::RoleArgs,
        context: Arc<dyn crate::roles::TeamContext>,
    ) -> Result<crate::roles::RolePrompt, crate::roles::RoleError> {
        let seen = json!({
            "team": context.team(),
            "inbox": context.inbox(),
            "inspect": context.inspect("c1").map(|v| v["name"].clone()),
        });
        Ok(crate::roles::RolePrompt {
            system: seen.to_string(),
            tools: Vec::new(),
            messages: Vec::new(),
        })
    }
}

/// Found by review: a role's context showed an agent more than its own
/// tools would.
#[test]
fn a_roles_context_shows_the_caller_what_its_tools_would() {
    TestDb::each(
        "a_roles_context_shows_the_caller_what_its_tools_would",
        a_roles_context_shows_the_caller_what_its_tools_would_on,
    );
}

fn a_roles_context_shows_the_caller_what_its_tools_would_on(dir: &TestDb) {
    let mut b = broker_with(dir, &["worker", "strict"]);
    b.register_role(Arc::new(Echo)).unwrap();
    let b = Arc::new(b);
    let lead = create(&b, "lead", None);
    let (body, is_error) = call(
        &b,
        &lead,
        "spawn_agent",
        json!({"name": "c1", "role": "strict", "instructions": "go"}),
    );
    assert!(!is_error, "{body}");
    let c1 = b.agent_named("c1").unwrap().unwrap();
    let seen = |caller: Option<Agent>| -> Value {
        let prompt = b
            .resolve_role("worker", Default::default(), caller)
            .unwrap();
        serde_json::from_str(&prompt.system).unwrap()
    };
    // The lead (worker: inspect_agent, check_inbox): its child, by name.
    assert_eq!(
        seen(Some(lead)),
        json!({"team": [{"name": "c1"}], "inbox": {"waiting": 0}, "inspect": "c1"})
    );
    // c1 (strict: no inspect_agent) sees its parent's name, its inbox, no one to inspect.
    assert_eq!(
        seen(Some(c1)),
        json!({"team": [{"name": "lead"}], "inbox": {"waiting": 1}, "inspect": null})
    );
    // The operator sees everyone, with roles and states.
    let all = seen(None);
    let roles: Vec<&str> = all["team"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|a| a["role"].as_str())
        .collect();
    assert_eq!(roles.len(), 2);
    assert!(
        roles.contains(&"strict") && roles.contains(&"worker"),
        "{all}"
    );
}
