//! Drawing `monitor top` from its state: header, level counts, the peer table, the followed
//! peer, the events, the key help. Nothing here talks to the agent or reads keys.

use monitor::serving::peer_view::PeerView;
use ratatui::{
    Frame,
    layout::{Constraint, Layout, Rect},
    style::{Color, Modifier, Style},
    text::{Line, Span},
    widgets::{Block, Borders, Cell, Paragraph, Row, Table, Wrap},
};

use super::state::{App, Source, Tone};

/// Below this the layout does not fit: a notice is drawn instead.
pub const MIN_WIDTH: u16 = 40;
pub const MIN_HEIGHT: u16 = 12;
/// From this width the followed peer's pane sits beside the table, else below it.
const SIDE_BY_SIDE_WIDTH: u16 = 120;
const DETAIL_WIDTH: u16 = 46;

pub const HELP: &str =
    "q quit  s sort  r reverse  1-9 level filter  0 all  / follow peer  Esc leave  p pause";

/// Colours: below the first level the terminal's own (the counts show it in green), the first
/// level yellow, levels between the first and the highest magenta, the highest red and bold;
/// recoveries green.
pub fn style(tone: Tone) -> Style {
    match tone {
        Tone::Plain => Style::default(),
        Tone::Low => Style::default().fg(Color::Yellow),
        Tone::Middle => Style::default().fg(Color::Magenta),
        Tone::High => Style::default().fg(Color::Red).add_modifier(Modifier::BOLD),
        Tone::Good => Style::default().fg(Color::Green),
        Tone::Warning => Style::default().fg(Color::Yellow),
    }
}

pub fn draw(frame: &mut Frame, app: &App) {
    let area = frame.area();
    if area.width < MIN_WIDTH || area.height < MIN_HEIGHT {
        let text = format!(
            "terminal too small ({}x{}; monitor top needs {MIN_WIDTH}x{MIN_HEIGHT}). q quits.",
            area.width, area.height
        );
        frame.render_widget(Paragraph::new(text).wrap(Wrap { trim: true }), area);
        return;
    }
    let events_height = ((area.height - 6) / 3).clamp(3, 12);
    let [header, counts, status, main, events, help] = Layout::vertical([
        Constraint::Length(2),
        Constraint::Length(1),
        Constraint::Length(1),
        Constraint::Min(3),
        Constraint::Length(events_height),
        Constraint::Length(1),
    ])
    .areas(area);
    frame.render_widget(Paragraph::new(header_lines(app)), header);
    frame.render_widget(Paragraph::new(counts_line(app)), counts);
    frame.render_widget(Paragraph::new(status_line(app)), status);
    if app.follow.is_some() {
        let (table_area, detail_area) = if main.width >= SIDE_BY_SIDE_WIDTH {
            let [t, d] =
                Layout::horizontal([Constraint::Min(40), Constraint::Length(DETAIL_WIDTH)])
                    .areas(main);
            (t, d)
        } else {
            let detail_height = (main.height / 2).min(17);
            let [t, d] = Layout::vertical([Constraint::Min(3), Constraint::Length(detail_height)])
                .areas(main);
            (t, d)
        };
        draw_table(frame, app, table_area);
        draw_detail(frame, app, detail_area);
    } else {
        draw_table(frame, app, main);
    }
    draw_events(frame, app, events);
    frame.render_widget(Paragraph::new(help_line(app)), help);
}

fn header_lines(app: &App) -> Vec<Line<'static>> {
    let Some(snapshot) = &app.snapshot else {
        return vec![Line::from(format!(
            "monitor top  {}  waiting for the agent...",
            app.socket
        ))];
    };
    let s = &snapshot.stats;
    let k = &s.kernel;
    let bold = Style::default().add_modifier(Modifier::BOLD);
    // The observer's own fault first: while it lasts, silences say nothing about the peers.
    let held = if !s.link.up {
        Some(("  LINK DOWN: new suspicions held", Color::Red))
    } else if s.link.holding {
        Some(("  new suspicions held", Color::Yellow))
    } else {
        None
    };
    let mut title = vec![
        Span::styled("monitor top", bold),
        Span::raw(format!(
            "  {} ({}, port {})  model {}  levels {}  peers {}/{}  up {}",
            s.iface,
            s.xdp_mode,
            s.port,
            s.model,
            levels_text(&s.levels),
            s.peers,
            s.capacity,
            uptime_text(s.uptime_s)
        )),
    ];
    if let Some((text, color)) = held {
        title.push(Span::styled(text, bold.fg(color)));
    }
    vec![
        Line::from(title),
        Line::from(format!(
            "kernel  heartbeats {}  malformed {}  unknown {}  auth failures {}  contended {}  \
             duplicates {}  out of order {}   agent  events {}  stalls {}",
            k.heartbeats,
            k.malformed,
            k.unknown_peer,
            k.auth_failures,
            k.contended,
            k.duplicates,
            k.out_of_order,
            s.events,
            s.stalls
        )),
    ]
}

