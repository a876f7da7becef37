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

from runcontrol.config import Settings
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


LONG_LEASE_S = 120


@pytest.fixture(scope="module")
def long_leases(ray_runtime: Any) -> dict[str, Any]:
    """The hosts grant ``LONG_LEASE_S`` leases while the module runs (the session's last two
    seconds: shorter than a host's restart or a pg_dump under load); answers their config.
    The modules using it run one after another (tests/conftest.py): the hosts are replaced when
    the first starts, checked by each next one, and given the session's settings again by the
    first test after them that does not ask for these."""
    from actors.run_host import host_config

    raw = ray_runtime.settings.model_dump(mode="json")
    raw["leases"]["duration_seconds"] = LONG_LEASE_S
    settings = Settings.model_validate(raw)
    ray_runtime.use_hosts(settings, check=True)
    return host_config(settings, ray_runtime.owner_url)
