#!/usr/bin/env python3
"""hb_policy.py: acts on a heartbeat monitor's suspicions, one action per level.

The agent publishes one signal per peer, phi, and crosses several levels (`monitor run
--levels`, 1,3,8 by default); what each level means is the consumer's policy. This consumer
runs a shell command when a peer reaches a level and another when it is heard again:

    python3 hb_policy.py --socket /run/heartbeat-monitor.sock \\
        --on '1=logger -t hb "peer $HB_PEER is late (phi $HB_PHI)"' \\
        --on '3=drain-traffic-from "$HB_PEER"' \\
        --on '8=evict "$HB_PEER"' \\
        --on-recover 'undrain "$HB_PEER"'

Each command runs with /bin/sh and these variables: HB_EVENT (`suspect` or `recover`), HB_PEER
(the id), HB_LEVEL (the level reached; for a recovery the highest one acted on) and HB_PHI
(phi when the level was reached; empty for a recovery). It prints one line per action.

Nothing is lost across the gaps a long-running consumer meets (docs/socket-protocol.md):
- started late, or reconnected after the agent restarted, it subscribes first and then asks
  for the suspect set at the lowest level it acts on, so a peer already suspected is acted on
  and a peer that recovered meanwhile gets its recovery;
- told it `lagged` (it read too slowly and events were dropped for it), it asks again;
- every action runs once per peer and level until the peer recovers: a level seen both in the
  suspect set and as an event is acted on once, and levels are acted on lowest first.

Commands run one at a time, in order; a slow one delays the next events (the agent keeps
65,536 of them for each subscriber, then says `lagged`, and this consumer resyncs).

Standard library only, Python 3.9 or later. `--levels-only` prints the policy and exits.
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import time


class Agent:
    """A connection to the agent's Unix socket: one JSON request and reply per line."""

    def __init__(self, path, timeout=5.0):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(path)
        self.buf = b""

    def request(self, req):
        self.sock.sendall(json.dumps(req).encode() + b"\n")
        reply = json.loads(self.read_line())
        if not reply.get("ok"):
            raise RuntimeError(f"{req['op']}: {reply.get('error', reply)}")
        return reply

    def read_line(self):
        while b"\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("the agent closed the connection")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return line.decode()

    def close(self):
        self.sock.close()


class Policy:
    """Which command each level runs, and what has been acted on for each peer."""

    def __init__(self, on_level, on_recover, out=sys.stdout):
        self.on_level = dict(sorted(on_level.items()))
        self.on_recover = on_recover
        self.out = out
        # peer id -> levels acted on since it was last heard
        self.acted = {}

    def lowest(self):
        return min(self.on_level) if self.on_level else None

    def reached(self, peer, level, phi):
        """The peer has reached `level`: act on every policy level up to it not yet acted on."""
        done = self.acted.setdefault(peer, set())
        for at, command in self.on_level.items():
            if at <= level and at not in done:
                done.add(at)
                self.run("suspect", peer, at, phi, command)
        if not done:
            del self.acted[peer]

    def heard(self, peer):
        """The peer was heard again (or is no longer suspected): its recovery, if it had any."""
        done = self.acted.pop(peer, None)
        if done:
            self.run("recover", peer, max(done), None, self.on_recover)

    def resync(self, suspects):
        """`suspects`: {peer id: (level, phi)} as the agent says now."""
        for peer in sorted(set(self.acted) - set(suspects)):
            self.heard(peer)
        for peer, (level, phi) in sorted(suspects.items()):
            self.reached(peer, level, phi)

    def run(self, event, peer, level, phi, command):
        phi_text = "" if phi is None else f"{phi:.2f}"
        print(
            f"{event} peer {peer} level {level:g}"
            + (f" phi {phi_text}" if phi_text else "")
            + ("" if command else " (no command)"),
            file=self.out,
            flush=True,
        )
        if not command:
            return
        env = dict(os.environ)
        env.update(HB_EVENT=event, HB_PEER=str(peer), HB_LEVEL=f"{level:g}", HB_PHI=phi_text)
        done = subprocess.run(["/bin/sh", "-c", command], env=env)
        if done.returncode != 0:
            print(f"  command exited with {done.returncode}: {command}", file=sys.stderr)


