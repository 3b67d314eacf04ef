//! The scripted plan carried in a prompt: extraction, turn matching, step
//! parsing and reply templating. Pure functions, no I/O.

use serde::Deserialize;
use serde_json::{Map, Value};

/// The fence line that opens a plan block.
pub const FENCE_OPEN: &str = "```substrat-plan";
/// The fence line that closes a plan block.
pub const FENCE_CLOSE: &str = "```";
/// How many characters of text the "nothing to do" reply and `read` keep.
pub const PREVIEW_CHARS: usize = 200;

/// A prompt split into the text the turn matches on and the plan source, if any.
#[derive(Debug, PartialEq, Eq)]
pub struct Extracted {
    /// The prompt with the plan block removed, trimmed.
    pub matching: String,
    /// The raw text between the fences.
    pub plan_source: Option<String>,
}

/// The whole plan: the turns the agent may run, first match wins.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Plan {
    pub turns: Vec<Turn>,
}

/// One entry of the plan: run `steps` when `when` is in the matching text.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Turn {
    #[serde(default)]
    pub when: Option<String>,
    #[serde(default)]
    pub steps: Vec<Value>,
}

/// One step of a turn.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    Call {
        tool: String,
        args: Map<String, Value>,
    },
    Write {
        path: String,
        text: String,
    },
    Read {
        path: String,
    },
    List {
        path: String,
    },
    /// `sh -c` in the workspace (cursor-agent's shell tool).
    Shell(String),
    SleepMs(u64),
    EmitRaw(String),
    Reply(String),
    Fail(String),
    Exit(i64),
}

/// Splits the first plan block out of `prompt`. Without a complete block
/// (opening and closing fence) the prompt is all matching text.
pub fn extract(prompt: &str) -> Extracted {
    let lines: Vec<&str> = prompt.split('\n').collect();
    let is = |line: &str, fence: &str| line.trim_end_matches('\r') == fence;
    let open = lines.iter().position(|l| is(l, FENCE_OPEN));
    let close = open.and_then(|o| {
        lines[o + 1..]
            .iter()
            .position(|l| is(l, FENCE_CLOSE))
            .map(|c| o + 1 + c)
    });
    match (open, close) {
        (Some(o), Some(c)) => {
            let mut rest = lines[..o].to_vec();
            rest.extend_from_slice(&lines[c + 1..]);
            Extracted {
                matching: rest.join("\n").trim().to_string(),
                plan_source: Some(lines[o + 1..c].join("\n")),
            }
        }
        _ => Extracted {
            matching: prompt.trim().to_string(),
            plan_source: None,
        },
    }
}

/// Parses the JSON plan source.
pub fn parse_plan(source: &str) -> Result<Plan, String> {
    serde_json::from_str(source).map_err(|e| format!("invalid plan: {e}"))
}

/// The first turn whose `when` is a substring of `matching` (absent `when` matches anything).
pub fn select<'p>(plan: &'p Plan, matching: &str) -> Option<&'p Turn> {
    plan.turns
        .iter()
        .find(|t| t.when.as_deref().is_none_or(|w| matching.contains(w)))
}

/// Parses every step of a turn; the first invalid or unknown step is the error.
pub fn parse_steps(turn: &Turn) -> Result<Vec<Step>, String> {
    turn.steps.iter().map(parse_step).collect()
}

const KINDS: [&str; 10] = [
    "call", "write", "read", "list", "shell", "sleep_ms", "emit_raw", "reply", "fail", "exit",
];

/// Parses one step object; its kind is the first known key it carries.
pub fn parse_step(value: &Value) -> Result<Step, String> {
    let Some(obj) = value.as_object() else {
        return Err(format!("invalid step (not an object): {value}"));
    };
    let Some(kind) = KINDS.iter().find(|k| obj.contains_key(**k)) else {
        let keys: Vec<&str> = obj.keys().map(String::as_str).collect();
        return Err(format!("unknown step kind {:?}: {value}", keys.join(",")));
    };
    step_of_kind(kind, obj).ok_or_else(|| format!("invalid {kind} step: {value}"))
}

