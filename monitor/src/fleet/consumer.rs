//! Reading the fleet: the bucket (every observer's verdicts and liveness, a snapshot and then
//! every change) and the event stream. Used by `monitor fleet`, by the publisher to find its
//! own keys, and by the benchmark probe.

use std::time::Duration;

use async_nats::{
    HeaderMap,
    jetstream::{
        self,
        consumer::{AckPolicy, DeliverPolicy, ReplayPolicy, push},
    },
};
use bytes::Bytes;
use futures_util::StreamExt;

use super::{
    FleetError, NatsAuth, STREAM, connect_or_give_up, datetime_ms, kv_stream, options,
    quorum::{Change, FleetView},
    unix_ms, validate_urls,
    wire::{self, FleetEvent, WireError},
};

/// One bucket entry: `value` is `None` for a delete or purge.
#[derive(Debug, Clone)]
pub struct BucketEntry {
    pub key: String,
    pub value: Option<Bytes>,
    /// Unix ms of the write, by the server's clock.
    pub written_ms: f64,
    /// The `Nats-Subject` header, which only the server's reply to a direct get carries: such
    /// an entry is a copy of another key's message that a client had the server send to this
    /// key (a reply subject is not checked against publish permissions), not a write by the
    /// observer the key names. Skipped as malformed.
    pub copied_from: Option<String>,
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
    pub async fn connect(urls: &[String], auth: &NatsAuth) -> Result<Self, FleetError> {
        validate_urls(urls)?;
        // A request the server refuses is answered by nothing (it times out): say why.
        let options = options(auth, "monitor fleet")
            .await?
            .event_callback(|event| async move {
                if let async_nats::Event::ServerError(e) = event {
                    log::warn!("fleet: the NATS server says: {e}");
                }
            });
        let client = connect_or_give_up(options, urls).await?;
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
    /// `None` when the bucket does not exist yet. Read through a consumer of its own, as
    /// [`Fleet::events_from`] says: an error from the reader means it was lost (a NATS node
    /// gone), and the bucket is to be read again.
    pub async fn bucket(
        &self,
        filter: &str,
        follow: bool,
    ) -> Result<Option<BucketReader>, FleetError> {
        let Ok(stream) = self.js.get_stream(kv_stream()).await else {
            return Ok(None);
        };
        let prefix = format!("$KV.{}.", super::BUCKET);
        let (delivery, empty) = Delivery::create(
            &self.js,
            &stream,
            "reading the bucket",
            push::Config {
                filter_subject: format!("{prefix}{filter}"),
                deliver_policy: DeliverPolicy::LastPerSubject,
                ..reader_config()
            },
        )
        .await?;
        Ok(Some(BucketReader {
            delivery,
            prefix,
            current: empty,
            follow,
        }))
    }

    /// The whole bucket now, as a view; each malformed entry is skipped and its error
    /// returned alongside.
    ///
    /// The read ends at the message the server sends with nothing pending after it, or at
    /// the consumer's first idle heartbeat (see `control`: one read in a full test run
    /// received heartbeats for twenty minutes and never a message with nothing pending). A
    /// read that has not come to the bucket's end within [`SNAPSHOT_WITHIN`] all the same is
    /// given up and made again with a new consumer, [`SNAPSHOT_TRIES`] times in all, then an
    /// error.
    pub async fn snapshot(&self) -> Result<Snapshot, FleetError> {
        for _ in 0..SNAPSHOT_TRIES {
            if let Ok(read) = tokio::time::timeout(SNAPSHOT_WITHIN, self.snapshot_once()).await {
                return read;
            }
            log::debug!("fleet: reading the bucket: not done within {SNAPSHOT_WITHIN:?}; again");
        }
        Err(FleetError::JetStream(format!(
            "reading the bucket: not done within {SNAPSHOT_WITHIN:?}, {SNAPSHOT_TRIES} times"
        )))
    }

    async fn snapshot_once(&self) -> Result<Snapshot, FleetError> {
        let as_of_ms = unix_ms();
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
        Ok(Snapshot {
            view,
            malformed,
            as_of_ms,
        })
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
    ///
    /// A consumer of its own, not the client's ordered consumer: after a NATS node is lost,
    /// async-nats 0.51's ordered consumer re-creates itself with 5 s request timeouts and, after
    /// five tries, 10 s between tries, and says nothing meanwhile (a watch was seen silent for over
    /// 60 s after a node crash in tests/tests/fleet.rs, the stream long since led by another node).
    /// Here the subscription is made first, the server sends a heartbeat every
    /// [`READER_HEARTBEAT`], and any sign of trouble (no message or heartbeat for three of them, a
    /// gap in the consumer's sequence, a status from the server) ends the reader with an error, so
    /// that the caller follows the stream again after the last event it took
    /// ([`EventStart::After`]).
    pub async fn events_from(&self, start: EventStart) -> Result<EventReader, FleetError> {
        let stream = loop {
            match self.js.get_stream(STREAM).await {
                Ok(stream) => break stream,
                Err(_) => tokio::time::sleep(Duration::from_millis(250)).await,
            }
        };
        let (delivery, _) = Delivery::create(
            &self.js,
            &stream,
            "following the stream",
            push::Config {
                filter_subject: format!("{}>", wire::EVENT_SUBJECT_PREFIX),
                deliver_policy: match start {
                    EventStart::First => DeliverPolicy::All,
                    EventStart::New => DeliverPolicy::New,
                    EventStart::After(seq) => DeliverPolicy::ByStartSequence {
                        start_sequence: seq + 1,
                    },
                },
                ..reader_config()
            },
        )
        .await?;
        Ok(EventReader {
            delivery,
            last_stream_seq: match start {
                EventStart::After(seq) => seq,
                _ => 0,
            },
        })
    }
}

/// Every reader's consumer: ephemeral, one replica in memory, no acks, heartbeats and flow
/// control (the subject, filter and start are the reader's).
fn reader_config() -> push::Config {
    push::Config {
        ack_policy: AckPolicy::None,
        replay_policy: ReplayPolicy::Instant,
        flow_control: true,
        idle_heartbeat: READER_HEARTBEAT,
        memory_storage: true,
        num_replicas: 1,
        // Left behind by a reader that went away: removed by the server.
        inactive_threshold: Duration::from_secs(30),
        ..Default::default()
    }
}

/// How long one try to create a consumer may take, times the try's number (1.5 s, 3 s,
/// 4.5 s), and how many tries there are.
const CREATE_TRY: Duration = Duration::from_millis(1500);
const CREATE_TRIES: u32 = 3;

/// Creates a consumer with `attempt`, trying again with a new one when the server does not
/// answer in time. After a node of three was killed, about one creation in three went
/// unanswered for over 30 s (5 s timeouts), while a new consumer asked for next was
/// answered in 0.1 s: nats-server 2.9 evidently still places some one-replica consumers
/// (the readers' consumers are) on the dead node of the stream's group (seen in
/// tests/tests/fleet.rs's node crash).
async fn create_consumer<T, E, F>(
    what: &str,
    mut attempt: impl FnMut() -> F,
) -> Result<T, FleetError>
where
    E: std::fmt::Display,
    F: std::future::Future<Output = Result<T, E>>,
{
    let mut last = String::new();
    for n in 1..=CREATE_TRIES {
        let within = CREATE_TRY * n;
        match tokio::time::timeout(within, attempt()).await {
            Ok(Ok(created)) => return Ok(created),
            Ok(Err(e)) => last = e.to_string(),
            Err(_) => last = format!("no answer within {within:?}"),
        }
        log::debug!("fleet: {what}: creating a consumer: {last}; trying again");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(FleetError::js(what, last))
}

/// How long one read of the whole bucket may take, and how many reads a snapshot tries
/// (`Fleet::snapshot`). A few hundred keys are read in milliseconds; the rest is room for a
/// consumer's creation, which may take all of its tries after a node is lost (1.5 + 3 + 4.5 s,
/// `CREATE_TRY`), so that a slow read that would succeed is not given up for a new one.
const SNAPSHOT_WITHIN: Duration = Duration::from_secs(20);
const SNAPSHOT_TRIES: u32 = 3;

/// How often the server sends a heartbeat to an idle reader.
pub const READER_HEARTBEAT: Duration = Duration::from_secs(1);

/// The messages of one reader's consumer, in order, each once; any sign that the consumer
/// is lost or out of step ends it with an error (see [`Fleet::events_from`]).
struct Delivery {
    subscriber: async_nats::Subscriber,
    js: jetstream::Context,
    what: &'static str,
    /// The consumer's sequence number of the last message taken.
    consumer_seq: u64,
    /// When the consumer counts as lost if nothing arrives.
    deadline: tokio::time::Instant,
}

/// Silence after which a reader's consumer counts as lost: three heartbeats.
const SILENCE: Duration = READER_HEARTBEAT.saturating_mul(3);

impl Delivery {
    /// Subscribes, then creates the consumer delivering there; a fresh subscription for
    /// each try, so that a consumer created late by a try given up on delivers to nobody.
    /// Returns, too, whether the consumer had nothing to deliver when it was made: nothing
    /// pending and nothing delivered yet (a consumer may deliver before the server reports
    /// its pending count, which then leaves out what is already on its way; ADR-8's rule).
    async fn create(
        js: &jetstream::Context,
        stream: &jetstream::stream::Stream,
        what: &'static str,
        config: push::Config,
    ) -> Result<(Self, bool), FleetError> {
        let js = js.clone();
        let client = js.client();
        let (subscriber, empty) = create_consumer(what, || {
            let client = client.clone();
            let config = config.clone();
            async move {
                let deliver_subject = client.new_inbox();
                let subscriber = client.subscribe(deliver_subject.clone()).await?;
                let consumer = stream
                    .create_consumer(push::Config {
                        deliver_subject,
                        ..config
                    })
                    .await?;
                let info = consumer.cached_info();
                let empty = info.num_pending == 0 && info.delivered.consumer_sequence == 0;
                Ok::<_, async_nats::Error>((subscriber, empty))
            }
        })
        .await?;
        let delivery = Self {
            subscriber,
            js,
            what,
            consumer_seq: 0,
            deadline: tokio::time::Instant::now() + SILENCE,
        };
        Ok((delivery, empty))
    }

    fn lost(&self, why: String) -> Option<Result<Delivered, FleetError>> {
        Some(Err(FleetError::JetStream(format!("{}: {why}", self.what))))
    }

    /// The next message, or word that the consumer has delivered everything it had; an
    /// error when the consumer is lost or fell out of step, `None` when the connection is
    /// closed.
    async fn next(&mut self) -> Option<Result<Delivered, FleetError>> {
        loop {
            // The deadline is kept across calls: `next` may be cancelled (in a `select!`)
            // and called again any number of times, and nothing after the message is taken
            // waits.
            let message = match tokio::time::timeout_at(self.deadline, self.subscriber.next()).await
            {
                Err(_) => return self.lost(format!("no heartbeat for {SILENCE:?}")),
                Ok(None) => return None,
                Ok(Some(m)) => m,
            };
            self.deadline = tokio::time::Instant::now() + SILENCE;
            if message.status.is_some() {
                match control(&message, self.consumer_seq) {
                    Control::Answer(subject) => {
                        let client = self.js.client();
                        tokio::spawn(async move { client.publish(subject, Bytes::new()).await });
                    }
                    Control::CaughtUp => return Some(Ok(Delivered::CaughtUp)),
                    Control::Lost(why) => return self.lost(why),
                }
                continue;
            }
            let message = jetstream::Message {
                message,
                context: self.js.clone(),
            };
            let consumer_seq = match message.info() {
                Ok(i) => i.consumer_sequence,
                Err(e) => return Some(Err(FleetError::js(self.what, e))),
            };
            if consumer_seq != self.consumer_seq + 1 {
                return self.lost(format!(
                    "message {consumer_seq} of the consumer after {}",
                    self.consumer_seq
                ));
            }
            self.consumer_seq = consumer_seq;
            return Some(Ok(Delivered::Message(message)));
        }
    }
}

/// What a reader's consumer delivered.
// Returned once per message and matched at once, never stored: a box would only add an
// allocation per message.
#[allow(clippy::large_enum_variant)]
enum Delivered {
    /// A stored message.
    Message(jetstream::Message),
    /// An idle heartbeat: the consumer has sent every message it had, all of them taken
    /// here, and waits for new ones.
    CaughtUp,
}

/// What a status message from the server asks of a reader.
#[derive(Debug, PartialEq, Eq)]
enum Control {
    /// Publish an empty message to this subject: a flow-control request's reply subject, or
    /// the one a heartbeat names while the consumer waits for that reply.
    Answer(async_nats::Subject),
    /// An idle heartbeat with nothing owed: everything the consumer had is here.
    CaughtUp,
    /// The consumer is lost or out of step: read again.
    Lost(String),
}

/// Reads a status message (`message.status` is set) of a reader's consumer that has
/// delivered `taken` messages, all taken.
///
/// A flow-control request carries a reply subject. A heartbeat sent while the consumer
/// waits for that reply names its subject in `Nats-Consumer-Stalled`: the reply was lost
/// or not yet sent, and the consumer delivers nothing until one comes, so it is answered
/// again (every NATS client does; unanswered, the consumer stalls for good, heartbeats and
/// all). Any other heartbeat means the consumer had nothing to send for a heartbeat's
/// period, which it tells without relying on the per-message pending count: nats-server
/// 2.9 keeps that count by increments and decrements, and a race with a key's old value
/// being removed (every write removes one, at one value per key) can leave it above 0 for
/// good; a snapshot that waited for it was seen to wait twenty minutes in a test run.
fn control(message: &async_nats::Message, taken: u64) -> Control {
    let header = |name: &str| {
        message
            .headers
            .as_ref()
            .and_then(|h| h.get(name))
            .map(|v| v.as_str().to_string())
    };
    if message.status != Some(async_nats::StatusCode::IDLE_HEARTBEAT) {
        return Control::Lost(format!(
            "the server says {} {}",
            message.status.map(|s| s.to_string()).unwrap_or_default(),
            message.description.as_deref().unwrap_or("")
        ));
    }
    // Only the server's flow-control subjects are answered: a status message naming any
    // other subject would have the reader publish there under its own credentials.
    let flow_control = |subject: &str| {
        subject
            .strip_prefix("$JS.FC.")
            .is_some_and(|rest| !rest.is_empty())
    };
    if let Some(reply) = &message.reply {
        return if flow_control(reply) {
            Control::Answer(reply.clone())
        } else {
            Control::Lost(format!("a flow-control request answered to {reply:?}"))
        };
    }
    // A heartbeat tells the consumer's last sequence number, which must be the last one
    // taken here.
    if let Some(last) = header("Nats-Last-Consumer").and_then(|v| v.parse::<u64>().ok())
        && last != taken
    {
        return Control::Lost(format!(
            "the consumer delivered {last} messages, {taken} arrived"
        ));
    }
    match header("Nats-Consumer-Stalled") {
        None => Control::CaughtUp,
        Some(subject) if flow_control(&subject) => Control::Answer(subject.into()),
        Some(subject) => Control::Lost(format!("a stalled consumer answered to {subject:?}")),
    }
}

/// Applies a bucket entry to a view; a malformed one is described in the error.
pub fn apply(view: &mut FleetView, entry: &BucketEntry) -> Result<Change, String> {
    if let Some(from) = &entry.copied_from {
        return Err(format!(
            "bucket key {:?}: a copy of {from:?} made by the server (a direct get's reply), \
             not a write by its observer",
            entry.key
        ));
    }
    view.apply(&entry.key, entry.value.as_deref(), entry.written_ms)
        .map_err(|e| format!("bucket key {:?}: {e}", entry.key))
}

/// Whether a stream message is a delete or purge marker of the bucket.
fn is_removal(headers: Option<&HeaderMap>) -> bool {
    headers
        .and_then(|h| h.get("KV-Operation"))
        .is_some_and(|op| matches!(op.as_str(), "DEL" | "PURGE"))
}

/// The bucket as [`Fleet::snapshot`] read it.
pub struct Snapshot {
    pub view: FleetView,
    /// The error of each malformed entry (the entry is skipped).
    pub malformed: Vec<String>,
    /// Unix ms when the read began: the time the view stands for, against which observers'
    /// liveness is judged. Not the end of the read: reading a bucket of a mass outage (a
    /// verdict per peer per observer) takes seconds, and judged at its end every observer
    /// looked stale, its verdicts stopped counting, and the fleet held no peer down exactly
    /// when they all were (a CI run: 2000 verdicts, the only observer reported not live).
    pub as_of_ms: f64,
}

/// Entries of the bucket, see [`Fleet::bucket`].
pub struct BucketReader {
    delivery: Delivery,
    prefix: String,
    current: bool,
    follow: bool,
}

impl BucketReader {
    /// Whether every value that existed when reading began has been returned: the last
    /// message pending when it was sent, or the consumer idle with every message taken.
    pub fn current(&self) -> bool {
        self.current
    }

    /// The next entry; `None` once the snapshot is read (without `follow`) or the
    /// connection is gone for good.
    pub async fn next(&mut self) -> Option<Result<BucketEntry, FleetError>> {
        let message = loop {
            if self.current && !self.follow {
                return None;
            }
            match self.delivery.next().await? {
                Ok(Delivered::Message(m)) => break m,
                // Set before the next wait, so that a caller that cancels `next` (in a
                // `select!`) sees it through `current`.
                Ok(Delivered::CaughtUp) => self.current = true,
                Err(e) => return Some(Err(e)),
            }
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
        let copied_from = message
            .headers
            .as_ref()
            .and_then(|h| h.get("Nats-Subject").or_else(|| h.get("Nats-Stream")))
            .map(|v| v.as_str().to_string());
        Some(Ok(BucketEntry {
            key,
            value,
            written_ms,
            copied_from,
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

/// Messages of the event stream, see [`Fleet::events`]: each once, in the stream's order.
pub struct EventReader {
    delivery: Delivery,
    /// The stream's sequence number of the last event returned.
    last_stream_seq: u64,
}

impl EventReader {
    /// The next event; an error when the consumer is lost or fell out of step (follow the
    /// stream again after the last event taken), `None` when the connection is closed.
    pub async fn next(&mut self) -> Option<Result<RawEvent, FleetError>> {
        loop {
            let message = match self.delivery.next().await? {
                Ok(Delivered::Message(m)) => m,
                Ok(Delivered::CaughtUp) => continue,
                Err(e) => return Some(Err(e)),
            };
            let stream_seq = match message.info() {
                Ok(i) => i.stream_sequence,
                Err(e) => return Some(Err(FleetError::js("stream message metadata", e))),
            };
            if stream_seq <= self.last_stream_seq {
                continue;
            }
            self.last_stream_seq = stream_seq;
            return Some(Ok(RawEvent {
                subject: message.subject.to_string(),
                payload: message.payload.clone(),
                stream_seq,
            }));
        }
    }
}

#[cfg(test)]
mod tests {
    use async_nats::{HeaderMap, Message, StatusCode};

    use super::{Control, control};

    /// A status message as nats-server 2.9 sends a push consumer's subscriber.
    fn status(
        code: StatusCode,
        description: &str,
        reply: Option<&str>,
        headers: &[(&str, &str)],
    ) -> Message {
        let mut map = HeaderMap::new();
        for (name, value) in headers {
            map.insert(*name, *value);
        }
        Message {
            subject: "_INBOX.reader".into(),
            reply: reply.map(Into::into),
            payload: Default::default(),
            headers: Some(map),
            status: Some(code),
            description: Some(description.into()),
            length: 0,
        }
    }

    #[test]
    fn a_flow_control_request_is_answered_on_its_reply_subject() {
        let m = status(
            StatusCode::IDLE_HEARTBEAT,
            "FlowControl Request",
            Some("$JS.FC.KV_b.x.1"),
            &[],
        );
        assert_eq!(control(&m, 7), Control::Answer("$JS.FC.KV_b.x.1".into()));
    }

    #[test]
    fn a_heartbeat_of_a_consumer_stalled_on_flow_control_is_answered_not_taken_as_the_end() {
        let m = status(
            StatusCode::IDLE_HEARTBEAT,
            "Idle Heartbeat",
            None,
            &[
                ("Nats-Last-Consumer", "7"),
                ("Nats-Last-Stream", "40"),
                ("Nats-Consumer-Stalled", "$JS.FC.KV_b.x.2"),
            ],
        );
        assert_eq!(control(&m, 7), Control::Answer("$JS.FC.KV_b.x.2".into()));
    }

    #[test]
    fn only_flow_control_subjects_are_answered() {
        let request = status(
            StatusCode::IDLE_HEARTBEAT,
            "FlowControl Request",
            Some("$JS.API.STREAM.PURGE.KV_b"),
            &[],
        );
        assert!(matches!(control(&request, 0), Control::Lost(_)));
        let stalled = status(
            StatusCode::IDLE_HEARTBEAT,
            "Idle Heartbeat",
            None,
            &[("Nats-Consumer-Stalled", "heartbeat.events.obs-b")],
        );
        assert!(matches!(control(&stalled, 0), Control::Lost(_)));
    }

    #[test]
    fn an_idle_heartbeat_after_every_message_is_taken_ends_the_snapshot() {
        let m = status(
            StatusCode::IDLE_HEARTBEAT,
            "Idle Heartbeat",
            None,
            &[("Nats-Last-Consumer", "7"), ("Nats-Last-Stream", "40")],
        );
        assert_eq!(control(&m, 7), Control::CaughtUp);
        // Before the consumer delivered anything, a heartbeat says the same.
        let m = status(StatusCode::IDLE_HEARTBEAT, "Idle Heartbeat", None, &[]);
        assert_eq!(control(&m, 0), Control::CaughtUp);
    }

    #[test]
    fn a_heartbeat_counting_messages_that_did_not_arrive_loses_the_consumer() {
        let m = status(
            StatusCode::IDLE_HEARTBEAT,
            "Idle Heartbeat",
            None,
            &[("Nats-Last-Consumer", "9")],
        );
        let Control::Lost(why) = control(&m, 7) else {
            panic!("a gap must end the reader");
        };
        assert!(why.contains("delivered 9 messages, 7 arrived"), "{why}");
    }

    #[test]
    fn any_other_status_loses_the_consumer() {
        let m = status(
            StatusCode::REQUEST_TERMINATED,
            "Consumer Deleted",
            None,
            &[],
        );
        let Control::Lost(why) = control(&m, 3) else {
            panic!("a deleted consumer must end the reader");
        };
        assert!(
            why.contains("409") && why.contains("Consumer Deleted"),
            "{why}"
        );
    }
}
