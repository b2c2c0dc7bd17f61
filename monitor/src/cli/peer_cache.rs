//! A local copy of the agent's view of its peers, kept current from its event stream, for the
//! consumers that answer other systems (`monitor haproxy-agent`, `monitor track-file`).
//!
//! It follows the rule of docs/socket-protocol.md, "A consumer that loses nothing", through the
//! client library's `Subscriber` (with `every_peer`): subscribe first, then read every peer
//! (`peers`) on a second connection and take that as the state; every change after the
//! subscription arrives as an event as well, so applying the events in order on top of the
//! snapshot ends where the agent is. After `lagged`, or after the connection ends (the agent
//! restarted), it starts over. Addresses are not in the events: a
//! second thread re-reads `peers` now and then and takes only their addresses (and peers it
//! has not seen yet) from it, never a level, which an event may have changed since.
//!
//! A check of HAProxy's then costs a map lookup, not a round trip to the agent: at
//! `agent-inter 100ms` and a few hundred servers that is thousands of socket requests a
//! second saved, and an answer does not wait on an agent busy with a sweep.

use std::{
    collections::HashMap,
    net::{IpAddr, SocketAddr},
    path::Path,
    sync::{Arc, Condvar, Mutex},
    thread,
    time::{Duration, Instant},
};

use monitor::serving::client::{Client, Event, PeerView, ResyncReason, Subscriber, Update};

/// What the cache holds of one peer.
#[derive(Debug, Clone, PartialEq)]
pub struct PeerState {
    /// The highest of the agent's levels reached; None below the lowest.
    pub level: Option<f64>,
    /// phi when that level was reached (or when last read), if known.
    pub phi: Option<f64>,
    /// The silence when `observed`, ms.
    pub silence_ms: f64,
    pub observed: Instant,
    /// The source address of its last heartbeat.
    pub addr: Option<IpAddr>,
}

impl PeerState {
    /// The silence now, if it is still silent (only known while suspected: a heartbeat that
    /// ends a silence below the lowest level raises no event).
    pub fn silence_now_ms(&self) -> f64 {
        self.silence_ms + self.observed.elapsed().as_secs_f64() * 1e3
    }
}

#[derive(Debug, Default)]
struct State {
    /// Whether the copy follows a live subscription; why not otherwise.
    connected: bool,
    why_not: String,
    peers: HashMap<u64, PeerState>,
    /// Bumped on every change, for waiters.
    version: u64,
}

/// What a name given by a consumer (`17`, `10.0.0.5`, `10.0.0.5:80`) resolves to.
#[derive(Debug, Clone, PartialEq)]
pub enum Lookup {
    Found(u64, PeerState),
    /// Not a peer the agent watches (yet).
    Unknown,
    /// Several peers send from that address: name one by id.
    Ambiguous(Vec<u64>),
    /// No live copy of the agent's view: why.
    NoAgent(String),
}

/// The shared copy; cheap to clone.
#[derive(Clone)]
pub struct PeerCache {
    inner: Arc<(Mutex<State>, Condvar)>,
}