fn step_of_kind(kind: &str, obj: &Map<String, Value>) -> Option<Step> {
    let s = |key: &str| obj.get(key).and_then(Value::as_str).map(str::to_string);
    Some(match kind {
        "call" => Step::Call {
            tool: s("call")?,
            args: match obj.get("args") {
                None | Some(Value::Null) => Map::new(),
                Some(v) => v.as_object()?.clone(),
            },
        },
        "write" => Step::Write {
            path: s("write")?,
            text: s("text")?,
        },
        "read" => Step::Read { path: s("read")? },
        "list" => Step::List { path: s("list")? },
        "shell" => Step::Shell(s("shell")?),
        "sleep_ms" => Step::SleepMs(obj.get("sleep_ms")?.as_u64()?),
        "emit_raw" => Step::EmitRaw(s("emit_raw")?),
        "reply" => Step::Reply(s("reply")?),
        "fail" => Step::Fail(s("fail")?),
        "exit" => Step::Exit(obj.get("exit")?.as_i64()?),
        _ => return None,
    })
}

/// Substitutes `{prompt}`, `{last}` and `{results}` in one pass (substituted
/// text is not scanned again).
pub fn templating(text: &str, prompt: &str, outcomes: &[String]) -> String {
    let last = outcomes.last().map(String::as_str).unwrap_or("");
    let results = outcomes.join("\n");
    let table = [
        ("{prompt}", prompt),
        ("{last}", last),
        ("{results}", &results),
    ];
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while !rest.is_empty() {
        match table.iter().find(|(token, _)| rest.starts_with(token)) {
            Some((token, value)) => {
                out.push_str(value);
                rest = &rest[token.len()..];
            }
            None => {
                let mut chars = rest.chars();
                if let Some(c) = chars.next() {
                    out.push(c);
                }
                rest = chars.as_str();
            }
        }
    }
    out
}

/// The first `n` characters of `text`.
pub fn preview(text: &str, n: usize) -> String {
    text.chars().take(n).collect()
}

