"""Reads and event streams off the write path: an API replica answers GETs and feeds every
live SSE stream from the database, through one LISTEN connection per replica, and never asks
a run host; so all of it keeps working with every host gone."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from typing import Any

import httpx
from api_harness import SSE_MAX_STREAMS, SseReader, TenantView, assert_problem, wait_until
from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

from runcontrol.api.events import FEED_APPLICATION_NAME
from runcontrol.client import TERMINAL_EVENTS
from runcontrol.commands import ReportOutcome
from runcontrol.domain import AttemptOutcome, canonical_hash

RUNS = 8
STREAMS_PER_RUN = 4


def feed_sessions(owner_url: str) -> list[str]:
    """The queries of the SSE feed's sessions on this database (pg_stat_activity)."""
    engine = create_engine(owner_url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT query FROM pg_stat_activity "
                    "WHERE application_name = :name AND datname = current_database()"
                ),
                {"name": FEED_APPLICATION_NAME},
            )
            return [r.query for r in rows]
    finally:
        engine.dispose()


class AsyncSse:
    """An SSE response read frame by frame: ``events()`` yields (id, type, data)."""

    def __init__(self, response: httpx.Response) -> None:
        assert response.status_code == 200, response.status_code
        self._lines = response.aiter_lines()

    async def next_event(self) -> tuple[int, str, dict[str, Any]] | None:
        fields: dict[str, str] = {}
        async for line in self._lines:
            if line.startswith(":"):
                continue
            if line == "":
                if "data" in fields:
                    return int(fields["id"]), fields["event"], json.loads(fields["data"])
                fields = {}
                continue
            name, _, value = line.partition(":")
            fields[name] = value.removeprefix(" ")
        return None


async def _finish_one(t: TenantView, worker: int) -> None:
    """Claim an attempt of this tenant's agent (any of its runs) and report success."""
    client = t.runtime.client
    claim = await client.claim([t.agent], f"worker-{t.tenant}-{worker}", 15.0)
    assert claim is not None
    outcome = ReportOutcome(
        **claim.fenced(),
        outcome=AttemptOutcome.SUCCEEDED,
        outcome_hash=canonical_hash({"done": 1}),
    )
    await client.send(outcome)


def test_many_streams_on_one_replica_share_one_listen_connection(t: TenantView) -> None:
    """32 live streams over 8 runs: one LISTEN session on the database for all of them, and
    each stream gets its run's events gap-free and in order up to the terminal event."""
    t.publish()
    runs = [t.submit() for _ in range(RUNS)]

    async def scenario() -> dict[tuple[str, int], list[tuple[int, str]]]:
        seen: dict[tuple[str, int], list[tuple[int, str]]] = {}
        async with contextlib.AsyncExitStack() as stack:
            http = await stack.enter_async_context(t.api.async_client(t.token()))
            readers: dict[tuple[str, int], AsyncSse] = {}
            for run_id in runs:
                for k in range(STREAMS_PER_RUN):
                    response = await stack.enter_async_context(
                        http.stream("GET", f"/factory/runs/{run_id}/events")
                    )
                    readers[(run_id, k)] = AsyncSse(response)
            for key, reader in readers.items():  # each stream is live: its first event came
                first = await asyncio.wait_for(reader.next_event(), 30)
                assert first is not None and first[1] == "RunAccepted"
                seen[key] = [first[:2]]

            sessions = await asyncio.to_thread(feed_sessions, t.runtime.owner_url)
            assert len(sessions) == 1, sessions
            # its last statement: a LISTEN, or the registration of its channels after them
            # (migration 0026: the write path NOTIFYs only registered channels)
            last = sessions[0].upper()
            assert last.startswith(("LISTEN", "SELECT RUNCONTROL_LISTEN(")), sessions

            await asyncio.gather(*(_finish_one(t, i) for i in range(RUNS)))

            async def drain(key: tuple[str, int], reader: AsyncSse) -> None:
                while (event := await reader.next_event()) is not None:
                    seen[key].append(event[:2])
                    if event[1] in TERMINAL_EVENTS:
                        return

            await asyncio.wait_for(asyncio.gather(*(drain(k, r) for k, r in readers.items())), 60)
        return seen

    seen = asyncio.run(scenario())
    for run_id in runs:
        history = t.requester().get(f"/factory/runs/{run_id}/events/history").json()
        expected = [(e["seq"], e["type"]) for e in history]
        assert expected[-1][1] == "RunCompleted"
        for k in range(STREAMS_PER_RUN):
            assert seen[(run_id, k)] == expected, (run_id, k)
    assert len(feed_sessions(t.runtime.owner_url)) == 1


