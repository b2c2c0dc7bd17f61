//! What the publisher's parts share: the queue of events and resyncs waiting to be sent, its
//! counters, and the last error the server sent.

use std::{
    collections::VecDeque,
    sync::{
        Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::Instant,
};

use tokio::sync::Notify;

use crate::serving::event::Event;

/// Queued the queue holds.
pub(super) enum Queued {
    Event(Event),
    Resync {
        reason: &'static str,
        suspects: usize,
    },
}

pub(super) struct Item {
    pub(super) seq: u64,
    pub(super) what: Queued,
}

pub(super) struct Queue {
    pub(super) items: VecDeque<Item>,
    pub(super) next_seq: u64,
    pub(super) capacity: usize,
    /// Why the whole state must be re-published, if it must.
    pub(super) resync: Option<&'static str>,
}

impl Queue {
    pub(super) fn push(&mut self, what: Queued, counters: &Counters) {
        if self.items.len() >= self.capacity {
            self.items.pop_front();
            counters.dropped.fetch_add(1, Ordering::Relaxed);
            self.resync = Some("overflow");
        }
        self.next_seq += 1;
        self.items.push_back(Item {
            seq: self.next_seq,
            what,
        });
    }
}

#[derive(Default)]
pub(super) struct Counters {
    pub(super) events: AtomicU64,
    pub(super) published: AtomicU64,
    pub(super) dropped: AtomicU64,
    pub(super) resyncs: AtomicU64,
    pub(super) held: AtomicU64,
    pub(super) buffered: AtomicU64,
}

pub(super) struct Shared {
    pub(super) queue: Mutex<Queue>,
    pub(super) wake: Notify,
    pub(super) counters: Counters,
    /// The last error the server sent (a permissions violation names the subject refused)
    /// and when: a publish the server refuses is only ever answered by a missing ack.
    pub(super) server_error: Mutex<Option<(Instant, String)>>,
}

impl Shared {
    pub(super) fn queue(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().expect("fleet queue lock")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_queue_drops_the_oldest_and_asks_for_a_resync() {
        let counters = Counters::default();
        let mut q = Queue {
            items: VecDeque::new(),
            next_seq: 0,
            capacity: 2,
            resync: None,
        };
        for id in 0..3 {
            q.push(Queued::Event(Event::Admit { id, at: 0 }), &counters);
        }
        assert_eq!(
            q.items.iter().map(|i| i.seq).collect::<Vec<_>>(),
            vec![2, 3]
        );
        assert_eq!(counters.dropped.load(Ordering::Relaxed), 1);
        assert_eq!(q.resync, Some("overflow"));
    }
}
