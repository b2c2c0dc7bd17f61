//! `monitor haproxy-agent`: answers HAProxy's agent checks from the agent's view of its peers.
//!
//! HAProxy connects, sends the server's `agent-send` string (one line: a peer id, an address
//! or `address:port`), reads one line and closes. The reply is the policy's for the peer's
//! level, with the reason after a `#` (HAProxy logs it with a health state change). The
//! levels come from a local copy of the agent's view kept current from its events
//! (`peer_cache`), so a check costs no round trip to the agent.
//!
//! A name the agent does not know, an address several peers send from, or no agent to follow
//! get a reply that changes nothing in HAProxy: one word HAProxy does not know
//! (`monitor:unknown-peer`, ...). HAProxy 2.6 treats an unknown word as a neutral result
//! ("agent reports an error : monitor:unknown-peer" in the server's agent status) and leaves
//! the health, the admin state and the weight as they were; a `#` comment alone would be
//! just as neutral but HAProxy would say nothing of it, as it reads the text after `#` only
//! with a health word.

use std::{
    io::{ErrorKind, Read, Write},
    net::{SocketAddr, TcpListener, TcpStream},
    path::PathBuf,
    process::ExitCode,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::Context;
use clap::Args;
use monitor::DEFAULT_SOCKET;

use super::peer_cache::{Lookup, PeerCache};

/// The policy when none is given: a reduced weight at level 1, drained at 3, down at 8.
pub const DEFAULT_POLICY: [&str; 4] = ["0=up ready 100%", "1=up ready 50%", "3=up drain", "8=down"];

#[derive(Debug, Args)]
pub struct HaproxyAgentArgs {
    /// Address and port to answer HAProxy's agent checks on (`agent-addr`, `agent-port`).
    #[arg(long, value_name = "ADDR:PORT")]
    listen: SocketAddr,
    /// Path of the agent's Unix socket.
    #[arg(long, short, default_value = DEFAULT_SOCKET)]
    socket: PathBuf,
    /// The reply at and above a level, LEVEL=REPLY (repeatable; given once, it replaces the
    /// whole default). The peer's level is the highest of the agent's --levels it has
    /// reached; 0 is below the lowest and must be given. A REPLY is HAProxy agent words:
    /// `up`, `down`, `ready`, `drain`, `maint`, `N%`, `maxconn:N`. Say `ready` with every
    /// reply that should undo a `drain`: HAProxy keeps an admin state until told otherwise.
    #[arg(
        long,
        value_name = "LEVEL=REPLY",
        value_parser = parse_rule,
        default_values = DEFAULT_POLICY,
    )]
    policy: Vec<(f64, String)>,
    /// Connections served at once; more are closed at once with `monitor:busy` (no change).
    #[arg(long, default_value_t = 256)]
    max_connections: usize,
    /// Time HAProxy has to send its whole `agent-send` line.
    #[arg(long, default_value = "2s", value_parser = super::parse_duration)]
    read_timeout: Duration,
    /// Longest `agent-send` line accepted, bytes.
    #[arg(long, default_value_t = 256)]
    max_line: usize,
    /// Wait between attempts to reach the agent's socket.
    #[arg(long, default_value = "1s", value_parser = super::parse_duration)]
    retry: Duration,
    /// How often the peers' addresses are read again (for servers named by address).
    #[arg(long, default_value = "1s", value_parser = super::parse_duration)]
    refresh: Duration,
}

fn parse_rule(text: &str) -> Result<(f64, String), String> {
    let (level, reply) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?}: expected LEVEL=REPLY, such as 3=drain"))?;
    let level: f64 = level
        .trim()
        .parse()
        .map_err(|_| format!("{text:?}: the level is not a number"))?;
    if !(level >= 0.0 && level.is_finite()) {
        return Err(format!("{text:?}: the level must be 0 or more"));
    }
    let reply = reply.trim();
    if reply.is_empty() || reply.contains(['#', '\n', '\r']) {
        return Err(format!(
            "{text:?}: the reply must be agent words on one line, without `#` (the reason is added)"
        ));
    }
    Ok((level, reply.to_string()))
}

/// The replies by level, lowest first.
#[derive(Debug, Clone)]
pub struct Policy(Vec<(f64, String)>);

