//! How the sweeper sleeps: until its planned wake (the next scan, or the earliest entry due
//! soon), unless something that may have brought a deadline nearer (a first-packet admission,
//! a detector change) or a stop wakes it first. A condvar, so an early wake costs one futex
//! wake and nothing is polled.

use std::time::Instant;

use parking_lot::{Condvar, Mutex};

/// Why the sweeper woke.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Woke {
    /// Its planned time came.
    Planned,
    /// Something was armed that may be due before the planned time.
    Poked,
    /// The agent is stopping.
    Stopped,
}

#[derive(Debug, Default)]
struct Flags {
    poked: bool,
    stopped: bool,
}

/// The sweeper's alarm clock, shared by the agent's other parts.
#[derive(Debug, Default)]
pub struct SweepWake {
    flags: Mutex<Flags>,
    changed: Condvar,
}

impl SweepWake {
    /// Wakes the sweeper to look at its due entries now (a no-op's cost if it is awake).
    pub fn poke(&self) {
        self.flags.lock().poked = true;
        self.changed.notify_one();
    }

    /// Ends the sweeper's loop.
    pub fn stop(&self) {
        self.flags.lock().stopped = true;
        self.changed.notify_one();
    }

    /// Sleeps until `until`, a poke or a stop, whichever comes first.
    pub fn wait_until(&self, until: Instant) -> Woke {
        let mut flags = self.flags.lock();
        loop {
            if flags.stopped {
                return Woke::Stopped;
            }
            if std::mem::take(&mut flags.poked) {
                return Woke::Poked;
            }
            if self.changed.wait_until(&mut flags, until).timed_out() {
                return if flags.stopped {
                    Woke::Stopped
                } else {
                    flags.poked = false;
                    Woke::Planned
                };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::{sync::Arc, time::Duration};

    use super::*;

    #[test]
    fn a_poke_or_a_stop_ends_the_wait_before_its_time() {
        let wake = Arc::new(SweepWake::default());
        let far = Instant::now() + Duration::from_secs(3600);
        let poker = {
            let wake = wake.clone();
            std::thread::spawn(move || wake.poke())
        };
        assert_eq!(wake.wait_until(far), Woke::Poked);
        poker.join().unwrap();
        // A poke before the wait is not lost.
        wake.poke();
        assert_eq!(wake.wait_until(far), Woke::Poked);
        assert_eq!(wake.wait_until(Instant::now()), Woke::Planned);
        let stopper = {
            let wake = wake.clone();
            std::thread::spawn(move || wake.stop())
        };
        assert_eq!(wake.wait_until(far), Woke::Stopped);
        stopper.join().unwrap();
    }
}
