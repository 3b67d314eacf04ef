//! One team on two daemons sharing a PostgreSQL database (issue 26): an
//! agent on each, a sync question from one to the other and its answer,
//! the operator reaching an agent through the daemon that does not run it,
//! and the first daemon killed mid-turn: its turn fails after the lease and
//! its agent's next turn runs on the second. Turns by the stand-in agent in
//! real sandboxes.

use super::*;

/// A daemon with the stand-in provider on the shared database.
pub(super) struct Seated {
    pub(super) dir: PathBuf,
    child: Child,
}

impl Seated {
    fn start(root: &Path, name: &str, url: &str) -> Self {
        Self::start_with(root, name, url, &[])
    }

    /// With more of the daemon's arguments (`--max-agents`, ...).
    pub(super) fn start_with(root: &Path, name: &str, url: &str, more: &[&str]) -> Self {
        let dir = root.join(name);
        let child = Command::new(bin())
            .args(["daemon", "--provider", "stand-in", "--backend", "native"])
            .args(["--lease", "5", "--state", url])
            .args(more)
            .arg("--policies")
            .arg(repo().join("policies"))
            .arg("--state-dir")
            .arg(&dir)
            .env("SUBSTRAT_LOG", "warn,rmcp=error")
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        // With a runtime directory the control socket is there.
        let sockets = more
            .iter()
            .position(|a| *a == "--runtime-dir")
            .and_then(|i| more.get(i + 1))
            .map_or(dir.clone(), PathBuf::from);
        let control = sockets.join("control.sock");
        wait_until("the daemon listens", 10, || {
            UnixStream::connect(&control).is_ok()
        });
        Seated { dir, child }
    }

    pub(super) fn agent(&self, args: &[&str]) -> Value {
        agent_json(&self.dir, args).unwrap_or_else(|e| panic!("agent {args:?}: {e}"))
    }

    pub(super) fn id(&self) -> String {
        std::fs::read_to_string(self.dir.join("daemon.id"))
            .unwrap()
            .trim()
            .to_string()
    }
}

impl Drop for Seated {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// (the prompt's first line, status, the daemon that ran it, error) of an
/// agent's turns, oldest first.
pub(super) fn turns_of(schema: &Schema, name: &str) -> Vec<(String, String, String, String)> {
    let rows = schema.query(&format!(
        "SELECT split_part(COALESCE(m.text, t.prompt), E'\\n', 1), t.status, COALESCE(t.daemon_id, '-'), COALESCE(t.error, '-')
         FROM turns t JOIN agents a ON a.id = t.agent_id LEFT JOIN messages m ON m.id = t.message_id
         WHERE a.name = '{name}' ORDER BY t.seq"
    ));
    rows.lines()
        .map(|line| {
            let mut cols = line.split('|').map(str::to_string);
            let mut next = || cols.next().unwrap_or_default();
            (next(), next(), next(), next())
        })
        .collect()
}

pub(super) fn plan(text: &str, plan: Value) -> String {
    team_plan::with_plan(text, &plan)
}

/// Which agents the daemon lists as its own, by name.
fn listed_here(daemon: &Seated) -> Vec<(String, bool)> {
    let list = daemon.agent(&["list"]);
    list["agents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| {
            (
                x["name"].as_str().unwrap().to_string(),
                x["daemon"]["here"] == true,
            )
        })
        .collect()
}

/// a on the first daemon, b (its child) on the second, each past its
/// first turn.
fn start_the_team(first: &Seated, second: &Seated, schema: &Schema, ws: &str) {
    let a_plan = plan(
        "You are a.",
        json!({"turns": [
            {"when": "the answer is 42", "steps": [{"reply": "a heard: {prompt}"}]},
            {"when": "ask b", "steps": [
                {"call": "send_message", "args": {"recipient": "b", "text": "What is 6*7?", "sync": true}},
                {"reply": "asked b"}]},
            {"when": "go slow", "steps": [{"sleep_ms": 60000}, {"reply": "slow done"}]},
            {"steps": [{"reply": "a ready"}]},
        ]}),
    );
    first.agent(&["spawn", "a", "--workspace", ws, &a_plan]);
    second.agent(&["create", "b", "--parent", "a", "--workspace", ws]);
    let b_plan = plan(
        "You are b.",
        json!({"turns": [
            {"when": "What is 6*7", "steps": [{"reply": "the answer is 42"}]},
            {"steps": [{"reply": "b ready"}]},
        ]}),
    );
    second.agent(&["send", "b", &b_plan]);
    wait_until("a and b take their first turns", 60, || {
        settled(schema, "a", 1) && settled(schema, "b", 1)
    });
}

