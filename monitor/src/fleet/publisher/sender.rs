//! The publisher's sender: the queue's batches out to the stream (every message sent before
//! any ack is awaited), each peer's verdict written once a batch, and the whole state
//! re-published when asked.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    sync::{Arc, atomic::Ordering},
    time::{Duration, Instant},
};

use async_nats::{
    HeaderMap,
    jetstream::{self, context::PublishAckFuture, message::PublishMessage},
};
use bytes::Bytes;
use tokio::sync::watch;

use super::{
    BATCH,
    queue::{Queued, Shared},
};
use crate::{
    agent::Agent,
    detector::tracker::Recovery,
    fleet::{
        FleetError,
        consumer::Fleet,
        ensure_stream_and_bucket, kv_subject, unix_ms,
        wire::{self, Key, Verdict},
    },
    serving::event::Event,
};

/// The phi written for a verdict: infinity (the fixed model) as the largest finite number,
/// as the socket does.
fn finite_phi(phi: f64) -> f64 {
    if phi.is_nan() { 0.0 } else { phi.min(f64::MAX) }
}

pub(super) struct Sender {
    pub(super) agent: Arc<Agent>,
    pub(super) shared: Arc<Shared>,
    pub(super) fleet: Fleet,
    pub(super) js: jetstream::Context,
    pub(super) observer: String,
    pub(super) subject: String,
    /// Part of every message id: this run's start, Unix ms.
    pub(super) boot: u64,
    pub(super) replicas: usize,
    /// Peers this observer has a verdict on in the bucket.
    pub(super) held: BTreeSet<u64>,
    pub(super) connected: watch::Receiver<bool>,
    pub(super) client: async_nats::Client,
    pub(super) last_warning: Option<Instant>,
}

impl Sender {
    pub(super) async fn run(mut self) {
        let mut ready = false;
        let mut backoff = Duration::from_millis(50);
        loop {
            self.wait_connected().await;
            let step = async {
                if !ready {
                    ensure_stream_and_bucket(&self.js, self.replicas).await?;
                    ready = true;
                }
                let reason = self.shared.queue().resync.take();
                if let Some(reason) = reason
                    && let Err(e) = self.resync(reason).await
                {
                    // Try again at the next step.
                    let mut queue = self.shared.queue();
                    queue.resync.get_or_insert(reason);
                    return Err(e);
                }
                self.publish_next().await
            };
            match step.await {
                Ok(true) => backoff = Duration::from_millis(50),
                Ok(false) => {
                    // Nothing queued: wait for events, a resync, or a connection change.
                    let notified = self.shared.wake.notified();
                    let pending = {
                        let q = self.shared.queue();
                        !q.items.is_empty() || q.resync.is_some()
                    };
                    if !pending {
                        tokio::select! {
                            () = notified => {}
                            _ = self.connected.changed() => {}
                        }
                    }
                }
                Err(e) => {
                    self.warn(&e);
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                }
            }
        }
    }

    fn warn(&mut self, e: &FleetError) {
        let now = Instant::now();
        if self
            .last_warning
            .is_none_or(|t| now.duration_since(t) >= Duration::from_secs(10))
        {
            self.last_warning = Some(now);
            let server = self
                .shared
                .server_error
                .lock()
                .expect("server error lock")
                .as_ref()
                .filter(|(t, _)| now.duration_since(*t) < Duration::from_secs(30))
                .map(|(_, m)| format!(" (the server said: {m})"))
                .unwrap_or_default();
            log::warn!(
                "fleet: {e}{server}; retrying ({} events buffered)",
                self.shared.queue().items.len()
            );
        }
    }

    async fn wait_connected(&mut self) {
        while self.client.connection_state() != async_nats::connection::State::Connected {
            tokio::select! {
                _ = self.connected.changed() => {}
                () = tokio::time::sleep(Duration::from_millis(100)) => {}
            }
        }
    }

