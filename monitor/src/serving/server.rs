//! The Unix socket: binding it safely, and serving newline-delimited JSON requests.

use std::{
    io,
    os::unix::fs::{FileTypeExt, PermissionsExt},
    path::{Path, PathBuf},
    sync::Arc,
};

use bytes::BytesMut;
use futures_util::StreamExt;
use serde_json::Value;
use tokio::{
    io::AsyncWriteExt,
    net::{
        UnixListener, UnixStream,
        unix::{ReadHalf, WriteHalf},
    },
    sync::broadcast,
    time::Instant,
};
use tokio_util::codec::{Decoder, FramedRead, LinesCodec, LinesCodecError};

use monitor_common::maps::ArrivalRecord;

use crate::{
    serving::access::AccessPolicy,
    serving::event::Event,
    serving::limits::{Caps, CutOff, Limits, Refusal},
    serving::peer_view::PeerView,
    serving::protocol::{INVALID_OP, MAX_REQUEST_BYTES, Request, error_reply, parse_request},
    serving::recording::{ArrivalLine, RecordingGuard},
};

#[derive(Debug, thiserror::Error)]
pub enum BindError {
    #[error("socket path {0} is in use by a running agent (stop it, or pick another --socket)")]
    InUse(PathBuf),
    #[error("socket path {0} exists and is not a socket; refusing to replace it")]
    NotASocket(PathBuf),
    #[error("binding {path}: {source}")]
    Bind { path: PathBuf, source: io::Error },
}

/// A bound listener that removes its socket file when dropped.
pub struct SocketGuard {
    path: PathBuf,
}

impl Drop for SocketGuard {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Binds `path` (mode 0660; group `group` if given), replacing a stale socket file left by a
/// dead agent but never a live one.
pub fn bind(path: &Path, group: Option<u32>) -> Result<(UnixListener, SocketGuard), BindError> {
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(BindError::NotASocket(path.into()));
        }
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(BindError::InUse(path.into()));
        }
        std::fs::remove_file(path).map_err(|source| BindError::Bind {
            path: path.into(),
            source,
        })?;
    }
    let bind_err = |source| BindError::Bind {
        path: path.into(),
        source,
    };
    let listener = UnixListener::bind(path).map_err(bind_err)?;
    let guard = SocketGuard { path: path.into() };
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660)).map_err(bind_err)?;
    if let Some(gid) = group {
        std::os::unix::fs::chown(path, None, Some(gid)).map_err(bind_err)?;
    }
    Ok((listener, guard))
}

/// What a request turns into.
pub enum Response {
    /// One reply line.
    Reply(Value),
    /// One reply line with a long list in it, made and written a chunk at a time.
    List(ListReply),
    /// A reply line, then every event from this receiver for as long as the client stays.
    Subscribe(Value, broadcast::Receiver<Event>),
    /// A reply line, then the recording's arrivals until it ends or the client hangs up.
    Record(Value, Recording),
}

/// Peers written to the socket at a time in a list reply (about 100 KiB of JSON): what a
/// client that does not read pins of its reply, besides the socket's own buffer.
pub const LIST_CHUNK: usize = 256;

/// A reply holding a list of peers (`peers`, `suspects`), serialized a chunk of `LIST_CHUNK`
/// peers at a time as the socket drains, never built whole. Its bytes are exactly those of
/// the reply with the list in it (`envelope` with `key` set to the peers), one line.
pub struct ListReply {
    /// The envelope's text up to the list, `[` included.
    head: String,
    peers: Vec<PeerView>,
    /// From the list's `]` on.
    tail: String,
}

impl ListReply {
    pub fn new(mut envelope: Value, key: &str, peers: Vec<PeerView>) -> Self {
        // The envelope is printed as it always was (keys in order) with a mark for the list,
        // and cut at the mark: the head and tail are what surrounded the list before.
        const MARK: &str = "\u{1}list\u{1}";
        envelope[key] = Value::String(MARK.into());
        let text = envelope.to_string();
        let mark = serde_json::to_string(MARK).expect("a string serializes");
        let (head, tail) = text
            .split_once(&mark)
            .expect("the mark is in the printed envelope");
        Self {
            head: format!("{head}["),
            peers,
            tail: format!("]{tail}"),
        }
    }

