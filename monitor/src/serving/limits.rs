//! How much of the socket one client, or one user, may hold: connection caps counted at accept
//! (a connection over a cap is answered and closed at once, never left waiting in the
//! backlog), an idle timeout, and a deadline on every write.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

/// Connections served at once, all clients together (`--socket-max-clients`).
pub const DEFAULT_MAX_CLIENTS: usize = 1024;
/// Connections one uid other than root and the agent's own may hold (`--socket-max-per-uid`).
pub const DEFAULT_MAX_PER_UID: usize = 64;
/// A request connection with no request for this long is closed (`--socket-idle-timeout`).
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// A reply or a batch of events not written in full within this long cuts the client off
/// (`--socket-write-timeout`).
pub const DEFAULT_WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// The socket's limits (see the module's doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Connections at once, all together. One eighth of it is kept for root and the agent's
    /// uid: the other uids together hold at most `max_clients - max_clients / 8`.
    pub max_clients: usize,
    /// Connections at once of each uid other than root and the agent's.
    pub max_per_uid: usize,
    /// How long a connection that carries requests may go without one.
    pub idle_timeout: Duration,
    /// How long one reply (all of it, however long), or one batch of events, may take to write.
    pub write_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_clients: DEFAULT_MAX_CLIENTS,
            max_per_uid: DEFAULT_MAX_PER_UID,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            write_timeout: DEFAULT_WRITE_TIMEOUT,
        }
    }
}

impl Limits {
    /// What the uids other than root and the agent's may hold together.
    pub fn shared(&self) -> usize {
        self.max_clients - self.max_clients / 8
    }
}

/// Why a client was refused (the `reason` of the refusals metric).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Its credentials are not served (`AccessPolicy`).
    Policy,
    /// Its uid holds `limit` connections already.
    PerUid { uid: u32, limit: usize },
    /// The uids other than root and the agent's hold `limit` already.
    Shared { limit: usize },
    /// Every connection is taken.
    Total { limit: usize },
}

impl Refusal {
    /// The metric's label value.
    pub fn reason(&self) -> &'static str {
        match self {
            Refusal::Policy => "policy",
            Refusal::PerUid { .. } => "uid_limit",
            Refusal::Shared { .. } => "shared_limit",
            Refusal::Total { .. } => "total_limit",
        }
    }

    /// What the client is told (a cap refusal; the policy's says who is served).
    pub fn message(&self, agent_uid: u32) -> String {
        match *self {
            Refusal::Policy => "permission denied".into(),
            Refusal::PerUid { uid, limit } => {
                format!("too many connections from uid {uid} (limit {limit})")
            }
            Refusal::Shared { limit } => format!(
                "too many connections from users other than root and uid {agent_uid} (limit {limit})"
            ),
            Refusal::Total { limit } => format!("too many connections (limit {limit})"),
        }
    }
}

/// Why a client was cut off (the `reason` of the cut-offs metric).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CutOff {
    /// No request within the idle timeout.
    Idle,
    /// A write did not complete within the write timeout: the client reads too slowly, or
    /// not at all.
    WriteTimeout,
}

impl CutOff {
    pub fn reason(&self) -> &'static str {
        match self {
            CutOff::Idle => "idle",
            CutOff::WriteTimeout => "write_timeout",
        }
    }
}

#[derive(Debug, Default)]
struct Counts {
    total: usize,
    /// Of `total`, the connections of uids other than root and the agent's.
    shared: usize,
    per_uid: HashMap<u32, usize>,
}

/// The connections held now, by uid; taken at accept, given back when a `Held` drops.
#[derive(Debug)]
pub struct Caps {
    limits: Limits,
    counts: Mutex<Counts>,
}

/// One connection counted against its uid's cap, until it is dropped.
#[derive(Debug)]
pub struct Held {
    caps: Arc<Caps>,
    uid: u32,
    privileged: bool,
}

impl Caps {
    pub fn new(limits: Limits) -> Arc<Self> {
        Arc::new(Self {
            limits,
            counts: Mutex::default(),
        })
    }

