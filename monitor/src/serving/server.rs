//! The Unix socket: binding it safely, and serving newline-delimited JSON requests.

use std::{
    io,
    os::unix::fs::{FileTypeExt, PermissionsExt},
    path::{Path, PathBuf},
    sync::Arc,
};

use bytes::BytesMut;
use futures_util::{SinkExt, StreamExt};
use serde_json::Value;
use tokio::{
    net::{UnixListener, UnixStream},
    sync::{Semaphore, broadcast},
};
use tokio_util::codec::{Decoder, Encoder, Framed, LinesCodec, LinesCodecError};

use monitor_common::maps::ArrivalRecord;

use crate::{
    serving::access::AccessPolicy,
    serving::event::Event,
    serving::protocol::{INVALID_OP, MAX_REQUEST_BYTES, Request, error_reply, parse_request},
    serving::recording::{ArrivalLine, RecordingGuard},
};

/// Clients served at once; more wait in the listen backlog.
pub const MAX_CLIENTS: usize = 256;

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
    /// A reply line, then every event from this receiver for as long as the client stays.
    Subscribe(Value, broadcast::Receiver<Event>),
    /// A reply line, then the recording's arrivals until it ends or the client hangs up.
    Record(Value, Recording),
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

    /// A client connected (`true`) or went away (`false`); for the metrics.
    fn client(&self, _connected: bool) {}

    /// A client was refused by the access policy; for the metrics.
    fn refused(&self) {}

    /// A request of `op` (`Request::op`, or `INVALID_OP`) was answered `took` after its line
    /// was read (for `subscribe` and `record`, the first reply); for the metrics.
    fn answered(&self, _op: &'static str, _took: std::time::Duration) {}
}