    /// Appends chunk `n` of the line (`n` from 0 while it returns true) to `out`.
    fn chunk(&self, n: usize, out: &mut Vec<u8>) -> io::Result<bool> {
        let chunks = self.peers.len().div_ceil(LIST_CHUNK);
        if n == 0 {
            out.extend_from_slice(self.head.as_bytes());
        }
        let from = n * LIST_CHUNK;
        for (i, peer) in self.peers.iter().enumerate().skip(from).take(LIST_CHUNK) {
            if i > 0 {
                out.push(b',');
            }
            // Straight from the view: its fields are declared in the order a Value prints them
            // (sorted), so the bytes are those of the whole reply built as a Value, without
            // a map and a string a key for every peer.
            serde_json::to_writer(&mut *out, peer).map_err(io::Error::other)?;
        }
        let last = n + 1 >= chunks;
        if last {
            out.extend_from_slice(self.tail.as_bytes());
            out.push(b'\n');
        }
        Ok(!last)
    }

    /// The whole line, as a client reads it (unit tests).
    #[cfg(test)]
    pub(crate) fn text(&self) -> String {
        let mut out = Vec::new();
        let mut n = 0;
        while self.chunk(n, &mut out).expect("a peer serializes") {
            n += 1;
        }
        String::from_utf8(out).expect("JSON is UTF-8")
    }
}

/// An open recording (see `recording`): whose arrivals, from where, until when.
pub struct Recording {
    pub ids: std::collections::HashSet<u64>,
    pub arrivals: broadcast::Receiver<ArrivalRecord>,
    pub until: Option<tokio::time::Instant>,
    /// Stops counting the ids as wanted when the recording ends, however it ends.
    pub guard: RecordingGuard,
}

/// Answers requests; implemented by the agent.
pub trait Handler: Send + Sync + 'static {
    fn handle(&self, request: Request) -> Response;

    /// The answer now, on the runtime's worker, for a request that needs nothing held by
    /// another: it must not wait for any lock or retry; `None` hands the request to
    /// [`Handler::handle`] on a blocking thread.
    fn try_handle(&self, _request: &Request) -> Option<Response> {
        None
    }

    /// A client connected (`true`) or went away (`false`); for the metrics.
    fn client(&self, _connected: bool) {}

    /// A client was refused, by the access policy or a cap; for the metrics.
    fn refused(&self, _why: Refusal) {}

    /// A client was cut off: idle, or too slow to take what was written; for the metrics.
    fn cut_off(&self, _why: CutOff) {}

    /// A request of `op` (`Request::op`, or `INVALID_OP`) was answered `took` after its line
    /// was read (for `subscribe` and `record`, the first reply); for the metrics.
    fn answered(&self, _op: &'static str, _took: std::time::Duration) {}
}

/// Descriptors the agent needs besides its socket clients (maps, rings, the metrics server's
/// connections, the fleet's).
const FD_HEADROOM: u64 = 256;

/// Raises the soft limit on open files towards the hard one, so `max_clients` connections fit;
/// says so if they cannot.
pub fn make_room_for(max_clients: usize) {
    let want = max_clients as u64 + FD_HEADROOM;
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit on a local struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return;
        }
        if limit.rlim_cur < want {
            let raised = libc::rlimit {
                rlim_cur: want.min(limit.rlim_max),
                rlim_max: limit.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                limit = raised;
            }
        }
    }
    if limit.rlim_cur < want {
        log::warn!(
            "the agent may open {} files, fewer than the {want} that --socket-max-clients {max_clients} needs; \
             raise the limit (LimitNOFILE=) or lower --socket-max-clients",
            limit.rlim_cur
        );
    }
}

