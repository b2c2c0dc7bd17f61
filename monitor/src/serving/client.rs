//! The client side of the agent's socket, socket protocol version 1 (docs/socket-protocol.md):
//! a blocking [`Client`] for requests and replies, and a [`Subscriber`] that follows the
//! agent's events without losing any.
//!
//! ```no_run
//! use monitor::serving::client::{Client, Subscriber, Update};
//! use monitor::serving::event::Event;
//!
//! # fn main() -> Result<(), monitor::serving::client::ClientError> {
//! let socket = std::path::Path::new(monitor::DEFAULT_SOCKET);
//! // Requests: typed replies; an error reply is `ClientError::Agent`.
//! let mut client = Client::open(socket)?;
//! for peer in client.suspects(Some(3.0))? {
//!     println!("peer {} phi {:.1}", peer.id, peer.phi);
//! }
//! // Events: the suspect set first (and again after `lagged` or a reconnection), then events.
//! for update in Subscriber::new(socket).threshold(3.0) {
//!     match update? {
//!         Update::Resync { suspects, .. } => println!("{} suspected", suspects.len()),
//!         Update::Event(Event::Suspect(s)) => println!("peer {} at level {}", s.id, s.level),
//!         Update::Event(Event::Recover(r)) => println!("peer {} heard again", r.id),
//!         Update::Disconnected(why) => eprintln!("not following: {why}"),
//!         _ => {}
//!     }
//! }
//! # Ok(())
//! # }
//! ```
//!
//! The request, reply and event types are the agent's own: [`Request`],
//! [`PeerView`], [`AgentStats`] and [`Event`]. [`Client::open`] and the [`Subscriber`] refuse
//! an agent of another major protocol version ([`ClientError::Version`]); [`Client::connect`]
//! does not ask (the raw lines of `monitor query` and the tests).

use std::{
    io::{self, BufRead, BufReader, Write},
    os::unix::net::UnixStream,
    path::{Path, PathBuf},
    thread,
    time::Duration,
};

use serde::de::DeserializeOwned;
use serde_json::{Value, json};

pub use super::event::Event;
pub use super::peer_view::PeerView;
pub use super::protocol::{AgentStats, PROTOCOL_VERSION, Request};

/// One connection to the agent's socket: one request and one reply per line, in order.
pub struct Client {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

/// What went wrong, each cause said once: the message includes the underlying error, so
/// `source()` is empty and a chain printer (`{:#}` of anyhow) does not repeat it.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("connecting to the agent at {path}: {error}{}", connect_hint(.error))]
    Connect { path: String, error: io::Error },
    #[error("talking to the agent: {0}")]
    Io(io::Error),
    #[error("the agent closed the connection")]
    Closed,
    #[error("the agent sent a line that is not JSON: {0}")]
    BadReply(serde_json::Error),
    /// An error reply (`{"ok":false,"error":...}`): the agent's message, and whether it said
    /// the request may simply be repeated (`"busy":true`: a peer's slot kept changing while
    /// it was read).
    #[error("{message}")]
    Agent { message: String, busy: bool },
    /// An ok reply whose result is not what this client expects.
    #[error("unexpected reply from the agent: {0}")]
    Unexpected(String),
    /// The agent speaks another major version of the socket protocol.
    #[error(
        "the agent speaks socket protocol version {agent}; this client speaks version {}: \
         upgrade the client or the agent so they agree",
        PROTOCOL_VERSION
    )]
    Version { agent: u64 },
}

impl ClientError {
    /// Whether this is the agent's busy reply (repeat the request).
    pub fn is_busy(&self) -> bool {
        matches!(self, ClientError::Agent { busy: true, .. })
    }
}

/// Refuses a `stats` object of another major protocol version than [`PROTOCOL_VERSION`]; an
/// agent that does not report `protocol` speaks version 1.
pub fn check_protocol(stats: &Value) -> Result<(), ClientError> {
    let agent = match stats.get("protocol") {
        None => 1,
        Some(v) => v.as_u64().ok_or(ClientError::Version { agent: 0 })?,
    };
    if agent == u64::from(PROTOCOL_VERSION) {
        Ok(())
    } else {
        Err(ClientError::Version { agent })
    }
}

/// How often [`Client`]'s typed `peer`, `peers` and `suspects` repeat a busy request.
const BUSY_RETRIES: usize = 100;

