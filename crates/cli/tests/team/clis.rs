//! Teams of real agent CLIs (npm, pinned by scripts/setup) against the
//! scripted model server (tests/model/scripted_model.py), reached only
//! through the daemon's model gateway: the daemon holds a real key, the
//! CLIs a placeholder.

use super::*;

/// The pinned CLIs, installed by scripts/setup.
fn agents_bin() -> PathBuf {
    repo().join(".cache/agents/npm/node_modules/.bin")
}

/// Whether `cli` and the scripted model can run here; says why not.
pub(super) fn clis_available(test: &str, cli: &str) -> bool {
    if !agents_bin().join(cli).exists() {
        println!(
            "SKIPPED {test}: {cli} is not installed (scripts/setup installs it under .cache/agents)"
        );
        return false;
    }
    if Command::new("python3").arg("--version").output().is_err() {
        println!("SKIPPED {test}: python3 runs the scripted model and is missing");
        return false;
    }
    sandbox_works(test, "native")
}

/// The scripted model on a loopback port, answering from `rules`; its
/// request log.
pub(super) struct Model {
    child: Child,
    pub port: u16,
    log: PathBuf,
}

impl Model {
    pub fn start(dir: &Path, rules: &Value) -> Self {
        let script = dir.join("script.json");
        std::fs::write(&script, rules.to_string()).unwrap();
        let log = dir.join("model.log");
        let mut child = Command::new("python3")
            .arg(repo().join("tests/model/scripted_model.py"))
            .arg("--script")
            .arg(&script)
            .arg("--log")
            .arg(&log)
            .stdout(Stdio::piped())
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        let port = line
            .trim()
            .strip_prefix("listening ")
            .unwrap()
            .parse()
            .unwrap();
        Model { child, port, log }
    }

