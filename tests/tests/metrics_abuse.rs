//! `/metrics` under abuse, against the real agent: a slowloris of 1,000 half-open HTTP
//! connections neither stalls a real scrape nor the agent's Unix socket, and is closed by the
//! server after the header read timeout; connections over the cap are closed at once.
//!
//! The agent runs with the open-file limit a systemd service gets by default (1024), where a
//! thousand connections the server keeps open would otherwise use up its descriptors, and with
//! them the Unix socket's accepts.

use std::{
    io::{ErrorKind, Read, Write},
    net::{SocketAddr, TcpStream},
    sync::mpsc,
    time::{Duration, Instant},
};

use integration_tests::{
    agent_process::{AgentProcess, TempDir},
    http::{get_in, in_netns},
    netns::NetnsPair,
    require_root, wait_for,
};
use monitor::serving::client::Client;
use serde_json::json;

const METRICS: &str = "127.0.0.1:9464";
/// The server's header read timeout (`metrics::HEADER_TIMEOUT`).
const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a scrape or a socket request may take while under attack: a functional bound
/// (the agent answers at all), not a performance claim.
const ANSWER_WITHIN: Duration = Duration::from_secs(2);

/// `f` on a thread of its own, if it returns within `limit`.
fn within<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit).ok()
}

/// Whether the server has closed `stream` (EOF or reset); the stream must be non-blocking.
fn closed_by_server(mut stream: &TcpStream) -> bool {
    let mut buf = [0u8; 512];
    match stream.read(&mut buf) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) if e.kind() == ErrorKind::WouldBlock => false,
        Err(_) => true,
    }
}

/// `n` connections from inside `ns`, each with the start of a request header and then nothing.
fn half_open(ns: &str, n: usize) -> Vec<TcpStream> {
    let addr: SocketAddr = METRICS.parse().unwrap();
    in_netns(ns, move || {
        (0..n)
            .filter_map(|_| {
                let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
                s.write_all(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: slo")
                    .ok()?;
                s.set_nonblocking(true).ok()?;
                Some(s)
            })
            .collect()
    })
    .expect("connections in the namespace")
}

/// The value of the sample `series` (exact text before the value) in classic text.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

fn closed(text: &str, reason: &str) -> f64 {
    sample(
        text,
        &format!("heartbeat_monitor_metrics_connections_closed_total{{reason=\"{reason}\"}}"),
    )
    .unwrap_or(0.0)
}

/// A full scrape and a socket `stats` request, each answered within `ANSWER_WITHIN`.
/// How long the last scrape under attack took, µs (for the attack suite's row).
static SCRAPED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn scrape_and_stats(pair: &NetnsPair, agent: &AgentProcess) -> String {
    let ns = pair.ns_a.clone();
    let started = Instant::now();
    let scrape = within(ANSWER_WITHIN, move || get_in(&ns, METRICS, "/metrics", &[]))
        .unwrap_or_else(|| panic!("no scrape within {ANSWER_WITHIN:?} under the slowloris"))
        .expect("GET /metrics under the slowloris");
    assert_eq!(scrape.0, 200, "{}", scrape.1);
    // The whole text: the first family and the last.
    for family in [
        "heartbeat_monitor_build_info",
        "heartbeat_monitor_peers{level=\"8\"}",
        "heartbeat_monitor_xdp_run_seconds_total",
    ] {
        assert!(scrape.1.contains(family), "{family} not in {}", scrape.1);
    }
    let scraped = started.elapsed();
    SCRAPED.store(
        scraped.as_micros() as u64,
        std::sync::atomic::Ordering::Relaxed,
    );
    let socket = agent.socket().to_path_buf();
    let started = Instant::now();
    let stats = within(ANSWER_WITHIN, move || {
        Client::connect(&socket)
            .map_err(|e| e.to_string())?
            .request(&json!({"op": "stats"}))
            .map_err(|e| e.to_string())
    })
    .unwrap_or_else(|| panic!("no socket stats within {ANSWER_WITHIN:?} under the slowloris"))
    .expect("socket stats under the slowloris");
    assert_eq!(stats["ok"], json!(true), "{stats}");
    eprintln!(
        "under the slowloris: scrape in {scraped:?}, stats in {:?}",
        started.elapsed()
    );
    scrape.1
}

#[test]
fn a_slowloris_stalls_neither_the_scrape_nor_the_socket_and_is_closed() {
    require_root();
    let pair = NetnsPair::new(170);
    let dir = TempDir::new("hbmloris");
    let agent = AgentProcess::start_with_nofile(
        &pair,
        &[
            "--peers",
            &dir.peers_file([1, 2]),
            "--metrics-addr",
            METRICS,
        ],
        1024,
    );
    // A scrape works before the attack.
    let (status, _) = get_in(&pair.ns_a, METRICS, "/metrics", &[]).expect("GET /metrics");
    assert_eq!(status, 200);

    let attack_started = Instant::now();
    let mut loris = half_open(&pair.ns_a, 1000);
    // Those the kernel could not queue time out connecting (on a server that stops accepting).
    assert!(loris.len() >= 900, "only {} connected", loris.len());
    let made = loris.len();
    let open = loris.iter().filter(|s| !closed_by_server(s)).count();
    eprintln!(
        "{} half-open connections made in {:?}; {open} still open",
        loris.len(),
        attack_started.elapsed()
    );

    // While they are open: a full scrape and a socket request are answered.
    scrape_and_stats(&pair, &agent);
    let still_open = loris.iter().filter(|s| !closed_by_server(s)).count();
    eprintln!(
        "{still_open} slowloris connections open after the scrape and stats ({:?} in)",
        attack_started.elapsed()
    );

    // The server closes every one of them, at the latest after the header read timeout.
    let limit = HEADER_TIMEOUT + Duration::from_secs(5);
    wait_for(
        limit,
        "the server to close every half-open connection",
        || {
            loris.retain(|s| !closed_by_server(s));
            loris.is_empty().then_some(())
        },
    );
    let all_closed = attack_started.elapsed();
    eprintln!(
        "every slowloris connection closed by the server {all_closed:?} after the attack began"
    );
    // Counted by why (a scrape may be up to a second old: wait for one that shows them all).
    let made = made as f64;
    let (evicted, timed_out) = wait_for(Duration::from_secs(5), "the closes counted", || {
        let (_, text) = get_in(&pair.ns_a, METRICS, "/metrics", &[]).ok()?;
        let counts = (closed(&text, "evicted"), closed(&text, "header_timeout"));
        (counts.0 + counts.1 >= made).then_some(counts)
    });
    eprintln!("closed: {evicted} evicted for newer connections, {timed_out} at the header timeout");
    assert!(timed_out >= 1.0);
    integration_tests::attack::AttackRow {
        attack: "a slowloris on /metrics",
        load: format!(
            "{made} half-open HTTP connections, all closed within {all_closed:.1?}; a scrape meanwhile took {:.1} ms",
            SCRAPED.load(std::sync::atomic::Ordering::Relaxed) as f64 / 1e3
        ),
        ..Default::default()
    }
    .report();
    drop(agent);
}

/// One request on a keep-alive connection; the response's status and body.
fn keep_alive_get(stream: &mut TcpStream) -> std::io::Result<(u16, String)> {
    stream.write_all(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")?;
    let mut reply = Vec::new();
    let mut buf = [0u8; 16384];
    let (head_len, length) = loop {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            return Err(ErrorKind::UnexpectedEof.into());
        }
        reply.extend_from_slice(&buf[..n]);
        if let Some(end) = reply.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&reply[..end]).to_ascii_lowercase();
            let length: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .ok_or_else(|| std::io::Error::other(format!("no content-length: {head}")))?;
            break (end + 4, length);
        }
    };
    while reply.len() < head_len + length {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            return Err(ErrorKind::UnexpectedEof.into());
        }
        reply.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&reply).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    Ok((status, text[head_len..].to_string()))
}

