//! The agent's side of the fleet: a task of its own (off the sweep's task) that takes every
//! event from the agent's broadcast, publishes it to the stream and keeps this observer's
//! verdicts and liveness in the bucket.
//!
//! - Events go into a bounded queue at once (the agent never waits on NATS) and are sent in
//!   batches of up to [`BATCH`]: every message of a batch is sent before any ack is awaited,
//!   and a batch is retried until it is acknowledged whole (the stream drops the duplicates
//!   of a retry by message id). Within a batch a peer's verdict is written once, its last.
//! - While NATS is unreachable the queue holds up to `FleetConfig::buffer` events; past that
//!   the oldest go. Every event has a sequence number, so a drop shows as a gap downstream.
//! - The whole state (every verdict, stale keys deleted) is re-published at start, on every
//!   reconnect, and after any drop (queue overflow or the agent's broadcast lagging); a
//!   `resync` event on the stream tells so.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, VecDeque},
    future::Future,
    pin::Pin,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    task::{Context, Poll},
    time::{Duration, Instant},
};

use async_nats::{
    HeaderMap,
    jetstream::{self, context::PublishAckFuture, message::PublishMessage},
};
use bytes::Bytes;
use tokio::{
    sync::{Notify, broadcast, watch},
    task::JoinHandle,
};

use super::{
    FleetConfig, FleetError,
    consumer::Fleet,
    ensure_stream_and_bucket, kv_subject, options, unix_ms,
    wire::{self, Key, Liveness, Verdict},
};
use crate::{agent::Agent, detector::tracker::Recovery, serving::event::Event};

/// Events sent before their acks are awaited.
pub const BATCH: usize = 2048;
/// How often the observer's liveness record is rewritten.
pub const LIVENESS_INTERVAL: Duration = Duration::from_secs(1);

/// The publisher as one of the agent's tasks: never completes unless it fails to start;
/// aborted when dropped. Without a fleet configuration it waits forever.
pub struct FleetTask {
    handle: Option<JoinHandle<Result<(), FleetError>>>,
}

impl Future for FleetTask {
    type Output = Result<(), FleetError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match &mut self.handle {
            None => Poll::Pending,
            Some(handle) => Pin::new(handle).poll(cx).map(|r| {
                r.unwrap_or_else(|e| Err(FleetError::JetStream(format!("publisher task: {e}"))))
            }),
        }
    }
}

impl Drop for FleetTask {
    fn drop(&mut self) {
        if let Some(handle) = &self.handle {
            handle.abort();
        }
    }
}

/// Subscribes to the agent's events now (so none is missed) and spawns the publisher.
pub fn start(agent: Arc<Agent>, config: Option<FleetConfig>) -> FleetTask {
    let Some(config) = config else {
        return FleetTask { handle: None };
    };
    let events = agent.subscribe();
    FleetTask {
        handle: Some(tokio::spawn(run(agent, config, events))),
    }
}

/// What the queue holds.
enum What {
    Event(Event),
    Resync {
        reason: &'static str,
        suspects: usize,
    },
}

struct Item {
    seq: u64,
    what: What,
}

struct Queue {
    items: VecDeque<Item>,
    next_seq: u64,
    capacity: usize,
    /// Why the whole state must be re-published, if it must.
    resync: Option<&'static str>,
}

