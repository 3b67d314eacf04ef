//! `substrat-sandbox demo --provider claude|codex|gemini`: a team of a real
//! agent CLI. A lead spawns a worker, asks it a sync question, and gets
//! the answer as its next turn, every model call through the gateway.
//! With the API's key in the environment the CLIs talk to the real model;
//! without one, to the scripted model server (tests/model), the demo's own
//! key passed through the gateway exactly as a real one would be, and
//! printed nowhere.

use std::io::BufRead;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use substrat_broker::control::Request;

use crate::daemon::call;
use crate::demo::{DemoDir, Progress, StallWatch, Stopped, wait_for_socket};

/// The CLIs the demo runs, their API and key variable.
const CLIS: [(&str, &str, &str); 3] = [
    ("claude", "anthropic", "ANTHROPIC_API_KEY"),
    ("codex", "openai", "OPENAI_API_KEY"),
    ("gemini", "gemini", "GEMINI_API_KEY"),
];

const LEAD: &str = "You lead a small team. Spawn a worker named w1 (spawn_agent) with the \
    instructions \"Answer each question you are sent in one short line.\". Then send w1 the \
    question \"What is 6*7?\" with send_message and sync set to true, and finish your turn. \
    When w1's reply comes, answer with it.";

/// The scripted model's answers to the demo's prompts.
fn demo_script() -> Value {
    json!([
        {"when": "You lead a small team", "calls": [
            {"tool": "spawn_agent", "args": {"name": "w1",
                "instructions": "Answer each question you are sent in one short line."}},
            {"tool": "send_message", "args": {"recipient": "w1", "text": "What is 6*7?", "sync": true}}
        ], "final": "asked w1"},
        {"when": "What is 6*7?", "final": "42"},
        {"when": "Answer each question", "final": "ready"},
        {"when": "Reply from w1", "final": "w1 says: 42"}
    ])
}

/// The scripted model, from the source tree, on a loopback port.
fn scripted_model(root: &Path) -> Result<(Stopped, u16)> {
    let server = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/model/scripted_model.py");
    if !server.is_file() {
        bail!(
            "no model key in the environment and no scripted model at {} (it is in the source tree)",
            server.display()
        );
    }
    let script = root.join("script.json");
    std::fs::write(&script, demo_script().to_string())?;
    let mut child = Command::new("python3")
        .arg(&server)
        .arg("--script")
        .arg(&script)
        .arg("--log")
        .arg(root.join("model.log"))
        .stdout(Stdio::piped())
        .stdin(Stdio::null())
        .spawn()
        .context("cannot start the scripted model (python3)")?;
    let stdout = child.stdout.take().context("no stdout")?;
    let mut line = String::new();
    std::io::BufReader::new(stdout).read_line(&mut line)?;
    let port = line
        .trim()
        .strip_prefix("listening ")
        .and_then(|p| p.parse().ok())
        .context("the scripted model did not start")?;
    Ok((Stopped(child), port))
}

/// PATH with the CLIs scripts/setup installs in front.
fn path_with_clis() -> String {
    let installed =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.cache/agents/npm/node_modules/.bin");
    let path = std::env::var("PATH").unwrap_or_default();
    if installed.is_dir() {
        format!("{}:{path}", installed.display())
    } else {
        path
    }
}

/// How `demo --provider CLI` runs.
#[derive(Debug, Clone, Default)]
pub struct DemoOptions {
    /// Keep the temporary directory.
    pub keep: bool,
    /// `API=URL`: the model endpoint the gateway forwards to (instead of
    /// the real API, or the scripted model when no key is given).
    pub model_upstream: Option<String>,
    /// The model the team's agents ask for.
    pub model: Option<String>,
}