    /// Publishes the oldest queued batch; `Ok(false)` when nothing is queued.
    async fn publish_next(&mut self) -> Result<bool, FleetError> {
        // Copy the batch out (the drainer keeps pushing); remove it once acknowledged.
        let batch: Vec<(u64, Vec<u8>, Option<VerdictChange>)> = {
            let queue = self.shared.queue();
            if queue.items.is_empty() {
                return Ok(false);
            }
            queue
                .items
                .iter()
                .take(BATCH)
                .map(|item| match &item.what {
                    Queued::Event(e) => (
                        item.seq,
                        wire::event_payload(&self.observer, item.seq, e),
                        verdict_change(e),
                    ),
                    Queued::Resync { reason, suspects } => (
                        item.seq,
                        wire::resync_payload(
                            &self.observer,
                            item.seq,
                            reason,
                            *suspects,
                            unix_ms() as u64,
                        ),
                        None,
                    ),
                })
                .collect()
        };
        let last = batch.last().map_or(0, |b| b.0);
        let mut acks = Vec::with_capacity(batch.len() * 2);
        // A peer's verdict once per batch: its last.
        let mut verdicts: HashMap<u64, Option<Verdict>> = HashMap::new();
        let mut order = Vec::new();
        for (seq, payload, change) in batch {
            let message = PublishMessage::build()
                .payload(payload.into())
                .message_id(format!("{}:{}:{seq}", self.observer, self.boot));
            acks.push(
                self.js
                    .send_publish(self.subject.clone(), message)
                    .await
                    .map_err(|e| FleetError::js("publishing an event", e))?,
            );
            if let Some((id, verdict)) = change
                && verdicts.insert(id, verdict).is_none()
            {
                order.push(id);
            }
        }
        let mut kv_ops = Vec::with_capacity(order.len());
        for id in order {
            let verdict = verdicts.remove(&id).expect("recorded above");
            kv_ops.push((id, verdict.is_some()));
            acks.push(self.write_verdict(id, verdict.as_ref()).await?);
        }
        await_acks(acks).await?;
        for (id, held) in kv_ops {
            if held {
                self.held.insert(id);
            } else {
                self.held.remove(&id);
            }
        }
        let mut queue = self.shared.queue();
        let before = queue.items.len();
        while queue.items.front().is_some_and(|i| i.seq <= last) {
            queue.items.pop_front();
        }
        let published = before - queue.items.len();
        self.shared
            .counters
            .published
            .fetch_add(published as u64, Ordering::Relaxed);
        self.shared
            .counters
            .buffered
            .store(queue.items.len() as u64, Ordering::Relaxed);
        self.shared
            .counters
            .held
            .store(self.held.len() as u64, Ordering::Relaxed);
        Ok(true)
    }

    /// Sends one verdict write (a put, or a delete for `None`); returns its ack.
    async fn write_verdict(
        &self,
        id: u64,
        verdict: Option<&Verdict>,
    ) -> Result<PublishAckFuture, FleetError> {
        let subject = kv_subject(&Key::verdict(id, &self.observer));
        let message = match verdict {
            Some(v) => PublishMessage::build()
                .payload(Bytes::from(serde_json::to_vec(v).unwrap_or_default())),
            None => {
                let mut headers = HeaderMap::new();
                headers.insert("KV-Operation", "DEL");
                PublishMessage::build().headers(headers)
            }
        };
        self.js
            .send_publish(subject, message)
            .await
            .map_err(|e| FleetError::js("writing a verdict", e))
    }

