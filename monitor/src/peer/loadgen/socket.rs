//! The userspace generator: sendmmsg batches from one connected UDP socket, each message
//! carrying up to [`GSO_SEGMENTS`] heartbeats that the kernel cuts into datagrams (UDP GSO,
//! Linux 4.18+): one pass through the socket and the route for 64 heartbeats instead of one
//! each. Every heartbeat is [`HEADER_LEN`] bytes, so a batch's packets, contiguous in memory,
//! are already the segments. Where the kernel refuses GSO, plain sendmmsg (one heartbeat a
//! message) is used.

use std::{
    cmp::Reverse,
    collections::BinaryHeap,
    net::{SocketAddr, UdpSocket},
    os::fd::AsRawFd,
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use monitor_common::wire::{HEADER_LEN, HeartbeatHeader};

use super::{Lateness, LoadgenConfig, LoadgenError, LoadgenReport, Sent, SentBy, unix_ms};

/// Packets per sendmmsg call.
pub const BATCH: usize = 256;

/// Heartbeats per GSO message: the kernel takes at most 64 segments (UDP_MAX_SEGMENTS; 128
/// since 6.9).
pub const GSO_SEGMENTS: usize = 64;

/// `setsockopt`/cmsg option of UDP GSO (linux/udp.h), not in every libc target.
const UDP_SEGMENT: libc::c_int = 103;

struct Batch {
    packets: Vec<[u8; HEADER_LEN]>,
    /// When each packet was due, ns from the start.
    due_ns: Vec<u64>,
    /// Send with UDP GSO; cleared for good the first time the kernel refuses it.
    gso: bool,
    /// Heartbeats back to back in each datagram (`LoadgenConfig::pack`); above 1, no GSO.
    pack: usize,
    start: Instant,
    lateness: Lateness,
    slack_ns: u64,
}

impl Batch {
    fn push(&mut self, packet: [u8; HEADER_LEN], due_ns: u64) {
        self.packets.push(packet);
        self.due_ns.push(due_ns);
    }

    /// Sends every packet, and counts how late each went; returns (sent, refused).
    fn flush(&mut self, fd: i32) -> (u64, u64) {
        let counts = self.send(fd);
        let sent_ns = self.start.elapsed().as_nanos() as u64;
        for &due in &self.due_ns {
            let late = sent_ns.saturating_sub(due);
            self.lateness.max_late_ms = self.lateness.max_late_ms.max(late as f64 / 1e6);
            self.lateness.late += u64::from(late > self.slack_ns);
        }
        self.due_ns.clear();
        counts
    }

    fn send(&mut self, fd: i32) -> (u64, u64) {
        if self.pack > 1 {
            return self
                .send_messages(fd, self.pack, false)
                .expect("a message without GSO is never refused as GSO");
        }
        if self.gso {
            match self.send_messages(fd, GSO_SEGMENTS, true) {
                Some(counts) => return counts,
                None => {
                    log::info!("UDP GSO refused by this kernel: one heartbeat a message");
                    self.gso = false;
                }
            }
        }
        self.send_messages(fd, 1, false)
            .expect("a message without GSO is never refused as GSO")
    }

    /// Sends the packets `per_message` to a message, with (`gso`) a `UDP_SEGMENT` control
    /// message of one heartbeat's size, so that the kernel cuts each into datagrams of one,
    /// or without, each message one datagram; returns (sent, refused), or `None`, with nothing
    /// sent, when the kernel refuses GSO itself (EINVAL, EIO, ENOPROTOOPT, EOPNOTSUPP on the
    /// first message).
    fn send_messages(&mut self, fd: i32, per_message: usize, gso: bool) -> Option<(u64, u64)> {
        let groups = self.packets.len().div_ceil(per_message);
        // SAFETY: CMSG_SPACE only computes a size.
        let space = unsafe { libc::CMSG_SPACE(size_of::<u16>() as u32) } as usize;
        // u64s, so that every control buffer is aligned for a cmsghdr.
        let words = if gso { space.div_ceil(8) } else { 1 };
        let mut control = vec![0u64; words * groups];
        let mut iovecs: Vec<libc::iovec> = self
            .packets
            .chunks_mut(per_message)
            .map(|group| libc::iovec {
                iov_base: group.as_mut_ptr().cast(),
                iov_len: group.len() * HEADER_LEN,
            })
            .collect();
        let mut headers: Vec<libc::mmsghdr> = iovecs
            .iter_mut()
            .zip(control.chunks_mut(words))
            .map(|(iov, control)| {
                // SAFETY: an all-zero msghdr is valid (no name, no control data); with GSO
                // the control buffer is `space` bytes, aligned, and holds exactly one
                // cmsghdr with a u16 of data.
                unsafe {
                    let mut h: libc::mmsghdr = std::mem::zeroed();
                    h.msg_hdr.msg_iov = iov;
                    h.msg_hdr.msg_iovlen = 1;
                    if gso {
                        h.msg_hdr.msg_control = control.as_mut_ptr().cast();
                        h.msg_hdr.msg_controllen = space;
                        let cmsg = libc::CMSG_FIRSTHDR(&h.msg_hdr);
                        (*cmsg).cmsg_level = libc::SOL_UDP;
                        (*cmsg).cmsg_type = UDP_SEGMENT;
                        (*cmsg).cmsg_len = libc::CMSG_LEN(size_of::<u16>() as u32) as usize;
                        std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast(), HEADER_LEN as u16);
                    }
                    h
                }
            })
            .collect();
        let packets_in = |iov: &libc::iovec| (iov.iov_len / HEADER_LEN) as u64;
        let (mut sent, mut refused, mut done) = (0u64, 0u64, 0usize);
        while done < headers.len() {
            let left = &mut headers[done..];
            // SAFETY: headers and the iovecs, control buffers and packets they point at
            // outlive the call.
            let n = unsafe { libc::sendmmsg(fd, left.as_mut_ptr(), left.len() as u32, 0) };
            if n < 0 {
                let error = std::io::Error::last_os_error().raw_os_error();
                if gso
                    && done == 0
                    && matches!(
                        error,
                        Some(libc::EINVAL | libc::EIO | libc::ENOPROTOOPT | libc::EOPNOTSUPP)
                    )
                {
                    return None;
                }
                // The first message of the rest was refused (ENOBUFS, ECONNREFUSED...):
                // skip its heartbeats.
                refused += packets_in(&iovecs[done]);
                done += 1;
            } else {
                sent += iovecs[done..done + n as usize]
                    .iter()
                    .map(packets_in)
                    .sum::<u64>();
                done += n as usize;
            }
        }
        self.packets.clear();
        Some((sent, refused))
    }
}