pub fn demo(cli: &str, options: &DemoOptions) -> Result<bool> {
    let (_, api, var) = CLIS
        .iter()
        .find(|(name, _, _)| *name == cli)
        .copied()
        .context("the demo runs claude, codex or gemini")?;
    let dir = DemoDir::new(options.keep)?;
    let root = &dir.root;
    let ws = root.join("ws").canonicalize()?;
    let state = root.join("state");
    let real = std::env::var(var).ok().filter(|k| !k.is_empty());
    let mut daemon = Command::new(std::env::current_exe()?);
    daemon
        .args(["daemon", "--provider", cli, "--state-dir"])
        .arg(&state)
        .env("PATH", path_with_clis())
        .env("SUBSTRAT_LOG", "warn,rmcp=error")
        .stdin(Stdio::null());
    if let Some(upstream) = &options.model_upstream {
        let Some(url) = upstream.strip_prefix(&format!("{api}=")) else {
            bail!("--model-upstream {upstream}: {cli} speaks the {api} API: give {api}=URL");
        };
        println!(
            "== {cli} against {} ({})",
            crate::agent_text::safe(url),
            if real.is_some() {
                format!("{var} from the environment")
            } else {
                format!("no {var} given: a placeholder key")
            }
        );
        daemon.arg("--model-upstream").arg(upstream);
        if real.is_none() {
            daemon.env(var, format!("sk-demo-{}", std::process::id()));
        }
    }
    let _model = match real {
        _ if options.model_upstream.is_some() => None,
        Some(_) => {
            println!("== {cli} against the real {api} endpoint ({var} from the environment)");
            None
        }
        None => {
            let (model, port) = scripted_model(root)?;
            println!("== {cli} against the scripted model on 127.0.0.1:{port} (no {var} given)");
            daemon
                .arg("--model-upstream")
                .arg(format!("{api}=http://127.0.0.1:{port}"))
                .env(var, format!("sk-demo-{}", std::process::id()));
            Some(model)
        }
    };
    let daemon = Stopped(daemon.spawn().context("cannot start the daemon")?);
    wait_for_socket(
        &crate::daemon::control_socket(&state)?,
        Duration::from_secs(60),
    )?;
    let spawned = call(
        &state,
        &Request::Spawn {
            name: "lead".into(),
            role: "worker".into(),
            workspace: ws.display().to_string(),
            model: options.model.clone(),
            provider: Some(cli.into()),
            instructions: LEAD.into(),
            args: Default::default(),
        },
    )?;
    if spawned["ok"] != true {
        bail!("spawn refused: {spawned}");
    }
    println!("== spawned the lead ({cli}) in {}", ws.display());
    let held = wait_and_check(&state)?;
    drop(daemon);
    Ok(held)
}

fn turns(state: &Path, name: &str) -> Vec<Value> {
    let reply = call(state, &Request::Inspect { name: name.into() }).unwrap_or_default();
    let mut turns = reply["activity"]["recent_turns"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    turns.reverse();
    turns
}

/// Waits for the flow (at most 5 minutes: a real model is slower), prints
/// it and checks each step; true if all held.
fn wait_and_check(state: &Path) -> Result<bool> {
    let start = Instant::now();
    let finished = |t: &Value| t["status"] == "done" || t["status"] == "failed";
    let mut progress = Progress::new();
    let mut stall = StallWatch::default();
    let mut stalled = None;
    loop {
        let list = call(state, &Request::List).unwrap_or_default();
        let agents = list["agents"].as_array().map_or(&[][..], Vec::as_slice);
        progress.agents(agents);
        let (lead, w1) = (turns(state, "lead"), turns(state, "w1"));
        if lead.len() >= 2 && lead.iter().all(finished) && w1.iter().all(finished) {
            break;
        }
        stalled = stall.check(agents);
        if stalled.is_some() {
            break;
        }
        if start.elapsed() > Duration::from_secs(300) {
            bail!("the team did not finish in 5 minutes");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let (lead, w1) = (turns(state, "lead"), turns(state, "w1"));
    println!("== the turns, oldest first");
    for (name, list) in [("lead", &lead), ("w1", &w1)] {
        for t in list {
            let answer = t["result"].as_str().or(t["error"].as_str()).unwrap_or("");
            println!(
                "  [{name}] {} turn, {}: {}",
                t["kind"].as_str().unwrap_or("?"),
                t["status"].as_str().unwrap_or("?"),
                answer.lines().next().unwrap_or("")
            );
        }
    }
    let gateway = std::fs::read_to_string(state.join("gateway.log")).unwrap_or_default();
    let forwarded = gateway
        .lines()
        .filter(|l| l.contains("\"forwarded\""))
        .count();
    let checks = [
        ("the lead spawned w1", !w1.is_empty()),
        (
            "w1 answered the question in a turn of its own",
            w1.iter()
                .any(|t| t["kind"] == "message" && t["status"] == "done"),
        ),
        (
            "the answer came back as the lead's next turn",
            lead.get(1)
                .is_some_and(|t| t["kind"] == "reply" && t["status"] == "done"),
        ),
        (
            "every model call went through the gateway",
            forwarded >= 3 && !gateway.contains("sk-demo-"),
        ),
    ];
    println!("== what happened ({forwarded} model calls through the gateway)");
    let mut all = true;
    for (what, held) in checks {
        println!("  [{}] {what}", if held { "ok" } else { "FAILED" });
        all &= held;
    }
    if let Some(reason) = &stalled {
        println!("== stopped: {reason}");
    }
    Ok(all && stalled.is_none())
}