    /// Re-publishes the whole state: a verdict for every peer suspected now, a delete for
    /// every key of this observer that names a peer no longer suspected; then a `resync` event.
    async fn resync(&mut self, reason: &'static str) -> Result<(), FleetError> {
        let lowest = self
            .agent
            .detector()
            .levels
            .as_slice()
            .first()
            .copied()
            .unwrap_or(f64::MAX);
        let now = unix_ms();
        // A pass over every peer: off the runtime's workers, which keep the NATS connection's
        // pings and the sockets going meanwhile.
        let agent = self.agent.clone();
        let suspects = tokio::task::spawn_blocking(move || agent.suspects(lowest))
            .await
            .map_err(|e| FleetError::js("reading the suspects", e))?;
        let current: BTreeMap<u64, Verdict> = suspects
            .into_iter()
            .filter_map(|p| {
                Some((
                    p.id,
                    Verdict {
                        level: p.level?,
                        phi: finite_phi(p.phi),
                        since: now - p.silence_ms,
                        crossed_at: None,
                        at: now as u64,
                    },
                ))
            })
            .collect();
        // Queued the bucket holds for this observer.
        let mut stale = BTreeSet::new();
        if let Some(mut reader) = self
            .fleet
            .bucket(&format!("*.{}", self.observer), false)
            .await?
        {
            while let Some(entry) = reader.next().await {
                let entry = entry?;
                if entry.value.is_none() {
                    continue;
                }
                match Key::parse(&entry.key) {
                    Ok(Key::Verdict { peer, observer })
                        if observer == self.observer && !current.contains_key(&peer) =>
                    {
                        stale.insert(peer);
                    }
                    _ => {}
                }
            }
        }
        let ops: Vec<(u64, Option<&Verdict>)> = current
            .iter()
            .map(|(&id, v)| (id, Some(v)))
            .chain(stale.iter().map(|&id| (id, None)))
            .collect();
        for chunk in ops.chunks(BATCH) {
            let mut acks = Vec::with_capacity(chunk.len());
            for &(id, verdict) in chunk {
                acks.push(self.write_verdict(id, verdict).await?);
            }
            await_acks(acks).await?;
        }
        self.held = current.keys().copied().collect();
        self.shared
            .counters
            .held
            .store(self.held.len() as u64, Ordering::Relaxed);
        self.shared.counters.resyncs.fetch_add(1, Ordering::Relaxed);
        log::info!(
            "fleet: state re-published ({reason}): {} verdicts, {} stale keys deleted",
            current.len(),
            stale.len()
        );
        let mut queue = self.shared.queue();
        queue.push(
            Queued::Resync {
                reason,
                suspects: current.len(),
            },
            &self.shared.counters,
        );
        Ok(())
    }
}

/// A peer's new verdict (`None`: no longer down in this monitor's view).
type VerdictChange = (u64, Option<Verdict>);

/// How an event changes this observer's verdict on a peer: `Some((id, None))` removes it.
fn verdict_change(event: &Event) -> Option<VerdictChange> {
    match event {
        Event::Suspect(s) => Some((
            s.id,
            Some(Verdict {
                level: s.level,
                phi: finite_phi(s.phi),
                since: s.at as f64 - s.silence_ms,
                crossed_at: Some(s.crossed_at),
                at: s.at,
            }),
        )),
        Event::Recover(Recovery { id, .. }) | Event::Forget { id, .. } => Some((*id, None)),
        _ => None,
    }
}

async fn await_acks(acks: Vec<PublishAckFuture>) -> Result<(), FleetError> {
    let acks = acks.into_iter().map(std::future::IntoFuture::into_future);
    for ack in futures_util::future::join_all(acks).await {
        ack.map_err(|e| FleetError::js("acknowledgement", e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_follow_events() {
        let suspect = Event::Suspect(crate::detector::tracker::Suspicion {
            id: 4,
            level: 3.0,
            phi: f64::INFINITY,
            silence_ms: 250.0,
            at: 10_000,
            crossed_at: 9_990.5,
        });
        let (id, v) = verdict_change(&suspect).unwrap();
        let v = v.unwrap();
        assert_eq!(id, 4);
        assert_eq!(v.level, 3.0);
        assert_eq!(v.phi, f64::MAX, "infinity is written as the largest number");
        assert_eq!(v.since, 9_750.0);
        assert_eq!(v.crossed_at, Some(9_990.5));
        // It survives the wire.
        let bytes = serde_json::to_vec(&v).unwrap();
        assert_eq!(Verdict::parse(&bytes).unwrap(), v);
        let recover = Event::Recover(Recovery {
            id: 4,
            level: 3.0,
            silence_ms: 1.0,
            at: 1,
        });
        assert_eq!(verdict_change(&recover), Some((4, None)));
        assert_eq!(verdict_change(&Event::Admit { id: 4, at: 1 }), None);
    }
}
