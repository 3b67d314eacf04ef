//! Script roles: resolving with arguments and context, and scripts that
//! loop, allocate, or reach for what they must not have.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::lua::{LuaLimits, LuaRole};
use super::*;

/// A team of two, with one message waiting.
struct FakeTeam;

impl TeamContext for FakeTeam {
    fn team(&self) -> Value {
        json!([{"name": "lead", "role": "worker", "state": "active"},
               {"name": "w1", "role": "worker", "state": "suspended"}])
    }
    fn inbox(&self) -> Value {
        json!({"waiting": 1, "from": ["lead"]})
    }
    fn inspect(&self, name: &str) -> Option<Value> {
        (name == "w1").then(|| json!({"name": "w1", "turns": 3}))
    }
}

fn limits(ms: u64) -> LuaLimits {
    LuaLimits {
        timeout: Duration::from_millis(ms),
        memory_bytes: 16 << 20,
        context_calls: 4,
    }
}

fn script(dir: &tempfile::TempDir, text: &str) -> std::path::PathBuf {
    let path = dir.path().join("role.lua");
    std::fs::write(&path, text).unwrap();
    path
}

fn load(text: &str) -> Result<LuaRole, RoleError> {
    let dir = tempfile::tempdir().unwrap();
    LuaRole::load(
        "responder",
        &script(&dir, text),
        json!({"search_limit": 5}),
        limits(300),
    )
}

fn resolve(text: &str, args: &[(&str, &str)]) -> Result<RolePrompt, RoleError> {
    let role = load(text)?;
    let args = args
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    role.resolve(&args, Arc::new(FakeTeam))
}

const RESPONDER: &str = r#"
agent = {}
agent.name = "responder"
agent.description = "Triages incidents"
agent.tools = { "send_message", "check_inbox" }
agent.arguments = {
    { name = "service", description = "The service", required = true },
    { name = "severity", description = "P1-P3" },
}
function agent.resolve(args, config, context)
    local team = context.team()
    local inbox = context.inbox()
    local w1 = context.inspect("w1")
    local nobody = context.inspect("nobody")
    return {
        system = string.format("You handle %s (%s). Team of %d, %d waiting from %s; w1 ran %d turns; nobody is %s; limit %d.",
            args.service, args.severity or "P2", #team, inbox.waiting, inbox.from[1], w1.turns,
            tostring(nobody), config.search_limit),
        messages = { { role = "assistant", content = "Ready for " .. args.service } },
    }
end
return agent
"#;

#[test]
fn a_script_role_resolves_with_arguments_config_and_context() {
    let role = load(RESPONDER).unwrap();
    assert_eq!(
        role.info,
        RoleInfo {
            name: "responder".into(),
            description: "Triages incidents".into(),
            tools: vec!["send_message".into(), "check_inbox".into()],
            source: RoleSource::Lua,
            arguments: vec![
                RoleArgument {
                    name: "service".into(),
                    description: "The service".into(),
                    required: true
                },
                RoleArgument {
                    name: "severity".into(),
                    description: "P1-P3".into(),
                    required: false
                },
            ],
        }
    );
    let prompt = resolve(RESPONDER, &[("service", "db")]).unwrap();
    assert_eq!(
        prompt,
        RolePrompt {
            system: "You handle db (P2). Team of 2, 1 waiting from lead; w1 ran 3 turns; nobody is nil; limit 5."
                .into(),
            tools: vec!["send_message".into(), "check_inbox".into()],
            messages: vec![PromptMessage {
                role: MessageRole::Assistant,
                content: "Ready for db".into()
            }],
        }
    );
    // The arguments it declares are checked before it runs.
    assert_eq!(
        check_args("responder", &role.info.arguments, &RoleArgs::new())
            .unwrap_err()
            .to_string(),
        "role `responder`: argument `service` is required"
    );
}

fn body(code: &str) -> String {
    format!(
        "local agent = {{ name = 'responder' }}\nfunction agent.resolve(args, config, context)\n{code}\nend\nreturn agent\n"
    )
}

