//! Reading the fleet: the bucket (every observer's verdicts and liveness, a snapshot and then
//! every change) and the event stream. Used by `monitor fleet`, by the publisher to find its
//! own keys, and by the benchmark probe.

use std::{path::Path, time::Duration};

use async_nats::{
    HeaderMap,
    jetstream::{
        self,
        consumer::{DeliverPolicy, ReplayPolicy, push},
    },
};
use bytes::Bytes;
use futures_util::StreamExt;

use super::{
    FleetError, STREAM, datetime_ms, kv_stream, options,
    quorum::{Change, FleetView},
    validate_urls,
    wire::{self, FleetEvent, WireError},
};

/// One bucket entry: `value` is `None` for a delete or purge.
#[derive(Debug, Clone)]
pub struct BucketEntry {
    pub key: String,
    pub value: Option<Bytes>,
    /// Unix ms of the write, by the server's clock.
    pub written_ms: f64,
}

/// One message from the event stream.
#[derive(Debug, Clone)]
pub struct RawEvent {
    pub subject: String,
    pub payload: Bytes,
    /// The stream's sequence number.
    pub stream_seq: u64,
}

impl RawEvent {
    pub fn parse(&self) -> Result<FleetEvent, WireError> {
        FleetEvent::parse(&self.subject, &self.payload)
    }
}

/// A connection to the fleet's NATS servers.
#[derive(Clone)]
pub struct Fleet {
    js: jetstream::Context,
}

impl Fleet {
    /// Connects (fails after a few seconds when no server answers).
    pub async fn connect(urls: &[String], creds: Option<&Path>) -> Result<Self, FleetError> {
        validate_urls(urls)?;
        let options = options(creds, "monitor fleet").await?;
        let client = tokio::time::timeout(Duration::from_secs(5), options.connect(urls.to_vec()))
            .await
            .map_err(|_| "no server answered within 5 s".to_string())
            .and_then(|r| r.map_err(|e| e.to_string()))
            .map_err(|reason| FleetError::Connect {
                urls: urls.join(","),
                reason,
            })?;
        Ok(Self::from_client(client))
    }

    pub(crate) fn from_client(client: async_nats::Client) -> Self {
        Self {
            js: jetstream::ContextBuilder::new()
                .timeout(Duration::from_secs(5))
                .build(client),
        }
    }

    /// Reads bucket entries whose key matches `filter` (NATS wildcards: `*.obs-a`, `71.*`,
    /// `>`): the current value of each key first, then, with `follow`, every change. Returns
    /// `None` when the bucket does not exist yet.
    pub async fn bucket(
        &self,
        filter: &str,
        follow: bool,
    ) -> Result<Option<BucketReader>, FleetError> {
        let Ok(stream) = self.js.get_stream(kv_stream()).await else {
            return Ok(None);
        };
        let prefix = format!("$KV.{}.", super::BUCKET);
        let consumer = stream
            .create_consumer(push::OrderedConfig {
                deliver_subject: self.js.client().new_inbox(),
                filter_subject: format!("{prefix}{filter}"),
                deliver_policy: DeliverPolicy::LastPerSubject,
                replay_policy: ReplayPolicy::Instant,
                ..Default::default()
            })
            .await
            .map_err(|e| FleetError::js("reading the bucket", e))?;
        let initial = consumer.cached_info().num_pending;
        let messages = consumer
            .messages()
            .await
            .map_err(|e| FleetError::js("reading the bucket", e))?;
        Ok(Some(BucketReader {
            messages,
            prefix,
            current: initial == 0,
            follow,
        }))
    }

    /// The whole bucket now, as a view; each malformed entry is skipped and its error
    /// returned alongside.
    pub async fn snapshot(&self) -> Result<(FleetView, Vec<String>), FleetError> {
        let mut view = FleetView::default();
        let mut malformed = Vec::new();
        if let Some(mut reader) = self.bucket(">", false).await? {
            while let Some(entry) = reader.next().await {
                let entry = entry?;
                if let Err(e) = apply(&mut view, &entry) {
                    malformed.push(e);
                }
            }
        }
        Ok((view, malformed))
    }