impl Queue {
    fn push(&mut self, what: What, counters: &Counters) {
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
struct Counters {
    events: AtomicU64,
    published: AtomicU64,
    dropped: AtomicU64,
    resyncs: AtomicU64,
    held: AtomicU64,
    buffered: AtomicU64,
}

struct Shared {
    queue: Mutex<Queue>,
    wake: Notify,
    counters: Counters,
    /// The last error the server sent (a permissions violation names the subject refused)
    /// and when: a publish the server refuses is only ever answered by a missing ack.
    server_error: Mutex<Option<(Instant, String)>>,
}

impl Shared {
    fn queue(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().expect("fleet queue lock")
    }
}

async fn run(
    agent: Arc<Agent>,
    config: FleetConfig,
    events: broadcast::Receiver<Event>,
) -> Result<(), FleetError> {
    config.validate()?;
    let shared = Arc::new(Shared {
        queue: Mutex::new(Queue {
            items: VecDeque::new(),
            next_seq: 0,
            capacity: config.buffer,
            resync: Some("start"),
        }),
        wake: Notify::new(),
        counters: Counters::default(),
        server_error: Mutex::new(None),
    });
    // Connection changes, from the client's callback: a reconnect means a resync.
    let (connected_tx, connected) = watch::channel(false);
    let callback_shared = shared.clone();
    let ever_connected = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let options = options(&config.auth, &format!("monitor {}", config.observer))
        .await?
        .retry_on_initial_connect()
        .event_callback(move |event| {
            let shared = callback_shared.clone();
            let tx = connected_tx.clone();
            let ever = ever_connected.clone();
            async move {
                match event {
                    async_nats::Event::Connected => {
                        log::info!("fleet: connected to NATS");
                        tx.send_replace(true);
                        // The first connection's resync is the one asked for at start.
                        if ever.swap(true, Ordering::Relaxed) {
                            shared.queue().resync = Some("reconnect");
                            shared.wake.notify_one();
                        }
                    }
                    async_nats::Event::Disconnected => {
                        log::warn!("fleet: disconnected from NATS; buffering events");
                        tx.send_replace(false);
                    }
                    async_nats::Event::ServerError(e) => {
                        let text = e.to_string();
                        let now = Instant::now();
                        let mut last = shared.server_error.lock().expect("server error lock");
                        // The same refusal comes with every retry: said once every 10 s.
                        let repeated = last.as_ref().is_some_and(|(t, m)| {
                            *m == text && now.duration_since(*t) < Duration::from_secs(10)
                        });
                        if !repeated {
                            log::warn!("fleet: the NATS server says: {text}");
                            *last = Some((now, text));
                        }
                    }
                    other => log::info!("fleet: NATS {other}"),
                }
            }
        });
    let client = options
        .connect(config.urls.clone())
        .await
        .map_err(|e| FleetError::Connect {
            urls: config.urls.join(","),
            reason: e.to_string(),
        })?;
    let js = jetstream::ContextBuilder::new()
        .timeout(Duration::from_secs(2))
        .max_ack_inflight(4 * BATCH)
        .backpressure_on_inflight(true)
        .build(client.clone());
    log::info!(
        "fleet: publishing as observer {:?} to {} (stream {}, bucket {})",
        config.observer,
        config.urls.join(","),
        super::STREAM,
        super::BUCKET
    );
    let started = unix_ms() as u64;
    let sender = Sender {
        agent: agent.clone(),
        shared: shared.clone(),
        fleet: Fleet::from_client(client.clone()),
        js: js.clone(),
        observer: config.observer.clone(),
        subject: format!("{}{}", wire::EVENT_SUBJECT_PREFIX, config.observer),
        boot: started,
        replicas: config.replicas,
        held: BTreeSet::new(),
        connected: connected.clone(),
        client: client.clone(),
        last_warning: None,
    };
    tokio::join!(
        drain(events, shared.clone()),
        sender.run(),
        liveness(agent, shared, js, config.observer, started, client),
    );
    Ok(())
}

/// Moves the agent's events into the queue as they come.
async fn drain(mut events: broadcast::Receiver<Event>, shared: Arc<Shared>) {
    loop {
        let first = events.recv().await;
        if matches!(first, Err(broadcast::error::RecvError::Closed)) {
            // The agent is gone; the task is about to be dropped with it.
            return std::future::pending().await;
        }
        let mut queue = shared.queue();
        let mut next = Some(first);
        while let Some(received) = next.take() {
            match received {
                Ok(event) => {
                    shared.counters.events.fetch_add(1, Ordering::Relaxed);
                    queue.push(What::Event(event), &shared.counters);
                }
                Err(broadcast::error::RecvError::Lagged(missed)) => {
                    // Those numbers are never published: the gap shows downstream.
                    queue.next_seq += missed;
                    shared.counters.dropped.fetch_add(missed, Ordering::Relaxed);
                    queue.resync = Some("lagged");
                    log::warn!(
                        "fleet: fell {missed} events behind the agent; re-publishing the state"
                    );
                }
                Err(broadcast::error::RecvError::Closed) => break,
            }
            // Take what is already there under the same lock.
            match events.try_recv() {
                Ok(e) => next = Some(Ok(e)),
                Err(broadcast::error::TryRecvError::Lagged(n)) => {
                    next = Some(Err(broadcast::error::RecvError::Lagged(n)))
                }
                Err(_) => {}
            }
            if queue.items.len().is_multiple_of(BATCH) {
                shared.wake.notify_one();
            }
        }
        shared
            .counters
            .buffered
            .store(queue.items.len() as u64, Ordering::Relaxed);
        drop(queue);
        shared.wake.notify_one();
    }
}

/// Rewrites `observers.<observer>` every second while connected.
async fn liveness(
    agent: Arc<Agent>,
    shared: Arc<Shared>,
    js: jetstream::Context,
    observer: String,
    started: u64,
    client: async_nats::Client,
) {
    let subject = kv_subject(&Key::observer(&observer));
    let mut tick = tokio::time::interval(LIVENESS_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if client.connection_state() != async_nats::connection::State::Connected {
            continue;
        }
        let c = &shared.counters;
        let record = Liveness {
            at: unix_ms() as u64,
            started,
            levels: agent.detector().levels.as_slice().to_vec(),
            suspects: c.held.load(Ordering::Relaxed),
            events: c.events.load(Ordering::Relaxed),
            published: c.published.load(Ordering::Relaxed),
            dropped: c.dropped.load(Ordering::Relaxed),
            resyncs: c.resyncs.load(Ordering::Relaxed),
            buffered: c.buffered.load(Ordering::Relaxed),
        };
        let bytes = serde_json::to_vec(&record).unwrap_or_default();
        let put = async {
            js.publish(subject.clone(), bytes.into())
                .await
                .map_err(|e| e.to_string())?
                .await
                .map_err(|e| e.to_string())
        };
        match tokio::time::timeout(LIVENESS_INTERVAL, put).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => log::debug!("fleet: liveness record: {e}"),
            Err(_) => log::debug!("fleet: liveness record: no ack within 1 s"),
        }
    }
}

/// The phi written for a verdict: infinity (the fixed model) as the largest finite number,
/// as the socket does.
fn finite_phi(phi: f64) -> f64 {
    if phi.is_nan() { 0.0 } else { phi.min(f64::MAX) }
}

struct Sender {
    agent: Arc<Agent>,
    shared: Arc<Shared>,
    fleet: Fleet,
    js: jetstream::Context,
    observer: String,
    subject: String,
    /// Part of every message id: this run's start, Unix ms.
    boot: u64,
    replicas: usize,
    /// Peers this observer has a verdict on in the bucket.
    held: BTreeSet<u64>,
    connected: watch::Receiver<bool>,
    client: async_nats::Client,
    last_warning: Option<Instant>,
}

impl Sender {
    async fn run(mut self) {
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
                    What::Event(e) => (
                        item.seq,
                        wire::event_payload(&self.observer, item.seq, e),
                        verdict_change(e),
                    ),
                    What::Resync { reason, suspects } => (
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
        // What the bucket holds for this observer.
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
            What::Resync {
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
            q.push(What::Event(Event::Admit { id, at: 0 }), &counters);
        }
        assert_eq!(
            q.items.iter().map(|i| i.seq).collect::<Vec<_>>(),
            vec![2, 3]
        );
        assert_eq!(counters.dropped.load(Ordering::Relaxed), 1);
        assert_eq!(q.resync, Some("overflow"));
    }
}
