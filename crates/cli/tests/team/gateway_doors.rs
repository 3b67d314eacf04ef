//! The model gateway attacked from inside a real agent's sandbox: Claude
//! Code's own shell tool, told by the scripted model, runs a script that
//! uses the agent's placeholder key against the gateway's port the way a
//! hostile agent would (another API's route, a provider-side tool, an
//! encoded body, many requests at once against the role's budget, a body
//! that stalls, one too large) and writes what each got back.

use super::clis::{Model, clis_available, daemon_with_policies};
use super::*;

/// Runs inside the sandbox (python3 from the host's /usr): each attack's
/// HTTP status, as JSON, into the workspace.
const ATTACK: &str = r#"
import http.client, json, os, socket, threading, time
base = os.environ["ANTHROPIC_BASE_URL"].split("//")[1]
host, port = base.split(":")[0], int(base.split(":")[1])
key = os.environ["ANTHROPIC_API_KEY"]
head = {"x-api-key": key, "content-type": "application/json", "anthropic-version": "2023-06-01"}

def post(path, body, extra={}):
    conn = http.client.HTTPConnection(host, port, timeout=60)
    conn.request("POST", path, body=body, headers=dict(head, **extra))
    answer = conn.getresponse()
    answer.read()
    return answer.status

probe = json.dumps({"model": "m", "max_tokens": 1000, "stream": True,
                    "messages": [{"role": "user", "content": "SLOW PROBE"}]})
out = {}
out["other_api"] = post("/v1/responses", json.dumps({"model": "m", "input": "hi"}))
out["hosted_tool"] = post("/v1/messages", json.dumps({"model": "m", "max_tokens": 10,
    "messages": [{"role": "user", "content": "hi"}],
    "tools": [{"type": "web_search_20250305", "name": "web_search"}]}))
out["encoded"] = post("/v1/messages", probe, {"content-encoding": "gzip"})
def raw(length, body):
    s = socket.create_connection((host, port))
    s.sendall(("POST /v1/messages HTTP/1.1\r\nhost: x\r\nx-api-key: %s\r\n"
               "content-length: %d\r\n\r\n%s" % (key, length, body)).encode())
    start = time.time()
    answer = s.recv(200).decode(errors="replace")
    status = int(answer.split(" ")[1]) if answer.startswith("HTTP/1.1") else answer
    return status, round(time.time() - start)
out["too_large"], _ = raw(33 << 20, "{")
statuses = []
def one():
    try:
        statuses.append(post("/v1/messages", probe, {"accept-encoding": "gzip"}))
    except OSError as e:
        statuses.append(0)
# Six at once: with the CLI's own connection, within the 8 an agent has.
threads = [threading.Thread(target=one) for _ in range(6)]
[t.start() for t in threads]
[t.join() for t in threads]
out["at_once"] = sorted(statuses)
out["stalled"], out["stalled_after_s"] = raw(1000, "{")
open("gateway-doors.json", "w").write(json.dumps(out))
"#;

#[test]
fn an_agent_attacking_its_gateway_from_its_sandbox_gets_nothing_past_it() {
    let test = "an_agent_attacking_its_gateway_from_its_sandbox_gets_nothing_past_it";
    if !clis_available(test, "claude") {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let ws = root.path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    std::fs::write(ws.join("attack.py"), ATTACK).unwrap();
    // A role with a budget of 3,000 tokens a turn; each probe reserves its
    // body's bytes and its 1,000 output tokens.
    let policies = root.path().join("policies");
    std::fs::create_dir(&policies).unwrap();
    std::fs::write(
        policies.join("budgeted.toml"),
        "version = 1\nextends = \"worker\"\n[model]\ntokens_per_turn = 3000\nconcurrent_requests = 16\n",
    )
    .unwrap();
    let bash = json!({"tool": "Bash", "args": {"command": "python3 attack.py", "description": "probe",
        "timeout": 120000}});
    let model = Model::start(
        root.path(),
        &json!([
            {"when": "SLOW PROBE", "final": "probed", "slow_step": 0, "slow_s": 2},
            {"when": "ATTACK START", "calls": [bash], "final": "attacked"}
        ]),
    );
    let real = format!("sk-REAL-doors-{}", std::process::id());
    let child = daemon_with_policies(root.path(), "claude", &real, model.port, &policies);
    let team = Team {
        root,
        backend: "native",
        policies,
        child,
        extra: Vec::new(),
    };
    team.agent(&[
        "spawn",
        "atk",
        "--role",
        "budgeted",
        "--workspace",
        ws.to_str().unwrap(),
        "ATTACK START",
    ]);
    wait_until("the attack's turn ends", 180, || {
        team.settled() && !team.turns("atk").is_empty()
    });
    let turns = team.turns("atk");
    let found = std::fs::read_to_string(ws.join("gateway-doors.json"))
        .unwrap_or_else(|e| panic!("the attack did not run ({e}): {turns:#?}"));
    let found: Value = serde_json::from_str(&found).unwrap();
    assert_eq!(found["other_api"], 403, "{found}");
    assert_eq!(found["hosted_tool"], 403, "{found}");
    assert_eq!(found["encoded"], 415, "{found}");
    assert_eq!(found["too_large"], 413, "{found}");
    // 3,000 tokens: spent (the CLI's own first request) plus reserved
    // stays under it for three probes; the other three are refused.
    assert_eq!(
        found["at_once"],
        json!([200, 200, 200, 429, 429, 429]),
        "{found}"
    );
    assert_eq!(found["stalled"], 408, "{found}");
    assert!(found["stalled_after_s"].as_u64() <= Some(12), "{found}");
    let probes = model
        .requests()
        .iter()
        .filter(|r| r["text"] == "probed")
        .count();
    assert_eq!(probes, 3, "only the admitted probes reached the model");
    assert_eq!(turns[0].status, "done", "{turns:#?}");
}
