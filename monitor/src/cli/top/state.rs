//! What `monitor top` shows and how the keys change it, without a terminal: the latest snapshot
//! from the agent, the sort, the level filter, the followed peer, the event log.

use std::collections::VecDeque;

use crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers};
use monitor::{serving::peer_view::PeerView, serving::protocol::AgentStats};
use serde_json::Value;

pub use super::event_line::{EventLine, Tone};
use super::event_line::{describe, level_index, tone};

/// Events kept for the events pane (more than any terminal shows).
pub const EVENTS_KEPT: usize = 500;
/// Longest id that can be typed after `/` (u64::MAX has 20 digits).
const MAX_ID_DIGITS: usize = 20;

/// The table's sort column, in the order `s` cycles through them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SortKey {
    Phi,
    Id,
    Silence,
    Lost,
}

impl SortKey {
    pub fn next(self) -> Self {
        match self {
            Self::Phi => Self::Id,
            Self::Id => Self::Silence,
            Self::Silence => Self::Lost,
            Self::Lost => Self::Phi,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Phi => "phi",
            Self::Id => "id",
            Self::Silence => "silence",
            Self::Lost => "lost",
        }
    }

    /// The direction a column sorts in before `r`: ids ascending, the rest worst first.
    fn descending_by_default(self) -> bool {
        !matches!(self, Self::Id)
    }
}

/// Which request filled the table.
#[derive(Debug, Clone, PartialEq)]
pub enum Source {
    /// `peers`: every peer.
    All,
    /// `suspects` at this threshold (the agent watches more than `--all-peers-up-to` peers).
    Suspects(f64),
}

/// One refresh's worth of replies, gathered by the fetcher thread.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub stats: AgentStats,
    pub source: Source,
    pub peers: Vec<PeerView>,
    /// The followed peer's `peer` reply (or the agent's error), when one is followed.
    pub detail: Option<(u64, Result<PeerView, String>)>,
    /// How long the requests took, shown so an operator sees what a refresh costs.
    pub took_ms: f64,
}

/// What the caller should do after a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    None,
    Quit,
    /// The followed peer or the pause changed: tell the fetcher and refresh now.
    Replan,
}

pub struct App {
    pub socket: String,
    pub interval_ms: u64,
    pub limit: Option<usize>,
    pub snapshot: Option<Snapshot>,
    /// The last refresh failed with this (the previous snapshot stays on screen).
    pub error: Option<String>,
    pub sort: SortKey,
    pub descending: bool,
    /// Show only peers at or above this level (1-based, as typed).
    pub filter: Option<usize>,
    pub follow: Option<u64>,
    /// Digits typed after `/`, while an id is being entered.
    pub input: Option<String>,
    pub paused: bool,
    /// A one-off remark about the last key (an unknown level, a bad id).
    pub message: Option<String>,
    pub events: VecDeque<EventLine>,
    /// Whether the event stream is connected (false until the subscription is confirmed).
    pub events_live: bool,
    /// Whether the stream was lost since it was last connected (to say so once).
    events_lost: bool,
}

impl App {
    pub fn new(socket: String, interval_ms: u64, limit: Option<usize>) -> Self {
        Self {
            socket,
            interval_ms,
            limit,
            snapshot: None,
            error: None,
            sort: SortKey::Phi,
            descending: true,
            filter: None,
            follow: None,
            input: None,
            paused: false,
            message: None,
            events: VecDeque::new(),
            events_live: false,
            events_lost: false,
        }
    }

    pub fn levels(&self) -> &[f64] {
        self.snapshot
            .as_ref()
            .map_or(&[][..], |s| s.stats.levels.as_slice())
    }

    /// Takes a refresh; while paused the screen keeps the old one.
    pub fn apply(&mut self, snapshot: Result<Snapshot, String>) {
        if self.paused {
            return;
        }
        match snapshot {
            Ok(s) => {
                self.error = None;
                // The agent's levels can change on a config reload: keep the filter in range.
                if let Some(n) = self.filter
                    && n > s.stats.levels.len()
                {
                    self.filter = None;
                }
                self.snapshot = Some(s);
            }
            Err(e) => self.error = Some(e),
        }
    }

