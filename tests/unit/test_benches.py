"""The user-facing benchmarks run end to end in their tiny variants, so they do not rot.

``python -m bench --only http,e2e,sse,fairness,output`` with small N, in a child process (its
own embedded PostgreSQL, Ray runtime, Serve with the fast ingress, worker processes), then its
JSON report is checked for every figure (``make bench-check``, run by ``.ci/run``). No figure is
compared with a threshold: only that each was measured, that every submitted run completed and
every event (and output chunk) reached every stream, and that the streams made no host call.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import make_url

ROOT = Path(__file__).resolve().parents[2]

# About three minutes (a Ray runtime, Serve and workers of its own): not in `make test`,
# which stays under ten minutes; `make bench-check` runs it, and `.ci/run` runs that.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not os.environ.get("RUNCONTROL_RUN_BENCH"),
        reason="the benches' tiny run: set RUNCONTROL_RUN_BENCH=1 (make bench-check)",
    ),
]


def _measured(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value) and value > 0


def _sampled(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value) and value >= 0


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("bench") / "bench.json"
    # Not this session's database nor its Ray's ports (HAProxy's listeners, replica port
    # windows): the bench starts a Ray of its own, which picks free ones (actors/ingress.py).
    env = {
        k: v
        for k, v in os.environ.items()
        if k != "RUNCONTROL_DATABASE_URL" and not k.startswith("RAY_")
    }
    subprocess.run(
        [
            sys.executable,
            "-m",
            "bench",
            "--only=http,e2e,sse,fairness,output",
            "--pgbench-seconds=2",
            "--http-seconds=2",
            "--e2e-runs=20",
            "--e2e-worker-concurrency=4",
            "--sse-streams=30",
            "--sse-runs=3",
            "--sse-seconds=2",
            "--sse-rate=5",
            "--fairness-a-runs=40",
            "--fairness-b-every=0.5",
            "--fairness-b-unloaded=3",
            "--fairness-worker-concurrency=4",
            "--fairness-work-seconds=0.1",
            "--output-attempts=5",
            "--output-rate=50",
            "--output-seconds=2",
            f"--json={out}",
        ],
        cwd=ROOT,
        env=env,
        check=True,
        timeout=900,
    )
    figures: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    return figures


def test_http_reports_submissions_beside_the_trivial_route(report: dict[str, Any]) -> None:
    http = report["http"]
    for route in ("submit", "trivial"):
        assert _measured(http[f"{route}_rps"])
        for p in (50, 95, 99):
            assert _measured(http[f"{route}_p{p}_ms"])
        assert _measured(http["cpu_ms_per_request"][route]["all"])
    submit_cpu = http["cpu_ms_per_request"]["submit"]
    for kind in ("API replica", "run hosts", "postgres"):
        assert _measured(submit_cpu[kind]), kind


@pytest.mark.parametrize("workers", ["e2e", "e2e_session", "e2e_sdk", "e2e_grpc"])
def test_e2e_completes_every_run_and_reports_its_figures(
    report: dict[str, Any], workers: str
) -> None:
    """Claiming workers (the old path), the hosts' session alone, the SDK's `runcontrol worker`
    in the cluster and over gRPC (separate processes, as a user starts them)."""
    e2e = report[workers]
    assert e2e["submitted"] == e2e["completed"] == 20
    assert e2e["submit_errors"] == 0
    for key in (
        "pgbench_tps",
        "completed_runs_per_s",
        "submit_to_completed_p50_ms",
        "submit_to_completed_p99_ms",
        "host_commands_per_run",
        "host_calls_per_run",
        "transactions_per_run",
        "commit_statements_per_run",
        "commit_documents_per_run",
        "commit_document_bytes",
    ):
        assert _measured(e2e[key]), key
    # Counted from the server's side (issue 33): NOTIFYs sent, by channel (none may be sent
    # when nobody listens, so only reported), rows written by table.
    assert e2e["notifies_per_run"] == pytest.approx(
        sum(e2e["notifies_per_run_by_channel"].values())
    )
    rows = e2e["rows_per_run"]
    for table in ("runs", "steps", "attempts", "outbox", "all"):  # the journal: on the events
        assert _measured(rows[table]["inserted"]), table
    assert _measured(rows["runs"]["updated"])
    cpu = e2e["cpu_ms_per_completed_run"]
    for kind in ("API replica", "run hosts", "postgres", "all", "server side"):
        assert _measured(cpu[kind]), kind
    assert cpu["server side"] < cpu["all"]  # the workers' and the load generator's apart
    # Sampled too, but may round to nothing in a run this small: CPU times count in 10 ms
    # ticks, and the scheduler spends a few ms on 20 runs (CI once read 0.0 for it).
    for kind in ("scheduler", "workers"):
        assert _sampled(cpu[kind]), kind
    # Then a quarter as many (at least 10) at half the peak rate, open loop (issue 42).
    paced = e2e["paced"]
    assert paced["submitted"] == paced["completed"] == 10
    assert paced["rate_per_s"] == pytest.approx(e2e["completed_runs_per_s"] / 2, rel=0.5)
    for key in ("submit_to_completed_p50_ms", "submit_to_completed_p99_ms"):
        assert _measured(paced[key]), key


def test_sse_delivers_every_event_to_every_stream_without_host_calls(
    report: dict[str, Any],
) -> None:
    sse = report["sse"]
    assert sse["streams_open"] == sse["streams"] == 30
    assert sse["streams_refused"] == 0
    assert sse["deliveries"] == sse["deliveries_expected"] == 10 * sse["events_sent"]
    assert _measured(sse["delivery_p50_ms"]) and _measured(sse["delivery_p99_ms"])
    assert sse["host_reads"] == 0
    assert sse["host_calls_by_streams"] == 0


def test_fairness_measures_b_beside_as_backlog_from_the_stored_leases(
    report: dict[str, Any],
) -> None:
    fair = report["fairness"]
    assert fair["a_submitted"] == fair["a_completed"] == 40
    assert fair["a_submit_errors"] == 0
    assert _measured(fair["a_drain_runs_per_s"])
    for phase in ("unloaded", "loaded"):
        b = fair[phase]
        assert b["runs"] >= 1 and b["claimed"] == b["runs"], phase
        for p in ("p50", "p95", "max"):
            # accepted -> leased may be 0: a credit waiting takes the run in its accepting commit
            assert (
                math.isfinite(b[f"accepted_to_claim_{p}_ms"])
                and b[f"accepted_to_claim_{p}_ms"] >= 0
            )
            assert _measured(b[f"sent_to_claim_{p}_ms"]), (phase, p)


@pytest.fixture(scope="module")
def journal_report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """``--only=journal`` alone (in-process grains: a few seconds), so ``-k journal`` runs it
    without the others."""
    out = tmp_path_factory.mktemp("bench") / "journal.json"
    env = {k: v for k, v in os.environ.items() if k != "RUNCONTROL_DATABASE_URL"}
    subprocess.run(
        [
            sys.executable,
            "-m",
            "bench",
            "--only=journal",
            "--journal-runs=20",
            "--journal-calls=5",
            f"--json={out}",
        ],
        cwd=ROOT,
        env={k: v for k, v in env.items() if not k.startswith("RAY_")},
        check=True,
        timeout=600,
    )
    figures: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    return figures


def test_journal_reports_a_journaled_call_s_cpu_beside_a_progress_report_s(
    journal_report: dict[str, Any],
) -> None:
    journal = journal_report["journal"]
    for kind in ("progress", "journal"):
        figures = journal[kind]
        assert figures["commands"] == 20 * 5
        assert _measured(figures["commands_per_s"])
        assert _measured(figures["commands_per_statement"])
        for part in ("grains (this process)", "postgres", "all"):
            assert _sampled(figures["cpu_ms_per_command"][part]), part
        assert _measured(figures["cpu_ms_per_command"]["all"])
    assert _measured(journal["journal_cpu_per_progress_cpu"])


def test_output_reports_chunks_per_second_and_cpu_per_1000_chunks(
    report: dict[str, Any],
) -> None:
    out = report["output"]
    assert out["chunks_stored"] == out["chunks_sent"] == out["delivered"] > 0
    assert out["delivered_in_order_once"] is True
    for key in (
        "pgbench_tps",
        "chunks_per_s",
        "writes_per_s",
        "statements_per_s",
        "chunks_per_write",
        "writes_per_statement",
        "delivery_p50_ms",
        "delivery_p99_ms",
        "server_cpu_ms_per_1000_chunks",
    ):
        assert _measured(out[key]), key
    for kind in ("run hosts", "postgres", "API replica", "all"):
        assert _measured(out["cpu_ms_per_1000_chunks"][kind]), kind


def test_host_cpu_measures_the_rules_and_the_sessions_per_run() -> None:
    """``python -m bench.host_cpu`` (issue 33), its tiny variant on its own PostgreSQL: every
    submitted run completes (it waits for every report) and each figure is measured."""
    env = {k: v for k, v in os.environ.items() if k != "RUNCONTROL_DATABASE_URL"}
    done = subprocess.run(
        [sys.executable, "-m", "bench.host_cpu", "--runs=20", "--rounds=1"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    figures = dict(line.rsplit(maxsplit=1) for line in done.stdout.splitlines() if line.strip())
    for name in ("rules_us_per_run", "sessions_runs_per_s", "sessions_cpu_ms_per_run"):
        assert _measured(float(figures[name])), name
    assert _sampled(float(figures["sessions_collector_ms_per_run"]))


def test_spy_profiles_the_hosts_while_the_measured_runs_flow() -> None:
    """``python -m bench.spy`` (issue 33), short: it finds the measured runs (past the
    warm-up), the run hosts and PostgreSQL have a share of a core, and the hosts' GIL samples
    show runcontrol's own turn."""
    env = {k: v for k, v in os.environ.items() if k != "RUNCONTROL_DATABASE_URL"}
    done = subprocess.run(
        [sys.executable, "-m", "bench.spy", "--transport=session", "--runs=2000", "--seconds=5"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
        check=True,
    )
    shares = dict(
        line.strip().rsplit(maxsplit=1)
        for line in done.stdout.split("\n\n")[0].splitlines()[1:]
        if line.strip().endswith("%")
    )
    assert _measured(float(shares["run hosts"].rstrip("%"))), done.stdout
    assert _measured(float(shares["postgres"].rstrip("%"))), done.stdout
    hosts = next(s for s in done.stdout.split("\n\n") if s.startswith("run hosts:"))
    samples = int(hosts.split(" GIL samples")[0].rsplit(maxsplit=1)[1])
    assert samples > 0, hosts
    assert "RunGrain.execute (runcontrol/grain/grain.py)" in hosts, hosts
    # bench.spy ends its bench with SIGTERM: the bench's PostgreSQL stopped all the same.
    data_dirs = done.stdout.rsplit("the bench's PostgreSQL: ", 1)[1].split("\n")[0].split()
    assert data_dirs and all(d.endswith("/pg") for d in data_dirs), done.stdout
    assert not _servers_of(data_dirs), _servers_of(data_dirs)


def _servers_of(data_dirs: list[str]) -> list[int]:
    """The postmasters (``postgres -D <dir>``) of these data directories still running."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            args = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
        except OSError:
            continue
        if args[0].endswith("postgres") and "-D" in args[:-1]:
            if args[args.index("-D") + 1] in data_dirs:
                found.append(int(pid))
    return found


def test_a_bench_ended_by_sigterm_stops_its_postgresql() -> None:
    """A process holding ``private_database`` (any bench) ended by SIGTERM stops its server
    and deletes its directory, as on a normal exit (issue 46: it died, leaving both)."""
    env = {k: v for k, v in os.environ.items() if k != "RUNCONTROL_DATABASE_URL"}
    hold = (
        "import time\nfrom bench.common import private_database\n"
        "with private_database() as url:\n    print(url, flush=True)\n    time.sleep(300)"
    )
    with subprocess.Popen(
        [sys.executable, "-c", hold], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True
    ) as child:
        try:
            url = child.stdout.readline() if child.stdout else ""
            data_dirs = [str(make_url(url.strip()).query["host"])]  # its socket is in it
            assert _servers_of(data_dirs), url
        finally:
            child.terminate()
            child.wait(60)
    assert not _servers_of(data_dirs), (url, _servers_of(data_dirs))
    assert not os.path.exists(os.path.dirname(data_dirs[0]))
