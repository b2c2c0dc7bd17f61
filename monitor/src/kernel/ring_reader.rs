//! Reading the kernel's BPF ring buffers (unknown-peer reports, traced arrivals): one record
//! type per ring, each record a plain `repr(C)` value the XDP program wrote.

use aya::maps::{MapData, RingBuf};
use tokio::io::{Interest, unix::AsyncFd};

/// Decodes one ring buffer record; None if it is shorter than a `T`.
pub fn decode<T: aya::Pod>(bytes: &[u8]) -> Option<T> {
    if bytes.len() < size_of::<T>() {
        return None;
    }
    // SAFETY: length checked; Pod types are plain integers, valid for any bit pattern, and
    // read_unaligned needs no alignment.
    Some(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast()) })
}

/// Records handled before the reader gives other tasks a turn.
const YIELD_EVERY: usize = 512;

/// Delivers every record of `ring` to `on_record`, forever (until reading fails).
pub async fn consume<T: aya::Pod>(
    ring: RingBuf<MapData>,
    mut on_record: impl FnMut(T),
) -> std::io::Result<()> {
    // SAFETY: the RingBuf owns its map fd and keeps it open, unchanged, for as long as the
    // AsyncFd owns the RingBuf.
    let mut fd = unsafe { AsyncFd::register_with_interest(ring, Interest::READABLE) }
        .map_err(std::io::Error::from)?;
    loop {
        let mut guard = fd.readable_mut().await?;
        let ring = guard.get_inner_mut();
        let mut batch = 0usize;
        let mut drained = true;
        while let Some(item) = ring.next() {
            if let Some(record) = decode(&item) {
                on_record(record);
            }
            batch += 1;
            if batch == YIELD_EVERY {
                // A ring refilled as fast as it is read (50,000 peers starting at once) must
                // not hold this worker thread: the socket and the sweep share the runtime.
                drained = false;
                break;
            }
        }
        if drained {
            guard.clear_ready();
        } else {
            drop(guard);
            tokio::task::yield_now().await;
        }
    }
}

/// Delivers every record of `ring` to `on_record` on a blocking thread of its own, for as long
/// as the returned future is not dropped (dropping it wakes the thread, which stops). For
/// records whose handling takes locks that others hold for milliseconds (admitting a peer
/// waits for a sweep of 50,000): on the async workers it would stall every socket client and
/// the fleet's connection meanwhile. The thread sleeps in `poll` on the ring and on an eventfd
/// the drop writes: it wakes for records or to stop, never on a timer (it used to look for
/// the stop ten times a second, an idle agent's second most frequent wake).
pub async fn consume_on_thread<T: aya::Pod + Send + 'static>(
    mut ring: RingBuf<MapData>,
    mut on_record: impl FnMut(T) + Send + 'static,
) -> std::io::Result<()> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    /// Wakes the reader to stop when the future is dropped (or finishes).
    struct StopOnDrop(std::sync::Arc<OwnedFd>);
    impl Drop for StopOnDrop {
        fn drop(&mut self) {
            let one = 1u64.to_ne_bytes();
            // SAFETY: 8 bytes from a live buffer to an eventfd this value keeps open. It can
            // fail only if the count would overflow, which one write per reader cannot reach.
            unsafe { libc::write(self.0.as_raw_fd(), one.as_ptr().cast(), one.len()) };
        }
    }
    // SAFETY: a plain syscall; the fd it returns is owned below.
    let raw = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if raw < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh fd nobody else owns.
    let stop = std::sync::Arc::new(unsafe { OwnedFd::from_raw_fd(raw) });
    let _stop_on_drop = StopOnDrop(stop.clone());
    let reader = tokio::task::spawn_blocking(move || -> std::io::Result<()> {
        let mut fds = [
            libc::pollfd {
                fd: ring.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: stop.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        loop {
            while let Some(item) = ring.next() {
                if let Some(record) = decode(&item) {
                    on_record(record);
                }
            }
            // SAFETY: two valid pollfds, for fds that `ring` and `stop` keep open.
            if unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) } < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
            if fds[1].revents != 0 {
                return Ok(());
            }
        }
    });
    reader.await.map_err(std::io::Error::other)?
}