    pub fn handle_key(&mut self, key: KeyEvent) -> Action {
        if key.kind == KeyEventKind::Release {
            return Action::None;
        }
        // Raw mode swallows SIGINT: Ctrl-C quits from anywhere.
        if key.modifiers.contains(KeyModifiers::CONTROL) && key.code == KeyCode::Char('c') {
            return Action::Quit;
        }
        if let Some(input) = &mut self.input {
            match key.code {
                KeyCode::Char(c) if c.is_ascii_digit() && input.len() < MAX_ID_DIGITS => {
                    input.push(c);
                }
                KeyCode::Backspace => {
                    input.pop();
                }
                KeyCode::Esc => self.input = None,
                KeyCode::Enter => {
                    let typed = self.input.take().unwrap_or_default();
                    if typed.is_empty() {
                        return Action::None;
                    }
                    match typed.parse::<u64>() {
                        Ok(id) => {
                            self.follow = Some(id);
                            self.message = None;
                            return Action::Replan;
                        }
                        Err(_) => self.message = Some(format!("{typed} is not a peer id")),
                    }
                }
                _ => {}
            }
            return Action::None;
        }
        self.message = None;
        match key.code {
            KeyCode::Char('q') => Action::Quit,
            KeyCode::Esc if self.follow.is_some() => {
                self.follow = None;
                Action::Replan
            }
            KeyCode::Esc => Action::Quit,
            KeyCode::Char('s') => {
                self.sort = self.sort.next();
                self.descending = self.sort.descending_by_default();
                Action::None
            }
            KeyCode::Char('r') => {
                self.descending = !self.descending;
                Action::None
            }
            KeyCode::Char('0') => {
                self.filter = None;
                Action::None
            }
            KeyCode::Char(c @ '1'..='9') => {
                let n = c as usize - '0' as usize;
                let levels = self.levels().len();
                if n <= levels {
                    self.filter = Some(n);
                } else {
                    self.message = Some(format!(
                        "the agent has {levels} level{}",
                        if levels == 1 { "" } else { "s" }
                    ));
                }
                Action::None
            }
            KeyCode::Char('/') => {
                self.input = Some(String::new());
                Action::None
            }
            KeyCode::Char('p') => {
                self.paused = !self.paused;
                Action::Replan
            }
            _ => Action::None,
        }
    }

    /// Index into the levels of the highest level `level` (as a peer reports it) has reached.
    pub fn level_index(&self, level: Option<f64>) -> Option<usize> {
        level_index(self.levels(), level)
    }

    pub fn tone(&self, level: Option<f64>) -> Tone {
        tone(self.levels(), level)
    }

    /// The table's rows: filtered, sorted, and cut to `--limit` (not yet to the screen).
    pub fn rows(&self) -> Vec<&PeerView> {
        let Some(snapshot) = &self.snapshot else {
            return Vec::new();
        };
        let min_index = self.filter.map(|n| n - 1);
        let mut rows: Vec<&PeerView> = snapshot
            .peers
            .iter()
            .filter(|p| match min_index {
                None => true,
                Some(min) => self.level_index(p.level).is_some_and(|i| i >= min),
            })
            .collect();
        let key = self.sort;
        rows.sort_by(|a, b| {
            let primary = match key {
                SortKey::Phi => a.phi.total_cmp(&b.phi),
                SortKey::Id => a.id.cmp(&b.id),
                SortKey::Silence => a.silence_ms.total_cmp(&b.silence_ms),
                SortKey::Lost => a.lost.cmp(&b.lost),
            };
            let primary = if self.descending {
                primary.reverse()
            } else {
                primary
            };
            // Ties in id order, so equal rows do not swap places between refreshes.
            primary.then(a.id.cmp(&b.id))
        });
        if let Some(limit) = self.limit {
            rows.truncate(limit);
        }
        rows
    }

    /// Peers below the first level, then at each level (as its highest), in the agent's order.
    /// With the table filled by `suspects`, the peers below come from `stats`.
    pub fn level_counts(&self) -> Vec<usize> {
        let levels = self.levels();
        let mut counts = vec![0; levels.len() + 1];
        let Some(snapshot) = &self.snapshot else {
            return counts;
        };
        for p in &snapshot.peers {
            match level_index(levels, p.level) {
                Some(i) => counts[i + 1] += 1,
                None => counts[0] += 1,
            }
        }
        if let Source::Suspects(_) = snapshot.source {
            let suspected: usize = counts[1..].iter().sum();
            counts[0] = snapshot.stats.peers.saturating_sub(suspected);
        }
        counts
    }

    /// Takes one line of the event stream.
    pub fn push_event(&mut self, event: &Value) {
        let line = describe(self.levels(), event);
        self.push_line(line);
    }

    pub fn stream_connected(&mut self) {
        if self.events_lost {
            self.push_line(EventLine {
                text: "event stream reconnected (events in between are not shown)".into(),
                tone: Tone::Warning,
            });
        }
        self.events_live = true;
        self.events_lost = false;
    }

