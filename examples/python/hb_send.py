#!/usr/bin/env python3
"""hb_send.py: sends heartbeat-monitor heartbeats (wire format v1, docs/wire-format.md).

Standard library only, Python 3.9 or later:

    python3 hb_send.py --to 192.0.2.1:18498 --id 17 --interval 100
    python3 hb_send.py --to 192.0.2.1:18498 --id 17 --auth-key-file /etc/heartbeat/key
    python3 hb_send.py --self-test

The options are those of `monitor send` (run with --help). Heartbeats go out on a fixed
schedule (start + k * interval), so one late wake-up does not shift every later heartbeat.
A heartbeat sent more than half an interval late is a stall (a stopped process, a paused VM, a
starved CPU): the schedule starts again from it, and the missed heartbeats are not sent in a
burst, whose near-zero intervals would distort the monitor's window (docs/tuning.md, "A
sender after a stall"). Sequence numbers start
at 0 in each incarnation and count only heartbeats sent.

To embed it, import this file and call `encode(peer_id, incarnation, seq, key)` for the 32
bytes of one heartbeat (`key` from `parse_key` or `read_key_file`, or None), or `send_loop`.
"""

import argparse
import os
import socket
import stat
import struct
import sys
import time

HEADER_LEN = 32
AUTHENTICATED_LEN = 24
FLAG_AUTH = 0x01
MASK = (1 << 64) - 1


# ---- SipHash-2-4 (Aumasson and Bernstein, 2012) ----


def _rotl(x, b):
    return ((x << b) | (x >> (64 - b))) & MASK


def _sip_round(v0, v1, v2, v3):
    v0 = (v0 + v1) & MASK
    v1 = _rotl(v1, 13) ^ v0
    v0 = _rotl(v0, 32)
    v2 = (v2 + v3) & MASK
    v3 = _rotl(v3, 16) ^ v2
    v0 = (v0 + v3) & MASK
    v3 = _rotl(v3, 21) ^ v0
    v2 = (v2 + v1) & MASK
    v1 = _rotl(v1, 17) ^ v2
    v2 = _rotl(v2, 32)
    return v0, v1, v2, v3


def siphash24(k0, k1, msg):
    """SipHash-2-4 of the bytes `msg` under the key (k0, k1); a 64-bit integer."""
    v0 = k0 ^ 0x736F6D6570736575
    v1 = k1 ^ 0x646F72616E646F6D
    v2 = k0 ^ 0x6C7967656E657261
    v3 = k1 ^ 0x7465646279746573
    full = len(msg) - len(msg) % 8
    # Whole 8-byte words, then the last block: the remaining bytes, little-endian, with the
    # length mod 256 in the top byte.
    words = [int.from_bytes(msg[i : i + 8], "little") for i in range(0, full, 8)]
    words.append(int.from_bytes(msg[full:], "little") | ((len(msg) & 0xFF) << 56))
    for m in words:
        v3 ^= m
        v0, v1, v2, v3 = _sip_round(v0, v1, v2, v3)
        v0, v1, v2, v3 = _sip_round(v0, v1, v2, v3)
        v0 ^= m
    v2 ^= 0xFF
    for _ in range(4):
        v0, v1, v2, v3 = _sip_round(v0, v1, v2, v3)
    return v0 ^ v1 ^ v2 ^ v3


# ---- the heartbeat ----


def encode(peer_id, incarnation, seq, key=None):
    """The 32 bytes of one heartbeat; with a key (k0, k1), signed over bytes 0..24."""
    flags = FLAG_AUTH if key is not None else 0
    head = struct.pack(">2sBBIQQ", b"HB", 1, flags, incarnation, peer_id, seq)
    if key is None:
        return head + bytes(8)
    # The tag is written little-endian, as SipHash emits it.
    return head + struct.pack("<Q", siphash24(key[0], key[1], head[:AUTHENTICATED_LEN]))


def parse_key(text):
    """32 hex digits -> (k0, k1), bytes 0..8 and 8..16 read little-endian; None if invalid."""
    text = text.strip()
    if len(text) != 32 or any(c not in "0123456789abcdefABCDEF" for c in text):
        return None
    raw = bytes.fromhex(text)
    return int.from_bytes(raw[:8], "little"), int.from_bytes(raw[8:], "little")


def read_key_file(path):
    """Reads a key file as `monitor` does: mode 0600 or stricter, 32 hex digits."""
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
        if mode & 0o077:
            raise SystemExit(
                f"hb_send.py: auth key file {path} is accessible to group or others "
                f"(mode {mode:04o}); `chmod 600 {path}` and keep it that way"
            )
        with open(path, encoding="ascii", errors="replace") as f:
            text = f.read(4096)
    except OSError as e:
        raise SystemExit(f"hb_send.py: reading auth key file {path}: {e.strerror}")
    key = parse_key(text)
    if key is None:
        raise SystemExit(
            f"hb_send.py: auth key file {path} must hold exactly 32 hexadecimal digits "
            "(a 128-bit key)"
        )
    return key


def send_loop(sock, peer_id, incarnation, interval_s, count=None, key=None):
    """Sends heartbeats 0, 1, ... on `sock` (connected) every interval_s seconds on a fixed
    schedule that a stall starts again, `count` of them (None: forever). Returns how many were
    sent."""
    due = time.monotonic()
    seq = 0
    while count is None or seq < count:
        delay = due - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        try:
            sock.send(encode(peer_id, incarnation, seq, key))
        except OSError as e:
            # A transient error (no route yet, ICMP feedback) must not stop a heartbeat sender.
            print(f"hb_send.py: sending heartbeat {seq}: {e}", file=sys.stderr)
        # Sent over half an interval late: a stall, after which the schedule starts again from
        # now rather than sending the missed heartbeats in a burst (see the top of this file).
        # Read after the send: a stop between a read before it and the send would go unseen.
        now = time.monotonic()
        if now - due > interval_s / 2:
            due = now
        due += interval_s
        seq += 1
    return seq


