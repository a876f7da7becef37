"""No 500 without a problem document and a log line (issue 34): a handler broken on purpose
(a read of ``runs`` that fails inside the database for one tenant: a restrictive row-level
security policy raising ``XX000``, installed by this test only) answers a problem+json 500
with a correlation id over HTTP and ``INTERNAL`` with the same kind of id over gRPC, and the
replica logs each at ERROR with its traceback under that id."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from api_harness import TenantView, assert_problem
from grpc_harness import GrpcTenant, Refused
from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

from runcontrol.store import Database


@pytest.fixture
def broken_reads(db: Database, t: TenantView) -> Iterator[Callable[[], None]]:
    """Breaks (when called) every read of a row of ``runs`` in ``t``'s tenant with an error
    nobody maps."""
    owner = create_engine(db.owner_url, poolclass=NullPool)
    installed: list[bool] = []

    def install() -> None:
        with owner.begin() as conn:
            conn.execute(
                text(
                    "CREATE FUNCTION test_broken_read(tenant text) RETURNS boolean"
                    f" LANGUAGE plpgsql AS $fn$ BEGIN IF tenant = '{t.tenant}' THEN RAISE"
                    " EXCEPTION USING ERRCODE = 'XX000', MESSAGE = 'test: a read broken on"
                    " purpose'; END IF; RETURN true; END $fn$"
                )
            )
            conn.execute(
                text(
                    "CREATE POLICY test_broken_read ON runs AS RESTRICTIVE"
                    " USING (test_broken_read(tenant_id))"
                )
            )
        installed.append(True)

    try:
        yield install
    finally:
        if installed:
            with owner.begin() as conn:
                conn.execute(text("DROP POLICY test_broken_read ON runs"))
                conn.execute(text("DROP FUNCTION test_broken_read(text)"))
        owner.dispose()


def logged(correlation_id: str, timeout: float = 15.0) -> str:
    """The replica's log line for ``correlation_id`` and what follows it (its traceback),
    from the replica's own log (``logs/serve/replica_*.log``)."""
    import ray

    logs = Path(ray._private.worker.global_worker.node.get_logs_dir_path())
    deadline = time.monotonic() + timeout
    while True:
        for path in (logs / "serve").glob("replica_*.log"):
            content = path.read_text(errors="replace")
            at = content.find(f"correlation id {correlation_id}")
            if at >= 0:
                start = content.rfind("\n", 0, at) + 1
                return content[start : at + 4000]
        assert time.monotonic() < deadline, f"no log line names {correlation_id}"
        time.sleep(0.2)


def test_an_unexpected_error_is_a_problem_with_a_correlation_id_and_an_error_log_line(
    t: TenantView, g: GrpcTenant, broken_reads: Callable[[], None]
) -> None:
    t.publish()
    run_id = t.submit()
    broken_reads()
    response = t.requester().get(f"/factory/runs/{run_id}")
    problem = assert_problem(response, 500, "internal-error")
    correlation_id = problem["correlationId"]
    assert response.headers["X-Correlation-Id"] == correlation_id
    assert correlation_id in problem["detail"]
    line = logged(correlation_id)
    assert line.startswith("ERROR ") and "unexpected error at HTTP GET /factory/runs/" in line
    assert "Traceback (most recent call last)" in line and "test: a read broken on purpose" in line

    chosen = t.requester().get(
        f"/factory/runs/{run_id}", headers={"X-Correlation-Id": "client-chose-this"}
    )
    assert assert_problem(chosen, 500)["correlationId"] == "client-chose-this"

    watch = g.reader().watch(run_id)
    with pytest.raises(grpc.RpcError) as failed:
        next(iter(watch))
    refusal = Refused(failed.value)  # a stream's status: Serve's proxy drops its trailers
    assert refusal.status is grpc.StatusCode.INTERNAL, refusal
    found = re.search(r"correlation id ([0-9a-f]{32})", refusal.message)
    assert found is not None, refusal.message
    grpc_id = found.group(1)
    line = logged(grpc_id)
    assert line.startswith("ERROR ") and "unexpected error at gRPC WatchRun" in line
    assert "Traceback (most recent call last)" in line