    /// The event stream broke (or could not be opened); said once, until it is back.
    pub fn stream_lost(&mut self, error: &str) {
        if !self.events_lost {
            self.push_line(EventLine {
                text: format!("event stream lost: {error} (reconnecting every second)"),
                tone: Tone::Warning,
            });
        }
        self.events_live = false;
        self.events_lost = true;
    }

    pub fn push_line(&mut self, line: EventLine) {
        if self.events.len() == EVENTS_KEPT {
            self.events.pop_front();
        }
        self.events.push_back(line);
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use serde_json::json;

    pub fn peer(id: u64, phi: f64, level: Option<f64>, silence_ms: f64, lost: u64) -> PeerView {
        serde_json::from_value(json!({
            "id": id, "addr": format!("10.0.0.{}:7000", id % 250), "incarnation": 1,
            "heartbeats": 100 + id, "samples": 50, "mean_ms": 100.0, "std_ms": 2.5,
            "silence_ms": silence_ms, "phi": phi, "level": level, "last_seq": 100,
            "lost": lost, "duplicates": 0, "out_of_order": 0, "auth_failures": 0,
            "qos": {"s_transitions": 1, "mistakes": 0, "mistake_total_ms": 0.0,
                    "mistake_mean_ms": null, "mistake_recurrence_ms": null,
                    "query_accuracy": 0.99}
        }))
        .unwrap()
    }

    pub fn stats(peers: usize, levels: &[f64]) -> AgentStats {
        serde_json::from_value(json!({
            "iface": "eth0", "xdp_mode": "native", "port": 18498, "window": 128,
            "model": "normal", "levels": levels, "peers": peers, "capacity": 65536,
            "uptime_s": 3725.5, "sweeps": 120, "stalls": 0, "events": 7, "subscribers": 1,
            "kernel": {"heartbeats": 214, "not_heartbeat": 8, "malformed": 3,
                       "unknown_peer": 4, "duplicates": 0, "out_of_order": 0,
                       "auth_failures": 2, "contended": 1, "unknown_reported": 4,
                       "unknown_suppressed": 0},
            "xdp": {"run_count": 0, "run_time_ns": 0},
            "admission": {"admitted": 4, "disabled": 0, "outside_ranges": 0,
                          "rate_limited": 0, "full": 0}
        }))
        .unwrap()
    }

    /// Four peers: 1 fine, 2 at the first level, 3 at the middle, 4 at the highest.
    pub fn app() -> App {
        let mut app = App::new("/run/test.sock".into(), 1000, None);
        app.apply(Ok(Snapshot {
            stats: stats(4, &[1.0, 3.0, 8.0]),
            source: Source::All,
            peers: vec![
                peer(1, 0.1, None, 90.0, 5),
                peer(2, 1.5, Some(1.0), 300.0, 0),
                peer(3, 4.0, Some(3.0), 200.0, 9),
                peer(4, 1e300, Some(8.0), 5000.0, 1),
            ],
            detail: None,
            took_ms: 1.0,
        }));
        app
    }

    fn key(app: &mut App, code: KeyCode) -> Action {
        app.handle_key(KeyEvent::from(code))
    }

    fn ids(app: &App) -> Vec<u64> {
        app.rows().iter().map(|p| p.id).collect()
    }

    #[test]
    fn sorts_by_phi_descending_then_cycles_and_reverses() {
        let mut app = app();
        assert_eq!(ids(&app), [4, 3, 2, 1]);
        key(&mut app, KeyCode::Char('r'));
        assert_eq!(ids(&app), [1, 2, 3, 4]);
        key(&mut app, KeyCode::Char('s'));
        assert_eq!((app.sort, app.descending), (SortKey::Id, false));
        assert_eq!(ids(&app), [1, 2, 3, 4]);
        key(&mut app, KeyCode::Char('r'));
        assert_eq!(ids(&app), [4, 3, 2, 1]);
        key(&mut app, KeyCode::Char('s'));
        assert_eq!(app.sort, SortKey::Silence);
        assert_eq!(ids(&app), [4, 2, 3, 1]);
        key(&mut app, KeyCode::Char('s'));
        assert_eq!(app.sort, SortKey::Lost);
        assert_eq!(ids(&app), [3, 1, 4, 2]);
        key(&mut app, KeyCode::Char('s'));
        assert_eq!((app.sort, app.descending), (SortKey::Phi, true));
    }

    #[test]
    fn ties_keep_id_order() {
        let mut app = app();
        let s = app.snapshot.as_mut().unwrap();
        for p in &mut s.peers {
            p.phi = 2.0;
        }
        assert_eq!(ids(&app), [1, 2, 3, 4]);
    }

    #[test]
    fn digits_filter_by_level_and_zero_clears() {
        let mut app = app();
        key(&mut app, KeyCode::Char('1'));
        assert_eq!(ids(&app), [4, 3, 2]);
        key(&mut app, KeyCode::Char('2'));
        assert_eq!(ids(&app), [4, 3]);
        key(&mut app, KeyCode::Char('3'));
        assert_eq!(ids(&app), [4]);
        // There is no fourth level: the filter stays and the key is explained.
        key(&mut app, KeyCode::Char('4'));
        assert_eq!(app.filter, Some(3));
        assert_eq!(app.message.as_deref(), Some("the agent has 3 levels"));
        key(&mut app, KeyCode::Char('0'));
        assert_eq!(app.filter, None);
        assert_eq!(app.message, None);
        assert_eq!(ids(&app).len(), 4);
    }

    #[test]
    fn limit_cuts_after_sorting() {
        let mut app = app();
        app.limit = Some(2);
        assert_eq!(ids(&app), [4, 3]);
    }

    #[test]
    fn counts_per_level() {
        assert_eq!(app().level_counts(), [1, 1, 1, 1]);
        // From `suspects`, the peers below the first level are the rest of `stats.peers`.
        let mut app = app();
        let s = app.snapshot.as_mut().unwrap();
        s.source = Source::Suspects(1.0);
        s.peers.retain(|p| p.level.is_some());
        s.stats.peers = 50_000;
        assert_eq!(app.level_counts(), [49_997, 1, 1, 1]);
    }

    #[test]
    fn tones_follow_levels() {
        let levels = [1.0, 3.0, 8.0];
        assert_eq!(tone(&levels, None), Tone::Plain);
        assert_eq!(tone(&levels, Some(1.0)), Tone::Low);
        assert_eq!(tone(&levels, Some(3.0)), Tone::Middle);
        assert_eq!(tone(&levels, Some(8.0)), Tone::High);
        assert_eq!(tone(&[5.0], Some(5.0)), Tone::High);
        assert_eq!(level_index(&levels, Some(3.5)), Some(1));
    }

    #[test]
    fn slash_follows_a_typed_id_and_esc_leaves() {
        let mut app = app();
        assert_eq!(key(&mut app, KeyCode::Char('/')), Action::None);
        for c in ['4', 'x', '2', 'q'] {
            // Only digits are taken, and `q` does not quit while typing.
            assert_eq!(key(&mut app, KeyCode::Char(c)), Action::None);
        }
        key(&mut app, KeyCode::Backspace);
        key(&mut app, KeyCode::Char('3'));
        assert_eq!(app.input.as_deref(), Some("43"));
        assert_eq!(key(&mut app, KeyCode::Enter), Action::Replan);
        assert_eq!((app.follow, app.input.as_deref()), (Some(43), None));
        // Esc leaves the peer, and only then quits.
        assert_eq!(key(&mut app, KeyCode::Esc), Action::Replan);
        assert_eq!(app.follow, None);
        assert_eq!(key(&mut app, KeyCode::Esc), Action::Quit);
    }

    #[test]
    fn typing_can_be_cancelled_or_fail() {
        let mut app = app();
        key(&mut app, KeyCode::Char('/'));
        key(&mut app, KeyCode::Char('7'));
        assert_eq!(key(&mut app, KeyCode::Esc), Action::None);
        assert_eq!((app.follow, app.input.as_deref()), (None, None));
        key(&mut app, KeyCode::Char('/'));
        assert_eq!(key(&mut app, KeyCode::Enter), Action::None);
        assert_eq!(app.input, None);
        key(&mut app, KeyCode::Char('/'));
        for _ in 0..25 {
            key(&mut app, KeyCode::Char('9'));
        }
        assert_eq!(app.input.as_ref().map(String::len), Some(20));
        assert_eq!(key(&mut app, KeyCode::Enter), Action::None);
        assert_eq!(app.follow, None);
        assert!(app.message.as_deref().unwrap().contains("not a peer id"));
    }

    #[test]
    fn quit_keys_and_pause() {
        let mut app = app();
        assert_eq!(key(&mut app, KeyCode::Char('q')), Action::Quit);
        let ctrl_c = KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL);
        key(&mut app, KeyCode::Char('/'));
        assert_eq!(app.handle_key(ctrl_c), Action::Quit);
        let mut app = self::app();
        assert_eq!(key(&mut app, KeyCode::Char('p')), Action::Replan);
        assert!(app.paused);
        // Paused, refreshes are not taken.
        app.apply(Err("gone".into()));
        assert_eq!(app.error, None);
        key(&mut app, KeyCode::Char('p'));
        app.apply(Err("gone".into()));
        assert_eq!(app.error.as_deref(), Some("gone"));
        // The failed refresh keeps the last good table.
        assert_eq!(ids(&app).len(), 4);
    }