/// The reply of a turn with no plan or no matching entry.
pub fn nothing_to_do(matching: &str) -> String {
    format!(
        "stand-in: nothing to do for: {}",
        preview(matching, PREVIEW_CHARS)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const PROMPT: &str = "Do the work.\n```substrat-plan\n{\"turns\": [{\"when\": \"Reply from w1\", \"steps\": [{\"reply\": \"got {prompt}\"}]}, {\"steps\": [{\"read\": \"a.txt\"}]}]}\n```\nThanks.";

    #[test]
    fn extracts_the_plan_and_removes_the_block() {
        let got = extract(PROMPT);
        assert_eq!(
            got,
            Extracted {
                matching: "Do the work.\nThanks.".into(),
                plan_source: Some("{\"turns\": [{\"when\": \"Reply from w1\", \"steps\": [{\"reply\": \"got {prompt}\"}]}, {\"steps\": [{\"read\": \"a.txt\"}]}]}".into()),
            }
        );
    }

    #[test]
    fn a_prompt_without_a_complete_block_is_all_matching_text() {
        assert_eq!(
            extract("hi\n```substrat-plan\n{}\n"),
            Extracted {
                matching: "hi\n```substrat-plan\n{}".into(),
                plan_source: None
            }
        );
        assert_eq!(
            extract(" plain "),
            Extracted {
                matching: "plain".into(),
                plan_source: None
            }
        );
    }

    #[test]
    fn fences_must_be_whole_lines() {
        let got = extract("x ```substrat-plan\n{}\n```");
        assert_eq!(got.plan_source, None);
        let got = extract("```substrat-plan\r\n{}\r\n```\r\nafter");
        assert_eq!(got.plan_source.as_deref(), Some("{}\r"));
        assert_eq!(got.matching, "after");
    }

    #[test]
    fn selects_the_first_matching_turn_on_the_text_without_the_plan() {
        let ex = extract(PROMPT);
        let plan = parse_plan(ex.plan_source.as_deref().unwrap()).unwrap();
        assert_eq!(select(&plan, &ex.matching), Some(&plan.turns[1]));
        let reply = "Reply from w1 (to message x):\nhello";
        assert_eq!(select(&plan, reply), Some(&plan.turns[0]));
        // The plan block itself contains "Reply from w1": it must not match.
        let only_when = parse_plan(r#"{"turns":[{"when":"Reply from w1","steps":[]}]}"#).unwrap();
        let ex = extract(&format!(
            "start\n```substrat-plan\n{}\n```",
            r#"{"turns":[{"when":"Reply from w1","steps":[]}]}"#
        ));
        assert_eq!(select(&only_when, &ex.matching), None);
    }

    #[test]
    fn rejects_malformed_plans() {
        assert_eq!(
            parse_plan("{\"turns\": 3}"),
            Err(
                "invalid plan: invalid type: integer `3`, expected a sequence at line 1 column 11"
                    .into()
            )
        );
    }

    #[test]
    fn parses_every_step_kind() {
        let turn = Turn {
            when: None,
            steps: vec![
                json!({"call": "echo", "args": {"text": "hi"}}),
                json!({"call": "bare"}),
                json!({"write": "a.txt", "text": "A"}),
                json!({"read": "a.txt"}),
                json!({"list": "."}),
                json!({"shell": "true"}),
                json!({"sleep_ms": 5}),
                json!({"emit_raw": "not json"}),
                json!({"reply": "R"}),
                json!({"fail": "F"}),
                json!({"exit": 3}),
            ],
        };
        let mut args = Map::new();
        args.insert("text".into(), json!("hi"));
        assert_eq!(
            parse_steps(&turn),
            Ok(vec![
                Step::Call {
                    tool: "echo".into(),
                    args
                },
                Step::Call {
                    tool: "bare".into(),
                    args: Map::new()
                },
                Step::Write {
                    path: "a.txt".into(),
                    text: "A".into()
                },
                Step::Read {
                    path: "a.txt".into()
                },
                Step::List { path: ".".into() },
                Step::Shell("true".into()),
                Step::SleepMs(5),
                Step::EmitRaw("not json".into()),
                Step::Reply("R".into()),
                Step::Fail("F".into()),
                Step::Exit(3),
            ])
        );
    }

    #[test]
    fn unknown_and_invalid_steps_are_named() {
        assert_eq!(
            parse_step(&json!({"frobnicate": 1})),
            Err("unknown step kind \"frobnicate\": {\"frobnicate\":1}".into())
        );
        assert_eq!(
            parse_step(&json!({"write": "a.txt"})),
            Err("invalid write step: {\"write\":\"a.txt\"}".into())
        );
        assert_eq!(
            parse_step(&json!({"call": "x", "args": [1]})),
            Err("invalid call step: {\"args\":[1],\"call\":\"x\"}".into())
        );
        assert_eq!(
            parse_step(&json!("reply")),
            Err("invalid step (not an object): \"reply\"".into())
        );
    }

    #[test]
    fn templating_substitutes_once() {
        let outcomes = vec!["write a: ok".to_string(), "read a: ok: A".to_string()];
        assert_eq!(
            templating(
                "[{prompt}] last={last}\n{results} {unknown} {",
                "p {results}",
                &outcomes
            ),
            "[p {results}] last=read a: ok: A\nwrite a: ok\nread a: ok: A {unknown} {"
        );
        assert_eq!(templating("{last}|{results}|é", "", &[]), "||é");
    }

    #[test]
    fn nothing_to_do_keeps_200_chars() {
        let long = "é".repeat(300);
        assert_eq!(
            nothing_to_do(&long),
            format!("stand-in: nothing to do for: {}", "é".repeat(200))
        );
    }
}
