"""Two nodes, one removed mid-run: every run still reaches a terminal state with a gap-free event
sequence. The cluster lives in a subprocess (``two_node_cluster.py``) because this pytest
process may already hold the session's Ray runtime; it uses the session's test database."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from runcontrol.store import Database

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
TIMEOUT_S = 120


@pytest.mark.slow
def test_removing_a_worker_node_mid_run_loses_no_run(db: Database, tenant: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_ADDRESS")}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "two_node_cluster.py"), db.owner_url, tenant],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: killable as a whole on timeout
    )
    try:
        out, err = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"the two-node run did not finish in {TIMEOUT_S}s:\n{err[-4000:]}")
    lines = [line for line in out.splitlines() if line.startswith("{")]
    assert proc.returncode == 0 and lines, f"rc={proc.returncode}\n{out[-2000:]}\n{err[-4000:]}"
    result = json.loads(lines[-1])
    print(json.dumps(result, indent=2))  # shown with -s: what the run observed

    assert result["hosts_before"] == ["head", "worker"]
    assert result["runs_on_worker_host"] >= 1  # the removed node hosted some runs' grains
    assert result["hosts_after"] == ["head", "head"]  # host-1 restarted on the surviving node
    assert set(result["states"]) == {"Completed"}, result  # every run finished
    assert all(result["gap_free"]), result
    assert len(result["states"]) == result["runs"] >= 6
