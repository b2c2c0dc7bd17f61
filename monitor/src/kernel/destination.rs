//! Which destination addresses heartbeats are accepted at (`monitor run --listen-addr`).
//!
//! With the check on (`XDP_FLAG_CHECK_DESTINATION`), the kernel records and consumes a
//! heartbeat only if its destination address is in the LOCAL_ADDRS map; one to another
//! address (a router or a forwarding host sees those) is passed untouched and counted as
//! `not_local`. The agent fills the map with the `--listen-addr` list, or, without one, with
//! the interface's own addresses, re-read whenever the kernel announces an address change
//! (an rtnetlink subscription) and at least every [`REFRESH`] (should a notification be
//! lost), so an address added or removed later is followed at once, within half a second at
//! worst. `--listen-addr any` turns the check off.
//!
//! Multicast and broadcast destinations are not addresses of the interface: a heartbeat to
//! a group or to a broadcast address is recorded only if that address is listed in
//! `--listen-addr` (or with `any`).

use std::{
    collections::BTreeSet,
    fmt, io,
    net::{IpAddr, Ipv6Addr},
    path::Path,
    str::FromStr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::Duration,
};

use aya::{
    Ebpf,
    maps::{Array, HashMap as BpfHashMap, Map, MapData, MapError},
};
use monitor_common::{
    config::XDP_FLAG_CHECK_DESTINATION,
    maps::{LOCAL_ADDRS_CAPACITY, LOCAL_ADDRS_MAP, LOCAL_FAST_MAP, LocalFast, local_addr_key},
};

/// How often the following thread wakes: to re-read the interface's addresses when no change
/// notifications could be subscribed, and in any case to see whether it should stop.
pub const REFRESH: Duration = Duration::from_millis(500);

/// How often the addresses are re-read although no change was announced: a safety net behind
/// the rtnetlink notifications (an overrun of them wakes a re-read too). Each read dumps every
/// link and address of the host (getifaddrs), which costs far more than a heartbeat's share of
/// the agent when done every REFRESH (a profile of the agent at scale showed it: see
/// docs/benchmarks-history.md, "the agent's address re-reads").
pub const RESYNC: Duration = Duration::from_secs(30);

/// One `--listen-addr` value: an address, or `any`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListenAddr {
    Any,
    Addr(IpAddr),
}

impl FromStr for ListenAddr {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        if text.eq_ignore_ascii_case("any") {
            return Ok(ListenAddr::Any);
        }
        text.parse::<IpAddr>()
            .map(ListenAddr::Addr)
            .map_err(|_| format!("{text:?} is not an IPv4 or IPv6 address (nor `any`)"))
    }
}

impl fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ListenAddr::Any => f.write_str("any"),
            ListenAddr::Addr(addr) => addr.fmt(f),
        }
    }
}

/// Which destinations count.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Listen {
    /// The interface's own addresses, followed as they change (no `--listen-addr`).
    #[default]
    Interface,
    /// Every destination (`--listen-addr any`): no check.
    Any,
    /// Exactly these (`--listen-addr A,B`).
    Addrs(BTreeSet<IpAddr>),
}

impl Listen {
    /// From the `--listen-addr` values: none is the interface's addresses; `any` must stand
    /// alone.
    pub fn from_args(values: &[ListenAddr]) -> Result<Self, String> {
        if values.is_empty() {
            return Ok(Listen::Interface);
        }
        if values.contains(&ListenAddr::Any) {
            if values.len() > 1 {
                return Err("--listen-addr any stands alone (it accepts every destination)".into());
            }
            return Ok(Listen::Any);
        }
        let addrs: BTreeSet<IpAddr> = values
            .iter()
            .filter_map(|v| match v {
                ListenAddr::Addr(a) => Some(a.to_canonical()),
                ListenAddr::Any => None,
            })
            .collect();
        if addrs.len() > LOCAL_ADDRS_CAPACITY as usize {
            return Err(format!(
                "--listen-addr: at most {LOCAL_ADDRS_CAPACITY} addresses"
            ));
        }
        Ok(Listen::Addrs(addrs))
    }

