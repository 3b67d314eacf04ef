//! `substrat-sandbox top`: a live view of the team a daemon serves, for
//! an SSH session: the agents as a tree with their state and the turn each
//! is in, tokens against budgets, layer sizes, upstream health; the
//! selected agent's reasons, turns, last tool calls and messages; keys to
//! suspend, resume, kill and open its diff. A thread of its own talks to
//! the daemon, so a daemon that stops answering never freezes the view.

mod data;
mod draw;
mod view;

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::mpsc::{self, Receiver, Sender};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use ratatui::crossterm::event::{self, Event, KeyCode, KeyEvent, KeyEventKind, KeyModifiers};

use data::{Action, Snapshot};

#[derive(Debug, clap::Args)]
pub struct TopArgs {
    /// The daemon's state directory (default: as for `agent`).
    #[arg(long, value_name = "DIR", env = "SUBSTRAT_STATE_DIR")]
    pub state_dir: Option<PathBuf>,
    /// Milliseconds between refreshes.
    #[arg(long, value_name = "MS", default_value_t = 1000, value_parser = clap::value_parser!(u64).range(100..=60_000))]
    pub interval: u64,
}

pub fn top(args: &TopArgs) -> ExitCode {
    match top_inner(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!(
                "substrat-sandbox top: {}",
                substrat_cli::term::error_text(&e)
            );
            ExitCode::from(2)
        }
    }
}

fn top_inner(args: &TopArgs) -> Result<()> {
    let state_dir = crate::daemon::state_dir(args.state_dir.as_deref())?;
    if !std::io::stdout().is_terminal() || !std::io::stdin().is_terminal() {
        bail!(
            "top draws on a terminal; for programs, `agent list --json` and `agent inspect NAME --json`"
        );
    }
    let (to_worker, requests) = mpsc::channel();
    let (replies, from_worker) = mpsc::channel();
    let interval = Duration::from_millis(args.interval);
    let dir = state_dir.clone();
    std::thread::spawn(move || worker(&dir, interval, &requests, &replies));
    let mut terminal = ratatui::init();
    let result = run(&mut terminal, &state_dir, &to_worker, &from_worker);
    ratatui::restore();
    result
}

/// What the view asks of the worker thread.
enum Ask {
    /// Details of this agent from now on (or none).
    Select(Option<String>),
    Act(Action, String),
    Diff(String),
}

/// What the worker thread answers.
enum Answer {
    Snapshot(Snapshot),
    Status(String),
    Diff(String, Vec<String>),
}

/// Reads the team every `interval` and does what it is asked in between,
/// until the view is gone.
fn worker(state_dir: &Path, interval: Duration, asks: &Receiver<Ask>, answers: &Sender<Answer>) {
    let mut selected: Option<String> = None;
    loop {
        let snapshot = data::fetch(state_dir, selected.as_deref());
        if answers.send(Answer::Snapshot(snapshot)).is_err() {
            return;
        }
        let next = Instant::now() + interval;
        while let Some(wait) = next.checked_duration_since(Instant::now()) {
            let answer = match asks.recv_timeout(wait) {
                Ok(Ask::Select(name)) => {
                    selected = name;
                    break;
                }
                Ok(Ask::Act(action, name)) => Answer::Status(data::act(state_dir, action, &name)),
                Ok(Ask::Diff(name)) => {
                    let lines = data::diff(state_dir, &name);
                    Answer::Diff(name, lines)
                }
                Err(mpsc::RecvTimeoutError::Timeout) => break,
                Err(mpsc::RecvTimeoutError::Disconnected) => return,
            };
            if answers.send(answer).is_err() {
                return;
            }
        }
    }
}

/// The view's state between frames.
#[derive(Default)]
struct App {
    snapshot: Snapshot,
    /// When the last snapshot came (a silent daemon shows its age).
    fresh: Option<Instant>,
    selected: usize,
    detail: bool,
    /// An agent's diff being read: its name, lines and scroll position.
    diff: Option<(String, Vec<String>, usize)>,
    /// The agent a kill waits to be confirmed for.
    confirm_kill: Option<String>,
    status: String,
}

impl App {
    fn rows(&self) -> Vec<view::Row> {
        view::rows(&self.snapshot.agents, now_ms())
    }

    fn selected_name(&self) -> Option<String> {
        self.rows().get(self.selected).map(|r| r.name.clone())
    }

    /// A new refresh of the team. The selection stays on its agent (agents
    /// spawned or removed meanwhile move its row), else on its row.
    fn take_snapshot(&mut self, snapshot: Snapshot) {
        let selected = self.selected_name();
        self.snapshot = snapshot;
        self.fresh = Some(Instant::now());
        let rows = self.rows();
        if let Some(at) = selected.and_then(|name| rows.iter().position(|r| r.name == name)) {
            self.selected = at;
        }
        self.selected = self.selected.min(rows.len().saturating_sub(1));
    }
}

