"""Streamed output read back by every kind of reader (issue 30, docs/streaming.md), through Ray
Serve's HTTP and gRPC ingress with real run hosts and PostgreSQL: many attempts stream at once
from an SDK worker over gRPC, and each run's readers (SSE from the start, SSE that drops its
connection mid-stream and resumes with ``Last-Event-ID``, gRPC ``WatchRun`` with
``include_output``, and the plain read paged by position) see every chunk once, in order.

The issue's full size (100 attempts x 100 chunks/s x 10 s) is the ``long`` variant."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from api_harness import Sse, SseReader
from grpc_harness import GrpcTenant, auth
from test_sdk_grpc import serve_over_grpc

from runcontrol.sdk import Backoff, Step, Worker
from schemas import runcontrol_pb2 as pb

END = {"end": True}


def expected(chunks: int) -> list[Any]:
    return [f"{i} " for i in range(chunks)] + [END]


def body(chunk: dict[str, Any]) -> Any:
    return chunk["text"] if "text" in chunk else chunk["data"]


class Readers:
    """Each run's readers, in threads of their own (they block on their streams)."""

    def __init__(self, g: GrpcTenant, drop_after: int) -> None:
        self.g = g
        self.drop_after = drop_after
        self.token = g.view.token()
        self.reader_token = g.reader().token
        self.sse: dict[str, list[Sse]] = {}
        self.resumed: dict[str, list[Sse]] = {}
        self.reconnects: dict[str, int] = {}
        self.watched: dict[str, list[pb.RunEvent]] = {}
        self.errors: list[BaseException] = []
        self.threads: list[threading.Thread] = []

    def start(self, run_id: str, watch: bool) -> None:
        self._thread(lambda: self._sse(run_id, self.sse, None))
        self._thread(lambda: self._sse(run_id, self.resumed, self.drop_after))
        if watch:
            self._thread(lambda: self._watch(run_id))

    def join(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for thread in self.threads:
            thread.join(max(deadline - time.monotonic(), 0.1))
        assert not [t for t in self.threads if t.is_alive()], "a reader never ended"
        assert not self.errors, self.errors

    def _thread(self, read: Callable[[], None]) -> None:
        def guarded() -> None:
            try:
                read()
            except BaseException as exc:  # noqa: BLE001 - reported by join
                self.errors.append(exc)

        thread = threading.Thread(target=guarded, daemon=True)
        thread.start()
        self.threads.append(thread)

    def _sse(self, run_id: str, into: dict[str, list[Sse]], drop_after: int | None) -> None:
        seen = into.setdefault(run_id, [])
        path = f"/factory/runs/{run_id}/output/stream"
        with self.g.api.client(self.token) as http:
            while True:
                headers = {"Last-Event-ID": str(seen[-1].id)} if seen else {}
                timeout = httpx.Timeout(30.0, read=60.0)
                with http.stream("GET", path, headers=headers, timeout=timeout) as response:
                    if response.status_code == 204:
                        return
                    read = SseReader(response).read(stop_after=drop_after)
                seen.extend(read.events)
                if read.ended:
                    return
                # dropped mid-stream (the connection closed): resume after the last id seen
                self.reconnects[run_id] = self.reconnects.get(run_id, 0) + 1
                drop_after = None

    def _watch(self, run_id: str) -> None:
        stub = self.g.stub
        request = pb.WatchRunRequest(run_id=run_id, include_output=True)
        stream = stub.WatchRun(request, metadata=auth(self.reader_token), timeout=120)
        self.watched[run_id] = list(stream)


def stream_and_read(g: GrpcTenant, grpc_port: int, runs: int, rate: int, seconds: float) -> None:
    g.view.publish()
    chunks = int(rate * seconds)
    worker = Worker("streams", concurrency=runs, wait_s=2.0, backoff=Backoff(0.05, 0.5))
    writes: list[int] = []

    @worker.agent(g.view.agent)
    async def talk(step: Step) -> int:
        period = 1.0 / rate
        started = time.monotonic()
        for i in range(chunks):  # paced as a model streams: i-th token at i / rate seconds
            await step.stream(f"{i} ")
            delay = started + (i + 1) * period - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
        await step.stream(END)
        await step._attempt.output.flush()
        writes.append(step._attempt.output.writes)
        return chunks

    readers = Readers(g, drop_after=chunks // 3)
    run_ids: list[str] = []

    async def scenario() -> None:
        for i in range(runs):
            run_id = await asyncio.to_thread(g.view.submit)
            run_ids.append(run_id)
            readers.start(run_id, watch=i % 2 == 0)
        for run_id in run_ids:
            view = await asyncio.to_thread(
                lambda r=run_id: g.view.wait_state(r, "Completed", "Failed", timeout=seconds + 60)
            )
            assert view["state"] == "Completed", view

    serve_over_grpc(g, grpc_port, worker, scenario, timeout=seconds + 120)
    readers.join(timeout=60)

    want = expected(chunks)
    for run_id in run_ids:
        # The stored output is the truth every reader is held to: paged by position, it holds
        # each attempt's chunks (an attempt whose lease ran out on a loaded machine left what
        # it wrote, and its retry wrote again), the completing attempt's last.
        paged: list[dict[str, Any]] = []
        http = g.view.requester()
        while True:
            after = paged[-1]["position"] if paged else 0
            page = http.get(f"/factory/runs/{run_id}/output", params={"after": after, "limit": 100})
            assert page.status_code == 200, page.text
            if not page.json():
                break
            paged.extend(page.json())
        positions = list(range(1, len(paged) + 1))
        assert [c["position"] for c in paged] == positions
        last = paged[-1]["attemptId"]
        assert [body(c) for c in paged if c["attemptId"] == last] == want
        stored = [body(c) for c in paged]
        sse = readers.sse[run_id]
        assert [e.id for e in sse] == positions
        assert [body(e.data) for e in sse] == stored
        resumed = readers.resumed[run_id]
        assert readers.reconnects.get(run_id) == 1
        assert [e.id for e in resumed] == positions  # no chunk lost, none twice
        assert [body(e.data) for e in resumed] == stored
        if run_id in readers.watched:
            watched = readers.watched[run_id]
            out = [m.output for m in watched if m.type == "OutputWritten"]
            assert [o.position for o in out] == positions
            assert [o.text or o.data_json for o in out if o.text] == [
                x for x in stored if isinstance(x, str)
            ]
            assert watched[-1].type == "RunCompleted"
        # batched: a write is one transaction, one writtenAt; a few per second, not `rate`
        for attempt in {c["attemptId"] for c in paged}:
            written = {c["writtenAt"] for c in paged if c["attemptId"] == attempt}
            assert len(written) <= seconds / 0.2 + 3
    assert len(writes) == runs and max(writes) <= seconds / 0.2 + 3, writes


def test_every_reader_sees_every_chunk_once_in_order(g: GrpcTenant, grpc_port: int) -> None:
    stream_and_read(g, grpc_port, runs=8, rate=100, seconds=3)


@pytest.mark.long
def test_every_reader_sees_every_chunk_at_the_issues_size(g: GrpcTenant, grpc_port: int) -> None:
    stream_and_read(g, grpc_port, runs=100, rate=100, seconds=10)
