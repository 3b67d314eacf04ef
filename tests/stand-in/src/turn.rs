//! Runs the steps of the selected plan entry, recording one outcome line per
//! action step.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Map, Value};

use crate::events::{Events, raw_line};
use crate::mcp::{self, Mcp};
use crate::plan::{PREVIEW_CHARS, Step, preview, templating};

/// How a turn ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    /// A successful turn with its final text.
    Reply(String),
    /// An error result with this text.
    Fail(String),
    /// Stop now with this exit code and no result event (a crashed agent).
    Exit(u8),
}

/// What the steps run against.
#[derive(Debug)]
pub struct Ctx<'a> {
    pub workspace: &'a Path,
    pub matching: &'a str,
    pub events: &'a Events,
}

/// Runs `steps`, starting the MCP servers first when a step calls a tool.
pub async fn run(steps: &[Step], ctx: &Ctx<'_>) -> End {
    let needs_mcp = steps.iter().any(|s| matches!(s, Step::Call { .. }));
    let mcp = if needs_mcp {
        Mcp::start(&mcp::load_config(ctx.workspace)).await
    } else {
        Mcp::default()
    };
    let end = run_steps(steps, ctx, &mcp).await;
    mcp.shutdown().await;
    end
}

async fn run_steps(steps: &[Step], ctx: &Ctx<'_>, mcp: &Mcp) -> End {
    let mut outcomes: Vec<String> = Vec::new();
    let mut reply = None;
    for step in steps {
        let text = |t: &str| templating(t, ctx.matching, &outcomes);
        match step {
            Step::Reply(t) => reply = Some(text(t)),
            Step::Fail(t) => return End::Fail(text(t)),
            Step::Exit(n) => return End::Exit(exit_code(*n)),
            action => outcomes.push(act(action, ctx, mcp).await),
        }
    }
    End::Reply(reply.unwrap_or_else(|| outcomes.join("\n")))
}

/// An exit code as the shell would see it (modulo 256).
pub fn exit_code(n: i64) -> u8 {
    u8::try_from(n.rem_euclid(256)).unwrap_or(1)
}

async fn act(step: &Step, ctx: &Ctx<'_>, mcp: &Mcp) -> String {
    match step {
        Step::Call { tool, args } => call(tool, args, ctx, mcp).await,
        Step::Write { path, text } => {
            let done = std::fs::write(resolve(ctx, path), text);
            format!("write {path}: {}", io_outcome(done.map(|()| None)))
        }
        Step::Read { path } => {
            let done = std::fs::read(resolve(ctx, path))
                .map(|b| Some(preview(&String::from_utf8_lossy(&b), PREVIEW_CHARS)));
            format!("read {path}: {}", io_outcome(done))
        }
        Step::List { path } => format!("list {path}: {}", io_outcome(list(&resolve(ctx, path)))),
        Step::Shell(command) => {
            let ran = tokio::process::Command::new("/bin/sh")
                .args(["-c", command])
                .current_dir(ctx.workspace)
                .stdin(std::process::Stdio::null())
                .output()
                .await;
            match ran {
                Ok(out) => format!(
                    "shell: exit {}: {}",
                    out.status.code().unwrap_or(-1),
                    preview(&String::from_utf8_lossy(&out.stdout), PREVIEW_CHARS)
                ),
                Err(e) => format!("shell: error: {e}"),
            }
        }
        Step::SleepMs(ms) => {
            tokio::time::sleep(Duration::from_millis(*ms)).await;
            format!("sleep {ms} ms")
        }
        Step::EmitRaw(line) => {
            raw_line(line);
            "emit_raw".to_string()
        }
        Step::Reply(_) | Step::Fail(_) | Step::Exit(_) => String::new(),
    }
}

fn resolve(ctx: &Ctx<'_>, path: &str) -> PathBuf {
    ctx.workspace.join(path)
}

fn io_outcome(done: std::io::Result<Option<String>>) -> String {
    match done {
        Ok(None) => "ok".to_string(),
        Ok(Some(text)) => format!("ok: {text}"),
        Err(e) => format!("error: {e}"),
    }
}

fn list(dir: &Path) -> std::io::Result<Option<String>> {
    let mut names = std::fs::read_dir(dir)?
        .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect::<std::io::Result<Vec<_>>>()?;
    names.sort();
    Ok(Some(names.join(", ")))
}

async fn call(tool: &str, args: &Map<String, Value>, ctx: &Ctx<'_>, mcp: &Mcp) -> String {
    let call_id = uuid::Uuid::new_v4().to_string();
    ctx.events.tool_started(&call_id, tool, args);
    let done = mcp.call(tool, args).await;
    let (is_error, text) = match &done {
        Ok(text) => (false, text.as_str()),
        Err(text) => (true, text.as_str()),
    };
    ctx.events.tool_completed(&call_id, tool, is_error, text);
    let status = if is_error { "error" } else { "ok" };
    format!("call {tool}: {status}: {text}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_wrap_like_a_shell() {
        assert_eq!([0, 3, 255, 256, -1].map(exit_code), [0, 3, 255, 0, 255]);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn file_steps_record_outcomes_and_reply_templates_them() {
        let ws = tempfile::tempdir().unwrap();
        let events = Events {
            session_id: "S".into(),
        };
        let ctx = Ctx {
            workspace: ws.path(),
            matching: "the prompt",
            events: &events,
        };
        let steps = vec![
            Step::Write {
                path: "a.txt".into(),
                text: "hello".into(),
            },
            Step::Read {
                path: "a.txt".into(),
            },
            Step::List { path: ".".into() },
            Step::Read {
                path: "missing".into(),
            },
            Step::Reply("{prompt} / {last} /\n{results}".into()),
        ];
        assert_eq!(
            run(&steps, &ctx).await,
            End::Reply(
                "the prompt / read missing: error: No such file or directory (os error 2) /\n\
                 write a.txt: ok\nread a.txt: ok: hello\nlist .: ok: a.txt\n\
                 read missing: error: No such file or directory (os error 2)"
                    .into()
            )
        );
        let steps = vec![Step::SleepMs(1), Step::Fail("failed after {last}".into())];
        assert_eq!(
            run(&steps, &ctx).await,
            End::Fail("failed after sleep 1 ms".into())
        );
        assert_eq!(
            run(&[Step::SleepMs(0)], &ctx).await,
            End::Reply("sleep 0 ms".into())
        );
    }
}
