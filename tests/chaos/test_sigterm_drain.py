"""SIGTERM to a real service under load (``runcontrol up``'s drain, ``service.py``): the edge
refuses new submissions with 503 ``draining`` (the driver resends them with their key), the
workers finish and report the attempts in hand, the edge and the run hosts their commands in
flight; then the service starts again. Every accepted run must end, none ``Uncertain`` (no
attempt in hand was abandoned), with gap-free event sequences and nothing half-written
(``chaos_checks.check``: journal, outbox, steps, leases, budget)."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest
from chaos import ChaosOptions, run
from chaos_checks import breaches


@pytest.mark.slow
@pytest.mark.long  # make test: the chaos run's service fault checks the same drain report
def test_sigterm_under_load_drains_and_loses_no_run() -> None:
    options = ChaosOptions(runs=60, mode="each", only_kinds=("service",))
    # Short path: PostgreSQL's unix socket lives in it (socket paths are limited to ~100 bytes).
    root = Path(tempfile.mkdtemp(prefix="rc-drain-", dir="/tmp"))
    report = run(options, root)
    text = json.dumps(report, indent=2, default=str)
    print(text)  # shown with -s: the figures
    found = breaches(report)
    assert not found, f"{found}\nlogs kept in {root}\n{text[-6000:]}"

    (fault,) = report["faults"]
    assert fault["kind"] == "service" and fault["detail"]["exit_code"] == 0, fault
    drained = fault["detail"]["drained"]
    assert drained is not None, f"the service printed no drain report; logs in {root}"
    # Nothing was cut off by the grace: the edge and every host finished what they had.
    assert drained["api"]["idle"], drained
    assert len(drained["hosts"]) == 2 and all(h["idle"] for h in drained["hosts"]), drained
    # No attempt in hand was abandoned to its lease's expiry (that settles a shared-write
    # attempt Uncertain): every run completed.
    checks = report["checks"]
    assert checks["uncertain"] == [], checks["uncertain"]
    assert checks["completed"] == checks["accepted"] == options.runs, checks
    shutil.rmtree(root, ignore_errors=True)
