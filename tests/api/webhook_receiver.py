"""A real HTTP receiver for webhook deliveries (``http.server`` in a thread on a free port).

Each path has a mode: ``ok`` answers 200, ``fail`` 500, ``flaky:N`` 500 for its first N
requests then 200. Every request is recorded with its headers, body and the status answered.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from runcontrol.domain.webhooks import (
    ATTEMPT_HEADER,
    EVENT_ID_HEADER,
    POSITION_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
)


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    status: int

    @property
    def event(self) -> dict[str, Any]:
        value: dict[str, Any] = json.loads(self.body)
        return value

    @property
    def event_id(self) -> str:
        return self.headers[EVENT_ID_HEADER]

    @property
    def attempt(self) -> int:
        return int(self.headers[ATTEMPT_HEADER])

    @property
    def position(self) -> int:
        return int(self.headers[POSITION_HEADER])

    @property
    def timestamp(self) -> str:
        return self.headers[TIMESTAMP_HEADER]

    @property
    def signature(self) -> str:
        return self.headers[SIGNATURE_HEADER]


class Receiver:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.modes: dict[str, str] = {}
        self.counts: dict[str, int] = {}
        self.received: list[Received] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with receiver.lock:
                    n = receiver.counts.get(self.path, 0)
                    receiver.counts[self.path] = n + 1
                    mode = receiver.modes.get(self.path, "ok")
                    if mode == "ok":
                        status = 200
                    elif mode == "fail":
                        status = 500
                    else:
                        status = 500 if n < int(mode.split(":")[1]) else 200
                    receiver.received.append(
                        Received(self.path, dict(self.headers.items()), body, status)
                    )
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str, mode: str = "ok") -> str:
        self.modes[path] = mode
        return f"http://127.0.0.1:{self.server.server_address[1]}{path}"

    def at(self, path: str) -> list[Received]:
        with self.lock:
            return [r for r in self.received if r.path == path]

    def __enter__(self) -> Receiver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
