"""A minimal Debug Adapter Protocol client of the tests' own: what an editor sends, one request at a time."""

from __future__ import annotations

import json
import socket
from typing import Any


class DapClient:
    """DAP over a TCP connection: ``request(command, **arguments)`` returns the response's body;
    events that come meanwhile are kept in ``events``."""

    def __init__(self, address: str, timeout: float = 30.0) -> None:
        host, _, port = address.rpartition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        self.file = self.sock.makefile("rb")
        self.seq = 0
        self.events: list[dict[str, Any]] = []

    def close(self) -> None:
        self.file.close()
        self.sock.close()

    def _read(self) -> dict[str, Any]:
        length = None
        while True:
            line = self.file.readline()
            if not line:
                raise EOFError("the debuggee closed the connection")
            if not line.strip():
                break
            name, _, value = line.decode().partition(":")
            if name.strip().lower() == "content-length":
                length = int(value)
        assert length is not None, "a message without Content-Length"
        message: dict[str, Any] = json.loads(self.file.read(length))
        return message

    def send(self, command: str, **arguments: Any) -> int:
        self.seq += 1
        body = json.dumps({"seq": self.seq, "type": "request", "command": command, "arguments": arguments})
        self.sock.sendall(f"Content-Length: {len(body.encode())}\r\n\r\n".encode() + body.encode())
        return self.seq

    def response(self, seq: int) -> dict[str, Any]:
        while True:
            message = self._read()
            if message["type"] == "event":
                self.events.append(message)
            elif message["type"] == "response" and message["request_seq"] == seq:
                assert message["success"], message
                body: dict[str, Any] = message.get("body") or {}
                return body

    def request(self, command: str, **arguments: Any) -> dict[str, Any]:
        return self.response(self.send(command, **arguments))

    def event(self, name: str) -> dict[str, Any]:
        """The first event ``name`` (kept or still to come)."""
        for i, message in enumerate(self.events):
            if message["event"] == name:
                return self.events.pop(i)
        while True:
            message = self._read()
            if message["type"] == "event" and message["event"] == name:
                return message
            if message["type"] == "event":
                self.events.append(message)
