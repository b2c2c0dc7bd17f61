"""A subscriber that loses nothing (docs/socket-protocol.md, "A consumer that loses nothing").

    from heartbeat_monitor import Subscriber

    for event in Subscriber("/run/heartbeat-monitor.sock", threshold=3):
        if event["event"] == "resync":
            suspected = {p["id"]: p for p in event["suspects"]}   # the state, as of now
        elif event["event"] == "suspect":
            ...

It subscribes first, then reads the suspect set at `threshold` on a second connection: every
change after the subscription arrives as an event as well, so nothing falls between the two.
Besides the agent's events it yields two of its own, as dicts like theirs:

- `{"event": "resync", "reason": R, "suspects": [peer, ...], "stats": {...}, "missed": N}`:
  the suspect set as the agent says now (each peer as in the `peer` reply), to take as the
  state in place of what the consumer held. `reason` is `connected` (the first
  subscription), `reconnected` (after the connection ended: the agent restarted) or `lagged`
  (the agent dropped `missed` events for this subscriber, which read too slowly; the
  agent's `lagged` event itself is not yielded). `stats` is the agent's `stats` at the
  (re)connection; `missed` is 0 unless `lagged`.
- `{"event": "disconnected", "error": "..."}`: the agent cannot be reached or the
  connection ended; said once per outage. The subscriber then retries by itself, waiting
  `retry` seconds at first and twice as long each time up to `max_retry`.

An agent of another protocol version raises ProtocolVersionError out of the iteration, which
then ends: retrying would not change it.
"""

import time

from .client import DEFAULT_SOCKET, Client, MonitorError, ProtocolVersionError


class Subscriber:
    def __init__(
        self, path=DEFAULT_SOCKET, threshold=None, retry=0.1, max_retry=5.0, timeout=10.0
    ):
        self.path = str(path)
        self.threshold = threshold
        self.retry = retry
        self.max_retry = max(max_retry, retry)
        self.timeout = timeout
        self._events = None

    def snapshot(self):
        """(stats, suspect set at the threshold) from a connection of its own."""
        with Client(self.path, timeout=self.timeout, check_version=False) as client:
            stats = client.stats()
            return stats, client.suspects(self.threshold)

    def _connect(self):
        events = Client(self.path, timeout=self.timeout, check_version=False)
        try:
            events.subscribe()
            # After subscribing: whatever changes from here on arrives as an event as well.
            stats, suspects = self.snapshot()
        except BaseException:
            events.close()
            raise
        events.settimeout(None)
        self._events = events
        return stats, suspects

    def close(self):
        """Closes the current subscription (the iteration then reconnects)."""
        if self._events is not None:
            self._events.close()
            self._events = None

    def __iter__(self):
        connections = 0
        told = False
        delay = self.retry
        while True:
            try:
                stats, suspects = self._connect()
            except ProtocolVersionError:
                raise
            except (OSError, MonitorError, ValueError) as e:
                if not told:
                    told = True
                    yield {"event": "disconnected", "error": str(e)}
                time.sleep(delay)
                delay = min(delay * 2, self.max_retry)
                continue
            told = False
            delay = self.retry
            connections += 1
            reason = "connected" if connections == 1 else "reconnected"
            yield _resync(reason, stats, suspects, 0)
            try:
                while self._events is not None:
                    event = self._events.read_json()
                    if event.get("event") == "lagged":
                        stats, suspects = self.snapshot()
                        yield _resync("lagged", stats, suspects, event.get("missed", 0))
                    else:
                        yield event
            except ProtocolVersionError:
                self.close()
                raise
            except (OSError, MonitorError, ValueError) as e:
                self.close()
                told = True
                yield {"event": "disconnected", "error": str(e)}
                time.sleep(delay)


def _resync(reason, stats, suspects, missed):
    return {
        "event": "resync",
        "reason": reason,
        "suspects": suspects,
        "stats": stats,
        "missed": missed,
    }