#[test]
fn connections_over_the_cap_are_closed_at_once() {
    require_root();
    let pair = NetnsPair::new(171);
    let dir = TempDir::new("hbmcap");
    let agent = AgentProcess::start(
        &pair,
        &[
            "--peers",
            &dir.peers_file([1, 2]),
            "--metrics-addr",
            METRICS,
        ],
    );
    let addr: SocketAddr = METRICS.parse().unwrap();
    let result = in_netns(&pair.ns_a, move || {
        // The cap's worth of scrapers, each on a keep-alive connection it has used.
        let mut held: Vec<TcpStream> = (0..64)
            .map(|i| {
                let mut s = TcpStream::connect(addr).expect("connect");
                s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                let (status, _) =
                    keep_alive_get(&mut s).unwrap_or_else(|e| panic!("scrape {i}: {e}"));
                assert_eq!(status, 200);
                s
            })
            .collect();
        // One more: closed at once, with its request unanswered, long before any timeout.
        let mut extra = TcpStream::connect(addr).expect("connect the 65th");
        extra.set_read_timeout(Some(HEADER_TIMEOUT * 2)).unwrap();
        let started = Instant::now();
        let answer = keep_alive_get(&mut extra);
        let waited = started.elapsed();
        // Every connection of the cap still works, and shows the refusal counted (once the
        // reused scrape, at most a second old, is renewed).
        let text = wait_for(Duration::from_secs(5), "the refusal counted", || {
            let (status, text) = keep_alive_get(&mut held[0]).expect("a held connection scrapes");
            assert_eq!(status, 200);
            (closed(&text, "over_cap") >= 1.0).then_some(text)
        });
        // Closing one frees its place for a newcomer.
        held.pop();
        let newcomer = wait_for(Duration::from_secs(5), "a place freed by a close", || {
            let mut s = TcpStream::connect(addr).ok()?;
            s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
            keep_alive_get(&mut s).ok()
        });
        (answer, waited, text, newcomer.0)
    })
    .expect("in the namespace");
    let (answer, waited, text, newcomer) = result;
    let answer = answer.map(|(status, _)| status);
    eprintln!("the 65th connection: {answer:?} after {waited:?}");
    assert!(
        answer.is_err(),
        "the 65th connection was served: {answer:?}"
    );
    assert!(
        waited < Duration::from_secs(1),
        "the 65th connection was closed after {waited:?}, not at once"
    );
    assert_eq!(closed(&text, "over_cap"), 1.0, "{text}");
    assert_eq!(newcomer, 200);
    drop(agent);
}