    /// Counts a new connection of `uid` (`privileged`: root or the agent's uid, which have no
    /// cap of their own and may use the reserve), or says which cap it is over.
    pub fn take(self: &Arc<Self>, uid: u32, privileged: bool) -> Result<Held, Refusal> {
        let mut counts = self.counts.lock().expect("caps lock");
        if counts.total >= self.limits.max_clients {
            return Err(Refusal::Total {
                limit: self.limits.max_clients,
            });
        }
        if !privileged {
            let mine = counts.per_uid.get(&uid).copied().unwrap_or(0);
            if mine >= self.limits.max_per_uid {
                return Err(Refusal::PerUid {
                    uid,
                    limit: self.limits.max_per_uid,
                });
            }
            if counts.shared >= self.limits.shared() {
                return Err(Refusal::Shared {
                    limit: self.limits.shared(),
                });
            }
            counts.shared += 1;
            *counts.per_uid.entry(uid).or_default() += 1;
        }
        counts.total += 1;
        Ok(Held {
            caps: self.clone(),
            uid,
            privileged,
        })
    }

    /// Connections held now: all, and those of uid `uid` (counted for unprivileged uids only).
    pub fn held(&self, uid: u32) -> (usize, usize) {
        let counts = self.counts.lock().expect("caps lock");
        (counts.total, counts.per_uid.get(&uid).copied().unwrap_or(0))
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut counts = self.caps.counts.lock().expect("caps lock");
        counts.total -= 1;
        if !self.privileged {
            counts.shared -= 1;
            if let Some(n) = counts.per_uid.get_mut(&self.uid) {
                *n -= 1;
                if *n == 0 {
                    // A map of every uid ever seen would grow without end.
                    counts.per_uid.remove(&self.uid);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caps(max_clients: usize, max_per_uid: usize) -> Arc<Caps> {
        Caps::new(Limits {
            max_clients,
            max_per_uid,
            ..Limits::default()
        })
    }

    #[test]
    fn each_uid_has_its_cap_and_gets_its_connections_back() {
        let caps = caps(1024, 3);
        let held: Vec<Held> = (0..3).map(|_| caps.take(1000, false).unwrap()).collect();
        assert_eq!(
            caps.take(1000, false).unwrap_err(),
            Refusal::PerUid {
                uid: 1000,
                limit: 3
            }
        );
        // Another uid is not held back by the first one's.
        let other = caps.take(1001, false).unwrap();
        assert_eq!(caps.held(1000), (4, 3));
        drop(held);
        assert_eq!(caps.held(1000), (1, 0));
        assert!(caps.take(1000, false).is_ok(), "given back on drop");
        drop(other);
        assert_eq!(caps.held(1001), (0, 0));
        assert!(
            caps.counts.lock().unwrap().per_uid.is_empty(),
            "no uid is remembered once it holds nothing"
        );
    }

    #[test]
    fn root_and_the_agent_keep_a_reserve_the_others_cannot_take() {
        // 16 in all: 14 shared by the other uids, 2 kept for root and the agent.
        let caps = caps(16, 10);
        assert_eq!(caps.limits.shared(), 14);
        let mut held: Vec<Held> = (0..10).map(|_| caps.take(1000, false).unwrap()).collect();
        held.extend((0..4).map(|_| caps.take(1001, false).unwrap()));
        assert_eq!(
            caps.take(1002, false).unwrap_err(),
            Refusal::Shared { limit: 14 }
        );
        // Privileged uids have no cap of their own, and take the reserve.
        held.push(caps.take(0, true).unwrap());
        held.push(caps.take(0, true).unwrap());
        assert_eq!(
            caps.take(0, true).unwrap_err(),
            Refusal::Total { limit: 16 }
        );
        assert_eq!(
            caps.take(1002, false).unwrap_err(),
            Refusal::Total { limit: 16 },
            "the total is checked first"
        );
        // A privileged connection given back frees a privileged place, not a shared one.
        held.pop();
        assert_eq!(
            caps.take(1002, false).unwrap_err(),
            Refusal::Shared { limit: 14 }
        );
        assert!(caps.take(0, true).is_ok());
    }

    #[test]
    fn privileged_uids_may_use_every_place() {
        let caps = caps(8, 1);
        let held: Vec<Held> = (0..8).map(|_| caps.take(0, true).unwrap()).collect();
        assert_eq!(caps.take(0, true).unwrap_err(), Refusal::Total { limit: 8 });
        drop(held);
        assert_eq!(caps.held(0), (0, 0));
    }

    #[test]
    fn refusals_say_which_cap_and_its_limit() {
        assert_eq!(
            Refusal::PerUid {
                uid: 1000,
                limit: 64
            }
            .message(0),
            "too many connections from uid 1000 (limit 64)"
        );
        assert_eq!(
            Refusal::Shared { limit: 896 }.message(998),
            "too many connections from users other than root and uid 998 (limit 896)"
        );
        assert_eq!(
            Refusal::Total { limit: 1024 }.message(0),
            "too many connections (limit 1024)"
        );
    }
}
