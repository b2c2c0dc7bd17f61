//! The observer's own faults, told apart from the peers': the monitored interface losing its
//! link (every peer falls silent at once, and none of them failed), and a correlated silence
//! (a large share of the peers crossing the lowest level together), which says the fault is
//! more likely here or on a shared path than in each of them.

use std::time::Duration;

use crate::serving::event::Event;

/// The interface's link as the kernel reports it (`/sys/class/net/IF/`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkState {
    Up,
    /// Not up, and why: "administratively down", "no carrier", another operstate the kernel
    /// gave ("dormant", ...), or "absent" when the interface is gone.
    Down(String),
}

impl LinkState {
    /// Reads `iface`'s state: set down by an administrator (`flags` without IFF_UP), then its
    /// carrier (`carrier`, which follows the driver at once, where `operstate` may lag it by up
    /// to a second: the kernel's linkwatch batches changes), then `operstate` where the driver
    /// reports no carrier.
    pub fn read(iface: &str) -> Self {
        let file = |name: &str| std::fs::read_to_string(sys_file(iface, name)).map_err(|_| Absent);
        Self::from_files(file("flags"), || file("carrier"), || file("operstate"))
    }

    /// The state from the three files' contents, each read only when needed (`Absent`: the
    /// file could not be read).
    fn from_files(
        flags: Result<String, Absent>,
        carrier: impl FnOnce() -> Result<String, Absent>,
        operstate: impl FnOnce() -> Result<String, Absent>,
    ) -> Self {
        let Ok(flags) = flags else {
            return LinkState::Down("absent".into());
        };
        let flags = u32::from_str_radix(flags.trim().trim_start_matches("0x"), 16).unwrap_or(1);
        if flags & libc::IFF_UP as u32 == 0 {
            return LinkState::Down("administratively down".into());
        }
        // `carrier` cannot be read while the interface is not running (EINVAL).
        match carrier().as_deref().map(str::trim) {
            Ok("1") => LinkState::Up,
            Ok("0") => LinkState::Down("no carrier".into()),
            _ => match operstate() {
                Ok(text) => Self::parse(text.trim()),
                Err(Absent) => LinkState::Down("absent".into()),
            },
        }
    }

    /// An `operstate`: "unknown" counts as up (drivers without carrier reporting, such as
    /// loopback and tun, say so while they pass traffic).
    pub fn parse(operstate: &str) -> Self {
        match operstate {
            "up" | "unknown" => LinkState::Up,
            other => LinkState::Down(other.into()),
        }
    }
}

/// A sysfs file of the interface could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Absent;

fn sys_file(iface: &str, name: &str) -> String {
    format!("/sys/class/net/{iface}/{name}")
}

/// [`LinkState::read`] once a scan, without its path lookups: the interface's three files stay
/// open, and each read rereads them in place (sysfs shows a file afresh to a read at offset
/// 0). Opening, looking up and closing them twenty times a second was about a sixth of an idle
/// agent's time at 50,000 peers (perf, 2026-12-06). When `flags` cannot be read (the interface
/// is gone: its open files answer ENODEV) the files are dropped, that read goes by the path,
/// and the next one opens them again. Open files follow the device, not its name: a renamed
/// interface, to which the program stays attached, is still watched.
///
/// It also keeps `carrier_down_count` open: the kernel counts a carrier loss the moment the
/// driver reports it, under no lock, where `carrier` and `operstate` wait for the rtnl lock
/// and linkwatch (a veth whose far end is set down reads "up" for the 30 ms the far end's
/// close holds that lock). So a pass between scans can ask whether the carrier was lost since
/// the last read ([`Self::lost_carrier_since_read`]), and a read can tell a link that went down
/// and came back between two reads ([`Self::read_since`]).
#[derive(Debug)]
pub struct LinkReader {
    iface: String,
    open: Option<[std::fs::File; 3]>,
    /// `carrier_down_count` (kernels before 4.16 have none: then no loss between reads is seen).
    downs: Option<std::fs::File>,
    /// Its value at the last read.
    downs_at_read: Option<u64>,
}

impl LinkReader {
    pub fn new(iface: &str) -> Self {
        Self {
            iface: iface.into(),
            open: None,
            downs: None,
            downs_at_read: None,
        }
    }