impl From<io::Error> for ClientError {
    fn from(error: io::Error) -> Self {
        ClientError::Io(error)
    }
}

/// What to check when the socket cannot be reached.
fn connect_hint(error: &io::Error) -> &'static str {
    match error.kind() {
        io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused => {
            " (is `monitor run` running?)"
        }
        io::ErrorKind::PermissionDenied => {
            " (the socket serves root, the agent's user and its --socket-group)"
        }
        _ => "",
    }
}

impl Client {
    /// Connects and checks the agent's protocol version (one `stats` request).
    pub fn open(path: &Path) -> Result<Self, ClientError> {
        let mut client = Self::connect(path)?;
        client.stats()?;
        Ok(client)
    }

    /// Connects without asking anything (10 s read timeout).
    pub fn connect(path: &Path) -> Result<Self, ClientError> {
        let stream = UnixStream::connect(path).map_err(|error| ClientError::Connect {
            path: path.display().to_string(),
            error,
        })?;
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        Ok(Self {
            reader: BufReader::new(stream.try_clone()?),
            writer: stream,
        })
    }

    /// Sends one raw line and returns the raw reply line (without the newline).
    pub fn request_line(&mut self, line: &str) -> Result<String, ClientError> {
        self.writer.write_all(line.as_bytes())?;
        self.writer.write_all(b"\n")?;
        self.read_line()
    }

    /// Reads one line (an event on a subscribed connection).
    pub fn read_line(&mut self) -> Result<String, ClientError> {
        let mut line = String::new();
        if self.reader.read_line(&mut line)? == 0 {
            return Err(ClientError::Closed);
        }
        Ok(line.trim_end().to_string())
    }

    /// Waits at most `timeout` for each reply or event (None: forever).
    pub fn set_read_timeout(&mut self, timeout: Option<Duration>) -> Result<(), ClientError> {
        self.writer.set_read_timeout(timeout)?;
        Ok(())
    }

    /// Sends a request and parses the reply as JSON (whether ok or not).
    pub fn request(&mut self, request: &Value) -> Result<Value, ClientError> {
        let line = self.request_line(&request.to_string())?;
        serde_json::from_str(&line).map_err(ClientError::BadReply)
    }
}

impl Client {
    /// Sends a request; returns the ok reply whole, or the error reply as
    /// [`ClientError::Agent`].
    pub fn call(&mut self, request: &Value) -> Result<Value, ClientError> {
        let reply = self.request(request)?;
        if reply.get("ok") == Some(&Value::Bool(true)) {
            return Ok(reply);
        }
        Err(ClientError::Agent {
            message: reply
                .get("error")
                .and_then(Value::as_str)
                .unwrap_or("malformed reply from the agent")
                .to_string(),
            busy: super::protocol::is_busy(&reply),
        })
    }

    /// `call`, and the result under `key` as a `T`; a busy reply is repeated.
    fn typed<T: DeserializeOwned>(&mut self, request: &Value, key: &str) -> Result<T, ClientError> {
        let mut tries = 0;
        let mut reply = loop {
            match self.call(request) {
                Err(e) if e.is_busy() && tries < BUSY_RETRIES => {
                    tries += 1;
                    thread::sleep(Duration::from_millis(5));
                }
                other => break other?,
            }
        };
        let value = reply
            .get_mut(key)
            .map(Value::take)
            .ok_or_else(|| ClientError::Unexpected(format!("no `{key}` in the reply")))?;
        serde_json::from_value(value).map_err(|e| ClientError::Unexpected(format!("{key}: {e}")))
    }

    /// One peer (`peer`).
    pub fn peer(&mut self, id: u64) -> Result<PeerView, ClientError> {
        self.typed(&json!({"op": "peer", "id": id}), "peer")
    }

    /// Every peer, sorted by id (`peers`).
    pub fn peers(&mut self) -> Result<Vec<PeerView>, ClientError> {
        self.typed(&json!({"op": "peers"}), "peers")
    }

    /// The peers whose phi is at least `threshold`, by default the agent's highest level
    /// (`suspects`).
    pub fn suspects(&mut self, threshold: Option<f64>) -> Result<Vec<PeerView>, ClientError> {
        let request = match threshold {
            Some(t) => json!({"op": "suspects", "threshold": t}),
            None => json!({"op": "suspects"}),
        };
        self.typed(&request, "suspects")
    }

