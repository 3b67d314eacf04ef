//! `role list | test | init` and `check` on script roles.

use super::*;

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn role_init_writes_templates_that_pass_check_list_and_test() {
    let dir = tempfile::tempdir().unwrap();
    let roles = dir.path().join("roles");
    let roles_arg = roles.to_str().unwrap();
    for args in [
        vec!["role", "init", "triage", "--lua", "--dir", roles_arg],
        vec!["role", "init", "plain", "--dir", roles_arg],
    ] {
        let out = substrat(&args);
        assert_eq!(code(&out), 0, "{}", stderr(&out));
    }
    let check = substrat(&["check", "--format", "json", roles_arg]);
    assert_eq!(code(&check), 0, "{}", stderr(&check));
    let report: Value = serde_json::from_slice(&check.stdout).unwrap();
    for policy in report["policies"].as_array().unwrap() {
        assert_eq!(policy["findings"], serde_json::json!([]), "{policy}");
    }

    let list = substrat(&["role", "list", "--json", "--policies", roles_arg]);
    assert_eq!(code(&list), 0, "{}", stderr(&list));
    let list: Value = serde_json::from_slice(&list.stdout).unwrap();
    let triage = list
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "triage")
        .unwrap();
    assert_eq!(triage["source"], "lua");
    assert_eq!(
        triage["arguments"],
        serde_json::json!([{"name": "topic", "description": "What the agent works on", "required": true}])
    );

    let test = substrat(&[
        "role",
        "test",
        "triage",
        "--json",
        "--policies",
        roles_arg,
        "--arg",
        "topic=the parser",
    ]);
    assert_eq!(code(&test), 0, "{}", stderr(&test));
    let prompt: Value = serde_json::from_slice(&test.stdout).unwrap();
    assert_eq!(
        prompt["system"],
        "You work on the parser with the team (0 teammates). Report with send_message."
    );
    let missing = substrat(&["role", "test", "triage", "--policies", roles_arg]);
    assert_eq!(code(&missing), 2);
    assert!(
        stderr(&missing).contains("role `triage`: argument `topic` is required"),
        "{}",
        stderr(&missing)
    );
    let static_arg = substrat(&[
        "role",
        "test",
        "plain",
        "--policies",
        roles_arg,
        "--arg",
        "x=1",
    ]);
    assert_eq!(code(&static_arg), 2);
    assert!(stderr(&static_arg).contains("takes no argument `x` (it takes: none)"));
    // Nothing is overwritten.
    let again = substrat(&["role", "init", "triage", "--dir", roles_arg]);
    assert_eq!(code(&again), 2);
    assert!(
        stderr(&again).contains("exists; nothing written"),
        "{}",
        stderr(&again)
    );
    assert!(
        std::fs::read_to_string(roles.join("triage.toml"))
            .unwrap()
            .contains("script = \"triage.lua\"")
    );
    let bad = substrat(&["role", "init", "../x", "--dir", roles_arg]);
    assert_eq!(code(&bad), 2);
    assert!(stdout(&bad).is_empty());
}

/// The next step `role init` prints, run as printed from where init ran:
/// with a relative --dir the script's path was joined to the policy's
/// directory twice (`roles/roles/triage.lua`), a high finding.
#[test]
fn role_inits_printed_check_passes_from_where_it_ran() {
    let cwd = tempfile::tempdir().unwrap();
    let in_cwd = |args: &[&str]| {
        Command::new(bin())
            .args(args)
            .current_dir(cwd.path())
            .env_remove("SUBSTRAT_POLICY_DIR")
            .env_remove("SUBSTRAT_SECCOMP_DIR")
            .output()
            .unwrap()
    };
    let init = in_cwd(&["role", "init", "triage", "--lua", "--dir", "./roles"]);
    assert_eq!(code(&init), 0, "{}", stderr(&init));
    let printed = stdout(&init);
    let next = printed
        .lines()
        .find_map(|l| l.strip_prefix("check it with: substrat-sandbox "))
        .unwrap_or_else(|| panic!("no next step in {printed}"));
    let args: Vec<&str> = next.split_whitespace().collect();
    assert_eq!(args[0], "check", "{next}");
    let check = in_cwd(&args);
    assert_eq!(code(&check), 0, "{}", stderr(&check));
    assert!(
        stdout(&check).contains("no findings"),
        "`{next}` from {}:\n{}",
        cwd.path().display(),
        stdout(&check)
    );
}