#[test]
fn a_script_that_loops_forever_is_stopped_at_its_time_limit() {
    for code in [
        "while true do end",
        // pcall does not swallow the time limit.
        "while true do pcall(function() while true do end end) end",
        "while true do xpcall(function() while true do end end, function(e) return e end) end",
        "local function f() return f() end return f()",
    ] {
        let start = Instant::now();
        let err = resolve(&body(code), &[]).unwrap_err();
        assert_eq!(
            err,
            RoleError::Timeout {
                role: "responder".into(),
                ms: 300
            },
            "{code}"
        );
        assert!(start.elapsed() < Duration::from_secs(3), "{code}");
    }
    // At load time too (the top level runs to learn the declarations).
    let err = load("while true do end").unwrap_err();
    assert!(matches!(err, RoleError::Timeout { .. }), "{err}");
}

#[test]
fn a_script_that_allocates_without_bound_is_stopped_at_its_memory_limit() {
    for code in [
        "local t = {} while true do t[#t + 1] = string.rep('x', 1000000) end",
        "return { system = string.rep('x', 1000000000) }",
        "local t = {} while true do pcall(function() t[#t + 1] = string.rep('y', 1000000) end) end",
    ] {
        let err = resolve(&body(code), &[]).unwrap_err();
        assert_eq!(
            err,
            RoleError::Memory {
                role: "responder".into(),
                bytes: 16 << 20
            },
            "{code}"
        );
    }
}

#[test]
fn a_script_cannot_reach_the_host() {
    for (code, name) in [
        ("os.execute('touch /tmp/luat/pwned')", "os"),
        ("io.open('/etc/passwd')", "io"),
        ("require('socket')", "require"),
        ("load(string.dump(function() end))", "load"),
        ("dofile('/etc/passwd')", "dofile"),
        ("debug.getinfo(1)", "debug"),
        ("coroutine.create(print)", "coroutine"),
        ("collectgarbage('stop')", "collectgarbage"),
    ] {
        let err = resolve(&body(code), &[]).unwrap_err().to_string();
        assert!(
            err.contains(&format!(
                "`{name}` is not available to role scripts (no io, os, require, load, debug)"
            )),
            "{code}: {err}"
        );
    }
    assert!(!std::path::Path::new("/tmp/luat/pwned").exists());
    // string.dump and print are gone as well.
    let err = resolve(&body("return string.dump(function() end)"), &[])
        .unwrap_err()
        .to_string();
    assert!(err.contains("attempt to call a nil value"), "{err}");
    // A bytecode file is refused as such.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("role.lua");
    std::fs::write(&path, b"\x1bLuaT\x00\x19\r\n\x1a\nreturn {}").unwrap();
    let err = LuaRole::load("responder", &path, Value::Null, limits(300))
        .unwrap_err()
        .to_string();
    assert!(err.contains("binary"), "{err}");
}

#[test]
fn bad_scripts_get_clear_errors() {
    let cases = [
        ("return 1", "neither returns nor sets an `agent` table"),
        (
            "return { name = 'other', resolve = function() end }",
            "agent.name is `other` but the role is `responder`",
        ),
        (
            "return { name = 'responder' }",
            "agent.resolve is not a function",
        ),
        (
            "return { arguments = { { nom = 'x' } }, resolve = function() end }",
            "agent.arguments must be a list of {name, description, required}: unknown field `nom`",
        ),
        ("syntax error here", "the script:"),
    ];
    for (text, wanted) in cases {
        let err = load(text).unwrap_err().to_string();
        assert!(err.contains(wanted), "{text}: {err}");
    }
    let runtime = [
        ("return 'text'", "resolve must return {system = string"),
        ("return { system = 1, extra = true }", "resolve must return"),
        ("error('boom')", "resolve: "),
        (
            "return { system = 'x', messages = { { role = 'robot', content = 'hi' } } }",
            "resolve must return",
        ),
        (
            "for i = 1, 5 do context.team() end",
            "more than 4 context calls",
        ),
    ];
    for (code, wanted) in runtime {
        let err = resolve(&body(code), &[]).unwrap_err().to_string();
        assert!(err.contains(wanted), "{code}: {err}");
        assert!(err.starts_with("role `responder`: "), "{err}");
    }
    let big = resolve(&body("return { system = string.rep('x', 300000) }"), &[]).unwrap_err();
    assert!(
        big.to_string().contains("over the limit of 262144"),
        "{big}"
    );
}