    pub fn read(&mut self) -> LinkState {
        self.read_since().0
    }

    /// The state now, and whether the carrier was lost since the last read (also if it is
    /// back: a flap the reads fell on either side of). The count is read first: a loss
    /// between the two reads shows in the state.
    pub fn read_since(&mut self) -> (LinkState, bool) {
        let downs = self.downs_now();
        let lost = moved(self.downs_at_read, downs);
        self.downs_at_read = downs;
        (self.state(), lost)
    }

    /// Whether the carrier was lost since the last read: one reread of an open file, for a
    /// pass about to raise suspicions between scans (`Agent::run_due_asking`).
    pub fn lost_carrier_since_read(&mut self) -> bool {
        let downs = self.downs_now();
        moved(self.downs_at_read, downs)
    }

    fn downs_now(&mut self) -> Option<u64> {
        if self.downs.is_none() {
            self.downs = std::fs::File::open(sys_file(&self.iface, "carrier_down_count")).ok();
        }
        let text = reread(self.downs.as_ref()?);
        match text.ok().and_then(|t| t.trim().parse().ok()) {
            Some(downs) => Some(downs),
            None => {
                // Gone with its interface: opened again at the next read.
                self.downs = None;
                None
            }
        }
    }

    fn state(&mut self) -> LinkState {
        if self.open.is_none() {
            let open = |name| std::fs::File::open(sys_file(&self.iface, name));
            self.open = match (open("flags"), open("carrier"), open("operstate")) {
                (Ok(f), Ok(c), Ok(o)) => Some([f, c, o]),
                _ => None,
            };
        }
        let Some([flags, carrier, operstate]) = &self.open else {
            return LinkState::read(&self.iface);
        };
        let Ok(flags_text) = reread(flags) else {
            self.open = None;
            return LinkState::read(&self.iface);
        };
        LinkState::from_files(Ok(flags_text), || reread(carrier), || reread(operstate))
    }
}

/// Whether the carrier-loss count moved between two reads (unknown on either side: no).
fn moved(then: Option<u64>, now: Option<u64>) -> bool {
    matches!((then, now), (Some(a), Some(b)) if a != b)
}

/// An open sysfs file's contents now.
fn reread(file: &std::fs::File) -> Result<String, Absent> {
    use std::os::unix::fs::FileExt;
    // Every file read here holds a few bytes ("0x1003", "1", "lowerlayerdown").
    let mut buf = [0u8; 64];
    let n = file.read_at(&mut buf, 0).map_err(|_| Absent)?;
    String::from_utf8(buf[..n].to_vec()).map_err(|_| Absent)
}

/// Follows the link from sweep to sweep: an event on each change, and whether new suspicions
/// are held (while the link is down, and for `grace` after it came back, so peers have time
/// to be heard again before their silence counts).
#[derive(Debug)]
pub struct LinkWatch {
    iface: String,
    grace_ns: u64,
    up: bool,
    down_since_ns: u64,
    hold_until_ns: u64,
    changes: u64,
}

impl LinkWatch {
    /// A watch that starts from the state read now (no event for it: a link down at start is
    /// logged by the caller).
    pub fn new(iface: &str, grace: Duration, state: &LinkState, now_ns: u64) -> Self {
        let up = *state == LinkState::Up;
        Self {
            iface: iface.into(),
            grace_ns: grace.as_nanos() as u64,
            up,
            down_since_ns: if up { 0 } else { now_ns },
            hold_until_ns: 0,
            changes: 0,
        }
    }

    /// The state read at `now_ns` (monotonic) and `wall_ms`: the event its change raises.
    pub fn observe(&mut self, state: &LinkState, now_ns: u64, wall_ms: u64) -> Option<Event> {
        match (self.up, state) {
            (true, LinkState::Down(operstate)) => {
                self.up = false;
                self.changes += 1;
                self.down_since_ns = now_ns;
                Some(Event::LinkDown {
                    iface: self.iface.clone(),
                    state: operstate.clone(),
                    at: wall_ms,
                })
            }
            (false, LinkState::Up) => {
                self.up = true;
                self.changes += 1;
                self.hold_until_ns = now_ns.saturating_add(self.grace_ns);
                Some(Event::LinkUp {
                    iface: self.iface.clone(),
                    down_ms: now_ns.saturating_sub(self.down_since_ns) / 1_000_000,
                    hold_ms: self.grace_ns / 1_000_000,
                    at: wall_ms,
                })
            }
            _ => None,
        }
    }