/// Accepts clients forever, each on its own task.
pub async fn serve<H: Handler>(
    listener: UnixListener,
    handler: Arc<H>,
    policy: AccessPolicy,
) -> io::Result<()> {
    let slots = Arc::new(Semaphore::new(MAX_CLIENTS));
    loop {
        let permit = slots
            .clone()
            .acquire_owned()
            .await
            .expect("semaphore never closed");
        let (stream, _) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // EMFILE and friends: keep serving the clients we have.
                log::warn!("accept on the agent socket: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let allowed = stream
            .peer_cred()
            .is_ok_and(|c| policy.allows(c.uid(), c.gid(), c.pid()));
        if !allowed {
            log::warn!("refused a socket client: not {}", policy.describe());
            handler.refused();
            tokio::spawn(refuse(stream, policy));
            drop(permit);
            continue;
        }
        let handler = handler.clone();
        tokio::spawn(async move {
            handler.client(true);
            if let Err(e) = serve_client(stream, &handler).await {
                log::debug!("client: {e}");
            }
            handler.client(false);
            drop(permit);
        });
    }
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

impl Encoder<String> for RequestCodec {
    type Error = io::Error;

    fn encode(&mut self, line: String, buf: &mut BytesMut) -> io::Result<()> {
        self.0.encode(line, buf).map_err(|e| match e {
            LinesCodecError::Io(e) => e,
            other => io::Error::other(other),
        })
    }
}

/// Tells a client it may not ask, and hangs up. Its first request is read (for a second at
/// most) before the answer, so the client is not cut off mid-write and sees why.
async fn refuse(stream: UnixStream, policy: AccessPolicy) {
    let mut lines = Framed::new(stream, RequestCodec::new());
    let _ = tokio::time::timeout(std::time::Duration::from_secs(1), lines.next()).await;
    let reply = error_reply(format!(
        "permission denied: this socket serves {}",
        policy.describe()
    ));
    let _ = lines.send(reply.to_string()).await;
}

type Lines = Framed<UnixStream, RequestCodec>;

async fn serve_client<H: Handler>(stream: UnixStream, handler: &Arc<H>) -> io::Result<()> {
    let mut lines = Framed::new(stream, RequestCodec::new());
    while let Some(line) = lines.next().await {
        let read_at = std::time::Instant::now();
        let (op, response) = match line? {
            Ok(line) if line.trim().is_empty() => continue,
            Ok(line) => match parse_request(&line) {
                // A pass over every peer (milliseconds at 50,000) runs on a blocking thread,
                // so the runtime's workers keep serving the other clients meanwhile.
                Ok(request) if request.scans_every_peer() => {
                    let op = request.op();
                    let handler = handler.clone();
                    let response = tokio::task::spawn_blocking(move || handler.handle(request))
                        .await
                        .map_err(io::Error::other)?;
                    (op, response)
                }
                Ok(request) => (request.op(), handler.handle(request)),
                Err(message) => (INVALID_OP, Response::Reply(error_reply(message))),
            },
            Err(message) => (INVALID_OP, Response::Reply(error_reply(message))),
        };
        match response {
            Response::Reply(reply) => {
                lines.send(reply.to_string()).await?;
                handler.answered(op, read_at.elapsed());
            }
            Response::Subscribe(reply, events) => {
                lines.send(reply.to_string()).await?;
                handler.answered(op, read_at.elapsed());
                return stream_events(lines, events).await;
            }
            Response::Record(reply, recording) => {
                lines.send(reply.to_string()).await?;
                handler.answered(op, read_at.elapsed());
                return stream_arrivals(lines, recording).await;
            }
        }
    }
    Ok(())
}

/// Events written to a subscriber before its socket is flushed: the ones a sweep raised
/// together (a mass failure raises thousands) leave in a few writes, not one each.
const EVENT_BATCH: usize = 256;

/// Forwards events until the client hangs up. A subscriber that reads too slowly falls behind
/// in the broadcast ring rather than slowing anyone down, and is told how many it missed.
async fn stream_events(mut lines: Lines, mut events: broadcast::Receiver<Event>) -> io::Result<()> {
    loop {
        tokio::select! {
            event = events.recv() => {
                let mut event = Some(event);
                let mut batched = 0;
                // This event, then whatever else is already waiting, flushed once.
                while let Some(next) = event.take() {
                    let next = match next {
                        Ok(event) => event,
                        Err(broadcast::error::RecvError::Lagged(missed)) => Event::Lagged { missed },
                        Err(broadcast::error::RecvError::Closed) => {
                            lines.flush().await?;
                            return Ok(());
                        }
                    };
                    let line = serde_json::to_string(&next).map_err(io::Error::other)?;
                    lines.feed(line).await?;
                    batched += 1;
                    if batched < EVENT_BATCH {
                        event = match events.try_recv() {
                            Ok(e) => Some(Ok(e)),
                            Err(broadcast::error::TryRecvError::Lagged(n)) => {
                                Some(Err(broadcast::error::RecvError::Lagged(n)))
                            }
                            Err(broadcast::error::TryRecvError::Closed) => {
                                Some(Err(broadcast::error::RecvError::Closed))
                            }
                            Err(broadcast::error::TryRecvError::Empty) => None,
                        };
                    }
                }
                lines.flush().await?;
            }
            input = lines.next() => match input {
                None => return Ok(()),
                Some(Err(e)) => return Err(e),
                Some(Ok(_)) => {
                    let reply = error_reply("this connection is subscribed: it only carries events");
                    lines.send(reply.to_string()).await?;
                }
            },
        }
    }
}

/// Forwards a recording's arrivals until it ends (then a closing line) or the client hangs up.
async fn stream_arrivals(mut lines: Lines, recording: Recording) -> io::Result<()> {
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
    loop {
        tokio::select! {
            () = &mut deadline => break,
            arrival = arrivals.recv() => match arrival {
                Ok(a) if ids.contains(&a.peer_id) => {
                    let line = serde_json::json!({ "arrival": ArrivalLine::from_record(&a) });
                    lines.send(line.to_string()).await?;
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
                    lines.send(reply.to_string()).await?;
                }
            },
        }
    }
    drop(guard);
    let done = serde_json::json!({ "done": true, "arrivals": sent, "missed": missed });
    lines.send(done.to_string()).await
}
