//! Traces of heartbeat arrivals, the input of replay and the output of `monitor record`.
//!
//! Text, one arrival per line, in arrival order: `TIME_MS [SEQ [INCARNATION]]`, where TIME_MS
//! is the arrival time in milliseconds (up to 6 decimals: nanoseconds, as the kernel stamps
//! them) and SEQ, INCARNATION are the heartbeat's sequence number and sender incarnation as the
//! wire carries them. Blank lines and lines starting with `#` are comments. A trace without
//! sequence numbers (the older format: times only) is taken as one incarnation whose
//! heartbeats are numbered 1, 2, 3... in the order given: nothing lost, nothing reordered.

use crate::serving::recording::ArrivalLine;

/// One heartbeat as the kernel saw it arrive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arrival {
    /// Arrival time, ns since the trace's origin (the peer's registration).
    pub at_ns: u64,
    pub seq: u64,
    pub incarnation: u32,
}

impl Arrival {
    pub fn at_ms(&self) -> f64 {
        self.at_ns as f64 / 1e6
    }
}

/// A parse error: the 1-based line (0 for the whole file) and what is wrong.
pub type TraceError = (usize, String);

/// Parses a trace (see the module docs); errors carry the line number.
pub fn parse_trace(text: &str) -> Result<Vec<Arrival>, TraceError> {
    let mut arrivals: Vec<Arrival> = Vec::new();
    let mut with_seq: Option<bool> = None;
    for (n, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let err = |message: String| (n + 1, message);
        let mut fields = line.split_whitespace();
        let time = fields.next().expect("non-empty line");
        let at_ns = parse_ms_as_ns(time).map_err(err)?;
        let seq = fields
            .next()
            .map(|s| {
                s.parse::<u64>()
                    .map_err(|_| err(format!("{s:?} is not a sequence number")))
            })
            .transpose()?;
        let incarnation = fields
            .next()
            .map(|s| {
                s.parse::<u32>()
                    .map_err(|_| err(format!("{s:?} is not an incarnation (0..=4294967295)")))
            })
            .transpose()?;
        if let Some(extra) = fields.next() {
            return Err(err(format!(
                "{extra:?}: a line is TIME_MS [SEQ [INCARNATION]]"
            )));
        }
        match with_seq {
            None => with_seq = Some(seq.is_some()),
            Some(w) if w != seq.is_some() => {
                return Err(err(
                    "every line carries a sequence number, or none does".into()
                ));
            }
            _ => {}
        }
        if let Some(prev) = arrivals.last()
            && at_ns < prev.at_ns
        {
            return Err(err(format!(
                "{time} comes after {}: arrivals must be in time order",
                prev.at_ms()
            )));
        }
        arrivals.push(Arrival {
            at_ns,
            seq: seq.unwrap_or(arrivals.len() as u64 + 1),
            incarnation: incarnation.unwrap_or(1),
        });
    }
    if arrivals.is_empty() {
        return Err((0, "the trace holds no heartbeat".into()));
    }
    Ok(arrivals)
}

/// Exact decimal milliseconds to integer nanoseconds (no float rounding): "12.5" -> 12_500_000.
fn parse_ms_as_ns(text: &str) -> Result<u64, String> {
    let bad =
        || format!("{text:?} is not a time in milliseconds (at most 6 decimals, not negative)");
    let (whole, frac) = text.split_once('.').unwrap_or((text, ""));
    if whole.is_empty() && frac.is_empty() {
        return Err(bad());
    }
    if !whole.bytes().all(|b| b.is_ascii_digit()) || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    if frac.len() > 6 {
        return Err(bad());
    }
    let whole: u64 = if whole.is_empty() {
        0
    } else {
        whole.parse().map_err(|_| bad())?
    };
    let frac_ns: u64 = if frac.is_empty() {
        0
    } else {
        frac.parse::<u64>().map_err(|_| bad())? * 10u64.pow(6 - frac.len() as u32)
    };
    whole
        .checked_mul(1_000_000)
        .and_then(|ns| ns.checked_add(frac_ns))
        .ok_or_else(bad)
}

