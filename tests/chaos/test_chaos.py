"""Runs under load while run hosts, the scheduler, the Serve replica, PostgreSQL and the whole
service are killed; then every invariant is checked (``chaos_checks.py``).

By default the CI size: 80 runs and one fault of each kind (about two minutes). ``make chaos``
runs the long one: RUNCONTROL_CHAOS_RUNS=2000 RUNCONTROL_CHAOS_MODE=random; it writes its
figures as JSON to RUNCONTROL_CHAOS_REPORT when set (``docs/reliability.md`` quotes them).
RUNCONTROL_CHAOS_NODES=2 (``make chaos-two-node``) runs the service on two Ray nodes and
removes the second one as a sixth kind of fault; not in ``make test`` (it takes minutes).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from chaos import ChaosOptions, run
from chaos_checks import breaches


@pytest.mark.slow
def test_no_run_is_lost_and_every_invariant_holds_under_faults() -> None:
    options = ChaosOptions(
        runs=int(os.environ.get("RUNCONTROL_CHAOS_RUNS", "80")),
        mode=os.environ.get("RUNCONTROL_CHAOS_MODE", "each"),
        nodes=int(os.environ.get("RUNCONTROL_CHAOS_NODES", "1")),
    )
    if "RUNCONTROL_CHAOS_SEED" in os.environ:
        options.seed = int(os.environ["RUNCONTROL_CHAOS_SEED"])
    # Short path: PostgreSQL's unix socket lives in it (socket paths are limited to ~100 bytes).
    root = Path(tempfile.mkdtemp(prefix="rc-chaos-", dir="/tmp"))
    report = run(options, root)
    text = json.dumps(report, indent=2, default=str)
    print(text)  # shown with -s: the figures
    if os.environ.get("RUNCONTROL_CHAOS_REPORT"):
        Path(os.environ["RUNCONTROL_CHAOS_REPORT"]).write_text(text + "\n")
    found = breaches(report)
    assert not found, f"{found}\nlogs kept in {root}\n{text[-6000:]}"
    # Each service fault is a SIGTERM under load: the service drained (the edge and every
    # host finished what they had within the grace) and exited 0. test_sigterm_drain (make
    # test-long) strikes only that fault, and checks no run ended Uncertain.
    for fault in (f for f in report["faults"] if f["kind"] == "service"):
        assert fault["detail"]["exit_code"] == 0, fault
        drained = fault["detail"]["drained"]
        assert drained is not None, f"the service printed no drain report; logs in {root}"
        assert drained["api"]["idle"], drained
        assert len(drained["hosts"]) == 2 and all(h["idle"] for h in drained["hosts"]), drained
    shutil.rmtree(root, ignore_errors=True)