    /// The `XdpConfig` flag bits this needs.
    pub fn xdp_flags(&self) -> u32 {
        match self {
            Listen::Any => 0,
            Listen::Interface | Listen::Addrs(_) => XDP_FLAG_CHECK_DESTINATION,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DestinationError {
    #[error("the eBPF object has no map {LOCAL_ADDRS_MAP} or {LOCAL_FAST_MAP}")]
    MissingMap,
    #[error("map {LOCAL_ADDRS_MAP}: {0}")]
    Map(#[from] MapError),
    #[error(transparent)]
    Pin(#[from] crate::kernel::pinning::PinError),
    #[error("reading the addresses of {iface}: {source}")]
    Interface { iface: String, source: io::Error },
    #[error("{0} destination addresses; LOCAL_ADDRS holds at most {LOCAL_ADDRS_CAPACITY}")]
    TooMany(usize),
    #[error(
        "whether destinations are checked (`any` or not) is fixed when the program is loaded: a restart applies it"
    )]
    CheckFixed,
}

/// The LOCAL_ADDRS map and its first few addresses in LOCAL_FAST, from userspace.
pub struct LocalAddrs {
    map: BpfHashMap<MapData, [u8; 16], u8>,
    fast: Array<MapData, LocalFast>,
}

impl LocalAddrs {
    /// The maps of a loaded object (taken out of it).
    pub fn take(ebpf: &mut Ebpf) -> Result<Self, DestinationError> {
        let map = ebpf
            .take_map(LOCAL_ADDRS_MAP)
            .ok_or(DestinationError::MissingMap)?;
        let fast = ebpf
            .take_map(LOCAL_FAST_MAP)
            .ok_or(DestinationError::MissingMap)?;
        Ok(Self {
            map: BpfHashMap::try_from(map)?,
            fast: Array::try_from(fast)?,
        })
    }

    /// The maps from their kernel handles (found by id, say).
    pub fn from_map_data(addrs: MapData, fast: MapData) -> Result<Self, DestinationError> {
        Ok(Self {
            map: BpfHashMap::try_from(Map::HashMap(addrs))?,
            fast: Array::try_from(Map::Array(fast))?,
        })
    }

    /// The maps pinned under `dir` (adopted state).
    pub fn open_pinned(dir: &Path) -> Result<Self, DestinationError> {
        let map: Map = crate::kernel::pinning::open(dir, LOCAL_ADDRS_MAP)?;
        let fast: Map = crate::kernel::pinning::open(dir, LOCAL_FAST_MAP)?;
        Ok(Self {
            map: BpfHashMap::try_from(map)?,
            fast: Array::try_from(fast)?,
        })
    }

    /// The addresses in the map now.
    pub fn get(&self) -> Result<BTreeSet<IpAddr>, DestinationError> {
        let mut out = BTreeSet::new();
        for key in self.map.keys() {
            out.insert(from_key(key?));
        }
        Ok(out)
    }

    /// Makes the map hold exactly `addrs`: new ones are added before old ones go, so an
    /// address in both is never missing.
    pub fn set(&mut self, addrs: &BTreeSet<IpAddr>) -> Result<(), DestinationError> {
        if addrs.len() > LOCAL_ADDRS_CAPACITY as usize {
            return Err(DestinationError::TooMany(addrs.len()));
        }
        let current = self.get()?;
        for addr in addrs.difference(&current) {
            self.map.insert(local_addr_key(*addr), 1, 0)?;
        }
        // Between the additions and the removals: every address of either set is still found.
        self.fast.set(0, fast_of(addrs), 0)?;
        for addr in current.difference(addrs) {
            match self.map.remove(&local_addr_key(*addr)) {
                Ok(()) | Err(MapError::KeyNotFound) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }
}

/// The first `LOCAL_FAST_ADDRS` of `addrs` as the kernel compares them.
fn fast_of(addrs: &BTreeSet<IpAddr>) -> LocalFast {
    let mut fast = LocalFast::default();
    for (slot, addr) in fast.addrs.iter_mut().zip(addrs) {
        let key = local_addr_key(*addr);
        *slot = [
            u64::from_ne_bytes(key[..8].try_into().expect("8 bytes")),
            u64::from_ne_bytes(key[8..].try_into().expect("8 bytes")),
        ];
        fast.count += 1;
    }
    fast
}

fn from_key(key: [u8; 16]) -> IpAddr {
    IpAddr::V6(Ipv6Addr::from(key)).to_canonical()
}

/// The addresses of `iface` (IPv4 and IPv6, link-local included), from getifaddrs(3); an
/// IPv4-mapped IPv6 address as the IPv4 address it maps (the kernel keys both alike).
pub fn interface_addrs(iface: &str) -> io::Result<BTreeSet<IpAddr>> {
    Ok(interface_entries(iface)?
        .map(|(addr, _)| addr.to_canonical())
        .collect())
}

/// The networks of `iface`'s addresses (each address's prefix, the host bits cleared:
/// 10.211.5.1/24 is 10.211.5.0/24), IPv4 and IPv6, link-local included: a packet from a
/// link-local source came from the link itself, as much a neighbour as one from the /24.
pub fn interface_networks(iface: &str) -> io::Result<BTreeSet<ipnet::IpNet>> {
    Ok(interface_entries(iface)?
        .filter_map(|(addr, prefix)| ipnet::IpNet::new(addr, prefix?).ok())
        .map(|net| net.trunc())
        .collect())
}

/// Each IP address of `iface` with its prefix length (None without a netmask).
fn interface_entries(iface: &str) -> io::Result<impl Iterator<Item = (IpAddr, Option<u8>)>> {
    let iface = iface.to_owned();
    Ok(nix::ifaddrs::getifaddrs()?.filter_map(move |entry| {
        if entry.interface_name != iface {
            return None;
        }
        let address = entry.address?;
        let netmask = entry.netmask;
        if let Some(sin) = address.as_sockaddr_in() {
            let prefix = netmask
                .as_ref()
                .and_then(|m| m.as_sockaddr_in())
                .map(|m| m.ip().to_bits().leading_ones() as u8);
            Some((IpAddr::V4(sin.ip()), prefix))
        } else if let Some(sin6) = address.as_sockaddr_in6() {
            let prefix = netmask
                .as_ref()
                .and_then(|m| m.as_sockaddr_in6())
                .map(|m| m.ip().to_bits().leading_ones() as u8);
            Some((IpAddr::V6(sin6.ip()), prefix))
        } else {
            None
        }
    }))
}

/// Follows the networks of an interface's addresses while alive (the default of
/// `--admit-from`), as [`Destinations`] follows its addresses: re-read on each rtnetlink
/// announcement and every [`RESYNC`]. Dropping it stops the thread (within [`REFRESH`]).
pub struct NetworkFollower {
    follower: Option<Follower>,
}

impl Drop for NetworkFollower {
    fn drop(&mut self) {
        if let Some(follower) = self.follower.take() {
            follower.stop().join();
        }
    }
}

/// Reads the networks of `iface` and hands them to `changed`, then again each time they
/// change, from a thread of its own, until the follower is dropped. Fails only if the
/// interface's addresses cannot be read at all.
pub fn follow_networks(
    iface: &str,
    changed: impl Fn(&BTreeSet<ipnet::IpNet>) + Send + 'static,
) -> Result<NetworkFollower, DestinationError> {
    let read = |iface: &str| {
        interface_networks(iface).map_err(|source| DestinationError::Interface {
            iface: iface.into(),
            source,
        })
    };
    // Subscribed before the first read, so no change falls between the two.
    let changes = AddressChanges::subscribe()
        .map_err(|e| log::warn!("rtnetlink address notifications: {e}; polling only"))
        .ok();
    let mut current = read(iface)?;
    changed(&current);
    let stop = Arc::new(AtomicBool::new(false));
    let thread = {
        let (iface, stop) = (iface.to_string(), stop.clone());
        std::thread::Builder::new()
            .name("networks".into())
            .spawn(move || {
                let mut read_at = std::time::Instant::now();
                while time_to_read(changes.as_ref(), &mut read_at, &stop) {
                    match read(&iface) {
                        Ok(next) if next != current => {
                            changed(&next);
                            current = next;
                        }
                        Ok(_) => {}
                        Err(e) => log::warn!("{e}"),
                    }
                }
            })
            .map_err(|source| DestinationError::Interface {
                iface: "(thread)".into(),
                source,
            })?
    };
    Ok(NetworkFollower {
        follower: Some(Follower { stop, thread }),
    })
}

/// Keeps LOCAL_ADDRS in step with the configuration while alive: for [`Listen::Interface`] a
/// thread re-reads the interface's addresses on each announced change and every [`RESYNC`]
/// (every [`REFRESH`] if changes cannot be subscribed). [`Destinations::set`] changes the
/// configuration live (SIGHUP). Dropping it stops the thread (within [`REFRESH`]); the map
/// keeps what it last held.
pub struct Destinations {
    iface: String,
    listen: Listen,
    /// Shared with the following thread; whoever writes holds the lock, and the thread
    /// checks under it that it has not been stopped, so a stopped thread never writes.
    map: Arc<Mutex<LocalAddrs>>,
    follower: Option<Follower>,
}

/// The thread that follows the interface's addresses.
struct Follower {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

impl Follower {
    /// Tells the thread to stop and wakes it; `join` waits for it to end.
    fn stop(self) -> Self {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.thread().unpark();
        self
    }

    fn join(self) {
        let _ = self.thread.join();
    }
}

impl Drop for Destinations {
    fn drop(&mut self) {
        if let Some(follower) = self.follower.take() {
            follower.stop().join();
        }
    }
}

/// Fills LOCAL_ADDRS for `listen` and, for the interface's addresses, follows them. The map
/// comes from `ebpf` when the program was loaded here, else from the pins under `pinned`.
pub fn start(
    iface: &str,
    listen: &Listen,
    ebpf: Option<&mut Ebpf>,
    pinned: Option<&Path>,
) -> Result<Destinations, DestinationError> {
    let map = match (ebpf, pinned) {
        (Some(ebpf), _) => LocalAddrs::take(ebpf)?,
        (None, Some(dir)) => LocalAddrs::open_pinned(dir)?,
        (None, None) => return Err(DestinationError::MissingMap),
    };
    let mut destinations = Destinations {
        iface: iface.to_string(),
        listen: listen.clone(),
        map: Arc::new(Mutex::new(map)),
        follower: None,
    };
    destinations.apply(listen)?;
    Ok(destinations)
}

impl Destinations {
    /// Changes what is accepted, live: a list for another list, for the interface's addresses,
    /// or the other way round. Whether the kernel checks at all is fixed when the program is
    /// loaded, so a change to or from `any` is refused ([`DestinationError::CheckFixed`]); so
    /// is one whose addresses cannot be read or written, and then nothing changes.
    pub fn set(&mut self, listen: &Listen) -> Result<(), DestinationError> {
        if (*listen == Listen::Any) != (self.listen == Listen::Any) {
            return Err(DestinationError::CheckFixed);
        }
        self.apply(listen)?;
        self.listen = listen.clone();
        Ok(())
    }

    fn apply(&mut self, listen: &Listen) -> Result<(), DestinationError> {
        let iface = self.iface.clone();
        // Subscribed before the first read, so no change falls between the two. Read before
        // anything changes: an interface that cannot be read changes nothing.
        let (wanted, changes) = match listen {
            Listen::Any => (None, None),
            Listen::Addrs(addrs) => (Some(addrs.clone()), None),
            Listen::Interface => {
                let changes = AddressChanges::subscribe()
                    .map_err(|e| log::warn!("rtnetlink address notifications: {e}; polling only"))
                    .ok();
                (Some(read_interface(&iface)?), changes)
            }
        };
        {
            let mut map = self.map.lock().expect("destinations lock");
            if let Some(addrs) = &wanted {
                map.set(addrs)?;
            }
            // Under the lock: the old thread, if any, writes nothing after this.
            // Not waited for: it ends within REFRESH, and writes nothing once stopped.
            if let Some(old) = self.follower.take() {
                drop(old.stop());
            }
        }
        match (listen, wanted) {
            (Listen::Interface, Some(current)) => {
                log::info!(
                    "heartbeats accepted at the addresses of {iface}: {} (followed as they change)",
                    show(&current)
                );
                let stop = Arc::new(AtomicBool::new(false));
                let thread = follow(iface, current, self.map.clone(), stop.clone(), changes)?;
                self.follower = Some(Follower { stop, thread });
            }
            (_, Some(addrs)) => log::info!("heartbeats accepted at {}", show(&addrs)),
            (_, None) => {
                log::info!("heartbeats accepted at every destination address (--listen-addr any)")
            }
        }
        Ok(())
    }
}

fn read_interface(iface: &str) -> Result<BTreeSet<IpAddr>, DestinationError> {
    interface_addrs(iface).map_err(|source| DestinationError::Interface {
        iface: iface.into(),
        source,
    })
}

/// A following thread's wait: until a change is announced (or, with no subscription, every
/// [`REFRESH`]), and at the latest every [`RESYNC`]; whether to read the interface again
/// (false: `stop` was set, the thread ends). `read_at` is when it last read.
fn time_to_read(
    changes: Option<&AddressChanges>,
    read_at: &mut std::time::Instant,
    stop: &AtomicBool,
) -> bool {
    while !stop.load(Ordering::Relaxed) {
        let announced = match changes {
            Some(changes) => changes.wait(REFRESH),
            None => {
                std::thread::park_timeout(REFRESH);
                true
            }
        };
        if stop.load(Ordering::Relaxed) {
            break;
        }
        if announced || read_at.elapsed() >= RESYNC {
            *read_at = std::time::Instant::now();
            return true;
        }
    }
    false
}

/// The thread that re-reads the addresses of `iface` and writes them to the map when they
/// changed, until `stop`.
fn follow(
    iface: String,
    mut current: BTreeSet<IpAddr>,
    map: Arc<Mutex<LocalAddrs>>,
    stop: Arc<AtomicBool>,
    changes: Option<AddressChanges>,
) -> Result<JoinHandle<()>, DestinationError> {
    std::thread::Builder::new()
        .name("destinations".into())
        .spawn(move || {
            let mut read_at = std::time::Instant::now();
            while time_to_read(changes.as_ref(), &mut read_at, &stop) {
                let next = match read_interface(&iface) {
                    Ok(next) => next,
                    Err(e) => {
                        log::warn!("{e}");
                        continue;
                    }
                };
                if next == current {
                    continue;
                }
                let mut map = map.lock().expect("destinations lock");
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                match map.set(&next) {
                    Ok(()) => {
                        log::info!(
                            "addresses of {iface} changed: heartbeats accepted at {}",
                            show(&next)
                        );
                        current = next;
                    }
                    Err(e) => log::warn!("updating {LOCAL_ADDRS_MAP}: {e}"),
                }
            }
        })
        .map_err(|source| DestinationError::Interface {
            iface: "(thread)".into(),
            source,
        })
}

/// A NETLINK_ROUTE socket subscribed to IPv4 and IPv6 address changes (RTMGRP_*_IFADDR):
/// only a wake-up, the addresses themselves are read with getifaddrs.
struct AddressChanges {
    fd: std::os::fd::OwnedFd,
}

impl AddressChanges {
    const RTMGRP_IPV4_IFADDR: u32 = 0x10;
    const RTMGRP_IPV6_IFADDR: u32 = 0x100;

    fn subscribe() -> io::Result<Self> {
        use std::os::fd::FromRawFd;
        // SAFETY: plain socket(2); the fd is owned below.
        let raw = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
                libc::NETLINK_ROUTE,
            )
        };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh fd nobody else owns.
        let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(raw) };
        // SAFETY: all-zero is a valid sockaddr_nl; the fields that matter are set below.
        let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        addr.nl_family = libc::AF_NETLINK as libc::sa_family_t;
        addr.nl_groups = Self::RTMGRP_IPV4_IFADDR | Self::RTMGRP_IPV6_IFADDR;
        // SAFETY: addr is a sockaddr_nl of the size passed.
        let rc = unsafe {
            libc::bind(
                std::os::fd::AsRawFd::as_raw_fd(&fd),
                (&raw const addr).cast(),
                std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Self { fd })
    }

    /// Returns when a change was announced (true, the messages drained) or after `limit`.
    fn wait(&self, limit: Duration) -> bool {
        use std::os::fd::AsRawFd;
        let mut pfd = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let ready = unsafe { libc::poll(&mut pfd, 1, limit.as_millis() as libc::c_int) };
        if ready <= 0 {
            return false;
        }
        let mut buf = [0u8; 8192];
        loop {
            // SAFETY: recv into a buffer of the given length; non-blocking socket.
            let n = unsafe { libc::recv(pfd.fd, buf.as_mut_ptr().cast(), buf.len(), 0) };
            // Drained (EAGAIN), or overrun (ENOBUFS: changes were lost, and the re-read that
            // follows picks them up anyway).
            if n <= 0 {
                break;
            }
        }
        true
    }
}

fn show(addrs: &BTreeSet<IpAddr>) -> String {
    if addrs.is_empty() {
        return "no address (every heartbeat is passed as not_local)".into();
    }
    addrs
        .iter()
        .map(IpAddr::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_addr_values() {
        let parse = |v: &[&str]| {
            let values: Vec<ListenAddr> = v.iter().map(|s| s.parse().unwrap()).collect();
            Listen::from_args(&values)
        };
        assert_eq!(parse(&[]), Ok(Listen::Interface));
        assert_eq!(parse(&["any"]), Ok(Listen::Any));
        assert!(parse(&["any", "10.0.0.1"]).is_err());
        let Ok(Listen::Addrs(addrs)) = parse(&["10.0.0.1", "::ffff:10.0.0.2", "fd00::1"]) else {
            panic!()
        };
        let want: BTreeSet<IpAddr> = ["10.0.0.1", "10.0.0.2", "fd00::1"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        assert_eq!(addrs, want);
        assert!("10.0.0".parse::<ListenAddr>().is_err());
        assert_eq!(Listen::Any.xdp_flags(), 0);
        assert_eq!(Listen::Interface.xdp_flags(), XDP_FLAG_CHECK_DESTINATION);
    }

    #[test]
    fn keys_round_trip() {
        for text in ["192.0.2.7", "2001:db8::7"] {
            let addr: IpAddr = text.parse().unwrap();
            assert_eq!(from_key(local_addr_key(addr)), addr);
        }
    }

    #[test]
    fn loopback_has_its_network() {
        let nets = interface_networks("lo").unwrap();
        assert!(nets.contains(&"127.0.0.0/8".parse().unwrap()), "{nets:?}");
    }

    #[test]
    fn loopback_has_its_address() {
        let addrs = interface_addrs("lo").unwrap();
        assert!(
            addrs.contains(&IpAddr::V4(std::net::Ipv4Addr::LOCALHOST)),
            "{addrs:?}"
        );
    }
}
