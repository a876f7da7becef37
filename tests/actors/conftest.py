"""Ray-layer fixtures: the session's Ray runtime (tests/conftest.py) seen through a harness
bound to the test's fresh tenant.

Tests marked ``slow`` here (the multi-node cluster test) run only when selected with
``-m slow`` (or with RUNCONTROL_RUN_SLOW=1), so ``pytest tests/actors`` stays quick.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from actor_harness import RayHarness

from runcontrol.store import Database

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if "slow" in (config.getoption("-m") or "") or os.environ.get("RUNCONTROL_RUN_SLOW"):
        return
    skip = pytest.mark.skip(reason="slow: select with -m slow")
    for item in items:
        if item.get_closest_marker("slow") and HERE in Path(str(item.path)).resolve().parents:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def db(ray_runtime: Any) -> Database:
    """Tests here read the Ray runtime's own database (see ``ray_db`` in tests/conftest.py)."""
    database: Database = ray_runtime.container.db
    return database


@pytest.fixture
def h(ray_runtime: Any, db: Database, tenant: str) -> RayHarness:
    return RayHarness(ray_runtime, db, tenant)