fn counts_line(app: &App) -> Line<'static> {
    let levels = app.levels();
    let counts = app.level_counts();
    let mut spans = vec![Span::raw("peers  ")];
    if let Some(first) = levels.first() {
        spans.push(Span::styled(
            format!("below {first}: {}", counts[0]),
            Style::default().fg(Color::Green),
        ));
    }
    for (i, level) in levels.iter().enumerate() {
        spans.push(Span::raw("  "));
        spans.push(Span::styled(
            format!("level {level}: {}", counts[i + 1]),
            style(app.tone(Some(*level))),
        ));
    }
    Line::from(spans)
}

fn status_line(app: &App) -> Line<'static> {
    let mut spans = vec![Span::raw(format!(
        "refresh {}",
        duration_text(app.interval_ms as f64)
    ))];
    if let Some(s) = &app.snapshot {
        spans.push(Span::raw(format!(" (took {:.0} ms)", s.took_ms)));
    }
    spans.push(Span::raw(format!(
        "  sort {} {}",
        app.sort.name(),
        if app.descending { "desc" } else { "asc" }
    )));
    match app.filter {
        Some(n) => spans.push(Span::raw(format!(
            "  filter level >= {}",
            app.levels().get(n - 1).copied().unwrap_or(f64::NAN)
        ))),
        None => spans.push(Span::raw("  filter none")),
    }
    if app.paused {
        spans.push(Span::styled(
            "  PAUSED",
            Style::default()
                .fg(Color::Yellow)
                .add_modifier(Modifier::BOLD),
        ));
    }
    if let Some(message) = &app.message {
        spans.push(Span::styled(
            format!("  {message}"),
            Style::default().fg(Color::Yellow),
        ));
    }
    if let Some(e) = &app.error {
        spans.push(Span::styled(
            format!("  refresh failed: {e}"),
            Style::default().fg(Color::Red),
        ));
    }
    Line::from(spans)
}

fn draw_table(frame: &mut Frame, app: &App, area: Rect) {
    let rows = app.rows();
    // Borders and the header row take three lines; only the rows that fit are built.
    let fit = area.height.saturating_sub(3) as usize;
    let shown = &rows[..rows.len().min(fit)];
    let title = match &app.snapshot {
        None => " Peers ".to_string(),
        Some(s) => {
            let what = match s.source {
                Source::All => format!("Peers: {}", s.peers.len()),
                Source::Suspects(t) => format!(
                    "Suspects at phi >= {t}: {} of {} peers (above --all-peers-up-to)",
                    s.peers.len(),
                    s.stats.peers
                ),
            };
            format!(" {what}, showing {} ", shown.len())
        }
    };
    let id_width = shown.iter().map(|p| digits(p.id)).max().unwrap_or(2).max(2);
    let addr_width = shown
        .iter()
        .map(|p| p.addr.as_deref().map_or(1, str::len))
        .max()
        .unwrap_or(4)
        .clamp(4, 47);
    let header = Row::new(
        [
            "ID", "ADDR", "PHI", "LEVEL", "SILENCE", "MEAN_MS", "STD_MS", "HB", "LOST",
        ]
        .map(Cell::from),
    )
    .style(Style::default().add_modifier(Modifier::BOLD));
    let body = shown.iter().map(|p| {
        let mut style = style(app.tone(p.level));
        if app.follow == Some(p.id) {
            style = style.add_modifier(Modifier::REVERSED);
        }
        Row::new(table_cells(p)).style(style)
    });
    let widths = [
        Constraint::Length(id_width as u16),
        Constraint::Length(addr_width as u16),
        Constraint::Length(9),
        Constraint::Length(5),
        Constraint::Length(9),
        Constraint::Length(9),
        Constraint::Length(9),
        Constraint::Length(10),
        Constraint::Length(6),
    ];
    let table = Table::new(body, widths)
        .header(header)
        .block(Block::default().borders(Borders::ALL).title(title));
    frame.render_widget(table, area);
}