    /// The agent's and the kernel's counters (`stats`); refuses another protocol version.
    pub fn stats(&mut self) -> Result<AgentStats, ClientError> {
        let reply = self.call(&json!({"op": "stats"}))?;
        let stats = reply
            .get("stats")
            .ok_or_else(|| ClientError::Unexpected("no `stats` in the reply".into()))?;
        check_protocol(stats)?;
        serde_json::from_value(stats.clone())
            .map_err(|e| ClientError::Unexpected(format!("stats: {e}")))
    }

    /// Stops watching a peer (`forget`).
    pub fn forget(&mut self, id: u64) -> Result<(), ClientError> {
        self.call(&json!({"op": "forget", "id": id}))?;
        Ok(())
    }

    /// Turns this connection into a stream of events (`subscribe`); read them with
    /// [`Client::read_line`], or use a [`Subscriber`].
    pub fn subscribe(&mut self) -> Result<(), ClientError> {
        self.call(&json!({"op": "subscribe"}))?;
        Ok(())
    }
}

/// Why a [`Subscriber`] hands over the suspect set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResyncReason {
    /// The first subscription.
    Connected,
    /// Subscribed again after the connection ended (the agent restarted, most likely).
    Reconnected,
    /// The agent dropped `missed` events for this subscriber, which read too slowly.
    Lagged { missed: u64 },
}

/// What a [`Subscriber`] yields.
#[derive(Debug, Clone, PartialEq)]
pub enum Update {
    /// The suspect set at the subscriber's threshold as the agent says now (every peer it
    /// watches, with [`Subscriber::every_peer`]): take it as the state in place of what you
    /// held. Peers you hold as suspected that are not in it were heard meanwhile. `stats` is
    /// the agent's at this subscription.
    Resync {
        reason: ResyncReason,
        suspects: Vec<PeerView>,
        stats: Box<AgentStats>,
    },
    /// One of the agent's events, in order (never `lagged`: that becomes a `Resync`).
    Event(Event),
    /// An event line this client does not know (a newer agent of the same major version).
    Unknown(Value),
    /// The agent cannot be reached or the connection ended: why. Said once per outage; the
    /// subscriber retries by itself.
    Disconnected(String),
}

/// A subscription that loses nothing (docs/socket-protocol.md, "A consumer that loses
/// nothing"): it subscribes first, then reads the suspect set on a second connection (every
/// change after the subscription arrives as an event as well); after `lagged`, and after
/// reconnecting to a restarted agent, it reads the set again. Reconnections wait
/// [`Subscriber::retry`] at first, twice as long each time up to its maximum.
///
/// As an iterator it blocks for each update; an `Err` is final (the agent's protocol version
/// differs, [`ClientError::Version`]) and ends the iteration.
pub struct Subscriber {
    socket: PathBuf,
    threshold: Option<f64>,
    every_peer: bool,
    retry: Duration,
    max_retry: Duration,
    delay: Duration,
    events: Option<Client>,
    connections: u64,
    told: bool,
    done: bool,
}

impl Subscriber {
    /// A subscriber to the agent at `socket`, with the suspect set at the agent's highest
    /// level, retrying after 100 ms up to 5 s. Nothing is connected until the first `next`.
    pub fn new(socket: &Path) -> Self {
        Self {
            socket: socket.to_path_buf(),
            threshold: None,
            every_peer: false,
            retry: Duration::from_millis(100),
            max_retry: Duration::from_secs(5),
            delay: Duration::from_millis(100),
            events: None,
            connections: 0,
            told: false,
            done: false,
        }
    }

    /// The threshold of the suspect set (your lowest level).
    pub fn threshold(mut self, threshold: f64) -> Self {
        self.threshold = Some(threshold);
        self
    }

    /// Resyncs with every peer the agent watches (`peers`) instead of the suspect set, for a
    /// consumer that keeps every peer's state: the peers below every level too, and their
    /// addresses (`monitor haproxy-agent` answers for servers named by address). The
    /// threshold is then not used.
    pub fn every_peer(mut self) -> Self {
        self.every_peer = true;
        self
    }

    /// The first wait before reconnecting, and the longest.
    pub fn retry(mut self, first: Duration, max: Duration) -> Self {
        self.retry = first;
        self.max_retry = max.max(first);
        self.delay = first;
        self
    }