/// Refusals are logged at most this often (a flood of connections would flood the log).
const REFUSAL_LOG_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// Accepts clients forever, each on its own task. Accept never waits: a client over a cap
/// (`Limits`) is answered with an error line at once and closed.
pub async fn serve<H: Handler>(
    listener: UnixListener,
    handler: Arc<H>,
    policy: AccessPolicy,
    limits: Limits,
) -> io::Result<()> {
    let caps = Caps::new(limits);
    let mut logged: Option<std::time::Instant> = None;
    let mut unlogged = 0u64;
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // EMFILE and friends: keep serving the clients we have.
                log::warn!("accept on the agent socket: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let cred = stream.peer_cred().ok();
        let uid = cred.map_or(u32::MAX, |c| c.uid());
        let allowed = cred
            .is_some_and(|c| policy.allows(c.uid(), c.gid(), &super::access::peer_groups(&stream)));
        let privileged = allowed && (uid == 0 || uid == policy.agent_uid);
        let held = match caps.take(uid, privileged) {
            Ok(held) => held,
            Err(refusal) => {
                handler.refused(refusal);
                let message = if allowed {
                    refusal.message(policy.agent_uid)
                } else {
                    denied(&policy)
                };
                unlogged += 1;
                if logged.is_none_or(|at| at.elapsed() >= REFUSAL_LOG_EVERY) {
                    log::warn!("refused {unlogged} socket client(s) of late; last: {message}");
                    (logged, unlogged) = (Some(std::time::Instant::now()), 0);
                }
                // At once, without waiting: the socket's buffer is empty, the line fits.
                let mut line = error_reply(message).to_string();
                line.push('\n');
                let _ = stream.try_write(line.as_bytes());
                continue;
            }
        };
        if !allowed {
            log::warn!("refused a socket client: not {}", policy.describe());
            handler.refused(Refusal::Policy);
            tokio::spawn(async move {
                refuse(stream, policy).await;
                drop(held);
            });
            continue;
        }
        let handler = handler.clone();
        tokio::spawn(async move {
            handler.client(true);
            if let Err(e) = serve_client(stream, &handler, limits).await {
                if e.kind() == io::ErrorKind::TimedOut {
                    handler.cut_off(CutOff::WriteTimeout);
                }
                log::debug!("client: {e}");
            }
            handler.client(false);
            drop(held);
        });
    }
}

fn denied(policy: &AccessPolicy) -> String {
    format!(
        "permission denied: this socket serves {}",
        policy.describe()
    )
}

/// A request line, or why a line could not be one. Line-level problems are items, not stream
/// errors: a framed stream stops after an error, and a bad line must not end the connection.
type RequestLine = Result<String, String>;

/// Newline-delimited requests with a length limit, built on `LinesCodec`.
struct RequestCodec(LinesCodec);

impl RequestCodec {
    fn new() -> Self {
        Self(LinesCodec::new_with_max_length(MAX_REQUEST_BYTES))
    }

    fn map(result: Result<Option<String>, LinesCodecError>) -> io::Result<Option<RequestLine>> {
        match result {
            Ok(line) => Ok(line.map(Ok)),
            // The codec discards the rest of the long line and then goes on.
            Err(LinesCodecError::MaxLineLengthExceeded) => Ok(Some(Err(format!(
                "request longer than {MAX_REQUEST_BYTES} bytes"
            )))),
            // The codec has already consumed the offending line.
            Err(LinesCodecError::Io(e)) if e.kind() == io::ErrorKind::InvalidData => {
                Ok(Some(Err("request is not valid UTF-8".into())))
            }
            Err(LinesCodecError::Io(e)) => Err(e),
        }
    }
}

impl Decoder for RequestCodec {
    type Item = RequestLine;
    type Error = io::Error;

    fn decode(&mut self, buf: &mut BytesMut) -> io::Result<Option<RequestLine>> {
        Self::map(self.0.decode(buf))
    }

    fn decode_eof(&mut self, buf: &mut BytesMut) -> io::Result<Option<RequestLine>> {
        Self::map(self.0.decode_eof(buf))
    }
}

