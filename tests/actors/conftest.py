"""Ray-layer fixtures: the session's Ray runtime (tests/conftest.py) seen through a harness
bound to the test's fresh tenant.

Tests marked ``slow`` here (the multi-node cluster test) run only when selected with
``-m slow`` (or with RUNCONTROL_RUN_SLOW=1), so ``pytest tests/actors`` stays quick.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from actor_harness import RayHarness
from support import skip_slow_unless_selected

from runcontrol.store import Database

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_slow_unless_selected(config, items, HERE)


@pytest.fixture(scope="session")
def db(ray_runtime: Any) -> Database:
    """Tests here read the Ray runtime's own database (see ``ray_db`` in tests/conftest.py)."""
    database: Database = ray_runtime.container.db
    return database


@pytest.fixture
def h(ray_runtime: Any, db: Database, tenant: str) -> RayHarness:
    return RayHarness(ray_runtime, db, tenant)