#[test]
fn what_runs_outside_the_time_limit_is_refused_or_bounded() {
    // Found by review: a finalizer runs with hooks off; string.rep and
    // table.move loop in C without allocating.
    let cases = [
        (
            "setmetatable({}, {__gc = function() while true do end end}) return { system = 'x' }",
            "__gc is not available to role scripts",
        ),
        (
            "return { system = string.rep('', 3000000000) }",
            "ran past its memory limit",
        ),
        (
            "return { system = (''):rep('3e9') }",
            "ran past its memory limit",
        ),
        (
            "table.move({}, 1, 3000000000, 1, {}) return { system = 'x' }",
            "table.move: more elements than",
        ),
    ];
    for (code, wanted) in cases {
        let start = Instant::now();
        let err = resolve(&body(code), &[]).unwrap_err().to_string();
        assert!(err.contains(wanted), "{code}: {err}");
        assert!(start.elapsed() < Duration::from_secs(2), "{code}");
    }
    // What stays within the bounds still works.
    let ok = resolve(
        &body("local t = table.move({1, 2, 3}, 1, 3, 1, {}) return { system = string.rep('ab', 3, '-') .. #t }"),
        &[],
    )
    .unwrap();
    assert_eq!(ok.system, "ab-ab-ab3");
}

/// A role that overruns its limit in code no hook reaches (as a script
/// stuck in one native call would).
struct Sleeper;

impl Role for Sleeper {
    fn name(&self) -> &str {
        "sleeper"
    }
    fn description(&self) -> &str {
        ""
    }
    fn tools(&self) -> Vec<String> {
        Vec::new()
    }
    fn resolve(&self, _: &RoleArgs, _: Arc<dyn TeamContext>) -> Result<RolePrompt, RoleError> {
        std::thread::sleep(Duration::from_millis(1500));
        Ok(RolePrompt {
            system: "late".into(),
            tools: Vec::new(),
            messages: Vec::new(),
        })
    }
}

/// A compiled role that answers at once.
struct Quick;

impl Role for Quick {
    fn name(&self) -> &str {
        "quick"
    }
    fn description(&self) -> &str {
        ""
    }
    fn tools(&self) -> Vec<String> {
        Vec::new()
    }
    fn resolve(&self, _: &RoleArgs, _: Arc<dyn TeamContext>) -> Result<RolePrompt, RoleError> {
        Ok(RolePrompt {
            system: "quick".into(),
            tools: Vec::new(),
            messages: Vec::new(),
        })
    }
}

#[test]
fn a_stuck_evaluation_blocks_its_own_role_only_and_only_while_it_runs() {
    let sleeper: Arc<dyn Role> = Arc::new(Sleeper);
    let limit = Duration::from_millis(50);
    let first = resolve_on_thread(sleeper.clone(), RoleArgs::new(), Arc::new(NoTeam), limit);
    assert!(matches!(first, Err(RoleError::Timeout { .. })), "{first:?}");
    let again = resolve_on_thread(sleeper.clone(), RoleArgs::new(), Arc::new(NoTeam), limit);
    assert!(matches!(again, Err(RoleError::Stuck { .. })), "{again:?}");
    // Other roles keep their capacity meanwhile.
    let other = resolve(RESPONDER, &[("service", "db")]);
    assert!(other.is_ok(), "{other:?}");
    let role: Arc<dyn Role> = Arc::new(Quick);
    for _ in 0..MAX_RUNNING + 1 {
        assert!(
            resolve_on_thread(
                role.clone(),
                RoleArgs::new(),
                Arc::new(FakeTeam),
                Duration::from_secs(2)
            )
            .is_ok()
        );
    }
    // Once it ends, the role is served again.
    std::thread::sleep(Duration::from_millis(1600));
    let later = resolve_on_thread(
        sleeper,
        RoleArgs::new(),
        Arc::new(NoTeam),
        Duration::from_secs(3),
    );
    assert_eq!(later.unwrap().system, "late");
}