impl PeerCache {
    /// Starts following the agent at `socket` (retrying every `retry` while it cannot be
    /// reached) and re-reading addresses every `refresh`.
    pub fn follow(socket: &Path, retry: Duration, refresh: Duration) -> Self {
        let cache = Self {
            inner: Arc::new((
                Mutex::new(State {
                    why_not: "not connected to the agent yet".into(),
                    ..State::default()
                }),
                Condvar::new(),
            )),
        };
        let (events, addrs) = (cache.clone(), cache.clone());
        let (socket_a, socket_b) = (socket.to_path_buf(), socket.to_path_buf());
        thread::Builder::new()
            .name("agent-events".into())
            .spawn(move || events.follow_loop(&socket_a, retry))
            .expect("spawning the event thread");
        thread::Builder::new()
            .name("agent-addrs".into())
            .spawn(move || addrs.refresh_loop(&socket_b, refresh))
            .expect("spawning the address thread");
        cache
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.inner.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn changed(&self, state: &mut State) {
        state.version += 1;
        self.inner.1.notify_all();
    }

    /// The current version (for `wait_change`).
    pub fn version(&self) -> u64 {
        self.lock().version
    }

    /// Waits until the copy changes from `version`, or `timeout` passes.
    pub fn wait_change(&self, version: u64, timeout: Duration) {
        let state = self.lock();
        let _ = self
            .inner
            .1
            .wait_timeout_while(state, timeout, |s| s.version == version);
    }

    /// Whether the copy follows the agent now, and why not.
    pub fn connected(&self) -> Result<(), String> {
        let state = self.lock();
        if state.connected {
            Ok(())
        } else {
            Err(state.why_not.clone())
        }
    }

    /// Resolves a peer named by id, address or address:port.
    pub fn lookup(&self, name: &str) -> Lookup {
        let state = self.lock();
        if !state.connected {
            return Lookup::NoAgent(state.why_not.clone());
        }
        match parse_name(name) {
            Some(Name::Id(id)) => match state.peers.get(&id) {
                Some(peer) => Lookup::Found(id, peer.clone()),
                None => Lookup::Unknown,
            },
            Some(Name::Addr(ip)) => {
                let mut ids: Vec<u64> = state
                    .peers
                    .iter()
                    .filter(|(_, p)| p.addr == Some(ip))
                    .map(|(id, _)| *id)
                    .collect();
                ids.sort_unstable();
                match ids.as_slice() {
                    [] => Lookup::Unknown,
                    [id] => Lookup::Found(*id, state.peers[id].clone()),
                    _ => Lookup::Ambiguous(ids),
                }
            }
            None => Lookup::Unknown,
        }
    }

    fn disconnected(&self, why: String) {
        let mut state = self.lock();
        if state.connected || state.why_not != why {
            log::warn!("not following the agent: {why}");
        }
        state.connected = false;
        state.why_not = why;
        self.changed(&mut state);
    }

    /// Follows the agent until it speaks another protocol version (then stays not connected,
    /// saying so): a resync replaces the copy, events change it, an outage marks it stale.
    fn follow_loop(&self, socket: &Path, retry: Duration) {
        let subscriber = Subscriber::new(socket).every_peer().retry(retry, retry);
        for update in subscriber {
            match update {
                Ok(Update::Resync {
                    reason, suspects, ..
                }) => {
                    if let ResyncReason::Lagged { missed } = reason {
                        log::warn!("missed {missed} events of the agent's; read every peer again");
                    }
                    self.resync(socket, &suspects);
                }
                Ok(Update::Event(event)) => self.apply(&event),
                Ok(Update::Unknown(_)) => {}
                Ok(Update::Disconnected(why)) => self.disconnected(why),
                Err(e) => self.disconnected(e.to_string()),
            }
        }
    }

    /// Takes every peer as the agent says now (after subscribing).
    fn resync(&self, socket: &Path, peers: &[PeerView]) {
        let mut state = self.lock();
        let now = Instant::now();
        state.peers = peers.iter().map(|p| (p.id, from_view(p, now))).collect();
        if !state.connected {
            log::info!(
                "following the agent at {}: {} peers",
                socket.display(),
                state.peers.len()
            );
        }
        state.connected = true;
        state.why_not.clear();
        self.changed(&mut state);
    }

    /// One event on top of the copy.
    fn apply(&self, event: &Event) {
        let mut state = self.lock();
        let now = Instant::now();
        match event {
            Event::Suspect(s) => {
                let peer = state.peers.entry(s.id).or_insert_with(|| blank(now));
                peer.level = Some(s.level);
                peer.phi = Some(s.phi);
                peer.silence_ms = s.silence_ms;
                peer.observed = now;
            }
            Event::Recover(r) => {
                let peer = state.peers.entry(r.id).or_insert_with(|| blank(now));
                peer.level = None;
                peer.phi = None;
                peer.silence_ms = 0.0;
                peer.observed = now;
            }
            Event::Admit { id, .. } => {
                state.peers.entry(*id).or_insert_with(|| blank(now));
            }
            Event::Forget { id, .. } => {
                state.peers.remove(id);
            }
            _ => return,
        }
        self.changed(&mut state);
    }

    fn refresh_loop(&self, socket: &Path, every: Duration) {
        loop {
            thread::sleep(every);
            if self.connected().is_err() {
                continue;
            }
            let Ok(peers) = read_peers(socket) else {
                continue;
            };
            let mut state = self.lock();
            if !state.connected {
                continue;
            }
            let now = Instant::now();
            let mut changed = false;
            for p in &peers {
                let addr = addr_of(p);
                match state.peers.get_mut(&p.id) {
                    // Only the address: the level may have changed by an event since.
                    Some(peer) if peer.addr != addr && addr.is_some() => {
                        peer.addr = addr;
                        changed = true;
                    }
                    Some(_) => {}
                    // Admitted before this read and after the copy's, its event still to
                    // come on the stream: the event will agree.
                    None => {
                        state.peers.insert(p.id, from_view(p, now));
                        changed = true;
                    }
                }
            }
            if changed {
                self.changed(&mut state);
            }
        }
    }
}

fn blank(now: Instant) -> PeerState {
    PeerState {
        level: None,
        phi: None,
        silence_ms: 0.0,
        observed: now,
        addr: None,
    }
}

fn addr_of(p: &PeerView) -> Option<IpAddr> {
    p.addr
        .as_deref()
        .and_then(|a| a.parse::<SocketAddr>().ok())
        .map(|a| a.ip().to_canonical())
}

fn from_view(p: &PeerView, now: Instant) -> PeerState {
    PeerState {
        level: p.level,
        phi: Some(p.phi),
        silence_ms: p.silence_ms,
        observed: now,
        addr: addr_of(p),
    }
}

/// Every peer (a busy reply is repeated by the client).
fn read_peers(socket: &Path) -> anyhow::Result<Vec<PeerView>> {
    let mut client = Client::connect(socket)?;
    client.set_read_timeout(Some(Duration::from_secs(30)))?;
    Ok(client.peers()?)
}

#[derive(Debug, PartialEq)]
enum Name {
    Id(u64),
    Addr(IpAddr),
}

/// `17`, `0x11`, `10.0.0.5`, `10.0.0.5:80`, `fd00::5`, `[fd00::5]:80`.
fn parse_name(name: &str) -> Option<Name> {
    let name = name.trim();
    let id = match name.strip_prefix("0x").or_else(|| name.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => name.parse::<u64>().ok(),
    };
    if let Some(id) = id {
        return Some(Name::Id(id));
    }
    if let Ok(ip) = name.parse::<IpAddr>() {
        return Some(Name::Addr(ip.to_canonical()));
    }
    name.parse::<SocketAddr>()
        .ok()
        .map(|a| Name::Addr(a.ip().to_canonical()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_ids_or_addresses() {
        assert_eq!(parse_name("17"), Some(Name::Id(17)));
        assert_eq!(parse_name(" 17\r"), Some(Name::Id(17)));
        assert_eq!(
            parse_name("10.0.0.5"),
            Some(Name::Addr("10.0.0.5".parse().unwrap()))
        );
        assert_eq!(
            parse_name("10.0.0.5:8080"),
            Some(Name::Addr("10.0.0.5".parse().unwrap()))
        );
        assert_eq!(
            parse_name("[fd00::5]:80"),
            Some(Name::Addr("fd00::5".parse().unwrap()))
        );
        assert_eq!(
            parse_name("::ffff:10.0.0.5"),
            Some(Name::Addr("10.0.0.5".parse().unwrap()))
        );
        assert_eq!(parse_name("0x11"), Some(Name::Id(17)));
        assert_eq!(parse_name("web1"), None);
    }
}
