//! The `/metrics` listener: HTTP/1.1 within its limits (header timeout, connection cap and
//! age), scrapes rendered off the async workers one at a time and shared while fresh.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode, body::Bytes, service::service_fn};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::HttpMetrics;

/// The two text formats a scraper may ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// OpenMetrics 1.0, what Prometheus asks for first.
    OpenMetrics,
    /// The classic Prometheus text format 0.0.4, for everything else (curl, promtool).
    Prometheus,
}

impl Format {
    /// From a request's `Accept` header, as Prometheus negotiates.
    pub fn from_accept(accept: Option<&str>) -> Self {
        match accept {
            Some(a) if a.contains("application/openmetrics-text") => Format::OpenMetrics,
            _ => Format::Prometheus,
        }
    }

    fn content_type(self) -> &'static str {
        match self {
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
            Format::Prometheus => prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
        }
    }
}

/// The text of `registry` in `format`.
pub fn render(registry: &Registry, format: Format) -> String {
    let mut text = String::new();
    let encoded = match format {
        Format::OpenMetrics => prometheus_client::encoding::text::encode(&mut text, registry),
        Format::Prometheus => {
            prometheus_client::encoding::prometheus_text::encode(&mut text, registry)
        }
    };
    if let Err(e) = encoded {
        // Only a formatter error, which writing to a String does not produce.
        let _ = writeln!(text, "# encoding failed: {e}");
    }
    text
}

/// Binds the metrics listener (before anything is loaded, so a taken port stops the start).
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

/// The limits of the metrics listener (docs/security.md, "/metrics"): what a client that
/// never finishes a request, or many of them, or a flood of scrapes, can hold.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    /// A request header not complete this long after the connection began waiting for it is
    /// dropped with its connection; an idle keep-alive connection is closed after as long.
    pub header_timeout: Duration,
    /// A connection this old is asked to finish (no keep-alive after the request in hand),
    /// and dropped `header_timeout` later if it has not (a body or a reply that trickles).
    pub max_age: Duration,
    /// Connections open at once. A newcomer over it closes the oldest connection that has
    /// not sent a request yet; if every one has, the newcomer is closed at once.
    pub max_connections: usize,
    /// A rendered scrape this young is served again instead of rendering anew.
    pub reuse: Duration,
}

impl Limits {
    pub const DEFAULT: Self = Self {
        header_timeout: Duration::from_secs(5),
        max_age: Duration::from_secs(60),
        max_connections: 64,
        reuse: Duration::from_secs(1),
    };
}

