"""Streamed output in the store (issue 30, docs/streaming.md): the lease holders' fenced
inserts (``runcontrol_append_output``, migration 0022), grouped per event loop, and the read
of a run's chunks after a position (the readers' cursor).

A write is not a turn of the run's grain: it commits nothing of the run and reads none of it,
so it costs one statement shared with every write ready at the same moment (many attempts
streaming at once write in few statements), not a decision and a ``runcontrol_apply``. The
fence is the database's: the attempt's current lease row, share-locked by the write.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any
from uuid import UUID

import orjson
from sqlalchemy import Connection, select

from ..commands import AppendOutput
from ..domain import canonical_json, errors
from ..domain.output import OUTPUT_ATTEMPT_MAX_BYTES, OutputAck, check_write, refusal
from .commit import Store
from .database import MOVED
from .group import GroupCommits
from .queries.events import RowsAfter
from .tables import output_chunks

# NOTIFYed (the run id as payload) by a write that stored chunks: wakes the run's readers.
OUTPUT_CHANNEL = "runcontrol_output"
# A write that met a deadlock or a serialization failure did nothing: resend it.
_RETRYABLE = frozenset({"40P01", "40001"})
_APPEND = "SELECT runcontrol_append_output(%s::jsonb, %s) AS answers"


class OutputWriter:
    """The lease holders' writes made on one event loop (a run host's), every write ready at
    the same moment in one statement (``GroupCommit``, one per shard database), each in its
    own subtransaction."""

    def __init__(self, store: Store) -> None:
        # a group per shard database (the run's): its writes share its statements
        self._group: GroupCommits[Store, dict[str, Any]] = GroupCommits(
            lambda run_id: store.for_run(UUID(run_id)), lambda shard: partial(self._send, shard)
        )
        self.attempt_max = OUTPUT_ATTEMPT_MAX_BYTES  # what one attempt may write in all
        # the writes answered, the chunks they stored and the statements that carried them
        self.writes = 0
        self.chunks = 0
        self.statements = 0

    async def _send(self, store: Store, docs: list[str]) -> list[dict[str, Any]]:
        self.statements += 1
        rows = await store.call(_APPEND, ("[" + ",".join(docs) + "]", self.attempt_max))
        answers: list[dict[str, Any]] = rows[0]["answers"]
        return answers

    async def append(self, command: AppendOutput) -> OutputAck:
        """Store the command's chunks: its ack, or the typed refusal (a stale lease, a gap,
        the attempt's total reached)."""
        check_write(command.chunks)
        doc = orjson.dumps(
            {
                "tenant_id": command.tenant_id,
                "run_id": str(command.run_id),
                "attempt_id": str(command.attempt_id),
                "holder": command.holder,
                "fencing_token": command.fencing_token,
                "lease_id": None if command.lease_id is None else str(command.lease_id),
                "chunks": [
                    {"seq": c.seq, "text": c.text}
                    if c.text is not None
                    else {"seq": c.seq, "data_json": canonical_json(c.data).decode()}
                    for c in command.chunks
                ],
            }
        ).decode()
        found = await self._group.commit(doc, str(command.run_id))
        self.writes += 1
        if found.get("sqlstate") == MOVED:  # the tenant's shard moved: route again
            raise errors.ShardMoved(found["message"])
        if "sqlstate" in found:
            if found["sqlstate"] in _RETRYABLE:
                raise errors.Unavailable(f"the output write did not commit: {found['message']}")
            raise errors.RunControlError(f"the output write failed: {found['message']}")
        acked = int(found["acked"])
        self.chunks += int(found["stored"])
        if found["error"] is not None:
            raise refusal(
                found["error"], found["message"], acked, command.attempt_id, self.attempt_max
            )
        return OutputAck(command.attempt_id, acked, int(found["stored"]), int(found["duplicates"]))


def output_view(row: Any) -> dict[str, Any]:
    """A stored chunk as readers see it (HTTP, SSE, gRPC): camelCase, ids and times as text."""
    view: dict[str, Any] = {
        "position": int(row["position"]),
        "attemptId": str(row["attempt_id"]),
        "stepId": str(row["step_id"]),
        "seq": int(row["seq"]),
        "writtenAt": row["written_at"].isoformat(),
    }
    if row["text"] is not None:
        view["text"] = row["text"]
    else:
        view["data"] = orjson.loads(row["data_json"])
    return view


# The run's chunks at positions after ``after``, in order (a tenant-scoped read).
output_after = RowsAfter(output_chunks, "position", output_view)


def streamed_attempts(
    conn: Connection, run_id: UUID, attempt_ids: Sequence[str] | None = None
) -> dict[str, str]:
    """The run's attempts (of ``attempt_ids``, else all) that stored output: attempt id ->
    step id (each one's first chunk, by the unique (attempt, seq) index)."""
    c = output_chunks.c
    query = select(c.attempt_id, c.step_id).where(c.run_id == run_id, c.seq == 1)
    if attempt_ids is not None:
        query = query.where(c.attempt_id.in_([UUID(a) for a in attempt_ids]))
    return {str(r.attempt_id): str(r.step_id) for r in conn.execute(query)}
