//! systemd's service notification protocol (sd_notify(3)), for a `Type=notify` unit such as
//! packaging/systemd/heartbeat-monitor.service: `READY=1` once the socket is bound and the
//! program attached, a `STATUS=` line (peers, suspects) now and then, `WATCHDOG=1` at half of
//! `WATCHDOG_USEC` and `STOPPING=1` on the way out.
//!
//! The watchdog is pinged from the sweep loop itself, after a sweep, never from a timer of its
//! own: an agent whose sweeps stall stops pinging, and the service manager restarts it.
//! Without `NOTIFY_SOCKET` (not started by systemd) every call is a no-op.

use std::time::{Duration, Instant};

use sd_notify::NotifyState;

use super::Agent;

/// How often the `STATUS=` line is refreshed.
const STATUS_EVERY: Duration = Duration::from_secs(5);

/// The agent's side of the protocol; lives in the sweep loop.
pub struct Notifier {
    /// A service manager listens (`NOTIFY_SOCKET` is set).
    enabled: bool,
    /// Time between watchdog pings (half of `WATCHDOG_USEC`), if the watchdog is on.
    ping_every: Option<Duration>,
    /// Time between calls of `tick`.
    sweep_interval: Duration,
    next_ping: Instant,
    next_status: Instant,
    /// A failed notification was logged at warn level once; later ones go to debug.
    warned: bool,
}

impl Notifier {
    /// Reads `NOTIFY_SOCKET`, `WATCHDOG_USEC` and `WATCHDOG_PID` from the environment.
    /// `sweep_interval` is how often `tick` will be called.
    pub fn from_env(sweep_interval: Duration) -> Self {
        let enabled = std::env::var_os("NOTIFY_SOCKET").is_some();
        let ping_every = sd_notify::watchdog_enabled()
            .filter(|_| enabled)
            .map(|timeout| timeout / 2);
        if let Some(every) = ping_every
            && sweep_interval > every
        {
            log::warn!(
                "--sweep-interval {sweep_interval:?} is longer than half the service watchdog \
                 ({:?}): the watchdog will fire; raise WatchdogSec= or shorten the interval",
                every * 2
            );
        }
        let now = Instant::now();
        Self {
            enabled,
            ping_every,
            sweep_interval,
            next_ping: now,
            next_status: now + STATUS_EVERY,
            warned: false,
        }
    }

    /// The agent serves: the socket is bound and the program attached (or adopted).
    pub fn ready(&mut self, agent: &Agent) {
        if !self.enabled {
            return;
        }
        let status = status_line(agent);
        self.send(&[NotifyState::Ready, NotifyState::Status(&status)]);
        self.next_status = Instant::now() + STATUS_EVERY;
    }

    /// After each sweep: pings the watchdog and refreshes the status line when they are due.
    pub fn tick(&mut self, agent: &Agent) {
        if !self.enabled {
            return;
        }
        let now = Instant::now();
        // Ping now unless the next sweep still comes before the ping is due: waiting for the
        // first sweep past the due time would stretch the period by up to a sweep interval.
        if let Some(every) = self.ping_every
            && now + self.sweep_interval > self.next_ping
        {
            self.send(&[NotifyState::Watchdog]);
            self.next_ping = now + every;
        }
        if now >= self.next_status {
            let status = status_line(agent);
            self.send(&[NotifyState::Status(&status)]);
            self.next_status = now + STATUS_EVERY;
        }
    }

    fn send(&mut self, states: &[NotifyState]) {
        if let Err(e) = sd_notify::notify(states) {
            if self.warned {
                log::debug!("notifying the service manager: {e}");
            } else {
                log::warn!("notifying the service manager (NOTIFY_SOCKET): {e}");
                self.warned = true;
            }
        }
    }
}

/// The agent is shutting down (a no-op without `NOTIFY_SOCKET`).
pub fn stopping() {
    if let Err(e) = sd_notify::notify(&[NotifyState::Stopping, NotifyState::Status("stopping")]) {
        log::debug!("notifying the service manager: {e}");
    }
}

/// One line for `systemctl status`: how many peers, how many at or above the highest level.
fn status_line(agent: &Agent) -> String {
    match agent.stats() {
        Ok(stats) => {
            let threshold = stats.levels.last().copied().unwrap_or(f64::INFINITY);
            let suspects = agent.suspects(threshold).len();
            format!(
                "{} peers, {suspects} suspected (phi >= {threshold}) on {} ({})",
                stats.peers, stats.iface, stats.xdp_mode
            )
        }
        Err(e) => format!("serving; {e}"),
    }
}
