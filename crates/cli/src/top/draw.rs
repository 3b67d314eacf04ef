//! Drawing the view with ratatui: a header, the agents' table, the
//! selected agent's details or diff, the upstreams and the keys. Only
//! text `view` (or `data`) escaped reaches here.

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Block, Cell, Paragraph, Row, Table, TableState};

use super::{App, now_ms, view};

const KEYS: &str = "↑↓ select  enter details  s suspend  r resume  K kill  d diff  q quit";

pub fn frame(frame: &mut Frame<'_>, app: &App) {
    let pane = if app.diff.is_some() || app.detail {
        Constraint::Percentage(50)
    } else {
        Constraint::Length(0)
    };
    let [header, table, lower, upstreams, footer] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Min(3),
        pane,
        Constraint::Length(1),
        Constraint::Length(1),
    ])
    .areas(frame.area());
    let rows = app.rows();
    frame.render_widget(Line::from(header_text(app, &rows)), header);
    agents(frame, table, &rows, app.selected);
    if let Some((name, lines, scroll)) = &app.diff {
        let title = format!(" diff of {} (esc closes) ", crate::agent_text::safe(name));
        text_pane(frame, lower, &title, lines, *scroll);
    } else if app.detail {
        let lines = match &app.snapshot.detail {
            Some((inspect, calls)) => view::detail(inspect, calls, now_ms()),
            None => vec!["(reading...)".to_string()],
        };
        text_pane(frame, lower, " details ", &lines, 0);
    }
    frame.render_widget(Line::from(view::servers(&app.snapshot.servers)), upstreams);
    let status = match &app.snapshot.error {
        Some(e) => format!("{e}  |  {KEYS}"),
        None if app.status.is_empty() => KEYS.to_string(),
        None => format!("{}  |  {KEYS}", app.status),
    };
    frame.render_widget(
        Line::from(status).style(Style::new().add_modifier(Modifier::REVERSED)),
        footer,
    );
}

fn header_text(app: &App, rows: &[view::Row]) -> String {
    let running = rows
        .iter()
        .filter(|r| r.turn.starts_with("running"))
        .count();
    let queued = rows.iter().filter(|r| r.turn.starts_with("queued")).count();
    let age = match app.fresh {
        Some(at) if at.elapsed().as_secs() >= 3 => {
            format!(
                "  (no answer from the daemon for {}s)",
                at.elapsed().as_secs()
            )
        }
        _ => String::new(),
    };
    format!(
        "substrat-sandbox top: {} agent(s), {running} running, {queued} queued{age}",
        rows.len()
    )
}

fn agents(frame: &mut Frame<'_>, area: Rect, rows: &[view::Row], selected: usize) {
    let header = Row::new([
        "AGENT", "ROLE", "STATE", "TURN", "TOKENS", "LAYER", "DAEMON",
    ])
    .style(Style::new().add_modifier(Modifier::BOLD));
    let lines = rows.iter().map(|r| {
        Row::new([
            Cell::from(r.shown.clone()),
            Cell::from(r.role.clone()),
            Cell::from(r.state.clone()),
            Cell::from(r.turn.clone()),
            Cell::from(r.tokens.clone()),
            Cell::from(r.layer.clone()),
            Cell::from(r.daemon.clone()),
        ])
    });
    let widths = [
        Constraint::Fill(3),
        Constraint::Fill(1),
        Constraint::Fill(1),
        Constraint::Fill(2),
        Constraint::Fill(1),
        Constraint::Fill(1),
        Constraint::Fill(2),
    ];
    let table = Table::new(lines, widths)
        .header(header)
        .row_highlight_style(Style::new().add_modifier(Modifier::REVERSED));
    let mut state = TableState::default().with_selected((!rows.is_empty()).then_some(selected));
    frame.render_stateful_widget(table, area, &mut state);
}

fn text_pane(frame: &mut Frame<'_>, area: Rect, title: &str, lines: &[String], scroll: usize) {
    let shown: Vec<Line<'_>> = lines
        .iter()
        .skip(scroll)
        .take(area.height as usize)
        .map(|l| Line::from(l.as_str()))
        .collect();
    frame.render_widget(
        Paragraph::new(shown).block(Block::bordered().title(title.to_string())),
        area,
    );
}