fn run(
    terminal: &mut ratatui::DefaultTerminal,
    state_dir: &Path,
    asks: &Sender<Ask>,
    answers: &Receiver<Answer>,
) -> Result<()> {
    let mut app = App {
        status: format!(
            "{}: waiting for the daemon",
            substrat_policy::text::escape_path(state_dir)
        ),
        ..App::default()
    };
    loop {
        while let Ok(answer) = answers.try_recv() {
            match answer {
                Answer::Snapshot(s) => app.take_snapshot(s),
                Answer::Status(s) => app.status = s,
                Answer::Diff(name, lines) => {
                    app.status.clear();
                    app.diff = Some((name, lines, 0));
                }
            }
        }
        let count = app.rows().len();
        app.selected = app.selected.min(count.saturating_sub(1));
        terminal.draw(|frame| draw::frame(frame, &app))?;
        if !event::poll(Duration::from_millis(100))? {
            continue;
        }
        if let Event::Key(key) = event::read()?
            && key.kind == KeyEventKind::Press
            && !on_key(&mut app, key, asks)
        {
            return Ok(());
        }
    }
}

/// Handles one key; false when the view should end.
fn on_key(app: &mut App, key: KeyEvent, asks: &Sender<Ask>) -> bool {
    if key.code == KeyCode::Char('c') && key.modifiers.contains(KeyModifiers::CONTROL) {
        return false;
    }
    if let Some(name) = app.confirm_kill.take() {
        if key.code == KeyCode::Char('y') {
            let _ = asks.send(Ask::Act(Action::Kill, name));
        } else {
            app.status = "kill cancelled".to_string();
        }
        return true;
    }
    if let Some((_, lines, scroll)) = &mut app.diff {
        let last = lines.len().saturating_sub(1);
        match key.code {
            KeyCode::Esc | KeyCode::Char('q') | KeyCode::Char('d') => app.diff = None,
            KeyCode::Down | KeyCode::Char('j') => *scroll = (*scroll + 1).min(last),
            KeyCode::Up | KeyCode::Char('k') => *scroll = scroll.saturating_sub(1),
            KeyCode::PageDown | KeyCode::Char(' ') => *scroll = (*scroll + 20).min(last),
            KeyCode::PageUp => *scroll = scroll.saturating_sub(20),
            _ => {}
        }
        return true;
    }
    let count = app.rows().len();
    let before = app.selected_name();
    match key.code {
        KeyCode::Char('q') | KeyCode::Esc => return false,
        KeyCode::Down | KeyCode::Char('j') => {
            app.selected = (app.selected + 1).min(count.saturating_sub(1))
        }
        KeyCode::Up | KeyCode::Char('k') => app.selected = app.selected.saturating_sub(1),
        KeyCode::Enter | KeyCode::Char('i') => app.detail = !app.detail,
        _ => {
            if let Some(name) = before.clone() {
                act_on(app, key.code, name, asks);
            }
            return true;
        }
    }
    let after = app.selected_name();
    if after != before || matches!(key.code, KeyCode::Enter | KeyCode::Char('i')) {
        let _ = asks.send(Ask::Select(app.detail.then_some(after).flatten()));
    }
    true
}

/// The keys that act on the selected agent.
fn act_on(app: &mut App, code: KeyCode, name: String, asks: &Sender<Ask>) {
    let shown = crate::agent_text::safe(&name);
    match code {
        KeyCode::Char('s') => {
            app.status = format!("suspending {shown}...");
            let _ = asks.send(Ask::Act(Action::Suspend, name));
        }
        KeyCode::Char('r') => {
            app.status = format!("resuming {shown}...");
            let _ = asks.send(Ask::Act(Action::Resume, name));
        }
        KeyCode::Char('K') => {
            app.status = format!("kill {shown}? y to confirm, any other key to cancel");
            app.confirm_kill = Some(name);
        }
        KeyCode::Char('d') => {
            app.status = format!("reading the diff of {shown}...");
            let _ = asks.send(Ask::Diff(name));
        }
        _ => {}
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn team(names: &[&str]) -> Snapshot {
        Snapshot {
            agents: names.iter().map(|n| json!({"name": n})).collect(),
            ..Snapshot::default()
        }
    }

    /// The selection follows the agent, not the row: agents spawned or
    /// removed between the operator's look and key (a refresh a second)
    /// must not move `s`, `r`, `K` or `d` onto another agent.
    #[test]
    fn the_selection_stays_on_its_agent_when_the_list_changes() {
        let (asks, _from_view) = mpsc::channel();
        let mut app = App::default();
        app.take_snapshot(team(&["lead", "w1", "w2"]));
        let down = KeyEvent::new(KeyCode::Down, KeyModifiers::NONE);
        assert!(on_key(&mut app, down, &asks));
        assert_eq!(app.selected_name().as_deref(), Some("w1"));
        // An agent that sorts first appears, then one is removed.
        app.take_snapshot(team(&["a0", "lead", "w1", "w2"]));
        assert_eq!(app.selected_name().as_deref(), Some("w1"));
        app.take_snapshot(team(&["a0", "w1", "w2"]));
        assert_eq!(app.selected_name().as_deref(), Some("w1"));
        // Its agent gone: the row where it was.
        app.take_snapshot(team(&["a0", "w2"]));
        assert_eq!(app.selected_name().as_deref(), Some("w2"));
    }
}
