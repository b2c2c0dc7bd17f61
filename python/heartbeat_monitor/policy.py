"""Acts on a heartbeat monitor's suspicions, one action per level: the policy loop of
examples/python/hb_policy.py on top of `Subscriber`.

    hb-policy --socket /run/heartbeat-monitor.sock \\
        --on '1=logger -t hb "peer $HB_PEER is late (phi $HB_PHI)"' \\
        --on '3=drain-traffic-from "$HB_PEER"' \\
        --on '8=evict "$HB_PEER"' \\
        --on-recover 'undrain "$HB_PEER"'

Each command runs with /bin/sh and these variables: HB_EVENT (`suspect` or `recover`), HB_PEER
(the id), HB_LEVEL (the level reached; for a recovery the highest one acted on) and HB_PHI
(phi when the level was reached; empty for a recovery). It prints one line per action.

Every action runs once per peer and level until the peer recovers, lowest level first, whether
it is learnt from the suspect set (at the start, after `lagged`, after reconnecting) or from an
event. Commands run one at a time, in order.
"""

import argparse
import os
import subprocess
import sys

from .client import DEFAULT_SOCKET, ProtocolVersionError
from .subscriber import Subscriber


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


def suspect_set(peers, threshold):
    """A `resync`'s suspects as {peer id: (level, phi)}; a peer past `threshold` but below the
    agent's lowest level counts as at `threshold`."""
    return {p["id"]: (p["level"] or threshold, p["phi"]) for p in peers}


def check_levels(stats, policy):
    """Warns of policy levels the agent does not raise: events come only at its --levels."""
    levels = stats.get("levels", [])
    for level in policy.on_level:
        if level not in levels:
            print(
                f"warning: the agent raises levels {levels}; level {level:g} is acted on only"
                " when a resync finds a peer past it",
                file=sys.stderr,
            )


def follow(path, policy, retry=1.0, max_retry=None):
    """Acts on the agent's suspicions until interrupted; says once per outage that it is not
    following, and each time it follows again."""
    subscriber = Subscriber(
        path, threshold=policy.lowest(), retry=retry, max_retry=retry if max_retry is None else max_retry
    )
    for event in subscriber:
        kind = event.get("event")
        if kind == "suspect":
            policy.reached(event["id"], event["level"], event.get("phi"))
        elif kind == "recover":
            policy.heard(event["id"])
        elif kind == "forget":
            # No longer watched: nothing more will be said of it.
            policy.acted.pop(event["id"], None)
        elif kind == "resync":
            if event["reason"] == "lagged":
                print(f"lagged: {event['missed']} events missed; resyncing", flush=True)
            else:
                print(f"following {path}", flush=True)
                check_levels(event["stats"], policy)
            policy.resync(suspect_set(event["suspects"], policy.lowest()))
        elif kind == "disconnected":
            print(f"not following ({event['error']}); retrying every {retry:g} s", flush=True)


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
    ap.add_argument("--socket", default=DEFAULT_SOCKET, help="the agent's socket")
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
    try:
        follow(args.socket, policy, retry=args.retry)
    except ProtocolVersionError as e:
        print(f"hb-policy: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