# ---- self-test ----


def self_test():
    key = parse_key(bytes(range(16)).hex())
    msg = bytes(range(64))
    checks = [
        # The SipHash paper (Appendix A): key 00..0f, message 00..0e.
        ("paper, 15 bytes", siphash24(key[0], key[1], msg[:15]), 0xA129CA6149BE45E5),
        # The reference implementation's vectors.h: messages 00..(len-1), same key.
        ("vectors.h, 0 bytes", siphash24(key[0], key[1], msg[:0]), 0x726FDB47DD0E0E31),
        ("vectors.h, 8 bytes", siphash24(key[0], key[1], msg[:8]), 0x93F5F5799A932462),
        ("vectors.h, 24 bytes", siphash24(key[0], key[1], msg[:24]), 0xB8AD50C6F649AF94),
        ("vectors.h, 63 bytes", siphash24(key[0], key[1], msg[:63]), 0x958A324CEB064572),
        # docs/wire-format.md's example: peer 7, incarnation 1, sequence 42, unauthenticated.
        (
            "unsigned heartbeat",
            encode(7, 1, 42).hex(),
            "48420100000000010000000000000007000000000000002a0000000000000000",
        ),
        # The same, signed with key 000102..0f by monitor_common::auth (the Rust sender).
        (
            "signed heartbeat",
            encode(7, 1, 42, parse_key("000102030405060708090a0b0c0d0e0f")).hex(),
            "48420101000000010000000000000007000000000000002a40aad048c3a11742",
        ),
    ]
    failed = 0
    for what, got, want in checks:
        if got != want:
            failed += 1
            show = (lambda v: v) if isinstance(got, str) else (lambda v: f"{v:016x}")
            print(f"hb_send.py: self-test {what}: got {show(got)}, want {show(want)}",
                  file=sys.stderr)
    if failed:
        print(f"hb_send.py: self-test: {failed} check(s) failed", file=sys.stderr)
        return 1
    print("hb_send.py: self-test passed")
    return 0


# ---- command line ----


def _u64(text):
    digits, base, allowed = text, 10, "0123456789"
    if text[:2] in ("0x", "0X"):
        digits, base, allowed = text[2:], 16, "0123456789abcdefABCDEF"
    if not digits or any(c not in allowed for c in digits) or int(digits, base) > MASK:
        raise argparse.ArgumentTypeError(f"{text!r} is not a u64 (decimal or 0x hex)")
    return int(digits, base)


def _u32(text):
    value = _u64(text)
    if value > 0xFFFFFFFF:
        raise argparse.ArgumentTypeError(f"{text!r} does not fit in 32 bits")
    return value


def _interval_ms(text):
    value = _u64(text[:-2] if text.endswith("ms") else text)
    if not 1 <= value <= 86_400_000:
        raise argparse.ArgumentTypeError("must be 1 to 86400000 ms")
    return value


def _target(text):
    host, sep, port = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port or any(c not in "0123456789" for c in port) \
            or not 0 < int(port) < 65536:
        raise SystemExit(f"hb_send.py: --to {text}: expected ADDR:PORT (port 1 to 65535)")
    try:
        found = socket.getaddrinfo(host, int(port), type=socket.SOCK_DGRAM)
        family, kind, proto, _, addr = found[0]
    except (OSError, OverflowError) as e:
        raise SystemExit(f"hb_send.py: --to {text}: {e}")
    sock = socket.socket(family, kind, proto)
    sock.connect(addr)
    return sock


def main(argv=None):
    parser = argparse.ArgumentParser(
        description="Send heartbeat-monitor heartbeats (wire format v1)."
    )
    add = parser.add_argument
    add("--to", help="the monitor: ADDR:PORT, [IPv6]:PORT or HOST:PORT")
    add("--id", type=_u64, help="this peer's id, decimal or 0x hex")
    add("--interval", type=_interval_ms, default=100, metavar="MS",
        help="milliseconds between heartbeats (default 100)")
    add("--count", type=_u64, help="stop after this many heartbeats (default: until interrupted)")
    add("--incarnation", type=_u32,
        help="sender epoch, must grow across restarts (default: Unix time)")
    add("--auth-key-file", metavar="FILE",
        help="sign with the 128-bit key in FILE (32 hex digits, mode 0600)")
    add("--dry-run", action="store_true",
        help="print each heartbeat as 64 hex digits instead of sending it")
    add("--self-test", action="store_true",
        help="check SipHash-2-4 and the encoding against known answers; exit 0 or 1")
    args = parser.parse_args(argv)
    if args.self_test:
        return self_test()
    if args.id is None or (args.to is None and not args.dry_run):
        parser.error("--to and --id are required")
    incarnation = args.incarnation
    if incarnation is None:
        incarnation = min(int(time.time()), 0xFFFFFFFF)
    key = read_key_file(args.auth_key_file) if args.auth_key_file else None
    if args.dry_run:
        seq = 0
        while args.count is None or seq < args.count:
            print(encode(args.id, incarnation, seq, key).hex())
            seq += 1
        return 0
    sock = _target(args.to)
    try:
        send_loop(sock, args.id, incarnation, args.interval / 1000.0, args.count, key)
    except KeyboardInterrupt:
        pass
    finally:
        sock.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
