"""The chaos suite runs only when slow tests are selected (``-m slow`` or RUNCONTROL_RUN_SLOW=1,
as ``make test`` and ``make chaos`` do). It needs no session fixture: it starts its own
PostgreSQL and, in a child process, its own Ray runtime and service."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if "slow" in (config.getoption("-m") or "") or os.environ.get("RUNCONTROL_RUN_SLOW"):
        return
    skip = pytest.mark.skip(reason="slow: select with -m slow")
    for item in items:
        if item.get_closest_marker("slow") and HERE in Path(str(item.path)).resolve().parents:
            item.add_marker(skip)