    #[test]
    fn a_reload_with_fewer_levels_clears_a_filter_out_of_range() {
        let mut app = app();
        key(&mut app, KeyCode::Char('3'));
        let mut s = app.snapshot.clone().unwrap();
        s.stats.levels = vec![2.0];
        app.apply(Ok(s));
        assert_eq!(app.filter, None);
    }

    #[test]
    fn events_are_described_and_bounded() {
        let mut app = app();
        app.push_event(&json!({"event":"suspect","id":4,"level":8.0,"phi":8.11,
            "silence_ms":240.2,"at":1795981530213u64,"crossed_at":1795981530209.7}));
        let line = app.events.back().unwrap();
        assert!(
            line.text
                .ends_with("suspect  peer 4 reached level 8 (phi 8.11) after 240 ms of silence"),
            "{}",
            line.text
        );
        assert!(line.text.contains(".213  "), "{}", line.text);
        assert_eq!(line.tone, Tone::High);
        app.push_event(
            &json!({"event":"recover","id":4,"level":8.0,"silence_ms":5120.0,
            "at":1795981535100u64}),
        );
        assert_eq!(app.events.back().unwrap().tone, Tone::Good);
        // The observer's own faults, said as such.
        for (event, said, tone) in [
            (
                json!({"event":"link_down","iface":"eth0","state":"no carrier","at":0}),
                "link     eth0 down (no carrier): new suspicions held",
                Tone::Warning,
            ),
            (
                json!({"event":"link_up","iface":"eth0","down_ms":510,"hold_ms":2000,"at":0}),
                "link     eth0 up after 510 ms: suspicions held 2000 ms more",
                Tone::Good,
            ),
            (
                json!({"event":"correlated_silence","level":1.0,"peers":60,"watched":100,
                    "window_ms":1000,"at":0}),
                "shared   60 of 100 peers crossed level 1 within 1000 ms: a shared fault?",
                Tone::Warning,
            ),
        ] {
            app.push_event(&event);
            let line = app.events.back().unwrap();
            assert!(line.text.ends_with(said), "{}", line.text);
            assert_eq!(line.tone, tone);
        }
        for i in 0..EVENTS_KEPT + 10 {
            app.push_event(&json!({"event":"admit","id":i,"at":0}));
        }
        assert_eq!(app.events.len(), EVENTS_KEPT);
        assert!(
            app.events
                .back()
                .unwrap()
                .text
                .ends_with("admit    peer 509")
        );
    }