    /// Whether new suspicions are held at `now_ns`.
    pub fn holding(&self, now_ns: u64) -> bool {
        !self.up || now_ns < self.hold_until_ns
    }

    pub fn is_up(&self) -> bool {
        self.up
    }

    /// Link changes seen (down and up each count).
    pub fn changes(&self) -> u64 {
        self.changes
    }
}

/// Lowest-level crossings of recent sweeps, against the number of peers watched: one
/// `correlated_silence` event when at least [`Self::SHARE`] of the peers (and at least
/// [`Self::MIN_PEERS`]) crossed within [`Self::WINDOW_NS`], and no other until the crossings
/// of a window fall below half that again.
#[derive(Debug, Default)]
pub struct CorrelatedSilence {
    window_start_ns: u64,
    crossed: u64,
    raised: bool,
}

impl CorrelatedSilence {
    /// Crossings closer together than this count as together: heartbeats are not sent in step,
    /// so a shared fault's crossings spread over about one interval.
    pub const WINDOW_NS: u64 = 1_000_000_000;
    /// The share of the watched peers.
    pub const SHARE: f64 = 0.5;
    /// Fewer peers than this crossing together say nothing about a shared cause.
    pub const MIN_PEERS: u64 = 8;

    /// `crossed` peers crossed the lowest level `level` in the sweep at `now_ns`, with
    /// `watched` peers watched.
    pub fn note(
        &mut self,
        crossed: u64,
        watched: u64,
        level: f64,
        now_ns: u64,
        wall_ms: u64,
    ) -> Option<Event> {
        if now_ns.saturating_sub(self.window_start_ns) >= Self::WINDOW_NS {
            let threshold = self.threshold(watched);
            if self.raised && self.crossed < threshold.div_ceil(2) {
                self.raised = false;
            }
            self.window_start_ns = now_ns;
            self.crossed = 0;
        }
        self.crossed += crossed;
        let threshold = self.threshold(watched);
        if self.raised || crossed == 0 || self.crossed < threshold {
            return None;
        }
        self.raised = true;
        Some(Event::CorrelatedSilence {
            level,
            peers: self.crossed,
            watched,
            window_ms: Self::WINDOW_NS / 1_000_000,
            at: wall_ms,
        })
    }