fn table_cells(p: &PeerView) -> [Cell<'static>; 9] {
    [
        Cell::from(p.id.to_string()),
        Cell::from(p.addr.clone().unwrap_or_else(|| "-".into())),
        Cell::from(phi_text(p.phi)),
        Cell::from(p.level.map_or_else(|| "-".into(), |l| l.to_string())),
        Cell::from(duration_text(p.silence_ms)),
        Cell::from(ms_text(p.mean_ms)),
        Cell::from(ms_text(p.std_ms)),
        Cell::from(p.heartbeats.to_string()),
        Cell::from(p.lost.to_string()),
    ]
}

fn draw_detail(frame: &mut Frame, app: &App, area: Rect) {
    let Some(id) = app.follow else { return };
    let block = Block::default()
        .borders(Borders::ALL)
        .title(format!(" Peer {id} (Esc leaves) "));
    let detail = app
        .snapshot
        .as_ref()
        .and_then(|s| s.detail.as_ref())
        .filter(|(of, _)| *of == id);
    let lines = match detail {
        None => vec![Line::from("asking the agent...")],
        Some((_, Err(e))) => vec![Line::styled(
            format!("the agent says: {e}"),
            Style::default().fg(Color::Red),
        )],
        Some((_, Ok(p))) => detail_lines(app, p),
    };
    frame.render_widget(
        Paragraph::new(lines)
            .block(block)
            .wrap(Wrap { trim: false }),
        area,
    );
}

fn detail_lines(app: &App, p: &PeerView) -> Vec<Line<'static>> {
    let level = p
        .level
        .map_or_else(|| "below the first level".into(), |l| format!("level {l}"));
    let source = match (&p.bfd_state, p.discriminator) {
        (Some(state), Some(discriminator)) => format!(
            "{} ({state}, discriminator {discriminator}, tx {} ms x {})",
            p.source,
            p.bfd_tx_ms
                .map_or_else(|| "-".into(), |ms| format!("{ms:.0}")),
            p.bfd_detect_mult
                .map_or_else(|| "-".into(), |m| m.to_string()),
        ),
        _ => p.source.clone(),
    };
    let mut lines = vec![
        Line::from(format!("source         {source}")),
        Line::from(format!(
            "addr           {}",
            p.addr.as_deref().unwrap_or("-")
        )),
        Line::from(format!("incarnation    {}", p.incarnation)),
        Line::styled(
            format!("phi            {} ({level})", phi_text(p.phi)),
            style(app.tone(p.level)),
        ),
        Line::from(format!("silence        {}", duration_text(p.silence_ms))),
        Line::from(format!(
            "interval       mean {}  std {} ms",
            ms_text(p.mean_ms),
            ms_text(p.std_ms)
        )),
        Line::from(format!(
            "heartbeats     {} ({} samples, last seq {})",
            p.heartbeats, p.samples, p.last_seq
        )),
        Line::from(format!(
            "lost {}  duplicates {}  out of order {}",
            p.lost, p.duplicates, p.out_of_order
        )),
        Line::from(format!(
            "auth failures {}  outages {}  restarts {}",
            p.auth_failures, p.outages, p.restarts
        )),
    ];
    if p.budget_unmet {
        lines.push(Line::styled(
            "budget         unmet: sends too slowly",
            Style::default().fg(Color::Yellow),
        ));
    }
    match &p.qos {
        None => lines.push(Line::from("QoS            not swept yet")),
        Some(q) => {
            lines.push(Line::styled(
                "QoS at the highest level",
                Style::default().add_modifier(Modifier::BOLD),
            ));
            lines.push(Line::from(format!(
                "  S-transitions    {}",
                q.s_transitions
            )));
            lines.push(Line::from(format!(
                "  mistakes         {} ({} ms, mean {} ms)",
                q.mistakes,
                q.mistake_total_ms.round(),
                ms_text(q.mistake_mean_ms)
            )));
            lines.push(Line::from(format!(
                "  recurrence       {} ms",
                ms_text(q.mistake_recurrence_ms)
            )));
            lines.push(Line::from(format!(
                "  query accuracy   {:.4}",
                q.query_accuracy
            )));
        }
    }
    lines
}

