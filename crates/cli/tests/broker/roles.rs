//! Roles as MCP prompts; upstream servers' network by category; an agent's
//! workspace judged when it is made.

use super::*;

#[test]
fn prompts_are_the_roles() {
    let d = Daemon::start();
    let a = d.create("a", "worker", None);
    let mut c = d.connect(&a).init();
    let list = c.request("prompts/list", json!({}));
    let names: Vec<&str> = list["result"]["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    for role in ["worker", "reviewer", "strict", "tight", "scoped"] {
        assert!(names.contains(&role), "{names:?}");
    }
    let prompt = c.request("prompts/get", json!({"name": "scoped"}));
    let text = prompt["result"]["messages"][0]["content"]["text"]
        .as_str()
        .unwrap();
    assert!(
        text.contains("worker agent")
            && text.ends_with("Tools in scope for this role: send_message, check_inbox."),
        "{text}"
    );
    assert_eq!(
        c.request("prompts/get", json!({"name": "nope"}))["error"]["code"],
        -32602
    );
}

#[test]
fn upstream_servers_get_network_only_in_the_network_category() {
    let dir = tempfile::tempdir().unwrap();
    let policies = dir.path().join("policies");
    std::fs::create_dir(&policies).unwrap();
    std::fs::write(
        policies.join("net.toml"),
        "version = 1\nextends = \"worker\"\nnetwork = \"host\"\n",
    )
    .unwrap();
    let start = |servers: &str| {
        let file = dir.path().join("upstreams.json");
        std::fs::write(&file, format!("{{\"mcpServers\": {{{servers}}}}}")).unwrap();
        let out = Command::new(bin())
            .args(["daemon", "--policies"])
            .arg(&policies)
            .arg("--state-dir")
            .arg(dir.path().join("state"))
            .arg("--upstreams")
            .arg(&file)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, err) = start(r#""s": {"command": "x", "category": "system", "policy": "net"}"#);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("only category network servers get network"),
        "{err}"
    );
    let (code, err) = start(r#""n": {"command": "x", "category": "network", "policy": "worker"}"#);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("they need a policy with it"), "{err}");
    let (code, err) = start(r#""u": {"command": "x", "policy": "nope"}"#);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("policy `nope` is not a known role"), "{err}");
    // The valid pairing starts (the server itself may not: `x` is no program).
    let file = dir.path().join("ok.json");
    std::fs::write(
        &file,
        r#"{"mcpServers": {"n": {"command": "x", "category": "network", "policy": "net"}}}"#,
    )
    .unwrap();
    let mut daemon = Command::new(bin())
        .args(["daemon", "--policies"])
        .arg(&policies)
        .arg("--state-dir")
        .arg(dir.path().join("state-ok"))
        .arg("--upstreams")
        .arg(&file)
        .env("SUBSTRAT_LOG", "error")
        .spawn()
        .unwrap();
    let control = dir.path().join("state-ok/control.sock");
    let start = Instant::now();
    while UnixStream::connect(&control).is_err() {
        assert!(daemon.try_wait().unwrap().is_none(), "the daemon exited");
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the daemon did not start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = daemon.kill();
    let _ = daemon.wait();
}

/// The daemon judges a workspace when an agent is made: one holding keys is
/// refused with what it exposes, unless the role allows it.
#[test]
fn an_agent_is_not_made_in_a_workspace_holding_keys() {
    let d = Daemon::start();
    let ws = tempfile::tempdir().unwrap();
    std::fs::create_dir(ws.path().join(".aws")).unwrap();
    let ws_arg = ws.path().to_str().unwrap();
    let err = d
        .agent(&["create", "lead", "--role", "tight", "--workspace", ws_arg])
        .unwrap_err();
    assert!(err.contains("exposes more than a project"), "{err}");
    assert!(err.contains("it holds credentials"), "{err}");
    assert!(err.contains(".aws"), "{err}");
    assert!(
        d.agent(&["inspect", "lead"]).is_err(),
        "no agent was registered"
    );
    // Without the credentials the same workspace is fine.
    std::fs::remove_dir(ws.path().join(".aws")).unwrap();
    let lead = d
        .agent(&["create", "lead", "--role", "tight", "--workspace", ws_arg])
        .unwrap();
    assert_eq!(lead["name"], "lead", "{lead}");
}

/// The daemon's CPU time so far, in clock ticks (utime + stime).
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = after.split(' ').collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

/// The evaluator processes (`__role-eval`, not their launcher) below `pid`.
fn evaluators(pid: i32) -> Vec<i32> {
    super::upstreams::descendants(pid)
        .into_iter()
        .filter(|p| {
            std::fs::read(format!("/proc/{p}/cmdline")).is_ok_and(|c| {
                let args: Vec<&[u8]> = c.split(|b| *b == 0).collect();
                args.first().is_some_and(|a| !a.ends_with(b"substrat-run"))
                    && args.iter().any(|a| *a == b"__role-eval")
            })
        })
        .collect()
}

/// Issue 39: a pattern an agent chose that backtracks exponentially runs
/// in one C call, where Lua's time hook never fires. It held a daemon
/// thread and a CPU on past the limit, and its role was refused as
/// `stuck` meanwhile. Its evaluator is now killed at the limit: the
/// answer comes in time, the daemon burns no CPU after, and the role
/// answers the next call at once.
#[test]
fn a_script_stuck_in_a_c_call_holds_no_daemon_thread() {
    let d = Daemon::start();
    let a = d.create("a", "worker", None);
    let mut c = d.connect(&a).init();
    let attack = json!({"name": "attack", "arguments": {
        "case": "args", "subject": "a".repeat(30), "pattern": format!("{}b", "a*".repeat(30))}});
    let daemon = d.child.id() as i32;
    let start = Instant::now();
    let call = std::thread::spawn(move || {
        let reply = c.request("prompts/get", attack);
        (reply, start.elapsed(), c)
    });
    // Meanwhile: the evaluator runs in a sandbox (a pid namespace and,
    // with cgroups, groups of its own), not in the daemon.
    let mut seen = None;
    while seen.is_none() && start.elapsed() < Duration::from_millis(300) {
        seen = evaluators(daemon).into_iter().next();
        std::thread::sleep(Duration::from_millis(5));
    }
    let evaluator = seen.expect("no evaluator process below the daemon");
    let ns = |pid: i32| std::fs::read_link(format!("/proc/{pid}/ns/pid")).ok();
    assert_ne!(
        ns(evaluator),
        ns(daemon),
        "the evaluator shares the daemon's pid namespace"
    );
    let (reply, took, mut c) = call.join().unwrap();
    assert_eq!(reply["error"]["code"], -32602, "{reply}");
    assert_eq!(
        reply["error"]["message"], "role `attack` ran past its time limit of 300 ms",
        "{reply}"
    );
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_millis(900),
        "{took:?}"
    );
    // Nothing of the daemon runs the pattern on: no evaluator is left, the
    // daemon spends no CPU.
    let gone = Instant::now();
    while !evaluators(daemon).is_empty() {
        assert!(
            gone.elapsed() < Duration::from_secs(1),
            "an evaluator outlived its answer"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let before = cpu_ticks(d.child.id());
    std::thread::sleep(Duration::from_secs(1));
    let spent = cpu_ticks(d.child.id()) - before;
    assert!(
        spent < 30,
        "the daemon spent {spent} ticks after the answer"
    );
    let ok = c.request(
        "prompts/get",
        json!({"name": "attack", "arguments": {"case": "ok"}}),
    );
    let text = ok["result"]["messages"][0]["content"]["text"].as_str();
    assert!(text.is_some_and(|t| t.starts_with("ok")), "{ok}");
}

/// Issue 39: one agent floods `prompts/get` on a slow script (8
/// connections calling without pause, every evaluation running to its
/// 300 ms limit). The operator's `agent spawn` of a script role and its
/// request to the roles HTTP endpoints meanwhile answer within a bound,
/// and the agent's excess calls are refused with the broker's limited
/// shape.
#[test]
fn an_agents_flood_of_evaluations_leaves_the_operator_its_capacity() {
    let dir = tempfile::tempdir().unwrap();
    let http = dir.path().join("roles.sock");
    let listen = format!("unix:{}", http.display());
    let token = "a-test-token-of-24-chars";
    let d = Daemon::start_with_env(
        dir,
        &[
            "--roles-http",
            &listen,
            "--roles-http-token-env",
            "ROLES_TOKEN",
        ],
        &[("ROLES_TOKEN", token)],
    );
    let a = d.create("a", "worker", None);
    let socket = a["socket"].as_str().unwrap().to_string();
    // Until the operator is done (at most 100 calls a connection).
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flood: Vec<_> = (0..8)
        .map(|_| {
            let (socket, stop) = (socket.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut c = Conn::open(Path::new(&socket)).init();
                let spin = json!({"name": "attack", "arguments": {"case": "spin"}});
                let mut replies = Vec::new();
                while !stop.load(std::sync::atomic::Ordering::Relaxed) && replies.len() < 100 {
                    replies.push(c.request("prompts/get", spin.clone()));
                    std::thread::sleep(Duration::from_millis(10));
                }
                replies
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(100));
    let ws = tempfile::tempdir().unwrap();
    let ws = ws.path().canonicalize().unwrap();
    let start = Instant::now();
    let spawned = d.agent(&[
        "spawn",
        "op1",
        "--role",
        "attack",
        "--arg",
        "case=ok",
        "--workspace",
        ws.to_str().unwrap(),
        "start",
    ]);
    let took = start.elapsed();
    assert!(spawned.is_ok(), "{spawned:?}");
    assert!(
        took < Duration::from_secs(2),
        "the operator waited {took:?}"
    );
    let op1 = d.agent(&["inspect", "op1"]).unwrap();
    assert_eq!(op1["persona"], "ok", "{op1}");
    // And over the roles HTTP endpoints.
    let start = Instant::now();
    let (status, body) = roles_http(&http, token, r#"{"arguments": {"case": "ok"}}"#);
    let took = start.elapsed();
    assert_eq!(
        (status, &body["result"]["system"]),
        (200, &json!("ok")),
        "{body}"
    );
    assert!(
        took < Duration::from_secs(1),
        "the operator waited {took:?}"
    );
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let replies: Vec<Value> = flood.into_iter().flat_map(|t| t.join().unwrap()).collect();
    let ran = replies
        .iter()
        .filter(|r| r["error"]["message"] == "role `attack` ran past its time limit of 300 ms")
        .count();
    let limited: Vec<&Value> = replies
        .iter()
        .filter(|r| r["error"]["data"]["status"] == "rate_limited")
        .collect();
    assert!(ran >= 1, "{replies:?}");
    assert!(limited.len() >= 16, "{replies:?}");
    assert_eq!(ran + limited.len(), replies.len(), "{replies:?}");
    for r in limited {
        assert_eq!(r["error"]["code"], -32602, "{r}");
        let retry = r["error"]["data"]["retry_after_ms"].as_u64().unwrap();
        assert!(retry > 0, "{r}");
        assert_eq!(
            r["error"]["message"],
            format!(
                "role `attack`: too many role evaluations by this agent; try again in {retry} ms"
            ),
            "{r}"
        );
    }
}

/// Issue 39: `spawn_agent` of a script role counts as one of the
/// parent's evaluations (its child's first turn resolves the role): past
/// the burst of 5 the parent is refused with the limited shape, and no
/// child is made.
#[test]
fn spawning_script_role_children_counts_against_the_parents_evaluations() {
    let d = Daemon::start();
    let lead = d.create("lead", "worker", None);
    let mut c = d.connect(&lead).init();
    let mut refused = None;
    for i in 1..=6 {
        let (body, is_error) = c.call(
            "spawn_agent",
            json!({"name": format!("s{i}"), "role": "attack", "instructions": "go",
                "role_args": {"case": "ok"}}),
        );
        if is_error {
            refused = Some((i, body));
            break;
        }
    }
    let (at, body) = refused.expect("six script-role children were spawned at once");
    assert_eq!(at, 6, "{body}");
    assert_eq!(body["status"], "rate_limited", "{body}");
    assert!(body["retry_after_ms"].as_u64().unwrap() > 0, "{body}");
    assert!(d.agent(&["inspect", "s6"]).is_err(), "s6 was made");
    // A static role's child costs no evaluation.
    let (body, is_error) = c.call(
        "spawn_agent",
        json!({"name": "plain", "role": "worker", "instructions": "go"}),
    );
    assert!(!is_error, "{body}");
}

/// POST /agents/attack/prompt on the roles HTTP endpoints' unix socket:
/// the status and the JSON body.
fn roles_http(socket: &Path, token: &str, body: &str) -> (u16, Value) {
    let mut stream = UnixStream::connect(socket).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let request = format!(
        "POST /agents/attack/prompt HTTP/1.1\r\nHost: roles\r\nAuthorization: Bearer {token}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let status = answer.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
    let json = answer
        .split_once("\r\n\r\n")
        .and_then(|(_, b)| serde_json::from_str(b).ok())
        .unwrap_or(Value::Null);
    (status, json)
}

/// A host whose launcher gets no cgroups (here: a parent group that does
/// not exist) still evaluates script roles in their sandbox: the
/// evaluator's own rlimits and the daemon's kill bound it there. The
/// daemon refused to start instead (its script roles could not load).
#[test]
fn script_roles_evaluate_where_the_launcher_gets_no_cgroups() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start_with(dir, &["--cgroup-parent", "substrat-test-no-such-group"]);
    let a = d.create("a", "worker", None);
    let mut c = d.connect(&a).init();
    let ok = c.request(
        "prompts/get",
        json!({"name": "attack", "arguments": {"case": "ok"}}),
    );
    let text = ok["result"]["messages"][0]["content"]["text"].as_str();
    assert!(text.is_some_and(|t| t.starts_with("ok")), "{ok}");
    let start = Instant::now();
    let spin = c.request(
        "prompts/get",
        json!({"name": "attack", "arguments": {"case": "find"}}),
    );
    assert_eq!(
        spin["error"]["message"], "role `attack` ran past its time limit of 300 ms",
        "{spin}"
    );
    assert!(
        start.elapsed() < Duration::from_millis(900),
        "{:?}",
        start.elapsed()
    );
}