/// Tells a client it may not ask, and hangs up. Its first request is read (for a second at
/// most) before the answer, so the client is not cut off mid-write and sees why.
async fn refuse(mut stream: UnixStream, policy: AccessPolicy) {
    let (read, mut write) = stream.split();
    let mut lines = FramedRead::with_capacity(read, RequestCodec::new(), READ_BUFFER);
    let _ = tokio::time::timeout(std::time::Duration::from_secs(1), lines.next()).await;
    let deadline = Instant::now() + std::time::Duration::from_secs(1);
    let _ = write_value(&mut write, &error_reply(denied(&policy)), deadline).await;
}

/// A connection's read buffer to start with (it grows to the longest request, 64 KiB at most):
/// small, so a thousand idle connections cost little.
const READ_BUFFER: usize = 512;

type Lines<'a> = FramedRead<ReadHalf<'a>, RequestCodec>;

/// Writes all of `bytes` by `deadline`, else fails with `TimedOut` (the client is cut off).
async fn write_by(out: &mut WriteHalf<'_>, bytes: &[u8], deadline: Instant) -> io::Result<()> {
    match tokio::time::timeout_at(deadline, out.write_all(bytes)).await {
        Ok(written) => written,
        Err(_) => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "write timeout: the client does not read",
        )),
    }
}

/// One JSON line, by `deadline`.
async fn write_value(out: &mut WriteHalf<'_>, value: &Value, deadline: Instant) -> io::Result<()> {
    let mut line = serde_json::to_vec(value).map_err(io::Error::other)?;
    line.push(b'\n');
    write_by(out, &line, deadline).await
}

/// A list reply, chunk by chunk; all of it by `deadline`, so a client that reads slowly pins it
/// for the write timeout at most.
async fn write_list(
    out: &mut WriteHalf<'_>,
    list: &ListReply,
    deadline: Instant,
) -> io::Result<()> {
    let mut buf = Vec::new();
    let mut n = 0;
    loop {
        buf.clear();
        let more = list.chunk(n, &mut buf)?;
        write_by(out, &buf, deadline).await?;
        if !more {
            return Ok(());
        }
        n += 1;
    }
}

/// How a duration is said in a message: whole seconds, else milliseconds.
fn said(d: std::time::Duration) -> String {
    if d.subsec_nanos() == 0 {
        format!("{} s", d.as_secs())
    } else {
        format!("{} ms", d.as_millis())
    }
}

async fn serve_client<H: Handler>(
    mut stream: UnixStream,
    handler: &Arc<H>,
    limits: Limits,
) -> io::Result<()> {
    let (read, mut out) = stream.split();
    let mut lines = FramedRead::with_capacity(read, RequestCodec::new(), READ_BUFFER);
    loop {
        let line = match tokio::time::timeout(limits.idle_timeout, lines.next()).await {
            Ok(Some(line)) => line,
            Ok(None) => return Ok(()),
            Err(_) => {
                handler.cut_off(CutOff::Idle);
                let message = format!(
                    "idle: no request for {}, closing",
                    said(limits.idle_timeout)
                );
                let deadline = Instant::now() + limits.write_timeout;
                let _ = write_value(&mut out, &error_reply(message), deadline).await;
                return Ok(());
            }
        };
        let read_at = std::time::Instant::now();
        let (op, response) = match line? {
            Ok(line) if line.trim().is_empty() => continue,
            Ok(line) => match parse_request(&line) {
                // A request that needs nothing held by another is answered here
                // (`Handler::try_handle`: one peer, whose hand-over to a blocking thread cost
                // more than its answer). Every other is answered on a blocking thread: a pass
                // over every peer takes milliseconds at 50,000, and even one peer's answer may
                // wait for a lock the sweep, an admission or a detector change holds, or retry
                // a busy slot. The runtime's two workers keep serving sockets, NATS and the
                // rings meanwhile.
                Ok(request) => {
                    let op = request.op();
                    let response = match handler.try_handle(&request) {
                        Some(response) => response,
                        None => {
                            let handler = handler.clone();
                            tokio::task::spawn_blocking(move || handler.handle(request))
                                .await
                                .map_err(io::Error::other)?
                        }
                    };
                    (op, response)
                }
                Err(message) => (INVALID_OP, Response::Reply(error_reply(message))),
            },
            Err(message) => (INVALID_OP, Response::Reply(error_reply(message))),
        };
        let deadline = Instant::now() + limits.write_timeout;
        match response {
            Response::Reply(reply) => {
                write_value(&mut out, &reply, deadline).await?;
                handler.answered(op, read_at.elapsed());
            }
            Response::List(list) => {
                write_list(&mut out, &list, deadline).await?;
                handler.answered(op, read_at.elapsed());
            }
            Response::Subscribe(reply, events) => {
                write_value(&mut out, &reply, deadline).await?;
                handler.answered(op, read_at.elapsed());
                return stream_events(lines, out, events, limits).await;
            }
            Response::Record(reply, recording) => {
                write_value(&mut out, &reply, deadline).await?;
                handler.answered(op, read_at.elapsed());
                return stream_arrivals(lines, out, recording, limits).await;
            }
        }
    }
}

