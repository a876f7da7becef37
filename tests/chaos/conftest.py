"""The chaos suite runs only when slow tests are selected (``-m slow`` or RUNCONTROL_RUN_SLOW=1,
as ``make test`` and ``make chaos`` do). It needs no session fixture: it starts its own
PostgreSQL and, in a child process, its own Ray runtime and service."""

from __future__ import annotations

from pathlib import Path

import pytest
from support import skip_slow_unless_selected

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_slow_unless_selected(config, items, HERE)