    #[test]
    fn a_lost_stream_is_said_once_and_its_return_too() {
        let mut app = app();
        app.stream_connected();
        assert!(app.events_live && app.events.is_empty());
        app.stream_lost("the agent closed the connection");
        app.stream_lost("connecting to the agent at x: refused");
        assert!(!app.events_live);
        assert_eq!(app.events.len(), 1);
        assert_eq!(app.events[0].tone, Tone::Warning);
        assert!(app.events[0].text.contains("closed the connection"));
        app.stream_connected();
        assert!(app.events_live);
        assert_eq!(app.events.len(), 2);
        assert!(app.events[1].text.contains("reconnected"));
    }

    #[test]
    fn fifty_thousand_peers_sort_and_filter() {
        let mut app = App::new("s".into(), 1000, Some(30));
        let peers: Vec<PeerView> = (0..50_000u64)
            .map(|i| {
                let phi = (i * 7919 % 50_000) as f64 / 1000.0;
                let level = [8.0, 3.0, 1.0].into_iter().find(|&l| phi >= l);
                peer(i, phi, level, phi * 10.0, i % 3)
            })
            .collect();
        app.apply(Ok(Snapshot {
            stats: stats(50_000, &[1.0, 3.0, 8.0]),
            source: Source::All,
            peers,
            detail: None,
            took_ms: 300.0,
        }));
        let rows = app.rows();
        assert_eq!(rows.len(), 30);
        assert!(rows.windows(2).all(|w| w[0].phi >= w[1].phi));
        assert_eq!(app.level_counts().iter().sum::<usize>(), 50_000);
    }
}