/// A subscriber's events are written a batch at a time: whatever is waiting when its task
/// wakes (the events a pass raised together: a mass failure raises thousands, handed over at
/// once) is serialized into one buffer and written with one write, until the buffer holds
/// about this many bytes (some 400 suspect events). It bounds what a client that does not
/// read pins, and the write timeout applies to each batch.
const EVENT_BATCH_BYTES: usize = 60 * 1024;

/// A subscriber's write buffer is let go rather than kept past this (a batch of long events).
const KEPT_BUFFER: usize = 64 * 1024;

/// Serializes `first`, then the events already waiting in `events`, one line each, into
/// `buf`, until none is waiting or `buf` holds `EVENT_BATCH_BYTES`; a lag is the `lagged`
/// line in its place. Returns whether the channel closed (nothing follows then).
fn fill_batch(
    first: Result<Event, broadcast::error::RecvError>,
    events: &mut broadcast::Receiver<Event>,
    buf: &mut Vec<u8>,
) -> io::Result<bool> {
    use broadcast::error::{RecvError, TryRecvError};
    let mut next = first;
    loop {
        let event = match next {
            Ok(event) => event,
            Err(RecvError::Lagged(missed)) => Event::Lagged { missed },
            Err(RecvError::Closed) => return Ok(true),
        };
        serde_json::to_writer(&mut *buf, &event).map_err(io::Error::other)?;
        buf.push(b'\n');
        if buf.len() >= EVENT_BATCH_BYTES {
            return Ok(false);
        }
        next = match events.try_recv() {
            Ok(event) => Ok(event),
            Err(TryRecvError::Lagged(n)) => Err(RecvError::Lagged(n)),
            Err(TryRecvError::Closed) => Err(RecvError::Closed),
            Err(TryRecvError::Empty) => return Ok(false),
        };
    }
}

/// Forwards events until the client hangs up. A subscriber that reads too slowly falls behind
/// in the broadcast ring rather than slowing anyone down, and is told how many it missed; one
/// that does not take a batch within the write timeout is cut off.
async fn stream_events(
    mut lines: Lines<'_>,
    mut out: WriteHalf<'_>,
    mut events: broadcast::Receiver<Event>,
    limits: Limits,
) -> io::Result<()> {
    let mut buf: Vec<u8> = Vec::new();
    loop {
        tokio::select! {
            event = events.recv() => {
                // This event, then whatever else is already waiting, written at once.
                let closed = fill_batch(event, &mut events, &mut buf)?;
                write_by(&mut out, &buf, Instant::now() + limits.write_timeout).await?;
                buf.clear();
                if buf.capacity() > KEPT_BUFFER {
                    buf = Vec::new();
                }
                if closed {
                    return Ok(());
                }
            }
            input = lines.next() => match input {
                None => return Ok(()),
                Some(Err(e)) => return Err(e),
                Some(Ok(_)) => {
                    let reply = error_reply("this connection is subscribed: it only carries events");
                    write_value(&mut out, &reply, Instant::now() + limits.write_timeout).await?;
                }
            },
        }
    }
}