fn draw_events(frame: &mut Frame, app: &App, area: Rect) {
    let inner = area.height.saturating_sub(2) as usize;
    let skip = app.events.len().saturating_sub(inner);
    let title = match (app.events_live, skip) {
        (false, _) => " Events (not connected: retrying) ".to_string(),
        (true, 0) => " Events (live) ".to_string(),
        (true, _) => format!(" Events (live; the last {inner} of {}) ", app.events.len()),
    };
    let lines: Vec<Line> = app
        .events
        .iter()
        .skip(skip)
        .map(|e| Line::styled(e.text.clone(), style(e.tone)))
        .collect();
    frame.render_widget(
        Paragraph::new(lines).block(Block::default().borders(Borders::ALL).title(title)),
        area,
    );
}

fn help_line(app: &App) -> Line<'static> {
    match &app.input {
        Some(typed) => Line::from(vec![
            Span::styled(
                "follow peer: ",
                Style::default().add_modifier(Modifier::BOLD),
            ),
            Span::raw(format!("{typed}_")),
            Span::raw("   Enter follows  Esc cancels  digits only"),
        ]),
        None => Line::styled(HELP, Style::default().add_modifier(Modifier::DIM)),
    }
}

fn digits(n: u64) -> usize {
    n.checked_ilog10().map_or(1, |d| d as usize + 1)
}

