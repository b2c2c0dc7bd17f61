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
//!
//! This file starts the task and runs its three parts side by side: the drain (the agent's
//! events into the queue), the sender (`sender`: batches out of the queue, verdicts, resyncs)
//! and the liveness record; `queue` holds what they share.

mod queue;
mod sender;

use std::{
    collections::{BTreeSet, VecDeque},
    future::Future,
    pin::Pin,
    sync::{Arc, Mutex, atomic::Ordering},
    task::{Context, Poll},
    time::{Duration, Instant},
};

use async_nats::jetstream;
use tokio::{
    sync::{Notify, broadcast, watch},
    task::JoinHandle,
};

use self::{
    queue::{Counters, Queue, Queued, Shared},
    sender::Sender,
};
use super::{
    FleetConfig, FleetError,
    consumer::Fleet,
    kv_subject, options, unix_ms,
    wire::{self, Key, Liveness},
};
use crate::{agent::Agent, serving::event::Event};

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
                    queue.push(Queued::Event(event), &shared.counters);
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
        // The record is sent in the loop and its ack awaited beside it: a server slow to
        // acknowledge (storing a burst of verdicts) no longer stretches the records' cadence
        // (a second for the tick, up to one more for the ack), which with the 3 s bound left
        // readers under a second to read the bucket.
        match tokio::time::timeout(LIVENESS_INTERVAL, js.publish(subject.clone(), bytes.into()))
            .await
        {
            Ok(Ok(ack)) => {
                tokio::spawn(async move {
                    match tokio::time::timeout(LIVENESS_INTERVAL * 3, ack).await {
                        Ok(Ok(_)) => {}
                        Ok(Err(e)) => log::debug!("fleet: liveness record: {e}"),
                        Err(_) => log::debug!("fleet: liveness record: no ack within 3 s"),
                    }
                });
            }
            Ok(Err(e)) => log::debug!("fleet: liveness record: {e}"),
            Err(_) => log::debug!("fleet: liveness record: not sent within 1 s"),
        }
    }
}