impl Policy {
    pub fn new(mut rules: Vec<(f64, String)>) -> anyhow::Result<Self> {
        rules.sort_by(|a, b| a.0.total_cmp(&b.0));
        rules.dedup_by(|later, earlier| {
            // The last one given wins.
            if later.0 == earlier.0 {
                earlier.1 = later.1.clone();
                true
            } else {
                false
            }
        });
        anyhow::ensure!(
            rules.first().is_some_and(|r| r.0 == 0.0),
            "--policy needs a reply for level 0 (below the lowest level), such as 0=up ready 100%"
        );
        Ok(Self(rules))
    }

    /// The reply for a peer at `level` (None: below the lowest).
    pub fn reply(&self, level: Option<f64>) -> &str {
        let level = level.unwrap_or(0.0);
        self.0
            .iter()
            .rev()
            .find(|r| r.0 <= level)
            .map(|r| r.1.as_str())
            .unwrap_or(self.0[0].1.as_str())
    }
}

/// The line HAProxy gets for `name`.
pub fn answer(cache: &PeerCache, policy: &Policy, name: &str) -> String {
    match cache.lookup(name) {
        Lookup::Found(id, peer) => match peer.level {
            None => format!("{} #peer {id} below every level", policy.reply(None)),
            Some(level) => format!(
                "{} #peer {id} level {level} phi {} silent {:.0} ms",
                policy.reply(Some(level)),
                peer.phi.map_or("?".into(), |p| format!("{p:.2}")),
                peer.silence_now_ms()
            ),
        },
        Lookup::Unknown => {
            format!("monitor:unknown-peer #{name} is not a peer the agent watches; no change")
        }
        Lookup::Ambiguous(ids) => format!(
            "monitor:ambiguous-address #peers {ids:?} send from {name}; name one by id; no change"
        ),
        Lookup::NoAgent(why) => format!("monitor:no-agent #{why}; no change"),
    }
}