pub(super) fn run(
    config: &LoadgenConfig,
    stop: &AtomicBool,
) -> Result<LoadgenReport, LoadgenError> {
    let io_err = |source| LoadgenError::Io {
        to: config.to,
        source,
    };
    let bind: SocketAddr = if config.to.is_ipv4() {
        "0.0.0.0:0"
    } else {
        "[::]:0"
    }
    .parse()
    .expect("literal");
    let socket = UdpSocket::bind(bind).map_err(io_err)?;
    socket.connect(config.to).map_err(io_err)?;
    let fd = socket.as_raw_fd();
    let sndbuf: libc::c_int = 8 << 20;
    // SAFETY: setting an int socket option on our own socket. Best effort.
    unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_SNDBUF,
            (&raw const sndbuf).cast(),
            size_of::<libc::c_int>() as u32,
        )
    };

    let total_rate = config.peers as f64 * config.rate_hz;
    let killed = config.killed();
    let kill_at_n = (config.kill_after.as_secs_f64() * total_rate) as u64;
    let jitter_ns = config.jitter.as_nanos() as u64;
    let mut rng = fastrand::Rng::new();
    let mut pending: BinaryHeap<Reverse<(u64, u64)>> = BinaryHeap::new();
    let slack_ns = (0.25e9 / config.rate_hz) as u64;
    let mut batch = Batch {
        packets: Vec::with_capacity(BATCH),
        due_ns: Vec::with_capacity(BATCH),
        gso: config.gso && config.pack == 1,
        pack: config.pack,
        start: Instant::now(),
        lateness: Lateness {
            slack_ms: slack_ns as f64 / 1e6,
            ..Default::default()
        },
        slack_ns,
    };
    let (mut sent, mut refused) = (0u64, 0u64);
    let mut next_n = 0u64;
    let mut killed_at = None;
    let start = batch.start;
    let churn = config.churn_schedule();

    let push = |batch: &mut Batch, n: u64, due_ns: u64| {
        let mut header = HeartbeatHeader::new(
            config.first_id + config.peer_index(n),
            config.incarnation,
            n / config.peers,
        );
        if let Some(key) = &config.key {
            crate::peer::auth_key::sign(&mut header, key);
        }
        batch.push(header.to_bytes(), due_ns);
    };

    while !stop.load(Ordering::Relaxed) {
        let elapsed = start.elapsed();
        if elapsed >= config.duration {
            break;
        }
        let elapsed_ns = elapsed.as_nanos() as u64;
        // At most a few batches per pass, so time and the stop flag are checked often even when
        // the generator cannot keep up with the rate asked of it.
        let due = ((elapsed.as_secs_f64() * total_rate) as u64).min(next_n + 4 * BATCH as u64);
        while next_n < due {
            let n = next_n;
            next_n += 1;
            if let Some(churn) = &churn
                && churn.silent(
                    config.first_id + config.peer_index(n),
                    n as f64 / total_rate,
                )
            {
                continue;
            }
            if killed > 0 && n >= kill_at_n {
                if killed_at.is_none() {
                    killed_at = Some(unix_ms());
                }
                if config.peer_index(n) < killed {
                    continue;
                }
            }
            if jitter_ns == 0 {
                push(&mut batch, n, (n as f64 / total_rate * 1e9) as u64);
                if batch.packets.len() == BATCH {
                    let (s, r) = batch.flush(fd);
                    sent += s;
                    refused += r;
                }
            } else {
                let nominal = (n as f64 / total_rate * 1e9) as u64;
                pending.push(Reverse((nominal + rng.u64(0..=jitter_ns), n)));
            }
        }
        while let Some(&Reverse((at, n))) = pending.peek() {
            if at > elapsed_ns {
                break;
            }
            pending.pop();
            push(&mut batch, n, at);
            if batch.packets.len() == BATCH {
                let (s, r) = batch.flush(fd);
                sent += s;
                refused += r;
            }
        }
        if !batch.packets.is_empty() {
            let (s, r) = batch.flush(fd);
            sent += s;
            refused += r;
        }
        // Caught up: sleep until about a batch is due (at most 1 ms, so the stream stays smooth).
        let next_due = Duration::from_secs_f64((next_n as f64 + BATCH as f64 / 2.0) / total_rate);
        let wait = next_due
            .saturating_sub(start.elapsed())
            .min(Duration::from_millis(1));
        if !wait.is_zero() {
            std::thread::sleep(wait);
        }
    }
    let duration_s = start.elapsed().as_secs_f64();
    let sent = Sent {
        sent,
        send_errors: refused,
        duration_s,
        killed_at_unix_ms: killed_at,
        by: if batch.pack > 1 {
            SentBy::Packed
        } else if batch.gso {
            SentBy::UdpGso
        } else {
            SentBy::Sendmmsg
        },
    };
    let mut report = LoadgenReport::of(config, sent, churn, None);
    report.lateness = Some(batch.lateness);
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sends 100 numbered heartbeats through a batch over loopback, `pack` a datagram, and
    /// returns the datagrams received.
    fn sent_through(gso: bool, pack: usize) -> (Vec<Vec<u8>>, bool) {
        let receiver = UdpSocket::bind("127.0.0.1:0").unwrap();
        receiver
            .set_read_timeout(Some(Duration::from_secs(2)))
            .unwrap();
        let sender = UdpSocket::bind("127.0.0.1:0").unwrap();
        sender.connect(receiver.local_addr().unwrap()).unwrap();
        let mut batch = Batch {
            packets: Vec::new(),
            due_ns: Vec::new(),
            gso,
            pack,
            start: Instant::now(),
            lateness: Lateness::default(),
            slack_ns: 0,
        };
        for n in 0..100u64 {
            batch.push(HeartbeatHeader::new(1 + n, 7, n).to_bytes(), 0);
        }
        assert_eq!(batch.flush(sender.as_raw_fd()), (100, 0));
        let mut received = Vec::new();
        let mut buf = [0u8; 2048];
        while received.len() < 100usize.div_ceil(pack) {
            let n = receiver.recv(&mut buf).unwrap();
            received.push(buf[..n].to_vec());
        }
        (received, batch.gso)
    }

    #[test]
    fn each_heartbeat_arrives_as_its_own_datagram_with_or_without_gso() {
        for gso in [true, false] {
            let (received, still_gso) = sent_through(gso, 1);
            assert_eq!(still_gso, gso, "this kernel takes UDP GSO");
            for (n, datagram) in received.iter().enumerate() {
                assert_eq!(
                    datagram.as_slice(),
                    HeartbeatHeader::new(1 + n as u64, 7, n as u64).to_bytes(),
                    "heartbeat {n}, gso {gso}"
                );
            }
        }
    }

    #[test]
    fn packed_heartbeats_arrive_back_to_back_in_datagrams_of_that_many() {
        let (received, _) = sent_through(false, 3);
        assert_eq!(received.len(), 34, "100 heartbeats 3 a datagram");
        let all: Vec<u8> = received.concat();
        for (n, datagram) in received.iter().enumerate() {
            let expected = if n < 33 { 3 * HEADER_LEN } else { HEADER_LEN };
            assert_eq!(datagram.len(), expected, "datagram {n}");
        }
        for n in 0..100usize {
            assert_eq!(
                &all[n * HEADER_LEN..(n + 1) * HEADER_LEN],
                HeartbeatHeader::new(1 + n as u64, 7, n as u64).to_bytes(),
                "heartbeat {n}"
            );
        }
    }
}