/// Forwards a recording's arrivals until it ends (then a closing line) or the client hangs up.
async fn stream_arrivals(
    mut lines: Lines<'_>,
    mut out: WriteHalf<'_>,
    recording: Recording,
    limits: Limits,
) -> io::Result<()> {
    let Recording {
        ids,
        mut arrivals,
        until,
        guard,
    } = recording;
    let (mut sent, mut missed) = (0u64, 0u64);
    let deadline = async {
        match until {
            Some(t) => tokio::time::sleep_until(t).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(deadline);
    let by = || Instant::now() + limits.write_timeout;
    loop {
        tokio::select! {
            () = &mut deadline => break,
            arrival = arrivals.recv() => match arrival {
                Ok(a) if ids.contains(&a.peer_id) => {
                    let line = serde_json::json!({ "arrival": ArrivalLine::from_record(&a) });
                    write_value(&mut out, &line, by()).await?;
                    sent += 1;
                }
                Ok(_) => {}
                Err(broadcast::error::RecvError::Lagged(n)) => missed += n,
                Err(broadcast::error::RecvError::Closed) => break,
            },
            input = lines.next() => match input {
                None => return Ok(()),
                Some(Err(e)) => return Err(e),
                Some(Ok(_)) => {
                    let reply = error_reply("this connection is recording: it only carries arrivals");
                    write_value(&mut out, &reply, by()).await?;
                }
            },
        }
    }
    drop(guard);
    let done = serde_json::json!({ "done": true, "arrivals": sent, "missed": missed });
    write_value(&mut out, &done, by()).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serving::protocol::ok_reply;
    use serde_json::json;

    fn peer(id: u64) -> PeerView {
        serde_json::from_value(json!({
            "id": id, "source": "bfd", "addr": format!("10.0.0.{}:4784", id % 250),
            "discriminator": 7, "bfd_state": "up", "incarnation": 3, "heartbeats": id * 10,
            "samples": 5, "mean_ms": 50.25, "std_ms": null, "silence_ms": 1.5e-3,
            "phi": f64::MAX, "level": 8.0, "last_seq": 9, "lost": 1, "duplicates": 0,
            "out_of_order": 0, "auth_failures": 0, "outages": 2, "restarts": 0,
            "qos": null,
        }))
        .expect("a peer view")
    }

    fn streamed(list: &ListReply) -> Vec<u8> {
        let mut out = Vec::new();
        let mut n = 0;
        while list.chunk(n, &mut out).unwrap() {
            n += 1;
        }
        out
    }

    /// The chunks make exactly the line the whole reply made: same keys, same order, same
    /// numbers, one line.
    #[test]
    fn a_list_reply_in_chunks_is_the_whole_reply_byte_for_byte() {
        for n in [
            0,
            1,
            2,
            LIST_CHUNK - 1,
            LIST_CHUNK,
            LIST_CHUNK + 1,
            3 * LIST_CHUNK + 7,
        ] {
            let peers: Vec<PeerView> = (1..=n as u64).map(peer).collect();
            let whole = format!("{}\n", ok_reply("peers", &peers));
            let list = ListReply::new(json!({"ok": true}), "peers", peers.clone());
            assert_eq!(
                String::from_utf8(streamed(&list)).unwrap(),
                whole,
                "{n} peers"
            );

            for threshold in [3.0, 0.25, 8.0] {
                let mut reply = ok_reply("suspects", &peers);
                reply["threshold"] = json!(threshold);
                let whole = format!("{reply}\n");
                let list = ListReply::new(
                    json!({"ok": true, "threshold": threshold}),
                    "suspects",
                    peers.clone(),
                );
                assert_eq!(String::from_utf8(streamed(&list)).unwrap(), whole);
            }
        }
    }

    #[test]
    fn a_chunk_holds_at_most_list_chunk_peers() {
        let list = ListReply::new(json!({"ok": true}), "peers", (1..=1000).map(peer).collect());
        let mut sizes = Vec::new();
        let mut n = 0;
        loop {
            let mut out = Vec::new();
            let more = list.chunk(n, &mut out).unwrap();
            sizes.push(out.len());
            if !more {
                break;
            }
            n += 1;
        }
        assert_eq!(sizes.len(), 1000usize.div_ceil(LIST_CHUNK));
        let one = serde_json::to_vec(&peer(1)).unwrap().len();
        assert!(
            sizes.iter().all(|&s| s <= (one + 8) * LIST_CHUNK),
            "{sizes:?}"
        );
    }

    fn suspect(id: u64) -> Event {
        Event::Suspect(crate::detector::tracker::Suspicion {
            id,
            level: 3.0,
            phi: 3.0417,
            silence_ms: 2_345.678,
            at: 1_795_981_530_153,
            crossed_at: 1_795_981_530_150.9,
        })
    }

    fn lines_of(events: &[Event]) -> Vec<u8> {
        let mut out = Vec::new();
        for event in events {
            out.extend_from_slice(serde_json::to_string(event).unwrap().as_bytes());
            out.push(b'\n');
        }
        out
    }

    /// A burst published at once leaves in batches of about `EVENT_BATCH_BYTES`, each one
    /// write, whose bytes are the events' lines in order, exactly as one line each made them.
    #[test]
    fn a_burst_is_written_in_few_batches_of_the_same_bytes() {
        let (tx, mut rx) = broadcast::channel(crate::agent::EVENT_BUFFER);
        let burst: Vec<Event> = (1..=2_000).map(suspect).collect();
        for event in &burst {
            tx.send(event.clone()).unwrap();
        }
        let mut written = Vec::new();
        let mut batches = 0;
        while let Ok(first) = rx.try_recv() {
            let mut buf = Vec::new();
            assert!(!fill_batch(Ok(first), &mut rx, &mut buf).unwrap());
            assert!(buf.len() < EVENT_BATCH_BYTES + 512, "{}", buf.len());
            assert!(buf.capacity() <= KEPT_BUFFER, "{}", buf.capacity());
            written.extend_from_slice(&buf);
            batches += 1;
        }
        assert_eq!(written, lines_of(&burst));
        let expected = lines_of(&burst).len().div_ceil(EVENT_BATCH_BYTES);
        assert!(batches <= expected + 1, "{batches} batches for {expected}");
    }

    /// A subscriber that fell behind gets the `lagged` line where the missed events were,
    /// then the ones still held; a closed channel ends the batch with what came before it.
    #[test]
    fn a_lag_is_a_line_in_the_batch_and_a_close_ends_it() {
        let (tx, mut rx) = broadcast::channel(4);
        let events: Vec<Event> = (1..=10).map(suspect).collect();
        for event in &events {
            tx.send(event.clone()).unwrap();
        }
        drop(tx);
        let first = rx.try_recv().map_err(|e| match e {
            broadcast::error::TryRecvError::Lagged(n) => broadcast::error::RecvError::Lagged(n),
            other => panic!("{other:?}"),
        });
        let mut buf = Vec::new();
        assert!(fill_batch(first, &mut rx, &mut buf).unwrap(), "closed");
        let mut expected = lines_of(&[Event::Lagged { missed: 6 }]);
        expected.extend(lines_of(&events[6..]));
        assert_eq!(
            String::from_utf8(buf).unwrap(),
            String::from_utf8(expected).unwrap()
        );
    }

    #[test]
    fn durations_are_said_in_seconds_or_milliseconds() {
        assert_eq!(said(std::time::Duration::from_secs(60)), "60 s");
        assert_eq!(said(std::time::Duration::from_millis(300)), "300 ms");
    }
}