fn levels_text(levels: &[f64]) -> String {
    levels
        .iter()
        .map(f64::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

pub fn phi_text(phi: f64) -> String {
    if phi >= f64::MAX || phi.is_infinite() {
        "inf".into()
    } else if phi >= 1e6 {
        format!("{phi:.2e}")
    } else {
        format!("{phi:.2}")
    }
}

fn ms_text(value: Option<f64>) -> String {
    value.map_or_else(|| "-".into(), |v| format!("{v:.1}"))
}

/// `42 s`, `4m05s`, `1h02m05s`.
fn uptime_text(s: f64) -> String {
    if s < 60.0 {
        format!("{s:.0} s")
    } else {
        duration_text(s * 1000.0)
    }
}

/// `240 ms`, `12.3 s`, `4m05s`, `1h02m05s`.
pub fn duration_text(ms: f64) -> String {
    if !ms.is_finite() {
        return "-".into();
    }
    if ms < 10_000.0 {
        return format!("{ms:.0} ms");
    }
    let s = ms / 1000.0;
    if s < 60.0 {
        return format!("{s:.1} s");
    }
    let s = s as u64;
    let (h, m, s) = (s / 3600, s / 60 % 60, s % 60);
    if h == 0 {
        format!("{m}m{s:02}s")
    } else {
        format!("{h}h{m:02}m{s:02}s")
    }
}

#[cfg(test)]
mod tests {
    use super::super::state::{
        App, Snapshot, Source,
        tests::{app, peer, stats},
    };
    use super::*;
    use ratatui::{Terminal, backend::TestBackend, buffer::Buffer};
    use serde_json::json;

    fn render(app: &App, width: u16, height: u16) -> Buffer {
        let mut terminal = Terminal::new(TestBackend::new(width, height)).unwrap();
        terminal.draw(|f| draw(f, app)).unwrap();
        terminal.backend().buffer().clone()
    }

    fn lines(buffer: &Buffer) -> Vec<String> {
        let area = buffer.area;
        (0..area.height)
            .map(|y| {
                (0..area.width)
                    .map(|x| buffer[(x, y)].symbol())
                    .collect::<String>()
            })
            .collect()
    }

    /// The first line whose first word is `word`, with its row number.
    fn row_starting(lines: &[String], word: &str) -> Option<(usize, String)> {
        lines.iter().enumerate().find_map(|(y, l)| {
            let first = l.trim_start_matches(['│', ' ']).split_whitespace().next();
            (first == Some(word)).then(|| (y, l.clone()))
        })
    }

    /// A peer over its `--budget` says so in the detail panel; one within it does not.
    #[test]
    fn the_detail_says_when_a_peer_cannot_meet_its_budget() {
        for unmet in [true, false] {
            let mut app = app();
            app.follow = Some(4);
            let mut s = app.snapshot.clone().unwrap();
            let mut view = peer(4, 0.2, None, 120.0, 0);
            view.budget_unmet = unmet;
            s.detail = Some((4, Ok(view)));
            app.apply(Ok(s));
            let screen = lines(&render(&app, 160, 40)).join("\n");
            assert_eq!(
                screen.contains("budget         unmet: sends too slowly"),
                unmet,
                "{screen}"
            );
        }
    }

    #[test]
    fn shows_header_counts_table_events_detail_and_help() {
        let mut app = app();
        app.events_live = true;
        app.push_event(&json!({"event":"suspect","id":4,"level":8.0,"phi":8.11,
            "silence_ms":240.2,"at":1795981530213u64}));
        app.follow = Some(4);
        let mut s = app.snapshot.clone().unwrap();
        s.detail = Some((4, Ok(peer(4, 1e300, Some(8.0), 5000.0, 1))));
        app.apply(Ok(s));
        let buffer = render(&app, 160, 40);
        let lines = lines(&buffer);
        let screen = lines.join("\n");
        for expected in [
            "eth0 (native, port 18498)",
            "model normal",
            "levels 1,3,8",
            "peers 4/65536",
            "up 1h02m05s",
            "heartbeats 214",
            "malformed 3",
            "unknown 4",
            "auth failures 2",
            "contended 1",
            "below 1: 1",
            "level 1: 1",
            "level 3: 1",
            "level 8: 1",
            "sort phi desc",
            "Peers: 4, showing 4",
            "suspect  peer 4 reached level 8 (phi 8.11)",
            "Peer 4 (Esc leaves)",
            "phi            1.00e300 (level 8)",
            "S-transitions    1",
            "query accuracy   0.9900",
            "Events (live)",
            HELP,
        ] {
            assert!(screen.contains(expected), "{expected:?} not in\n{screen}");
        }
        // Rows in phi order, each with its level, the highest in bold red.
        let (y4, row4) = row_starting(&lines, "4").unwrap();
        let (y3, _) = row_starting(&lines, "3").unwrap();
        let (y2, _) = row_starting(&lines, "2").unwrap();
        let (y1, row1) = row_starting(&lines, "1").unwrap();
        assert!(y4 < y3 && y3 < y2 && y2 < y1, "{screen}");
        let words: Vec<&str> = row4
            .trim_start_matches(['│', ' '])
            .split_whitespace()
            .collect();
        assert_eq!(
            &words[..5],
            ["4", "10.0.0.4:7000", "1.00e300", "8", "5000"],
            "{row4}"
        );
        assert!(row1.contains(" - "), "{row1}");
        let cell = &buffer[(1, y4 as u16)];
        assert_eq!(cell.fg, Color::Red);
        assert!(cell.modifier.contains(Modifier::BOLD | Modifier::REVERSED));
        assert_eq!(buffer[(1, y3 as u16)].fg, Color::Magenta);
        assert_eq!(buffer[(1, y2 as u16)].fg, Color::Yellow);
        assert_eq!(buffer[(1, y1 as u16)].fg, Color::Reset);
    }

    #[test]
    fn filter_and_input_show() {
        let mut app = app();
        app.filter = Some(3);
        app.input = Some("12".into());
        app.message = Some("the agent has 3 levels".into());
        let lines = lines(&render(&app, 100, 30));
        let screen = lines.join("\n");
        assert!(screen.contains("filter level >= 8"), "{screen}");
        assert!(screen.contains("follow peer: 12_"), "{screen}");
        assert!(screen.contains("the agent has 3 levels"), "{screen}");
        assert!(row_starting(&lines, "4").is_some(), "{screen}");
        assert!(row_starting(&lines, "3").is_none(), "{screen}");
        // Narrow: the detail pane goes below the table.
        let mut app = self::app();
        app.follow = Some(9);
        let mut s = app.snapshot.clone().unwrap();
        s.detail = Some((9, Err("unknown peer 9".into())));
        app.apply(Ok(s));
        let screen = lines_text(&render(&app, 80, 40));
        assert!(
            screen.contains("the agent says: unknown peer 9"),
            "{screen}"
        );
    }

    fn lines_text(buffer: &Buffer) -> String {
        lines(buffer).join("\n")
    }

    #[test]
    fn events_pane_keeps_the_newest() {
        let mut app = app();
        app.stream_connected();
        for i in 0..30 {
            app.push_event(&json!({"event": "admit", "id": 1000 + i, "at": 0}));
        }
        // 42 lines: (42 - 6) / 3 = 12 for events, 10 inside the frame.
        let screen = lines_text(&render(&app, 100, 42));
        assert!(
            screen.contains("Events (live; the last 10 of 30)"),
            "{screen}"
        );
        assert!(screen.contains("admit    peer 1029"), "{screen}");
        assert!(screen.contains("admit    peer 1020"), "{screen}");
        assert!(!screen.contains("admit    peer 1019"), "{screen}");
        app.stream_lost("the agent closed the connection");
        let screen = lines_text(&render(&app, 100, 40));
        assert!(
            screen.contains("Events (not connected: retrying)"),
            "{screen}"
        );
        assert!(
            screen.contains("event stream lost: the agent closed"),
            "{screen}"
        );
    }

    #[test]
    fn tiny_terminals_get_a_notice() {
        let app = app();
        for (w, h) in [(0, 0), (1, 1), (10, 3), (39, 40), (160, 11)] {
            let screen = lines_text(&render(&app, w, h));
            if w >= 10 {
                assert!(screen.contains("too"), "{w}x{h}: {screen}");
            }
        }
        // The smallest full layout draws without panicking and shows a row.
        let lines = lines(&render(&app, MIN_WIDTH, MIN_HEIGHT));
        assert!(lines.iter().any(|l| l.contains("ID")), "{lines:#?}");
    }

    #[test]
    fn before_the_first_refresh_and_after_a_failed_one() {
        let mut app = App::new("/run/x.sock".into(), 500, None);
        let screen = lines_text(&render(&app, 100, 20));
        assert!(screen.contains("waiting for the agent"), "{screen}");
        assert!(screen.contains("not connected"), "{screen}");
        app.apply(Err("the agent closed the connection".into()));
        let screen = lines_text(&render(&app, 100, 20));
        assert!(
            screen.contains("refresh failed: the agent closed the connection"),
            "{screen}"
        );
    }

    #[test]
    fn fifty_thousand_suspects_draw_only_what_fits() {
        let mut app = App::new("s".into(), 1000, None);
        app.apply(Ok(Snapshot {
            stats: stats(60_000, &[1.0, 3.0, 8.0]),
            source: Source::Suspects(1.0),
            peers: (0..50_000)
                .map(|i| peer(i, 9.0, Some(8.0), 1.0, 0))
                .collect(),
            detail: None,
            took_ms: 250.0,
        }));
        let screen = lines_text(&render(&app, 160, 48));
        assert!(
            screen.contains("Suspects at phi >= 1: 50000 of 60000 peers"),
            "{screen}"
        );
        assert!(screen.contains("below 1: 10000"), "{screen}");
        // 48 lines: 4 above, 12 for events, 1 for help, 3 for the table's frame and header.
        assert!(screen.contains("showing 28 "), "{screen}");
    }

    #[test]
    fn durations_and_phi() {
        assert_eq!(duration_text(240.4), "240 ms");
        assert_eq!(duration_text(12_345.0), "12.3 s");
        assert_eq!(duration_text(245_000.0), "4m05s");
        assert_eq!(duration_text(3_725_500.0), "1h02m05s");
        assert_eq!(uptime_text(1.204), "1 s");
        assert_eq!(uptime_text(61.0), "1m01s");
        assert_eq!(phi_text(f64::MAX), "inf");
        assert_eq!(phi_text(2.345), "2.35");
        assert_eq!(digits(0), 1);
        assert_eq!(digits(u64::MAX), 20);
    }
}