    fn threshold(&self, watched: u64) -> u64 {
        ((watched as f64 * Self::SHARE).ceil() as u64).max(Self::MIN_PEERS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reader_rereads_its_open_files_as_a_read_by_path_does() {
        // Loopback is in every namespace: up, whatever its carrier file says.
        let mut reader = LinkReader::new("lo");
        for _ in 0..3 {
            assert_eq!(reader.read(), LinkState::read("lo"));
        }
        assert!(reader.open.is_some(), "the files stay open between reads");
        let mut gone = LinkReader::new("hbm-no-such-if");
        assert_eq!(gone.read(), LinkState::Down("absent".into()));
        assert!(gone.open.is_none());
    }

    #[test]
    fn the_reader_counts_carrier_losses_between_reads() {
        // Loopback never loses its carrier; a loss itself is made on a veth in
        // tests/tests/observer_faults.rs.
        let mut reader = LinkReader::new("lo");
        assert_eq!(reader.read_since(), (LinkState::Up, false));
        assert!(reader.downs.is_some() && reader.downs_at_read.is_some());
        assert!(!reader.lost_carrier_since_read());
        // A count that moved since the read is a loss, until the next read.
        reader.downs_at_read = reader.downs_at_read.map(|d| d + 1);
        assert!(reader.lost_carrier_since_read());
        assert_eq!(reader.read_since(), (LinkState::Up, true));
        assert!(!reader.lost_carrier_since_read());
        let mut gone = LinkReader::new("hbm-no-such-if");
        assert_eq!(gone.read_since(), (LinkState::Down("absent".into()), false));
        assert!(!gone.lost_carrier_since_read());
    }

    const S: u64 = 1_000_000_000;

    #[test]
    fn operstates_that_pass_traffic_are_up() {
        assert_eq!(LinkState::parse("up"), LinkState::Up);
        assert_eq!(LinkState::parse("unknown"), LinkState::Up);
        for state in ["down", "lowerlayerdown", "dormant", "notpresent", "testing"] {
            assert_eq!(LinkState::parse(state), LinkState::Down(state.into()));
        }
        assert_eq!(
            LinkState::read("no-such-interface-here"),
            LinkState::Down("absent".into())
        );
        assert_eq!(LinkState::read("lo"), LinkState::Up);
        assert_eq!(
            LinkState::read("../../../../etc"),
            LinkState::Down("absent".into()),
            "not a path to anything but an interface"
        );
    }

    #[test]
    fn a_link_down_holds_suspicions_until_the_grace_after_it_came_back() {
        let down = LinkState::Down("lowerlayerdown".into());
        let mut link = LinkWatch::new("eth0", Duration::from_secs(2), &LinkState::Up, 0);
        assert!(!link.holding(S));
        assert_eq!(link.observe(&LinkState::Up, S, 1000), None);
        assert_eq!(
            link.observe(&down, 10 * S, 10_000),
            Some(Event::LinkDown {
                iface: "eth0".into(),
                state: "lowerlayerdown".into(),
                at: 10_000
            })
        );
        assert_eq!(link.observe(&down, 11 * S, 11_000), None, "once");
        assert!(link.holding(20 * S));
        assert_eq!(
            link.observe(&LinkState::Up, 13 * S, 13_000),
            Some(Event::LinkUp {
                iface: "eth0".into(),
                down_ms: 3000,
                hold_ms: 2000,
                at: 13_000
            })
        );
        assert!(link.holding(14 * S), "within the grace");
        assert!(!link.holding(15 * S), "after it");
        assert_eq!(link.changes(), 2);
        // Down at start: held from the start, and its return is an event.
        let mut link = LinkWatch::new("eth0", Duration::ZERO, &down, 5 * S);
        assert!(link.holding(6 * S));
        assert!(matches!(
            link.observe(&LinkState::Up, 7 * S, 0),
            Some(Event::LinkUp { down_ms: 2000, .. })
        ));
        assert!(!link.holding(7 * S));
    }

    #[test]
    fn a_correlated_silence_is_one_event_until_it_subsides() {
        let mut c = CorrelatedSilence::default();
        // 100 peers: 50 must cross within a second.
        assert_eq!(c.note(20, 100, 1.0, 10 * S, 0), None);
        assert_eq!(c.note(20, 100, 1.0, 10 * S + S / 2, 0), None);
        let raised = c.note(15, 100, 1.0, 10 * S + S * 9 / 10, 7);
        assert_eq!(
            raised,
            Some(Event::CorrelatedSilence {
                level: 1.0,
                peers: 55,
                watched: 100,
                window_ms: 1000,
                at: 7
            })
        );
        assert_eq!(c.note(30, 100, 1.0, 10 * S + S * 95 / 100, 0), None, "once");
        // Still many in the next window: no second event.
        assert_eq!(c.note(60, 100, 1.0, 12 * S, 0), None);
        // A quiet window, then another burst: a new event.
        assert_eq!(c.note(1, 100, 1.0, 14 * S, 0), None);
        assert_eq!(c.note(0, 100, 1.0, 15 * S + 1, 0), None);
        assert!(c.note(50, 100, 1.0, 15 * S + 2, 0).is_some());
    }

    #[test]
    fn a_few_peers_crossing_together_are_not_correlated() {
        let mut c = CorrelatedSilence::default();
        // All 4 of 4 peers: below MIN_PEERS.
        assert_eq!(c.note(4, 4, 1.0, S, 0), None);
        // Spread over windows, 50 of 100 never within one second.
        let mut c = CorrelatedSilence::default();
        for k in 0..10 {
            assert_eq!(c.note(10, 100, 1.0, k * 2 * S, 0), None);
        }
    }
}
