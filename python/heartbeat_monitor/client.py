"""A blocking client of the agent's Unix socket: one JSON request and reply per line
(docs/socket-protocol.md)."""

import json
import socket
import time

#: The socket protocol's major version this package speaks.
PROTOCOL_VERSION = 1

#: Where `monitor run` listens by default.
DEFAULT_SOCKET = "/run/heartbeat-monitor.sock"


class MonitorError(Exception):
    """The agent answered `{"ok": false, ...}`: `message` is its `error`, `busy` whether it said
    the request may simply be repeated (a peer's slot kept changing while it was read)."""

    def __init__(self, message, busy=False, reply=None):
        super().__init__(message)
        self.message = message
        self.busy = busy
        self.reply = reply


class ProtocolVersionError(MonitorError):
    """The agent speaks another major version of the socket protocol than this package."""

    def __init__(self, agent_version):
        super().__init__(
            f"the agent speaks socket protocol version {agent_version}; this client speaks"
            f" version {PROTOCOL_VERSION} (upgrade the client or the agent so they agree)"
        )
        self.agent_version = agent_version


def check_protocol(stats):
    """Raises ProtocolVersionError unless `stats` (the `stats` reply's object) is of this
    package's major version. An agent that does not say is of version 1, the first."""
    version = stats.get("protocol", 1)
    try:
        major = int(str(version).split(".", 1)[0])
    except ValueError:
        raise ProtocolVersionError(version) from None
    if major != PROTOCOL_VERSION:
        raise ProtocolVersionError(version)
    return version


class Client:
    """A connection to the agent: `request()` sends any request and returns the reply; the
    other methods return the reply's result and raise MonitorError on an error reply.

    Connecting asks for `stats` once and refuses an agent of another protocol version
    (ProtocolVersionError) unless `check_version` is false. Requests that can be busy
    (`peer`, `peers`, `suspects`) are repeated up to `busy_retries` times before the busy
    error is raised. A connection is closed by the agent after `--socket-idle-timeout` (60 s)
    without a request: connect again, or use one per burst of requests.
    """

    def __init__(self, path=DEFAULT_SOCKET, timeout=10.0, check_version=True, busy_retries=100):
        self.path = str(path)
        self.busy_retries = busy_retries
        self._buf = b""
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._sock.settimeout(timeout)
            self._sock.connect(self.path)
            if check_version:
                self.stats()
        except BaseException:
            self._sock.close()
            raise

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        self._sock.close()

    def settimeout(self, timeout):
        """Waits at most `timeout` seconds for each reply or event (None: forever)."""
        self._sock.settimeout(timeout)

    def send(self, request):
        """Sends one request without reading its reply."""
        self._sock.sendall(json.dumps(request).encode() + b"\n")

    def read_line(self):
        """One line from the agent (a reply, or an event on a subscribed connection)."""
        while b"\n" not in self._buf:
            chunk = self._sock.recv(65536)
            if not chunk:
                raise ConnectionError("the agent closed the connection")
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return line.decode()

    def read_json(self):
        """One line from the agent, parsed."""
        return json.loads(self.read_line())

    def request(self, request):
        """Sends `request` (a dict with an "op") and returns the reply (a dict); raises
        MonitorError if the reply is not ok."""
        self.send(request)
        reply = self.read_json()
        if reply.get("ok") is not True:
            raise MonitorError(
                str(reply.get("error", "malformed reply from the agent")),
                busy=reply.get("busy") is True,
                reply=reply,
            )
        return reply

    def _retrying(self, request):
        for attempt in range(self.busy_retries + 1):
            try:
                return self.request(request)
            except MonitorError as e:
                if not e.busy or attempt == self.busy_retries:
                    raise
                time.sleep(0.005)

    def peer(self, peer_id, window=False):
        """One peer's view (a dict as docs/socket-protocol.md, `peer`)."""
        request = {"op": "peer", "id": int(peer_id)}
        if window:
            request["window"] = True
        return self._retrying(request)["peer"]

    def peers(self, addr=None, source=None):
        """Every peer, sorted by id; only those from `addr` or of `source` if given."""
        request = {"op": "peers"}
        if addr is not None:
            request["addr"] = str(addr)
        if source is not None:
            request["source"] = source
        return self._retrying(request)["peers"]

    def suspects(self, threshold=None):
        """The peers whose phi is at least `threshold` (default: the agent's highest level)."""
        request = {"op": "suspects"}
        if threshold is not None:
            request["threshold"] = float(threshold)
        return self._retrying(request)["suspects"]

    def stats(self):
        """The agent's and the kernel's counters; refuses another protocol version."""
        stats = self.request({"op": "stats"})["stats"]
        check_protocol(stats)
        return stats

    def forget(self, peer_id):
        """Stops watching a peer; returns its id."""
        return self.request({"op": "forget", "id": int(peer_id)})["forgotten"]

    def subscribe(self):
        """Turns this connection into a stream of events: read them with `read_json()`."""
        self.request({"op": "subscribe"})