/// What an agent can make a script fail with names the role's chunk and
/// line (`responder.lua:3:`), never the daemon's path to the script.
#[test]
fn errors_name_the_role_and_line_never_the_scripts_path() {
    let dir = tempfile::tempdir().unwrap();
    let host = dir.path().to_str().unwrap().to_string();
    let fails = |text: &str| -> String {
        let path = script(&dir, text);
        let run = || -> Result<RolePrompt, RoleError> {
            let role = LuaRole::load("responder", &path, Value::Null, limits(1000))?;
            role.resolve(&RoleArgs::new(), Arc::new(FakeTeam))
        };
        run().unwrap_err().to_string()
    };
    let cases = [
        (
            "local x = = 1",
            "responder.lua:1: unexpected symbol near '='",
        ),
        ("\nerror('boom')", "responder.lua:2: boom"),
        (
            &body("local t = nil\nreturn t.x"),
            "responder.lua:4: attempt to index a nil value",
        ),
        (&body("error({})"), "resolve: "),
        (
            &body("error(setmetatable({}, {__tostring = function() return 'obj' end}))"),
            "resolve: ",
        ),
        (
            &body("local t = {} while true do t[#t + 1] = ('x'):rep(1000) end"),
            "ran past its memory limit",
        ),
        (&body("while true do end"), "ran past its time limit"),
        (&body("return { system = 1 }"), "resolve must return"),
    ];
    for (text, wanted) in cases {
        let err = fails(text);
        assert!(err.contains(wanted), "{text}: {err}");
        assert!(!err.contains(&host), "{text}: {err}");
    }
}

/// Resolves on a thread of the test's own and waits at most `bound`: a
/// hang shows as this test's failure, not as a test that never ends.
fn bounded(text: &str, bound: Duration) -> (Result<RolePrompt, RoleError>, Duration) {
    let owned = text.to_string();
    let (tx, rx) = std::sync::mpsc::channel();
    let start = Instant::now();
    std::thread::spawn(move || {
        let _ = tx.send(resolve(&owned, &[]));
    });
    match rx.recv_timeout(bound) {
        Ok(outcome) => (outcome, start.elapsed()),
        Err(_) => panic!("no answer within {bound:?}: {text}"),
    }
}

/// Found by review: a result is copied out of Lua (and serialized) after
/// it is made, and one large string referenced many times is copied as
/// many times: 10,000 references to a 1 MiB string held 1 MiB in Lua
/// and asked the daemon for 10 GiB. It is measured first, as copied.
#[test]
fn a_result_is_measured_as_copied_before_it_is_copied() {
    let many = "local m = { role = 'user', content = ('x'):rep(1 << 20) }\n\
        local list = {} for i = 1, 10000 do list[i] = m end\n\
        return { system = 's', messages = list }";
    let (outcome, took) = bounded(&body(many), Duration::from_secs(10));
    assert_eq!(
        outcome.unwrap_err().to_string(),
        "role `responder`: the result holds over 589824 bytes of text (each reference to a string counted as it would be copied)"
    );
    assert!(took < Duration::from_secs(2), "{took:?}");
    // Tables referenced many times count each time as well.
    let tables = "local m = { role = 'user', content = 'x' }\n\
        local list = {} for i = 1, 3000 do list[i] = m end\n\
        return { system = 's', messages = list }";
    let (outcome, _) = bounded(&body(tables), Duration::from_secs(10));
    assert_eq!(
        outcome.unwrap_err().to_string(),
        "role `responder`: the result holds over 4096 table entries (each reference to a table counted)"
    );
    let (outcome, _) = bounded(
        &body("local t = {} t.t = t return { system = 's', x = t }"),
        Duration::from_secs(10),
    );
    assert_eq!(
        outcome.unwrap_err().to_string(),
        "role `responder`: the result nests tables deeper than 8"
    );
}
