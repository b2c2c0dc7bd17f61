"""Client of the heartbeat monitor agent's Unix socket, socket protocol version 1
(docs/socket-protocol.md). Standard library only.

- `Client`: one connection; `request(dict) -> dict` and `peer`, `peers`, `suspects`, `stats`,
  `forget`; an error reply raises `MonitorError` (its `message` and `busy`).
- `Subscriber`: an iterator of events that subscribes first, then reads the suspect set, and
  resyncs after `lagged` and after reconnecting to a restarted agent.
- `policy`: act on suspicions, one command per level (`hb-policy`, or
  `python3 -m heartbeat_monitor.policy`).

An agent of another major protocol version is refused with `ProtocolVersionError`.
"""

from .client import (
    DEFAULT_SOCKET,
    PROTOCOL_VERSION,
    Client,
    MonitorError,
    ProtocolVersionError,
    check_protocol,
)
from .subscriber import Subscriber

__all__ = [
    "DEFAULT_SOCKET",
    "PROTOCOL_VERSION",
    "Client",
    "MonitorError",
    "ProtocolVersionError",
    "Subscriber",
    "check_protocol",
]