def snapshot(path, threshold):
    """The suspect set at `threshold`: {peer id: (level, phi)}."""
    agent = Agent(path)
    try:
        reply = agent.request({"op": "suspects", "threshold": threshold})
    finally:
        agent.close()
    return {p["id"]: (p["level"] or threshold, p["phi"]) for p in reply["suspects"]}


def check_levels(path, policy):
    """Warns of policy levels the agent does not raise: events come only at its --levels."""
    agent = Agent(path)
    try:
        levels = agent.request({"op": "stats"})["stats"]["levels"]
    finally:
        agent.close()
    for level in policy.on_level:
        if level not in levels:
            print(
                f"warning: the agent raises levels {levels}; level {level:g} is acted on only"
                " when a resync finds a peer past it",
                file=sys.stderr,
            )


def follow(path, policy, connected):
    """Subscribes, resyncs from the suspect set, then acts on events until the connection ends;
    calls `connected()` once subscribed."""
    events = Agent(path, timeout=None)
    try:
        events.request({"op": "subscribe"})
        print(f"following {path}", flush=True)
        connected()
        check_levels(path, policy)
        # After subscribing: whatever changes from here on arrives as an event as well.
        policy.resync(snapshot(path, policy.lowest()))
        while True:
            event = json.loads(events.read_line())
            kind = event.get("event")
            if kind == "suspect":
                policy.reached(event["id"], event["level"], event.get("phi"))
            elif kind == "recover":
                policy.heard(event["id"])
            elif kind == "forget":
                # No longer watched: nothing more will be said of it.
                policy.acted.pop(event["id"], None)
            elif kind == "lagged":
                print(f"lagged: {event.get('missed')} events missed; resyncing", flush=True)
                policy.resync(snapshot(path, policy.lowest()))
    finally:
        events.close()


def parse_on(text):
    level, sep, command = text.partition("=")
    try:
        value = float(level)
    except ValueError:
        value = -1.0
    if not sep or not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected LEVEL=COMMAND with a positive LEVEL")
    return value, command


def main(argv=None):
    ap = argparse.ArgumentParser(
        description="Act on a heartbeat monitor's suspicions: a command per level, one on recovery."
    )
    ap.add_argument("--socket", default="/run/heartbeat-monitor.sock", help="the agent's socket")
    ap.add_argument(
        "--on",
        type=parse_on,
        action="append",
        default=[],
        metavar="LEVEL=COMMAND",
        help="run COMMAND when a peer reaches LEVEL, one of the agent's --levels (repeatable)",
    )
    ap.add_argument("--on-recover", default="", metavar="COMMAND", help="run COMMAND when it is heard again")
    ap.add_argument(
        "--retry", type=float, default=1.0, metavar="SECONDS", help="wait between reconnections"
    )
    ap.add_argument("--levels-only", action="store_true", help="print the policy and exit")
    args = ap.parse_args(argv)
    if not args.on:
        ap.error("at least one --on LEVEL=COMMAND")
    policy = Policy(dict(args.on), args.on_recover)
    if args.levels_only:
        for level, command in policy.on_level.items():
            print(f"{level:g}: {command}")
        print(f"recover: {args.on_recover}")
        return 0
    # Said once per outage, not once per attempt.
    outage = {"told": False}
    while True:
        try:
            follow(args.socket, policy, lambda: outage.update(told=False))
        except (OSError, RuntimeError, ValueError) as e:
            if not outage["told"]:
                print(f"not following ({e}); retrying every {args.retry:g} s", flush=True)
            outage["told"] = True
            time.sleep(args.retry)
        except KeyboardInterrupt:
            return 0


if __name__ == "__main__":
    sys.exit(main())
