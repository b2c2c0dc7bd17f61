//! HAProxy seen from the tests: its stats socket (`show stat`), HTTP backends that log what
//! they serve, and the GETs of a steady load through it.

use std::{
    collections::HashMap,
    io::{Read, Write},
    net::TcpStream,
    os::unix::net::UnixStream,
    path::{Path, PathBuf},
    process::Stdio,
    time::{Duration, Instant},
};

use crate::{
    agent_process::{ChildGuard, sender, spawn},
    daemon::Daemon,
    monitor_bin,
    netns::NetnsPair,
};

/// A backend: prints its name to each GET and appends the Unix time of each to its log.
pub const BACKEND_PY: &str = r#"
import http.server, sys, time
name, port, log = sys.argv[1], int(sys.argv[2]), open(sys.argv[3], "a", buffering=1)
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"
    def do_GET(self):
        log.write(f"{time.time():.6f}\n")
        body = name.encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer.allow_reuse_address = True
http.server.ThreadingHTTPServer((sys.argv[4], port), H).serve_forever()
"#;

/// One of a HAProxy test's backends: an HTTP server (`BACKEND_PY`) that is also a heartbeat
/// peer; killing both is killing the backend.
pub struct Backend {
    pub server: Daemon,
    pub heartbeats: ChildGuard,
}

impl Backend {
    /// Backend `i` in the pair's b namespace: `BACKEND_PY` (at `backend_py`) serving as `b{i}`
    /// on the b address, port 8000 + i, each GET logged to `log`; and peer `i`'s heartbeats
    /// every `interval`.
    pub fn start(pair: &NetnsPair, backend_py: &Path, i: u64, log: &Path, interval: &str) -> Self {
        let mut cmd = NetnsPair::command_in(&pair.ns_b, Path::new("python3"));
        cmd.arg(backend_py)
            .args([
                &format!("b{i}"),
                &(8000 + i).to_string(),
                log.to_str().unwrap(),
                &pair.addr_b,
            ])
            .stdin(Stdio::null());
        Self {
            server: Daemon::new(cmd.spawn().expect("python3 backend")),
            heartbeats: spawn(sender(pair, i, interval, &[])),
        }
    }
}

/// Writes `BACKEND_PY` into `dir`; its path.
pub fn write_backend_py(dir: &Path) -> PathBuf {
    let path = dir.join("backend.py");
    std::fs::write(&path, BACKEND_PY).unwrap();
    path
}

/// `monitor haproxy-agent` in the pair's a namespace, on 127.0.0.1:`port`, answering from the
/// agent at `socket`.
pub fn agent_responder(pair: &NetnsPair, port: u16, socket: &Path) -> Daemon {
    let mut responder = NetnsPair::command_in(&pair.ns_a, &monitor_bin());
    responder
        .args(["haproxy-agent", "--listen", &format!("127.0.0.1:{port}")])
        .arg("--socket")
        .arg(socket)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null());
    Daemon::new(responder.spawn().expect("monitor haproxy-agent"))
}

/// `show stat` through the stats socket: server name -> column -> value.
pub fn show_stat(socket: &Path) -> HashMap<String, HashMap<String, String>> {
    let mut out = HashMap::new();
    let Ok(mut s) = UnixStream::connect(socket) else {
        return out;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    if s.write_all(b"show stat\n").is_err() {
        return out;
    }
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    let mut lines = text.lines();
    let Some(header) = lines.next() else {
        return out;
    };
    let cols: Vec<&str> = header.trim_start_matches("# ").split(',').collect();
    for line in lines {
        let fields: Vec<&str> = line.split(',').collect();
        if fields.len() < 2 || fields[1] == "FRONTEND" || fields[1] == "BACKEND" {
            continue;
        }
        let row: HashMap<String, String> = cols
            .iter()
            .zip(&fields)
            .map(|(c, f)| (c.to_string(), f.to_string()))
            .collect();
        out.insert(format!("{}/{}", fields[0], fields[1]), row);
    }
    out
}

pub fn col<'a>(stat: &'a HashMap<String, HashMap<String, String>>, srv: &str, c: &str) -> &'a str {
    stat.get(srv)
        .and_then(|r| r.get(c))
        .map(String::as_str)
        .unwrap_or("")
}

pub fn num(stat: &HashMap<String, HashMap<String, String>>, srv: &str, c: &str) -> u64 {
    col(stat, srv, c).parse().unwrap_or(0)
}

/// Whether server `srv` (`backend/server`) was last answered "up" by the agent and stands at
/// full weight.
pub fn up_by_agent(stat: &HashMap<String, HashMap<String, String>>, srv: &str) -> bool {
    col(stat, srv, "last_agt").starts_with("via agent : up") && num(stat, srv, "weight") == 100
}

/// One request's outcome as the load generator saw it.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub started: Instant,
    pub ok: bool,
    pub backend: String,
}

/// One HTTP/1.0 GET; the body (the backend's name) if the status is 200.
pub fn get(port: u16) -> Option<String> {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.write_all(b"GET / HTTP/1.0\r\nHost: lb\r\n\r\n").ok()?;
    let mut reply = String::new();
    s.read_to_string(&mut reply).ok()?;
    if !reply.starts_with("HTTP/1.0 200") && !reply.starts_with("HTTP/1.1 200") {
        return None;
    }
    reply.split("\r\n\r\n").nth(1).map(str::to_string)
}