#[test]
fn check_reports_a_broken_script_and_tools_out_of_scope() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(
        d.join("gone.toml"),
        "version = 1\nextends = \"worker\"\n[persona]\nscript = \"gone.lua\"\n",
    )
    .unwrap();
    std::fs::write(d.join("loops.lua"), "while true do end\n").unwrap();
    std::fs::write(
        d.join("loops.toml"),
        "version = 1\nextends = \"worker\"\n[persona]\nscript = \"loops.lua\"\ntimeout_ms = 100\n",
    )
    .unwrap();
    std::fs::write(
        d.join("wide.lua"),
        "return { tools = { 'check_inbox', 'spawn_agent', 'web_fetch' }, resolve = function() return { system = 'x' } end }\n",
    )
    .unwrap();
    std::fs::write(
        d.join("wide.toml"),
        "version = 1\nextends = \"worker\"\n[tools]\nallow = [\"check_inbox\"]\n[persona]\nscript = \"wide.lua\"\n",
    )
    .unwrap();
    let out = substrat(&["check", "--format", "json", d.to_str().unwrap()]);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let findings = |file: &str| -> Vec<(String, String, String)> {
        report["policies"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["path"].as_str().unwrap().ends_with(file))
            .unwrap()["findings"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| {
                (
                    f["rule_id"].as_str().unwrap().to_string(),
                    f["severity"].as_str().unwrap().to_string(),
                    f["message"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    };
    let gone = findings("gone.toml");
    assert_eq!(gone.len(), 1, "{gone:?}");
    assert_eq!((gone[0].0.as_str(), gone[0].1.as_str()), ("ROL001", "high"));
    assert!(gone[0].2.contains("gone.lua: No such file"), "{gone:?}");
    assert_eq!(
        findings("loops.toml"),
        [(
            "ROL001".to_string(),
            "high".to_string(),
            "role `loops` ran past its time limit of 100 ms".to_string()
        )]
    );
    assert_eq!(
        findings("wide.toml"),
        [(
            "ROL002".to_string(),
            "medium".to_string(),
            "the script declares tools outside the policy's tools scope: spawn_agent, web_fetch"
                .to_string()
        )]
    );
}

#[test]
fn roles_written_inline_in_the_daemons_configuration() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::create_dir(d.join("scripts")).unwrap();
    std::fs::copy(
        repo().join("tests/broker/roles/incident.lua"),
        d.join("scripts/responder.lua"),
    )
    .unwrap();
    let config = d.join("substrat.toml");
    std::fs::write(
        &config,
        r#"
[roles.code-reviewer]
description = "Reviews code changes"
extends = "reviewer"
tools = ["send_message", "check_inbox"]
system_prompt = "You review code."

[roles.script.responder]
path = "scripts/responder.lua"
timeout = 2
escalate_to = "the lead"
"#,
    )
    .unwrap();
    let config_arg = config.to_str().unwrap();
    let list = substrat(&["role", "list", "--json", "--config", config_arg]);
    assert_eq!(code(&list), 0, "{}", stderr(&list));
    let list: Value = serde_json::from_slice(&list.stdout).unwrap();
    let by_name = |n: &str| {
        list.as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == n)
            .cloned()
            .unwrap_or_else(|| panic!("no {n} in {list}"))
    };
    assert_eq!(by_name("code-reviewer")["source"], "toml");
    assert_eq!(
        by_name("code-reviewer")["tools"],
        serde_json::json!(["send_message", "check_inbox"])
    );
    assert_eq!(by_name("responder")["source"], "lua");
    let test = substrat(&[
        "role",
        "test",
        "responder",
        "--json",
        "--config",
        config_arg,
        "--arg",
        "service=db",
    ]);
    assert_eq!(code(&test), 0, "{}", stderr(&test));
    let prompt: Value = serde_json::from_slice(&test.stdout).unwrap();
    assert_eq!(
        prompt["system"],
        "You respond to a P2 incident on db. Escalate to the lead. Team: ."
    );
    // The daemon serves them: an agent of an inline role can be made.
    let state = d.join("state");
    let mut daemon = Command::new(bin())
        .args(["daemon", "--config", config_arg, "--state-dir"])
        .arg(&state)
        .env("SUBSTRAT_LOG", "warn")
        .spawn()
        .unwrap();
    let start = std::time::Instant::now();
    while !state.join("control.sock").exists() && start.elapsed().as_secs() < 15 {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let made = agent_json(&state, &["create", "cr", "--role", "code-reviewer"]);
    let _ = daemon.kill();
    let _ = daemon.wait();
    assert_eq!(made.unwrap()["role"], "code-reviewer");
    // A name taken by a policy, and a bad file, stop everything with the reason.
    std::fs::write(
        d.join("taken.toml"),
        "[roles.worker]\nsystem_prompt = \"x\"\n",
    )
    .unwrap();
    let taken = substrat(&[
        "role",
        "list",
        "--config",
        d.join("taken.toml").to_str().unwrap(),
    ]);
    assert_eq!(code(&taken), 2);
    assert!(
        stderr(&taken).contains("role `worker` is also a policy"),
        "{}",
        stderr(&taken)
    );
    std::fs::write(d.join("bad.toml"), "[roles.a]\nprompt = \"x\"\n").unwrap();
    let bad = Command::new(bin())
        .args(["daemon", "--config"])
        .arg(d.join("bad.toml"))
        .arg("--state-dir")
        .arg(d.join("state2"))
        .output()
        .unwrap();
    assert_eq!(code(&bad), 2);
    assert!(
        stderr(&bad).contains("roles.a: unknown field `prompt`"),
        "{}",
        stderr(&bad)
    );
}