    /// Whether the subscription is live now.
    pub fn connected(&self) -> bool {
        self.events.is_some()
    }

    /// The agent's stats and its suspect set (or every peer), from a connection of its own.
    fn snapshot(&self) -> Result<(AgentStats, Vec<PeerView>), ClientError> {
        let mut client = Client::connect(&self.socket)?;
        let stats = client.stats()?;
        if self.every_peer {
            // Tens of thousands of peers are a reply of megabytes, written while the agent
            // sweeps: more than the usual wait.
            client.set_read_timeout(Some(Duration::from_secs(30)))?;
            return Ok((stats, client.peers()?));
        }
        Ok((stats, client.suspects(self.threshold)?))
    }

    fn subscribe(&mut self) -> Result<Update, ClientError> {
        let mut events = Client::connect(&self.socket)?;
        events.subscribe()?;
        // After subscribing: whatever changes from here on arrives as an event as well.
        let (stats, suspects) = self.snapshot()?;
        events.set_read_timeout(None)?;
        self.events = Some(events);
        self.connections += 1;
        let reason = if self.connections == 1 {
            ResyncReason::Connected
        } else {
            ResyncReason::Reconnected
        };
        Ok(Update::Resync {
            reason,
            suspects,
            stats: Box::new(stats),
        })
    }

    fn read(&mut self) -> Result<Update, ClientError> {
        let events = self.events.as_mut().ok_or(ClientError::Closed)?;
        let line = events.read_line()?;
        let value: Value = serde_json::from_str(&line).map_err(ClientError::BadReply)?;
        if value.get("event") == Some(&json!("lagged")) {
            let missed = value.get("missed").and_then(Value::as_u64).unwrap_or(0);
            let (stats, suspects) = self.snapshot()?;
            return Ok(Update::Resync {
                reason: ResyncReason::Lagged { missed },
                suspects,
                stats: Box::new(stats),
            });
        }
        Ok(match serde_json::from_value::<Event>(value.clone()) {
            Ok(event) => Update::Event(event),
            Err(_) => Update::Unknown(value),
        })
    }

    /// The next update, blocking; `Err` only for a final refusal.
    pub fn next_update(&mut self) -> Result<Update, ClientError> {
        loop {
            let attempt = if self.events.is_some() {
                self.read()
            } else {
                self.subscribe()
            };
            match attempt {
                Ok(update) => {
                    self.told = false;
                    self.delay = self.retry;
                    return Ok(update);
                }
                Err(e @ ClientError::Version { .. }) => {
                    self.events = None;
                    return Err(e);
                }
                Err(e) => {
                    let was_live = self.events.take().is_some();
                    let tell = !self.told;
                    self.told = true;
                    if !was_live {
                        thread::sleep(self.delay);
                        self.delay = (self.delay * 2).min(self.max_retry);
                    }
                    if tell {
                        return Ok(Update::Disconnected(e.to_string()));
                    }
                }
            }
        }
    }
}

impl Iterator for Subscriber {
    type Item = Result<Update, ClientError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let update = self.next_update();
        self.done = update.is_err();
        Some(update)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn another_major_version_is_refused() {
        assert!(check_protocol(&json!({"protocol": 1})).is_ok());
        assert!(check_protocol(&json!({})).is_ok());
        let err = check_protocol(&json!({"protocol": 2})).unwrap_err();
        assert!(matches!(err, ClientError::Version { agent: 2 }), "{err}");
        assert!(err.to_string().contains("version 2"), "{err}");
    }

    #[test]
    fn events_read_back_as_they_are_written() {
        let line = r#"{"event":"suspect","id":4,"level":1.0,"phi":1.02,"silence_ms":150.3,"at":1795981530123,"crossed_at":1795981530101.4}"#;
        let event: Event = serde_json::from_str(line).unwrap();
        assert!(matches!(event, Event::Suspect(ref s) if s.id == 4 && s.level == 1.0));
        assert_eq!(
            serde_json::to_value(&event).unwrap(),
            serde_json::from_str::<Value>(line).unwrap()
        );
        let event: Event = serde_json::from_str(r#"{"event":"lagged","missed":3}"#).unwrap();
        assert_eq!(event, Event::Lagged { missed: 3 });
    }
}
