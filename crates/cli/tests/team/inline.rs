//! Roles written inline in the daemon's `--config` file run turns as the
//! roles of policy files do.

use super::*;

/// An agent of an inline role (static, extending a policy beside the
/// configuration by path) runs a turn under the role's policy. Before, the
/// launcher was given `NAME.toml` beside the configuration, a file that
/// does not exist (every turn failed), or, worse, another policy that
/// happens to have that name there (here a file that is no policy at all).
#[test]
fn an_agent_of_a_role_written_inline_runs_its_turns() {
    let test = "an_agent_of_a_role_written_inline_runs_its_turns";
    if !sandbox_works(test, "native") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("base")).unwrap();
    std::fs::write(
        dir.path().join("base/team.toml"),
        "version = 1\nextends = \"worker\"\n[env]\nset = { PATH = \"/usr/bin:/bin\", HOME = \"${HOME}\", MARK = \"team-base\" }\n",
    )
    .unwrap();
    std::fs::write(dir.path().join("helper.toml"), "not a policy [").unwrap();
    let config = dir.path().join("substrat.toml");
    std::fs::write(
        &config,
        r#"
[roles.helper]
description = "Helps"
extends = "base/team.toml"
tools = ["send_message", "check_inbox"]
system_prompt = "You help."
"#,
    )
    .unwrap();
    let config: &'static str = Box::leak(config.display().to_string().into_boxed_str());
    let team = Team::start_with_args(
        "native",
        2,
        repo().join("policies"),
        vec!["--config", config],
    );
    let plan = json!({"turns": [{"steps": [
        {"shell": "echo \"mark=$MARK\" > mark.txt; echo shell-done"},
    ]}]});
    let ws = team.ws().display().to_string();
    team.agent(&[
        "spawn",
        "h",
        "--role",
        "helper",
        "--workspace",
        &ws,
        &with_plan("go", &plan),
    ]);
    wait_until("the turn ends", 60, || {
        team.settled() && team.turns("h").len() == 1
    });
    let turn = &team.turns("h")[0];
    assert_eq!(turn.status, "done", "{turn:?}");
    // The policy it extends is the one beside the configuration.
    assert_eq!(
        std::fs::read_to_string(team.ws().join("mark.txt")).unwrap(),
        "mark=team-base\n"
    );
    // The policy the launcher got is the daemon's own, private file.
    let written = team.state().join("roles/helper.toml");
    let mode = std::fs::metadata(&written).unwrap().permissions();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
        0o600
    );
}
