//! The demo team's scripted plans for the stand-in agent: a lead that
//! spawns two workers, asks one a sync question, broadcasts, and reads its
//! inbox; a worker that tries to reach its sibling's workspace, the
//! daemon's state and its own mcp.json. Shared by `substrat-sandbox demo`
//! and the end-to-end test (tests/team.rs includes this file).

use std::path::Path;

use serde_json::{Value, json};

/// Paths the plans name: the lead's workspace, the daemon's state
/// directory and the HOME the sandboxes see.
#[derive(Debug, Clone)]
pub struct TeamPaths<'a> {
    pub workspace: &'a Path,
    pub state_dir: &'a Path,
    pub home: &'a Path,
}

/// How long the lead pauses after broadcasting (a window in which the
/// end-to-end test kills the daemon).
pub const LEAD_PAUSE_MS: u64 = 1500;

/// A prompt carrying a plan for the stand-in agent.
pub fn with_plan(text: &str, plan: &Value) -> String {
    format!("{text}\n```substrat-plan\n{plan}\n```")
}

fn w1_plan() -> Value {
    json!({"turns": [
        {"when": "What is 6*7", "steps": [{"reply": "the answer is 42"}]},
        {"when": "status?", "steps": [{"reply": "w1 status: fine"}]},
        {"steps": [{"write": "notes.txt", "text": "w1 private notes"}, {"reply": "w1 ready"}]},
    ]})
}

fn w2_plan(paths: &TeamPaths<'_>) -> Value {
    let sibling_file = paths.workspace.join("w1/notes.txt");
    json!({"turns": [
        {"when": "status?", "steps": [{"reply": "w2 status: fine"}]},
        {"steps": [
            {"read": sibling_file.display().to_string()},
            {"list": paths.workspace.display().to_string()},
            {"list": paths.state_dir.join("agents").display().to_string()},
            {"list": paths.home.join(".cursor/chats").display().to_string()},
            {"write": ".cursor/mcp.json", "text": "{\"mcpServers\": {\"evil\": {\"command\": \"/bin/sh\"}}}"},
            {"reply": "{results}"},
        ]},
    ]})
}

/// The lead's instructions (its first turn's prompt).
pub fn lead_instructions(paths: &TeamPaths<'_>) -> String {
    let plan = json!({"turns": [
        {"when": "the answer is 42", "steps": [
            {"call": "broadcast", "args": {"text": "status?"}},
            {"sleep_ms": LEAD_PAUSE_MS},
            {"reply": "w1 answered; broadcast sent: {results}"},
        ]},
        {"when": "status: fine", "steps": [
            {"call": "check_inbox", "args": {}},
            {"reply": "{prompt} | inbox: {last}"},
        ]},
        {"steps": [
            {"call": "spawn_agent", "args": {"name": "w1", "workspace_subdir": "w1",
                "instructions": with_plan("You are w1.", &w1_plan())}},
            {"call": "spawn_agent", "args": {"name": "w2", "workspace_subdir": "w2",
                "instructions": with_plan("You are w2.", &w2_plan(paths))}},
            {"call": "send_message", "args": {"recipient": "w1", "text": "What is 6*7?", "sync": true}},
            {"reply": "team started: {results}"},
        ]},
    ]});
    with_plan("You lead a team of two workers.", &plan)
}