impl Default for Limits {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// Renders scrapes one at a time off the async workers, and serves a rendering younger than
/// `Limits::reuse` again: concurrent scrapers wait for the one rendering under way and share
/// it, so a flood of scrapes costs at most one walk over the peers per `reuse` per format,
/// on a blocking thread, never on the two workers the agent's socket shares.
pub(super) struct Renderer {
    pub registry: Arc<Registry>,
    pub reuse: Duration,
    /// The last rendering of each format (OpenMetrics, Prometheus), and when it began.
    pub last: tokio::sync::Mutex<[Option<(Instant, Bytes)>; 2]>,
}

impl Renderer {
    pub(super) async fn body(self: &Arc<Self>, format: Format) -> Bytes {
        // In a task of its own, so a scraper that goes away mid-way neither cancels the
        // rendering nor lets the next one start beside it.
        let this = self.clone();
        let task = tokio::spawn(async move {
            let mut last = this.last.lock().await;
            let slot = &mut last[format as usize];
            if let Some((at, body)) = slot
                && at.elapsed() <= this.reuse
            {
                return body.clone();
            }
            let began = Instant::now();
            let registry = this.registry.clone();
            let body = tokio::task::spawn_blocking(move || Bytes::from(render(&registry, format)))
                .await
                .unwrap_or_else(|e| Bytes::from(format!("# rendering failed: {e}\n")));
            *slot = Some((began, body.clone()));
            body
        });
        task.await
            .unwrap_or_else(|e| Bytes::from(format!("# rendering failed: {e}\n")))
    }
}

/// The connections open on the listener, and which of them have not sent a request yet (the
/// ones a newcomer over the cap may evict, oldest first).
#[derive(Default)]
pub(super) struct Connections {
    open: usize,
    next: u64,
    waiting: BTreeMap<u64, CancellationToken>,
}

/// One admitted connection's place; gives it back when the connection ends (unless it was
/// evicted, which gave it to the newcomer).
pub(super) struct Place {
    id: u64,
    pub evicted: CancellationToken,
    connections: Arc<Mutex<Connections>>,
    http: HttpMetrics,
}

impl Place {
    /// The connection sent a request: it can no longer be evicted.
    pub fn requested(&self) {
        self.connections
            .lock()
            .expect("connections lock")
            .waiting
            .remove(&self.id);
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut c = self.connections.lock().expect("connections lock");
        c.waiting.remove(&self.id);
        if !self.evicted.is_cancelled() {
            c.open -= 1;
            self.http.connections.set(c.open as i64);
        }
    }
}

/// A place for a new connection, evicting the oldest that has not sent a request if the
/// listener is full; None if every place is held by a connection that has.
pub(super) fn admit(
    connections: &Arc<Mutex<Connections>>,
    limits: &Limits,
    http: &HttpMetrics,
) -> Option<Place> {
    let mut c = connections.lock().expect("connections lock");
    if c.open >= limits.max_connections {
        if let Some((_, oldest)) = c.waiting.pop_first() {
            oldest.cancel();
            c.open -= 1;
            http.closed("evicted");
        } else {
            http.closed("over_cap");
            return None;
        }
    }
    c.open += 1;
    http.connections.set(c.open as i64);
    let id = c.next;
    c.next += 1;
    let evicted = CancellationToken::new();
    c.waiting.insert(id, evicted.clone());
    Some(Place {
        id,
        evicted,
        connections: connections.clone(),
        http: http.clone(),
    })
}

/// Serves `GET /metrics` forever; anything else is a 404 or 405. One task per connection,
/// HTTP/1.1 with keep-alive, as Prometheus scrapes, within `limits`; `http` counts what
/// the limits closed.
pub async fn serve(
    listener: TcpListener,
    registry: Arc<Registry>,
    limits: Limits,
    http: HttpMetrics,
) -> std::io::Result<()> {
    let renderer = Arc::new(Renderer {
        registry,
        reuse: limits.reuse,
        last: tokio::sync::Mutex::new([None, None]),
    });
    let connections = Arc::new(Mutex::new(Connections::default()));
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        // Scrape requests are a few hundred bytes; this bounds each connection's buffer.
        .max_buf_size(16 * 1024);
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                log::warn!("accept on the metrics listener: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let Some(place) = admit(&connections, &limits, &http) else {
            drop(stream);
            continue;
        };
        let renderer = renderer.clone();
        let builder = builder.clone();
        let http = http.clone();
        tokio::spawn(async move {
            let place = Arc::new(place);
            let evicted = place.evicted.clone();
            let service = {
                let place = place.clone();
                service_fn(move |request: Request<hyper::body::Incoming>| {
                    place.requested();
                    let renderer = renderer.clone();
                    async move { Ok::<_, std::convert::Infallible>(respond(&request, &renderer).await) }
                })
            };
            let connection = builder.serve_connection(TokioIo::new(stream), service);
            tokio::pin!(connection);
            let age = tokio::time::sleep(limits.max_age);
            tokio::pin!(age);
            let result = tokio::select! {
                result = connection.as_mut() => result,
                // Dropping the connection closes it.
                () = evicted.cancelled() => return,
                () = &mut age => {
                    http.closed("max_age");
                    connection.as_mut().graceful_shutdown();
                    match tokio::time::timeout(limits.header_timeout, connection.as_mut()).await {
                        Ok(result) => result,
                        Err(_) => return,
                    }
                }
            };
            if let Err(e) = result {
                if e.is_timeout() {
                    http.closed("header_timeout");
                }
                log::debug!("metrics client: {e}");
            }
        });
    }
}

pub(super) async fn respond<B>(
    request: &Request<B>,
    renderer: &Arc<Renderer>,
) -> Response<Full<Bytes>> {
    let reply = |status: StatusCode, content_type: &str, body: Bytes| {
        Response::builder()
            .status(status)
            .header(hyper::header::CONTENT_TYPE, content_type)
            .body(Full::new(body))
            .expect("a valid response")
    };
    match (request.method(), request.uri().path()) {
        (&Method::GET | &Method::HEAD, "/metrics") => {
            let accept = request
                .headers()
                .get(hyper::header::ACCEPT)
                .and_then(|v| v.to_str().ok());
            let format = Format::from_accept(accept);
            reply(
                StatusCode::OK,
                format.content_type(),
                renderer.body(format).await,
            )
        }
        (_, "/metrics") => reply(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain; charset=utf-8",
            Bytes::from_static(b"only GET /metrics\n"),
        ),
        _ => reply(
            StatusCode::NOT_FOUND,
            "text/plain; charset=utf-8",
            Bytes::from_static(b"the metrics are at /metrics\n"),
        ),
    }
}
