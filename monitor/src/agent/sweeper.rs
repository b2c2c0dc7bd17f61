//! The sweep's own thread and its pace: a scan every `--sweep-interval`, and between scans a
//! due pass at each deadline armed for before the next one (`due_soon`), so an event is raised
//! at its deadline, not at the next scan; the agent's own stalls and the interface's link
//! watched between scans (`observer_faults`), and the watchdog's pings (`notify`).

use std::{sync::Arc, sync::atomic::Ordering, time::Duration};

use anyhow::{Context, Result};

use super::{
    Agent,
    notify::Notifier,
    observer_faults::{LinkReader, LinkState, LinkWatch},
    sweep_wake::Woke,
    wall_ms,
};
use crate::kernel::clock::monotonic_ns;

/// The sweep's own thread: it wakes for a scan or a due slot, or when poked (`SweepWake`),
/// where a sweep driven by the async runtime's timer cost a handful of thread switches each
/// (the timer's worker, then the task's thread), and it keeps its pace whatever the socket's
/// clients ask of the runtime.
pub(super) struct Sweeper {
    agent: Arc<Agent>,
    thread: std::thread::JoinHandle<()>,
}

impl Sweeper {
    /// Starts sweeping every `interval`; `ended` fires if the thread ever ends by itself.
    pub(super) fn start(
        agent: Arc<Agent>,
        interval: Duration,
        stall_bound: Duration,
        link_grace: Duration,
        notifier: Notifier,
        ended: tokio::sync::oneshot::Sender<()>,
    ) -> Result<Self> {
        let on = agent.clone();
        let thread = std::thread::Builder::new()
            .name("sweep".into())
            .spawn(move || {
                // Dropped when the thread ends, also by a panic: the agent then stops.
                let _ended = ended;
                sweep_loop(&on, interval, stall_bound, link_grace, notifier);
            })
            .context("starting the sweep thread")?;
        Ok(Self { agent, thread })
    }

    pub(super) fn stop(self) {
        self.agent.sweep_wake.stop();
        let _ = self.thread.join();
    }
}