    pub fn requests(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

impl Drop for Model {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The model APIs: the daemon's flag name and its key variable.
const APIS: [(&str, &str); 3] = [
    ("anthropic", "ANTHROPIC_API_KEY"),
    ("openai", "OPENAI_API_KEY"),
    ("gemini", "GEMINI_API_KEY"),
];

/// A daemon whose default provider is `cli`, with `key` as its real key
/// for every API, the model gateway sending each to the scripted model.
fn daemon_with_cli(root: &Path, cli: &str, key: &str, port: u16) -> Child {
    daemon_with_policies(root, cli, key, port, &repo().join("policies"))
}

/// The same with the roles of `policies`.
pub(super) fn daemon_with_policies(
    root: &Path,
    cli: &str,
    key: &str,
    port: u16,
    policies: &Path,
) -> Child {
    daemon_with_args(root, cli, key, port, policies, &[], &[])
}

/// The same with more daemon arguments and environment variables.
pub(super) fn daemon_with_args(
    root: &Path,
    cli: &str,
    key: &str,
    port: u16,
    policies: &Path,
    extra: &[&str],
    envs: &[(&str, &str)],
) -> Child {
    let path = format!(
        "{}:{}",
        agents_bin().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut command = Command::new(bin());
    command.args(["daemon", "--provider", cli, "--backend", "native"]);
    command.args(extra).envs(envs.iter().copied());
    for (api, var) in APIS {
        command
            .arg("--model-upstream")
            .arg(format!("{api}=http://127.0.0.1:{port}"))
            .env(var, key);
    }
    let child = command
        .arg("--policies")
        .arg(policies)
        .arg("--state-dir")
        .arg(root.join("state"))
        .env("PATH", path)
        .env("SUBSTRAT_LOG", "warn,rmcp=error")
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let control = root.join("state/control.sock");
    wait_until("the daemon listens", 60, || {
        UnixStream::connect(&control).is_ok()
    });
    child
}

/// The lead spawns w1 and asks it a sync question; w1 answers; the answer
/// is the lead's next turn (a resumed session). w1's first turn searches
/// its sandbox for the real key (and, as a control, the placeholder) with
/// the CLI's own shell tool.
fn team_script(cli: &str, real: &str) -> Value {
    // The key travels encoded: the command itself (in /proc and in the
    // CLI's session files) must not be what the search finds.
    let encoded = base64(real);
    assert_eq!(base64("sk-ant-x"), "c2stYW50LXg=", "the encoder itself");
    let search = secret_search(&encoded, "substrat-");
    // Each CLI's shell tool and its arguments (Codex's is a nested tool
    // of its code-mode exec).
    let shell = match cli {
        "claude" => json!({"tool": "Bash", "args": {"command": search, "description": "search"}}),
        "codex" => {
            json!({"tool": "exec_command", "args": {"cmd": search, "login": false, "yield_time_ms": 30000}})
        }
        _ => json!({"tool": "run_shell_command", "args": {"command": search}}),
    };
    json!([
        {"when": "LEAD START", "calls": [
            {"tool": "spawn_agent", "args": {"name": "w1", "role": "worker",
                "instructions": "WORKER START: search, then wait for questions"}},
            {"tool": "send_message", "args": {"recipient": "w1", "text": "WHAT IS 6x7", "sync": true}}
        ], "final": "asked w1"},
        {"when": "WORKER START", "calls": [shell], "final": "ready"},
        {"when": "WHAT IS 6x7", "final": "the answer is 42"},
        {"when": "Reply from w1", "final": "lead done: got 42"}
    ])
}

#[test]
fn a_claude_code_team_talks_to_its_model_only_through_the_gateway() {
    team_through_the_gateway(
        "a_claude_code_team_talks_to_its_model_only_through_the_gateway",
        "claude",
        "x_api_key",
    );
}

#[test]
fn a_codex_team_talks_to_its_model_only_through_the_gateway() {
    team_through_the_gateway(
        "a_codex_team_talks_to_its_model_only_through_the_gateway",
        "codex",
        "authorization",
    );
}

#[test]
fn a_gemini_team_talks_to_its_model_only_through_the_gateway() {
    team_through_the_gateway(
        "a_gemini_team_talks_to_its_model_only_through_the_gateway",
        "gemini",
        "x_goog_api_key",
    );
}

/// A team of `cli`: the flow of team_script, the key search from inside,
/// what the model and the gateway saw. `credential` is the model log's
/// field holding the key the API carries.
fn team_through_the_gateway(test: &str, cli: &str, credential: &str) {
    if !clis_available(test, cli) {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir(root.path().join("ws")).unwrap();
    let real = format!("sk-REAL-{}-{}", cli, std::process::id());
    let model = Model::start(root.path(), &team_script(cli, &real));
    let child = daemon_with_cli(root.path(), cli, &real, model.port);
    let team = Team {
        root,
        backend: "native",
        policies: repo().join("policies"),
        child,
        extra: Vec::new(),
    };
    let ws = team.ws();
    team.agent(&[
        "spawn",
        "lead",
        "--workspace",
        ws.to_str().unwrap(),
        "LEAD START",
    ]);
    wait_until("the team settles", 180, || {
        team.settled() && team.turns("lead").len() == 2 && team.turns("w1").len() == 2
    });
    let lead = team.turns("lead");
    let w1 = team.turns("w1");
    let show = |turns: &[Turn]| format!("{turns:#?}");
    assert!(
        lead.iter().chain(&w1).all(|t| t.status == "done"),
        "{}\n{}",
        show(&lead),
        show(&w1)
    );
    assert_eq!(
        w1[1].result.as_deref(),
        Some("the answer is 42"),
        "{}",
        show(&w1)
    );
    assert_eq!(lead[1].kind, "reply");
    assert_eq!(lead[1].result.as_deref(), Some("lead done: got 42"));
    assert_eq!(
        lead[0].session, lead[1].session,
        "the reply resumed the lead's session"
    );
    // The CLI reached the broker over MCP streamable HTTP on its sandbox's
    // loopback: its configuration names the URL and no relay.
    assert_configured_with_the_mcp_url(&team.state());
    // The sandbox held the placeholder, never the real key.
    let found = std::fs::read_to_string(ws.join("found.txt"))
        .unwrap_or_else(|e| panic!("the search did not run ({e}): {}", show(&w1)));
    assert!(found.starts_with("real=0 control="), "{found}");
    assert!(
        !found.contains("control=0"),
        "the search saw the placeholder: {found}"
    );
    // The model saw the real key on every call (the gateway swapped it).
    let requests = model.requests();
    assert_no_side_doors(cli, &requests);
    assert!(requests.len() >= 6, "{requests:?}");
    for r in &requests {
        let carried = r[credential].as_str().unwrap_or_default();
        assert!(
            carried == real || carried == format!("Bearer {real}"),
            "{r}"
        );
    }
    let gateway = std::fs::read_to_string(team.state().join("gateway.log")).unwrap();
    assert!(!gateway.contains(&real));
    assert!(
        gateway
            .lines()
            .all(|l| l.contains("\"decision\":\"forwarded\"")),
        "{gateway}"
    );
    // Every broker tool call is in the audit log.
    let audit = std::fs::read_to_string(team.state().join("audit.log")).unwrap();
    for tool in ["spawn_agent", "send_message"] {
        assert!(
            audit.contains(&format!("\"tool\":\"{tool}\"")),
            "{tool}: {audit}"
        );
    }
    // The transcript (`agent inspect`) holds the calls the CLI reported,
    // with their arguments and the start of their results.
    let inspect = team.agent(&["inspect", "lead"]);
    let calls: Vec<Value> = inspect["activity"]["recent_turns"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|t| {
            t["stream_notes"]["reported_tool_calls"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .collect();
    let spawn = calls
        .iter()
        .find(|c| c["name"].as_str().unwrap_or("").ends_with("spawn_agent"))
        .unwrap_or_else(|| panic!("{cli}: no spawn_agent in {inspect}"));
    assert!(
        spawn["arguments"].as_str().unwrap().contains("\"w1\""),
        "{spawn}"
    );
    assert_eq!(spawn["is_error"], false, "{spawn}");
    assert!(spawn["output"].as_str().unwrap().contains("w1"), "{spawn}");
    // Usage per agent, as the gateway counted it.
    let lead_state = team.state_of("lead");
    assert!(
        lead_state["model_usage"]["requests"].as_u64() >= Some(2),
        "{lead_state}"
    );
    drop(team);
}

/// Every agent's CLI configuration (regenerated each turn) names the
/// broker's MCP URL, and none names the stdio relay.
pub(super) fn assert_configured_with_the_mcp_url(state: &Path) {
    let mut configs = Vec::new();
    for agent in std::fs::read_dir(state.join("agents")).unwrap().flatten() {
        let Ok(files) = std::fs::read_dir(agent.path().join("config")) else {
            continue;
        };
        for file in files.flatten() {
            if let Ok(text) = std::fs::read_to_string(file.path()) {
                configs.push((file.path(), text));
            }
        }
    }
    let with_url = configs
        .iter()
        .filter(|(_, text)| text.contains("http://127.0.0.1:3130/mcp"))
        .count();
    assert!(with_url >= 2, "{configs:#?}");
    for (path, text) in &configs {
        assert!(
            !text.contains("substrat-mcp-server"),
            "{} names the relay: {text}",
            path.display()
        );
    }
}

/// The CLI's own tools that reach past the broker or the network policy
/// (sub-agents, agent messaging, web search and fetch) were never offered
/// to the model, and no request named a provider-side tool; the broker's
/// tools were (so the list was read).
fn assert_no_side_doors(cli: &str, requests: &[Value]) {
    let off: &[&str] = match cli {
        "claude" => &[
            "custom:Agent",
            "custom:Task",
            "custom:SendMessage",
            "custom:ListAgents",
            "custom:WebSearch",
            "custom:WebFetch",
        ],
        "gemini" => &[
            "function:google_web_search",
            "function:web_fetch",
            "function:invoke_agent",
        ],
        _ => &[],
    };
    let mut offered = 0;
    for r in requests {
        let Some(kinds) = r["tool_kinds"].as_array() else {
            continue;
        };
        for kind in kinds.iter().filter_map(Value::as_str) {
            assert!(!off.contains(&kind), "{cli} offered {kind}: {r}");
            let (what, _) = kind.split_once(':').unwrap_or((kind, ""));
            assert!(
                matches!(what, "custom" | "function" | "namespace"),
                "{cli} named a tool of kind {what}: {r}"
            );
        }
        offered += kinds.len();
    }
    assert!(
        offered > 0,
        "{cli}: no request offered any tool: {requests:?}"
    );
}

#[test]
fn a_mixed_team_claude_lead_codex_and_gemini_workers() {
    let test = "a_mixed_team_claude_lead_codex_and_gemini_workers";
    if !["claude", "codex", "gemini"]
        .iter()
        .all(|cli| clis_available(test, cli))
    {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir(root.path().join("ws")).unwrap();
    let real = format!("sk-REAL-{}", std::process::id());
    let rules = json!([
        {"when": "LEAD MIX START", "calls": [
            {"tool": "spawn_agent", "args": {"name": "w1", "provider": "codex",
                "instructions": "CODEX WORKER START"}},
            {"tool": "spawn_agent", "args": {"name": "w2", "provider": "gemini",
                "instructions": "GEMINI WORKER START"}},
            {"tool": "send_message", "args": {"recipient": "w1", "text": "CODEX Q", "sync": true}},
            {"tool": "send_message", "args": {"recipient": "w2", "text": "GEMINI Q", "sync": true}}
        ], "final": "asked both"},
        {"when": "CODEX WORKER START", "final": "codex ready"},
        {"when": "GEMINI WORKER START", "final": "gemini ready"},
        {"when": "CODEX Q", "final": "codex says 42"},
        {"when": "GEMINI Q", "final": "gemini says 42"},
        {"when": "Reply from w1", "final": "lead got codex"},
        {"when": "Reply from w2", "final": "lead got gemini"}
    ]);
    let model = Model::start(root.path(), &rules);
    let child = daemon_with_cli(root.path(), "claude", &real, model.port);
    let team = Team {
        root,
        backend: "native",
        policies: repo().join("policies"),
        child,
        extra: Vec::new(),
    };
    let ws = team.ws();
    team.agent(&[
        "spawn",
        "lead",
        "--provider",
        "claude",
        "--workspace",
        ws.to_str().unwrap(),
        "LEAD MIX START",
    ]);
    wait_until("the mixed team settles", 240, || {
        team.settled()
            && team.turns("lead").len() == 3
            && team.turns("w1").len() == 2
            && team.turns("w2").len() == 2
    });
    let (lead, w1, w2) = (team.turns("lead"), team.turns("w1"), team.turns("w2"));
    let all: Vec<&Turn> = lead.iter().chain(&w1).chain(&w2).collect();
    assert!(all.iter().all(|t| t.status == "done"), "{all:#?}");
    assert_eq!(w1[1].result.as_deref(), Some("codex says 42"), "{w1:#?}");
    assert_eq!(w2[1].result.as_deref(), Some("gemini says 42"), "{w2:#?}");
    let mut replies: Vec<&str> = lead[1..]
        .iter()
        .filter_map(|t| t.result.as_deref())
        .collect();
    replies.sort();
    assert_eq!(replies, ["lead got codex", "lead got gemini"]);
    // Each resumed its own session, and each CLI its own API.
    assert_eq!(w1[0].session, w1[1].session, "codex resumed its thread");
    assert_eq!(w2[0].session, w2[1].session, "gemini resumed its session");
    for (name, provider) in [("lead", "claude"), ("w1", "codex"), ("w2", "gemini")] {
        assert_eq!(team.state_of(name)["provider"], provider, "{name}");
    }
    let apis: std::collections::BTreeSet<String> = model
        .requests()
        .iter()
        .filter_map(|r| r["api"].as_str().map(String::from))
        .collect();
    assert_eq!(
        apis.into_iter().collect::<Vec<_>>(),
        ["anthropic", "gemini", "openai"]
    );
    for r in model.requests() {
        let presented = [&r["x_api_key"], &r["authorization"], &r["x_goog_api_key"]];
        assert!(
            presented
                .iter()
                .any(|v| v.as_str().is_some_and(|k| k.ends_with(&real))),
            "the real key on every request: {r}"
        );
        assert!(
            !r.to_string().contains("substrat-"),
            "no placeholder upstream: {r}"
        );
    }
}

#[test]
fn an_interrupted_claude_turn_is_told_what_took_effect_and_repeats_nothing() {
    let test = "an_interrupted_claude_turn_is_told_what_took_effect_and_repeats_nothing";
    if !clis_available(test, "claude") {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir(root.path().join("ws")).unwrap();
    let real = format!("sk-ant-REAL-{}", std::process::id());
    // The first run spawns w1 and messages it, then its model is slow and
    // the daemon is killed; the re-run (told what took effect) answers
    // differently: it makes no call at all.
    let rules = json!([
        {"when": "already took effect", "final": "resumed without repeating"},
        {"when": "SLOW LEAD", "calls": [
            {"tool": "spawn_agent", "args": {"name": "w1", "instructions": "W1 START"}},
            {"tool": "send_message", "args": {"recipient": "w1", "text": "PING", "sync": true}}
        ], "slow_step": 2, "slow_s": 60, "final": "never seen"},
        {"when": "W1 START", "final": "w1 ready"},
        {"when": "PING", "final": "pong"},
        {"when": "Reply from w1", "final": "lead done"}
    ]);
    let model = Model::start(root.path(), &rules);
    let child = daemon_with_cli(root.path(), "claude", &real, model.port);
    let mut team = Team {
        root,
        backend: "native",
        policies: repo().join("policies"),
        child,
        extra: Vec::new(),
    };
    let ws = team.ws();
    team.agent(&[
        "spawn",
        "lead",
        "--workspace",
        ws.to_str().unwrap(),
        "SLOW LEAD",
    ]);
    wait_until("the lead's message to w1 took effect", 120, || {
        team.count("SELECT COUNT(*) FROM messages WHERE kind = 'message' AND text = 'PING'") == 1
    });
    std::thread::sleep(Duration::from_millis(500));
    team.child.kill().unwrap();
    team.child.wait().unwrap();
    let _ = std::fs::remove_file(team.state().join("control.sock"));
    team.child = daemon_with_cli(team.root.path(), "claude", &real, model.port);
    let start = Instant::now();
    while !(team.settled() && team.turns("lead").len() == 2 && team.turns("w1").len() == 2) {
        if start.elapsed() > Duration::from_secs(120) {
            panic!(
                "the team did not settle after the restart:\nlead {:#?}\nw1 {:#?}\nmodel {:#?}",
                team.turns("lead"),
                team.turns("w1"),
                model.requests()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let lead = team.turns("lead");
    assert_eq!(lead[0].attempts, 2, "{lead:#?}");
    assert_eq!(lead[0].status, "done", "{lead:#?}");
    assert_eq!(lead[0].result.as_deref(), Some("resumed without repeating"));
    assert_eq!(lead[1].result.as_deref(), Some("lead done"));
    // Nothing done twice: one w1, one PING.
    assert_eq!(
        team.count("SELECT COUNT(*) FROM agents WHERE name = 'w1'"),
        1
    );
    assert_eq!(
        team.count("SELECT COUNT(*) FROM messages WHERE text = 'PING'"),
        1
    );
    // The re-run was told what took effect, and resumed the session.
    let prompt: String = team
        .db()
        .query_row(
            "SELECT t.prompt FROM turns t JOIN agents a ON a.id = t.agent_id WHERE a.name = 'lead' ORDER BY t.seq LIMIT 1",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert!(prompt.contains("already took effect"), "{prompt}");
    assert!(prompt.contains("- spawn_agent: w1"), "{prompt}");
    assert!(prompt.contains("- message to w1: PING"), "{prompt}");
    assert!(prompt.ends_with("SLOW LEAD"), "{prompt}");
    let rerun = model
        .requests()
        .into_iter()
        .find(|r| r["text"] == "resumed without repeating")
        .unwrap();
    assert!(
        rerun["history"].as_u64() > Some(3),
        "the re-run carried the interrupted session's history: {rerun}"
    );
}

/// The README's main job with each CLI: `demo --provider X` runs a lead
/// that spawns a worker and asks it a sync question (Codex reaching the
/// relay through its code-mode `exec` tool, as it does for the models it
/// knows), and says which of its checks held.
#[test]
fn the_demo_holds_with_each_agent_cli() {
    for cli in ["claude", "codex", "gemini"] {
        let test = format!("the_demo_holds_with_each_agent_cli ({cli})");
        if !clis_available(&test, cli) {
            continue;
        }
        let out = Command::new(bin())
            .args(["demo", "--provider", cli])
            .env_remove("ANTHROPIC_API_KEY")
            .env_remove("OPENAI_API_KEY")
            .env_remove("GEMINI_API_KEY")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(code(&out), 0, "{cli}: {stdout}\n{stderr}");
        assert!(stdout.contains("against the scripted model"), "{stdout}");
        assert_eq!(stdout.matches("  [ok] ").count(), 4, "{cli}: {stdout}");
        assert!(!stdout.contains("FAILED"), "{cli}: {stdout}");
    }
}
