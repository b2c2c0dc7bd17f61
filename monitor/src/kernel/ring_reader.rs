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

/// How often a ring read on a thread of its own ([`consume_on_thread`]) looks whether it was
/// told to stop while nothing arrived.
const STOP_POLL_MS: i32 = 100;

/// Delivers every record of `ring` to `on_record` on a blocking thread of its own, for as long
/// as the returned future is not dropped (dropping it stops the thread within
/// `STOP_POLL_MS`). For records whose handling takes locks that others hold for
/// milliseconds (admitting a peer waits for a sweep of 50,000): on the async workers it
/// would stall every socket client and the fleet's connection meanwhile.
pub async fn consume_on_thread<T: aya::Pod + Send + 'static>(
    mut ring: RingBuf<MapData>,
    mut on_record: impl FnMut(T) + Send + 'static,
) -> std::io::Result<()> {
    use std::{
        os::fd::AsRawFd,
        sync::{
            Arc,
            atomic::{AtomicBool, Ordering},
        },
    };
    struct StopOnDrop(Arc<AtomicBool>);
    impl Drop for StopOnDrop {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Relaxed);
        }
    }
    let stop = Arc::new(AtomicBool::new(false));
    let _stop_on_drop = StopOnDrop(stop.clone());
    let reader = tokio::task::spawn_blocking(move || -> std::io::Result<()> {
        let fd = ring.as_raw_fd();
        while !stop.load(Ordering::Relaxed) {
            while let Some(item) = ring.next() {
                if let Some(record) = decode(&item) {
                    on_record(record);
                }
            }
            let mut pollfd = libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd, for the ring's fd that `ring` keeps open.
            if unsafe { libc::poll(&mut pollfd, 1, STOP_POLL_MS) } < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
        Ok(())
    });
    reader.await.map_err(std::io::Error::other)?
}