pub fn haproxy_agent(args: HaproxyAgentArgs) -> anyhow::Result<ExitCode> {
    let policy = Arc::new(Policy::new(args.policy.clone())?);
    anyhow::ensure!(
        args.max_connections > 0,
        "--max-connections must be at least 1"
    );
    let listener =
        TcpListener::bind(args.listen).with_context(|| format!("listening on {}", args.listen))?;
    let cache = PeerCache::follow(&args.socket, args.retry, args.refresh);
    log::info!(
        "answering HAProxy's agent checks on {} from the agent at {}; policy {}",
        listener.local_addr()?,
        args.socket.display(),
        policy
            .0
            .iter()
            .map(|(l, r)| format!("{l}={r}"))
            .collect::<Vec<_>>()
            .join("; ")
    );
    let active = Arc::new(AtomicUsize::new(0));
    for stream in listener.incoming() {
        let mut stream = match stream {
            Ok(s) => s,
            Err(e) => {
                // Out of file descriptors and the like: say so, wait a little, go on.
                log::warn!("accepting a connection: {e}");
                thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        if active.fetch_add(1, Ordering::AcqRel) >= args.max_connections {
            active.fetch_sub(1, Ordering::AcqRel);
            let _ = stream.set_nonblocking(true);
            let _ = stream.write_all(b"monitor:busy #too many connections; no change\n");
            continue;
        }
        let (cache, policy, active) = (cache.clone(), policy.clone(), active.clone());
        let (timeout, max_line) = (args.read_timeout, args.max_line);
        let spawned = thread::Builder::new()
            .name("agent-check".into())
            .stack_size(128 * 1024)
            .spawn(move || {
                serve(stream, &cache, &policy, timeout, max_line);
                active.fetch_sub(1, Ordering::AcqRel);
            });
        if let Err(e) = spawned {
            log::warn!("no thread for a check: {e}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// One check: a line in, a line out, closed.
fn serve(
    mut stream: TcpStream,
    cache: &PeerCache,
    policy: &Policy,
    timeout: Duration,
    max_line: usize,
) {
    let reply = match read_name(&mut stream, timeout, max_line) {
        Ok(name) => answer(cache, policy, &name),
        Err(why) => format!("monitor:bad-request #{why}; no change"),
    };
    log::debug!("agent check from {:?}: {reply}", stream.peer_addr().ok());
    let _ = stream.set_write_timeout(Some(timeout));
    let _ = stream.write_all(format!("{reply}\n").as_bytes());
    let _ = stream.shutdown(std::net::Shutdown::Both);
}

/// The name in HAProxy's `agent-send` line, read within `timeout` and `max_line` bytes.
fn read_name(stream: &mut TcpStream, timeout: Duration, max_line: usize) -> Result<String, String> {
    let deadline = Instant::now() + timeout;
    let mut buf = Vec::with_capacity(64);
    let mut chunk = [0u8; 512];
    loop {
        if let Some(end) = buf.iter().position(|&b| b == b'\n' || b == b'\r') {
            buf.truncate(end);
            break;
        }
        if buf.len() > max_line {
            return Err(format!("a line longer than {max_line} bytes"));
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(format!(
                "no agent-send line within {timeout:?} (agent-send \"ID\\n\" names the peer)"
            ));
        }
        let _ = stream.set_read_timeout(Some(left));
        match stream.read(&mut chunk) {
            // The sender closed its side: what came is the line.
            Ok(0) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n.min(max_line + 1)]),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) => return Err(format!("reading the request: {e}")),
        }
    }
    if buf.len() > max_line {
        return Err(format!("a line longer than {max_line} bytes"));
    }
    let name = String::from_utf8(buf).map_err(|_| "a line that is not UTF-8".to_string())?;
    let name = name.trim();
    if name.is_empty() {
        return Err("an empty agent-send line (agent-send \"ID\\n\" names the peer)".into());
    }
    if name.chars().any(|c| c.is_control()) {
        return Err("control characters in the line".into());
    }
    Ok(name.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn default_policy() -> Policy {
        Policy::new(
            DEFAULT_POLICY
                .iter()
                .map(|r| parse_rule(r).unwrap())
                .collect(),
        )
        .unwrap()
    }

    #[test]
    fn the_default_policy_by_level() {
        let p = default_policy();
        assert_eq!(p.reply(None), "up ready 100%");
        assert_eq!(p.reply(Some(1.0)), "up ready 50%");
        assert_eq!(p.reply(Some(3.0)), "up drain");
        assert_eq!(p.reply(Some(5.0)), "up drain");
        assert_eq!(p.reply(Some(8.0)), "down");
        assert_eq!(p.reply(Some(12.0)), "down");
    }

    #[test]
    fn rules_are_checked() {
        assert!(parse_rule("3=drain #x").is_err());
        assert!(parse_rule("drain").is_err());
        assert!(parse_rule("-1=up").is_err());
        assert!(parse_rule("x=up").is_err());
        assert_eq!(parse_rule(" 2 = 75% ").unwrap(), (2.0, "75%".into()));
        assert!(Policy::new(vec![(3.0, "drain".into())]).is_err());
        let p = Policy::new(vec![(0.0, "up".into()), (0.0, "75%".into())]).unwrap();
        assert_eq!(p.reply(None), "75%");
    }

    /// One check through `serve` on loopback: what the client sends, what it reads back.
    fn check(send: &[u8], close_after: bool) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let cache = PeerCache::follow(
            std::path::Path::new("/nonexistent/agent.sock"),
            Duration::from_secs(60),
            Duration::from_secs(60),
        );
        let server = thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            serve(
                stream,
                &cache,
                &default_policy(),
                Duration::from_millis(300),
                16,
            );
        });
        let mut client = TcpStream::connect(addr).unwrap();
        client.write_all(send).unwrap();
        if close_after {
            client.shutdown(std::net::Shutdown::Write).unwrap();
        }
        // Up to the end or an error (a reset after the reply, for input left unread).
        let mut reply = Vec::new();
        let mut buf = [0u8; 256];
        while let Ok(n) = client.read(&mut buf) {
            if n == 0 {
                break;
            }
            reply.extend_from_slice(&buf[..n]);
        }
        server.join().unwrap();
        String::from_utf8(reply).unwrap()
    }

    #[test]
    fn every_input_is_bounded_and_answered_without_a_change() {
        // No agent to follow: a neutral word, with why.
        assert!(check(b"17\n", false).starts_with("monitor:no-agent #"));
        // Longer than --max-line, without a newline: refused, not waited on.
        assert!(check(&[b'7'; 4000], false).starts_with("monitor:bad-request #a line longer"));
        // Nothing within --read-timeout.
        assert!(check(b"", false).starts_with("monitor:bad-request #no agent-send line"));
        // Closed without a newline: what came is the line.
        assert!(check(b"17", true).starts_with("monitor:no-agent #"));
        assert!(
            check(b"\xff\n", false).starts_with("monitor:bad-request #a line that is not UTF-8")
        );
        assert!(check(b"\n", false).starts_with("monitor:bad-request #an empty"));
        for reply in [check(b"17\n", false), check(b"", false)] {
            assert_eq!(reply.matches('\n').count(), 1, "one line: {reply:?}");
        }
    }
}
