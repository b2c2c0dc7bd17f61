"""The package against the real agent (run by tests/tests/python_client.rs, which starts it):
HB_SOCKET is its socket, HB_SENDER a JSON argv that sends heartbeats as peer HB_PEER, the one
peer these tests silence and revive. The version refusal runs against a fake agent of its own
and needs neither."""

import json
import os
import socket
import subprocess
import tempfile
import threading
import time
import unittest

from heartbeat_monitor import Client, MonitorError, ProtocolVersionError, Subscriber

SOCKET = os.environ.get("HB_SOCKET")
SENDER = json.loads(os.environ.get("HB_SENDER", "null"))
PEER = int(os.environ.get("HB_PEER", "0"))


def wait_for(what, check, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def next_event(events, kinds, peer=None):
    for event in events:
        if event["event"] in kinds and (peer is None or event.get("id") == peer):
            return event
    raise AssertionError("the subscription ended")


@unittest.skipUnless(SOCKET, "HB_SOCKET: no agent to talk to")
class AgainstTheAgent(unittest.TestCase):
    def test_requests_and_replies(self):
        with Client(SOCKET) as client:
            stats = client.stats()
            self.assertEqual(stats["protocol"], 1)
            self.assertIn(PEER, [p["id"] for p in client.peers()])
            peer = client.peer(PEER)
            self.assertEqual(peer["id"], PEER)
            self.assertIn("phi", peer)
            self.assertIsInstance(client.suspects(), list)
            self.assertIsInstance(client.suspects(threshold=1), list)
            raw = client.request({"op": "peer", "id": PEER})
            self.assertIs(raw["ok"], True)

    def test_an_error_reply_is_a_monitor_error(self):
        with Client(SOCKET) as client:
            with self.assertRaises(MonitorError) as caught:
                client.peer(987654321)
            self.assertEqual(caught.exception.message, "unknown peer 987654321")
            self.assertFalse(caught.exception.busy)
            with self.assertRaises(MonitorError) as caught:
                client.request({"op": "nope"})
            self.assertIn("nope", caught.exception.message)
            # The connection carries on after an error reply.
            self.assertEqual(client.peer(PEER)["id"], PEER)

    def test_the_subscriber_sees_a_suspicion_and_its_recovery(self):
        sender = subprocess.Popen(SENDER, stdin=subprocess.DEVNULL)
        try:
            with Client(SOCKET) as client:
                wait_for("the peer heard", lambda: client.peer(PEER)["level"] is None
                         and client.peer(PEER)["samples"] > 5)
            subscriber = Subscriber(SOCKET, threshold=1)
            events = iter(subscriber)
            first = next(events)
            self.assertEqual(first["event"], "resync")
            self.assertEqual(first["reason"], "connected")
            self.assertNotIn(PEER, [p["id"] for p in first["suspects"]])
            sender.kill()
            sender.wait()
            suspect = next_event(events, ("suspect",), PEER)
            self.assertGreaterEqual(suspect["phi"], suspect["level"])
            sender = subprocess.Popen(SENDER, stdin=subprocess.DEVNULL)
            recover = next_event(events, ("recover",), PEER)
            self.assertGreaterEqual(recover["level"], suspect["level"])
            subscriber.close()
        finally:
            sender.kill()
            sender.wait()


class FakeAgent:
    """Answers `stats` with protocol version `version` and `subscribe` with ok."""

    def __init__(self, version):
        self.dir = tempfile.TemporaryDirectory()
        self.path = os.path.join(self.dir.name, "fake.sock")
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(self.path)
        self.listener.listen()
        self.version = version
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self):
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self.answer, args=(conn,), daemon=True).start()

    def answer(self, conn):
        with conn, conn.makefile("rwb") as f:
            for line in f:
                op = json.loads(line)["op"]
                if op == "stats":
                    reply = {"ok": True, "stats": {"protocol": self.version, "levels": [1.0]}}
                elif op == "subscribe":
                    reply = {"ok": True, "subscribed": True}
                else:
                    reply = {"ok": True, "suspects": [], "threshold": 1.0}
                f.write(json.dumps(reply).encode() + b"\n")
                f.flush()

    def close(self):
        self.listener.close()
        self.dir.cleanup()


class ProtocolVersion(unittest.TestCase):
    def test_another_major_version_is_refused(self):
        fake = FakeAgent(2)
        try:
            with self.assertRaises(ProtocolVersionError) as caught:
                Client(fake.path)
            self.assertEqual(caught.exception.agent_version, 2)
            self.assertIn("protocol version 2", str(caught.exception))
            subscriber = Subscriber(fake.path)
            with self.assertRaises(ProtocolVersionError):
                next(iter(subscriber))
            subscriber.close()
        finally:
            fake.close()

    def test_the_same_version_is_accepted(self):
        fake = FakeAgent(1)
        try:
            with Client(fake.path) as client:
                self.assertEqual(client.stats()["protocol"], 1)
            subscriber = Subscriber(fake.path)
            first = next(iter(subscriber))
            self.assertEqual((first["event"], first["reason"]), ("resync", "connected"))
            subscriber.close()
        finally:
            fake.close()


if __name__ == "__main__":
    unittest.main()