/// Scans every `interval`, and runs the due slots between scans, until the agent's
/// `SweepWake` is stopped; detects its own stalls (Cassandra pauses convictions the same way)
/// and its interface's link going down (`observer_faults`), and holds new suspicions through
/// either. A scan that comes late is taken at once and the next one an interval after it.
fn sweep_loop(
    agent: &Agent,
    interval: Duration,
    stall_bound: Duration,
    link_grace: Duration,
    mut notifier: Notifier,
) {
    // The first scan at once: it gives the listed (or adopted) peers their trackers and arms
    // the deadlines that fall before the next one. A first scan an interval after the start
    // left a listed peer that never sent unlooked-at until then (its levels all raised at
    // once, late by up to an interval), and nothing armed before it for a peer admitted on its
    // first packet.
    let mut next = std::time::Instant::now();
    let mut last = monotonic_ns();
    let mut hold_until = 0u64;
    let mut link_reader = LinkReader::new(agent.iface());
    let state = link_reader.read();
    // The program is attached to the interface, so it exists: not finding it in /sys means
    // this /sys is another network namespace's (the agent entered its namespace without
    // remounting /sys, as `nsenter --net` does), and its link cannot be watched. Better no
    // watch than suspicions held for good.
    let watched = state != LinkState::Down("absent".into());
    if !watched {
        log::warn!(
            "{}: not in /sys/class/net (a /sys of another network namespace?): its link is not watched, and a link down will raise suspicions",
            agent.iface()
        );
    }
    let link = LinkWatch::new(agent.iface(), link_grace, &state, last);
    if let LinkState::Down(operstate) = &state
        && watched
    {
        log::warn!(
            "{}: link down ({operstate}); holding new suspicions until it is up",
            agent.iface()
        );
    }
    let mut link = watched.then_some(link);
    if let Some(link) = &link {
        agent.note_link(link);
    }
    loop {
        // The planned wake: the next scan, or the earliest due slot if sooner.
        let (planned, planned_ns) = (std::time::Instant::now(), monotonic_ns());
        let wake = agent
            .next_due_ns()
            .map(|due| planned + Duration::from_nanos(due.saturating_sub(planned_ns)))
            .map_or(next, |due| due.min(next));
        if agent.sweep_wake.wait_until(wake) == Woke::Stopped {
            return;
        }
        let woke = std::time::Instant::now();
        // The time since the last pass ended: a pass that itself takes long (the first one
        // over a million new peers) is not a stall, since the kernel kept stamping arrivals
        // meanwhile; a thread or a machine that was not running is.
        let now = monotonic_ns();
        let gap = now.saturating_sub(last);
        if gap > stall_bound.as_nanos() as u64 {
            agent.stalls.fetch_add(1, Ordering::Relaxed);
            hold_until = now + gap;
            log::warn!(
                "the agent was not scheduled for {:.0} ms; holding new suspicions for as long",
                gap as f64 / 1e6
            );
        }
        if woke < next {
            // A due slot, or a poke: the link as last read, the clock as now, and the
            // carrier's loss counter reread if the pass is about to raise (see `run_due_asking`).
            let link_holds = link.as_ref().is_some_and(|link| link.holding(now));
            let mut lost = false;
            agent.run_due_asking(now, now < hold_until || link_holds, &mut || {
                lost = link.is_some() && link_reader.lost_carrier_since_read();
                lost
            });
            if lost && let Some(link) = link.as_mut() {
                // Down until a scan reads it up (and then held for the grace).
                observe_link(
                    agent,
                    link,
                    &LinkState::Down("no carrier".into()),
                    now,
                    link_grace,
                );
            }
            last = monotonic_ns();
            continue;
        }
        next = if woke > next + interval {
            woke + interval
        } else {
            next + interval
        };
        // Three rereads of open sysfs files a scan: a link change is seen within a scan, and
        // a loss between two scans (down and up again) as one.
        if let Some(link) = link.as_mut() {
            let (state, lost) = link_reader.read_since();
            // A link read up that lost its carrier since it was last read up came back
            // unseen: taken down and up again, so suspicions are held for the grace while
            // its peers are heard again.
            if lost && link.is_up() && state == LinkState::Up {
                let flapped = LinkState::Down(FLAPPED.into());
                observe_link(agent, link, &flapped, now, link_grace);
            }
            observe_link(agent, link, &state, now, link_grace);
        }
        let link_holds = link.as_ref().is_some_and(|link| link.holding(now));
        // Due slots first (those armed for up to now), then the scan, which arms the slots due
        // before the next one.
        let hold = now < hold_until || link_holds;
        agent.run_due(now, hold);
        let next_ns = now + next.saturating_duration_since(woke).as_nanos() as u64;
        agent.sweep_until(now, hold, next_ns);
        last = monotonic_ns();
        // The watchdog hears from the sweep itself: a stalled sweep stops the pings.
        notifier.tick(agent);
    }
}

/// The `state` of a `link_down` event for a link that lost its carrier and had it back between
/// two reads.
const FLAPPED: &str = "down and up again between two reads";

/// Observes `state` read at `now`; logs and publishes the event of a change.
fn observe_link(
    agent: &Agent,
    link: &mut LinkWatch,
    state: &LinkState,
    now: u64,
    link_grace: Duration,
) {
    let Some(event) = link.observe(state, now, wall_ms() as u64) else {
        return;
    };
    match state {
        LinkState::Down(operstate) => log::warn!(
            "{}: link down ({operstate}); holding new suspicions until it is up",
            agent.iface()
        ),
        LinkState::Up => log::warn!(
            "{}: link up again; new suspicions held for {link_grace:?} more",
            agent.iface()
        ),
    }
    agent.note_link(link);
    agent.publish(event);
}