/// All `n` turns of the agent are done.
fn settled(schema: &Schema, name: &str, n: usize) -> bool {
    let turns = turns_of(schema, name);
    turns.len() == n && turns.iter().all(|t| t.1 == "done")
}

/// The operator asks a through the second daemon; a (on the first) asks
/// b (on the second), whose answer is a's next turn (on the first).
fn ask_across(first: &Seated, second: &Seated, schema: &Schema) {
    second.agent(&["send", "a", "ask b"]);
    wait_until("a hears b's answer", 60, || {
        settled(schema, "a", 3) && settled(schema, "b", 2)
    });
    let (one, two) = (first.id(), second.id());
    let a = turns_of(schema, "a");
    assert!(
        a.iter().all(|t| t.2 == one),
        "a's turns on the first: {a:?}"
    );
    let b = turns_of(schema, "b");
    assert!(
        b.iter().all(|t| t.2 == two),
        "b's turns on the second: {b:?}"
    );
    assert_eq!(b[1].0, "What is 6*7?");
    assert_eq!(a[2].0, "the answer is 42");
    let result = schema.query(
        "SELECT t.result FROM turns t JOIN agents a ON a.id = t.agent_id WHERE a.name = 'a' ORDER BY t.seq DESC LIMIT 1",
    );
    assert!(result.starts_with("a heard: Reply from b"), "{result}");
}

#[test]
fn a_team_on_two_daemons_talks_across_them_and_survives_one_killed() {
    let test = "a_team_on_two_daemons_talks_across_them_and_survives_one_killed";
    if !sandbox_works(test, "native") {
        return;
    }
    let Some(schema) = Schema::new(test) else {
        return;
    };
    let url = schema.url();
    let root = tempfile::tempdir().unwrap();
    let ws = root.path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    let mut first = Seated::start(root.path(), "one", &url);
    let second = Seated::start(root.path(), "two", &url);
    start_the_team(&first, &second, &schema, &ws.display().to_string());
    ask_across(&first, &second, &schema);

    // Where each runs, as the second daemon lists it; what changes a is
    // left to the first.
    assert_eq!(
        listed_here(&second),
        [("a".to_string(), false), ("b".to_string(), true)]
    );
    let refused = agent_json(&second.dir, &["kill", "a"]).unwrap_err();
    assert!(refused.contains("`a` runs on daemon"), "{refused}");

    // The first daemon dies mid-turn.
    first.agent(&["send", "a", "go slow"]);
    wait_until("a's slow turn runs", 30, || {
        turns_of(&schema, "a")
            .last()
            .is_some_and(|t| t.1 == "running")
    });
    first.child.kill().unwrap();
    first.child.wait().unwrap();
    let after = plan(
        "after the first daemon",
        json!({"turns": [{"steps": [{"reply": "a again"}]}]}),
    );
    second.agent(&["send", "a", &after]);
    wait_until("a's next turn runs on the second", 60, || {
        turns_of(&schema, "a")
            .last()
            .is_some_and(|t| t.1 == "done" && t.0 == "after the first daemon")
    });
    let a = turns_of(&schema, "a");
    let slow = &a[3];
    assert_eq!(
        (slow.0.as_str(), slow.1.as_str()),
        ("go slow", "failed"),
        "{a:?}"
    );
    assert!(slow.3.contains("lease on the turn ran out"), "{slow:?}");
    assert_eq!(
        a[4].2,
        second.id(),
        "the next turn ran on the second: {a:?}"
    );
    assert!(
        listed_here(&second).iter().all(|(_, here)| *here),
        "the second runs both now"
    );
    // Nothing acknowledged was lost or sent twice.
    assert_eq!(
        schema.query("SELECT kind || ':' || count(*) FROM messages GROUP BY kind ORDER BY kind"),
        "instructions:1\nmessage:1\noperator:4\nreply:1"
    );
}