/// Writes arrivals as a trace with sequence numbers, after `header` (each line becomes a
/// `#` comment). Times keep nanosecond precision, so a recorded trace replays exactly.
pub fn format_trace(header: &str, arrivals: &[Arrival]) -> String {
    let mut out = String::with_capacity(arrivals.len() * 24 + header.len() + 64);
    for line in header.lines() {
        out.push_str("# ");
        out.push_str(line);
        out.push('\n');
    }
    out.push_str("# TIME_MS SEQ INCARNATION\n");
    for a in arrivals {
        let ms = a.at_ns / 1_000_000;
        let ns = a.at_ns % 1_000_000;
        out.push_str(&format!("{ms}.{ns:06} {} {}\n", a.seq, a.incarnation));
    }
    out
}

// Kept here, not in serving: the conversion is replay's, and serving does not read offline.
impl ArrivalLine {
    /// The arrival in replay's terms, its time counted from `origin_ns`.
    pub fn arrival(&self, origin_ns: u64) -> Arrival {
        Arrival {
            at_ns: self.at_ns.saturating_sub(origin_ns),
            seq: self.seq,
            incarnation: self.incarnation,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use monitor_common::maps::ArrivalRecord;

    fn at(ms: u64) -> u64 {
        ms * 1_000_000
    }

    #[test]
    fn times_only_is_one_incarnation_numbered_in_order() {
        let t = parse_trace("# c\n\n100\n200.5\n 300 \n").unwrap();
        let got: Vec<(u64, u64, u32)> = t.iter().map(|a| (a.at_ns, a.seq, a.incarnation)).collect();
        assert_eq!(
            got,
            vec![(at(100), 1, 1), (at(200) + 500_000, 2, 1), (at(300), 3, 1)]
        );
    }

    #[test]
    fn sequence_and_incarnation_columns() {
        let t = parse_trace("100 7 3\n200.000001 9 3\n250 1 4\n").unwrap();
        assert_eq!(
            t[1],
            Arrival {
                at_ns: at(200) + 1,
                seq: 9,
                incarnation: 3
            }
        );
        assert_eq!(t[2].incarnation, 4);
        // Incarnation defaults to 1 when only the sequence is given.
        assert_eq!(parse_trace("5 2\n").unwrap()[0].incarnation, 1);
    }

    #[test]
    fn errors_name_the_line() {
        for (text, line, needle) in [
            ("100\nx\n", 2, "not a time"),
            ("100\n50\n", 2, "time order"),
            ("-5\n", 1, "not a time"),
            ("1.1234567\n", 1, "6 decimals"),
            ("100 1\n200\n", 2, "or none does"),
            ("100 a\n", 1, "sequence number"),
            ("100 1 -1\n", 1, "incarnation"),
            ("100 1 1 9\n", 1, "TIME_MS [SEQ"),
            ("1e3\n", 1, "not a time"),
            ("99999999999999999999\n", 1, "not a time"),
        ] {
            let (n, message) = parse_trace(text).expect_err(text);
            assert_eq!(n, line, "{text:?}: {message}");
            assert!(message.contains(needle), "{text:?}: {message}");
        }
        assert_eq!(parse_trace("# nothing\n").unwrap_err().0, 0);
    }

    #[test]
    fn format_round_trips_to_the_nanosecond() {
        let arrivals = vec![
            Arrival {
                at_ns: 1,
                seq: 1,
                incarnation: 1,
            },
            Arrival {
                at_ns: 123_456_789_012,
                seq: 2,
                incarnation: 1,
            },
            Arrival {
                at_ns: 123_456_789_013,
                seq: 1,
                incarnation: u32::MAX,
            },
        ];
        let text = format_trace("recorded\nby a test", &arrivals);
        assert!(text.starts_with("# recorded\n# by a test\n"));
        assert_eq!(parse_trace(&text).unwrap(), arrivals);
    }

    #[test]
    fn lines_say_what_the_kernel_decided() {
        let record = ArrivalRecord {
            peer_id: 7,
            at_ns: 5_000_000_123,
            seq: 9,
            incarnation: 2,
            outcome: 2,
        };
        let line = ArrivalLine::from_record(&record);
        assert_eq!(line.outcome, "out_of_order");
        assert_eq!(
            line.arrival(1_000_000_000),
            Arrival {
                at_ns: 4_000_000_123,
                seq: 9,
                incarnation: 2
            }
        );
    }
}
