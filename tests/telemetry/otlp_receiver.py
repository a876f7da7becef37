"""A real OTLP/HTTP trace receiver on loopback: ``POST /v1/traces`` with an
``ExportTraceServiceRequest`` (protobuf), decoded with ``opentelemetry-proto`` and kept as
plain ``ReceivedSpan`` records for the tests to query."""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.common.v1 import common_pb2


@dataclass(frozen=True)
class ReceivedSpan:
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str  # "" for a root span
    kind: int
    attributes: dict[str, Any]
    resource: dict[str, Any]


def _value(value: common_pb2.AnyValue) -> Any:
    field = value.WhichOneof("value")
    return None if field is None else getattr(value, field)


def _attributes(items: Any) -> dict[str, Any]:
    return {item.key: _value(item.value) for item in items}


class OtlpReceiver:
    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.requests = 0
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path != "/v1/traces":
                    self.send_response(404)
                    self.end_headers()
                    return
                receiver._take(trace_service_pb2.ExportTraceServiceRequest.FromString(body))
                answer = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _take(self, request: trace_service_pb2.ExportTraceServiceRequest) -> None:
        spans = [
            ReceivedSpan(
                span.name,
                span.trace_id.hex(),
                span.span_id.hex(),
                span.parent_span_id.hex(),
                span.kind,
                _attributes(span.attributes),
                _attributes(resource_spans.resource.attributes),
            )
            for resource_spans in request.resource_spans
            for scope_spans in resource_spans.scope_spans
            for span in scope_spans.spans
        ]
        with self._lock:
            self.requests += 1
            self.spans.extend(spans)

    def wait_for(
        self, predicate: Callable[[list[ReceivedSpan]], Any], timeout: float = 60.0
    ) -> Any:
        """Poll the spans received so far until ``predicate`` answers something truthy
        (spans arrive in batches from each process's exporter thread)."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                found = predicate(list(self.spans))
            if found:
                return found
            assert time.monotonic() < deadline, f"spans not received ({len(self.spans)} so far)"
            time.sleep(0.2)
