"""The upgrade across migration 0033 with runs in flight and the previous release's code
committing through it (``upgrade_check.py``): 0 lost, 0 double outcomes, 0 event gaps, every
stale report audited, the journal complete row by row against the events. ``make
upgrade-check`` runs it (about three minutes: two services start); not in ``make test``."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
from upgrade_check import run, upgrade_breaches


@pytest.mark.slow
@pytest.mark.long
def test_the_previous_release_commits_through_0033_and_every_run_ends_whole() -> None:
    # Short path: PostgreSQL's unix socket lives in it (socket paths are limited to ~100 bytes).
    root = Path(tempfile.mkdtemp(prefix="rc-upgrade-", dir="/tmp"))
    report = run(root, int(os.environ.get("RUNCONTROL_UPGRADE_RUNS", "32")))
    found = upgrade_breaches(report)
    assert not found, f"{found}\nlogs kept in {root}"
    shutil.rmtree(root, ignore_errors=True)
