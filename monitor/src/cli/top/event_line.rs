//! The events pane's lines: each event of the agent's stream as one line of text and a tone,
//! and a level's tone (how `monitor top` colours a row or a line).

use serde_json::Value;

/// A line of the events pane.
#[derive(Debug, Clone, PartialEq)]
pub struct EventLine {
    pub text: String,
    pub tone: Tone,
}

/// How a row or an event line is coloured (ui.rs maps tones to colours).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tone {
    /// Below the first level, or an event of no consequence (admit, forget).
    Plain,
    /// At the first level (of several).
    Low,
    /// At a level between the first and the highest.
    Middle,
    /// At the highest level.
    High,
    /// A recovery.
    Good,
    /// Something about the tool itself: the event stream was lost, events were missed.
    Warning,
}

pub fn level_index(levels: &[f64], level: Option<f64>) -> Option<usize> {
    let level = level?;
    // The agent reports the configured value itself; the highest one not above it.
    levels.iter().rposition(|&l| l <= level)
}

pub fn tone(levels: &[f64], level: Option<f64>) -> Tone {
    match level_index(levels, level) {
        None => Tone::Plain,
        Some(i) if i + 1 == levels.len() => Tone::High,
        Some(0) => Tone::Low,
        Some(_) => Tone::Middle,
    }
}

/// One event as a line: `HH:MM:SS.mmm  suspect  peer 4 reached level 8 (phi 8.11) after 240 ms`.
pub fn describe(levels: &[f64], e: &Value) -> EventLine {
    let at = e["at"]
        .as_f64()
        .map_or_else(|| "--:--:--.---".into(), clock);
    let id = &e["id"];
    let number = |key: &str| e[key].as_f64().unwrap_or(f64::NAN);
    let level = e["level"]
        .as_f64()
        .map_or_else(|| e["level"].to_string(), |l| l.to_string());
    let (text, tone) = match e["event"].as_str().unwrap_or("?") {
        "suspect" => (
            format!(
                "suspect  peer {id} reached level {level} (phi {:.2}) after {:.0} ms of silence",
                number("phi"),
                number("silence_ms")
            ),
            tone(levels, e["level"].as_f64()),
        ),
        "recover" => (
            format!(
                "recover  peer {id} heard again after {:.0} ms (had reached level {level})",
                number("silence_ms"),
            ),
            Tone::Good,
        ),
        "admit" => (format!("admit    peer {id}"), Tone::Plain),
        "forget" => (
            format!(
                "forget   peer {id} ({})",
                e["reason"].as_str().unwrap_or("?")
            ),
            Tone::Plain,
        ),
        "lagged" => (
            format!("lagged   this view missed {} events", e["missed"]),
            Tone::Warning,
        ),
        "link_down" => (
            format!(
                "link     {} down ({}): new suspicions held",
                e["iface"].as_str().unwrap_or("?"),
                e["state"].as_str().unwrap_or("?")
            ),
            Tone::Warning,
        ),
        "link_up" => (
            format!(
                "link     {} up after {} ms: suspicions held {} ms more",
                e["iface"].as_str().unwrap_or("?"),
                e["down_ms"],
                e["hold_ms"]
            ),
            Tone::Good,
        ),
        "correlated_silence" => (
            format!(
                "shared   {} of {} peers crossed level {level} within {} ms: a shared fault?",
                e["peers"], e["watched"], e["window_ms"]
            ),
            Tone::Warning,
        ),
        _ => (e.to_string(), Tone::Plain),
    };
    EventLine {
        text: format!("{at}  {text}"),
        tone,
    }
}

/// Local time of day of a Unix time in milliseconds.
pub fn clock(unix_ms: f64) -> String {
    let secs = (unix_ms / 1000.0).floor();
    let millis = (unix_ms - secs * 1000.0).clamp(0.0, 999.0) as u32;
    let t = secs as libc::time_t;
    // SAFETY: localtime_r writes only into the tm we pass; a zeroed tm is a valid value.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    if unsafe { libc::localtime_r(&t, &mut tm) }.is_null() {
        return format!("{secs}.{millis:03}");
    }
    format!(
        "{:02}:{:02}:{:02}.{millis:03}",
        tm.tm_hour, tm.tm_min, tm.tm_sec
    )
}
