#![forbid(unsafe_code)]
//! A stand-in for `cursor-agent` in headless mode: the same flags, the same
//! stream-json events, the same session store layout and MCP client
//! behaviour, driven by a scripted plan carried in the prompt.

mod cli;
mod events;
mod mcp;
mod plan;
mod session;
mod turn;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use cli::{Args, Command};
use events::Events;
use plan::Plan;
use session::Session;
use turn::End;

/// Exit code of a usage error.
const USAGE: u8 = 2;

fn main() -> ExitCode {
    let started = Instant::now();
    let args = match cli::parse(std::env::args().skip(1)) {
        Ok(Command::Version) => {
            println!(
                "{} {} (stand-in for cursor-agent)",
                env!("CARGO_PKG_NAME"),
                env!("CARGO_PKG_VERSION")
            );
            return ExitCode::SUCCESS;
        }
        Ok(Command::Run(args)) => args,
        Err(usage) => {
            eprintln!("stand-in: {usage}");
            return ExitCode::from(USAGE);
        }
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build();
    match runtime {
        Ok(rt) => ExitCode::from(rt.block_on(run(args, started))),
        Err(e) => {
            eprintln!("stand-in: cannot start the runtime: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The workspace as an absolute, canonical path; the process moves into it.
fn enter_workspace(args: &Args) -> Result<PathBuf, String> {
    let given = match &args.workspace {
        Some(w) => w.clone(),
        None => std::env::current_dir().map_err(|e| format!("current dir: {e}"))?,
    };
    let workspace = given
        .canonicalize()
        .map_err(|e| format!("workspace {}: {e}", given.display()))?;
    std::env::set_current_dir(&workspace)
        .map_err(|e| format!("workspace {}: {e}", workspace.display()))?;
    Ok(workspace)
}

/// Opens the resumed session or creates a new one; `Err` is the result text.
fn open_session(args: &Args, ws_hash: &str) -> Result<Session, (String, String)> {
    let home = std::env::var_os("HOME").map(PathBuf::from);
    let home = home.ok_or_else(|| (String::new(), "HOME is not set".to_string()))?;
    match &args.resume {
        None => Session::create(&home, ws_hash)
            .map_err(|e| (String::new(), format!("session store: {e:#}"))),
        Some(id) => match Session::open(&home, ws_hash, id) {
            Ok(Some(s)) => Ok(s),
            Ok(None) => Err((id.clone(), format!("session {id} not found"))),
            Err(e) => Err((id.clone(), format!("session {id}: {e:#}"))),
        },
    }
}

fn elapsed_ms(started: Instant) -> u64 {
    u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX)
}

async fn run(args: Args, started: Instant) -> u8 {
    let workspace = match enter_workspace(&args) {
        Ok(w) => w,
        Err(e) => {
            eprintln!("stand-in: {e}");
            return USAGE;
        }
    };
    let cwd = workspace.to_string_lossy().into_owned();
    let mut session = match open_session(&args, &session::workspace_hash(&cwd)) {
        Ok(s) => s,
        Err((session_id, text)) => {
            Events { session_id }.result(true, &text, elapsed_ms(started));
            return 1;
        }
    };
    let events = Events {
        session_id: session.id.clone(),
    };
    events.init(&cwd, &args.model);
    events.user(&args.prompt);
    let extracted = plan::extract(&args.prompt);
    let (plan, new_plan) = match resolve_plan(&session, extracted.plan_source.as_deref()) {
        Ok(found) => found,
        Err(text) => (Err(text), None),
    };
    let end = match plan {
        Ok(plan) => play(plan.as_ref(), &workspace, &extracted.matching, &events).await,
        Err(text) => End::Fail(text),
    };
    finish(
        end,
        &mut session,
        &args,
        new_plan.as_deref(),
        &events,
        started,
    )
}

type Resolved = (Result<Option<Plan>, String>, Option<String>);

/// This turn's plan (the prompt's, else the session's latest) and the plan
/// source to store, which is the prompt's plan when it parses.
fn resolve_plan(session: &Session, in_prompt: Option<&str>) -> Result<Resolved, String> {
    if let Some(source) = in_prompt {
        let plan = plan::parse_plan(source);
        let store = plan.is_ok().then(|| source.to_string());
        return Ok((plan.map(Some), store));
    }
    let stored = session
        .latest_plan()
        .map_err(|e| format!("session store: {e:#}"))?;
    let plan = stored.as_deref().map(plan::parse_plan).transpose();
    Ok((plan, None))
}

async fn play(plan: Option<&Plan>, workspace: &Path, matching: &str, events: &Events) -> End {
    let Some(turn) = plan.and_then(|p| plan::select(p, matching)) else {
        return End::Reply(plan::nothing_to_do(matching));
    };
    let steps = match plan::parse_steps(turn) {
        Ok(steps) => steps,
        Err(e) => return End::Fail(e),
    };
    let ctx = turn::Ctx {
        workspace,
        matching,
        events,
    };
    turn::run(&steps, &ctx).await
}

/// Stores the turn, then prints the closing events. The store is committed
/// before the result line so a caller may resume as soon as it reads it.
fn finish(
    end: End,
    session: &mut Session,
    args: &Args,
    plan: Option<&str>,
    events: &Events,
    started: Instant,
) -> u8 {
    let (is_error, text) = match end {
        End::Exit(code) => return code,
        End::Reply(text) => (false, text),
        End::Fail(text) => (true, text),
    };
    if let Err(e) = session.append_turn(&args.prompt, plan, &text) {
        events.result(true, &format!("session store: {e:#}"), elapsed_ms(started));
        return 1;
    }
    if is_error {
        events.result(true, &text, elapsed_ms(started));
        return 1;
    }
    if args.stream_partial_output {
        events.partials(&text);
    }
    events.assistant(&text);
    events.result(false, &text, elapsed_ms(started));
    0
}