    /// Follows the event stream: from its first event with `from_start`, else from now.
    /// Waits for the stream to exist.
    pub async fn events(&self, from_start: bool) -> Result<EventReader, FleetError> {
        self.events_from(if from_start {
            EventStart::First
        } else {
            EventStart::New
        })
        .await
    }

    /// Follows the event stream from `start` (see [`EventStart`]). Waits for the stream.
    pub async fn events_from(&self, start: EventStart) -> Result<EventReader, FleetError> {
        let stream = loop {
            match self.js.get_stream(STREAM).await {
                Ok(stream) => break stream,
                Err(_) => tokio::time::sleep(Duration::from_millis(250)).await,
            }
        };
        let consumer = stream
            .create_consumer(push::OrderedConfig {
                deliver_subject: self.js.client().new_inbox(),
                filter_subject: format!("{}>", wire::EVENT_SUBJECT_PREFIX),
                deliver_policy: match start {
                    EventStart::First => DeliverPolicy::All,
                    EventStart::New => DeliverPolicy::New,
                    EventStart::After(seq) => DeliverPolicy::ByStartSequence {
                        start_sequence: seq + 1,
                    },
                },
                replay_policy: ReplayPolicy::Instant,
                ..Default::default()
            })
            .await
            .map_err(|e| FleetError::js("following the stream", e))?;
        let messages = consumer
            .messages()
            .await
            .map_err(|e| FleetError::js("following the stream", e))?;
        Ok(EventReader { messages })
    }
}

/// Applies a bucket entry to a view; a malformed one is described in the error.
pub fn apply(view: &mut FleetView, entry: &BucketEntry) -> Result<Change, String> {
    view.apply(&entry.key, entry.value.as_deref(), entry.written_ms)
        .map_err(|e| format!("bucket key {:?}: {e}", entry.key))
}

/// Whether a stream message is a delete or purge marker of the bucket.
fn is_removal(headers: Option<&HeaderMap>) -> bool {
    headers
        .and_then(|h| h.get("KV-Operation"))
        .is_some_and(|op| matches!(op.as_str(), "DEL" | "PURGE"))
}

/// Entries of the bucket, see [`Fleet::bucket`].
pub struct BucketReader {
    messages: push::Ordered,
    prefix: String,
    current: bool,
    follow: bool,
}

impl BucketReader {
    /// Whether every value that existed when reading began has been returned.
    pub fn current(&self) -> bool {
        self.current
    }

    /// The next entry; `None` once the snapshot is read (without `follow`) or the
    /// connection is gone for good.
    pub async fn next(&mut self) -> Option<Result<BucketEntry, FleetError>> {
        if self.current && !self.follow {
            return None;
        }
        let message = match self.messages.next().await? {
            Ok(m) => m,
            Err(e) => return Some(Err(FleetError::js("reading the bucket", e))),
        };
        let info = match message.info() {
            Ok(i) => i,
            Err(e) => return Some(Err(FleetError::js("bucket message metadata", e))),
        };
        if info.pending == 0 {
            self.current = true;
        }
        let written_ms = datetime_ms(info);
        let key = message
            .subject
            .strip_prefix(self.prefix.as_str())
            .unwrap_or(message.subject.as_str())
            .to_string();
        let value = (!is_removal(message.headers.as_ref())).then(|| message.payload.clone());
        Some(Ok(BucketEntry {
            key,
            value,
            written_ms,
        }))
    }
}

/// Where following the event stream begins.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventStart {
    /// Its first event.
    First,
    /// The next event published.
    New,
    /// The event after this stream sequence number (resuming after an interruption).
    After(u64),
}

/// Messages of the event stream, see [`Fleet::events`].
pub struct EventReader {
    messages: push::Ordered,
}

impl EventReader {
    pub async fn next(&mut self) -> Option<Result<RawEvent, FleetError>> {
        let message = match self.messages.next().await? {
            Ok(m) => m,
            Err(e) => return Some(Err(FleetError::js("following the stream", e))),
        };
        let stream_seq = message.info().map_or(0, |i| i.stream_sequence);
        Some(Ok(RawEvent {
            subject: message.subject.to_string(),
            payload: message.payload.clone(),
            stream_seq,
        }))
    }
}