def test_live_streams_per_replica_are_limited_and_a_closed_one_frees_its_place(
    t: TenantView,
) -> None:
    """Past ``api.sse_max_streams`` live streams (of any runs) the replica answers 429
    (problem+json, Retry-After) instead of opening another; the JSON history still answers,
    and a closed stream frees its place."""
    _, _, approval = t.waiting_for_approval()
    run_id = approval["runId"]
    t.publish()
    other = t.submit()
    readers = []  # kept: a dropped reader closes its response, and the server notices
    with contextlib.ExitStack() as open_streams:
        refused = None
        for n in range(SSE_MAX_STREAMS + 1):
            response = open_streams.enter_context(
                t.requester().stream(
                    "GET", f"/factory/runs/{(run_id, other)[n % 2]}/events", timeout=30.0
                )
            )
            if response.status_code == 429:
                refused = response
                break
            readers.append(SseReader(response))
            assert readers[-1].read(stop_after=1).events[0].event == "RunAccepted"
        assert refused is not None, "no stream was refused"
        refused.read()
        assert_problem(refused, 429, "too-many-subscribers")
        assert refused.headers["Retry-After"] == "1"
        history = t.requester().get(f"/factory/runs/{run_id}/events/history")
        assert history.json()[0]["type"] == "RunAccepted"

    def admitted() -> bool:
        with t.requester().stream("GET", f"/factory/runs/{run_id}/events") as response:
            if response.status_code == 429:
                return False
            return SseReader(response).read(stop_after=1).events[0].id == 1

    assert wait_until(admitted, timeout=15.0)


def test_reads_and_streams_answer_with_every_host_gone(t: TenantView) -> None:
    """GET run, list, approvals, history, a live stream and the approval lookup behind a
    decision all come from the replica's database reads: none needs a run host."""
    import ray

    from actors.run_host import ensure_hosts

    run_id, _, pending = t.waiting_for_approval()
    runtime = t.runtime
    for handle in runtime.hosts:
        ray.kill(handle, no_restart=True)

    def gone(handle: Any) -> bool:
        # ray.kill is asynchronous: a ping sent at once may still be answered
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                ray.get(handle.ping.remote(), timeout=5)
            except ray.exceptions.RayActorError:
                return True
            except ray.exceptions.GetTimeoutError:
                continue
            time.sleep(0.2)
        return False

    try:
        assert all(gone(h) for h in runtime.hosts)
        http = t.requester()
        assert t.run(run_id)["state"] == "WaitingForApproval"
        listed = http.get("/factory/runs", params={"state": "WaitingForApproval"}).json()
        assert [r["runId"] for r in listed["items"]] == [run_id]
        approvals = t.reviewer().get("/factory/approvals").json()
        assert [a["approvalId"] for a in approvals["items"]] == [pending["approvalId"]]
        history = http.get(f"/factory/runs/{run_id}/events/history").json()
        assert "ApprovalRequested" in [e["type"] for e in history]

        with http.stream("GET", f"/factory/runs/{run_id}/events", timeout=30.0) as response:
            sse = SseReader(response)
            replayed = sse.read(stop_after=len(history)).events
            assert [e.data for e in replayed] == history
            assert sse.read(stop_on_comment=True).comments == 1  # live: heartbeats, no error

        unknown = t.reviewer().post(
            f"/factory/approvals/{uuid.uuid4()}/decision",
            json={"decision": "approve", "version": 1, "proposalHash": "0" * 64, "reason": "x"},
        )
        assert_problem(unknown, 404, "approval-not-found")
    finally:
        runtime.hosts = ensure_hosts(runtime.settings, runtime.owner_url)
