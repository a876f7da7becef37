"""Ray-layer fixtures: the session's Ray runtime (tests/conftest.py) seen through a harness
bound to the test's fresh tenant.

Tests marked ``slow`` here (the multi-node cluster test) run only when selected with
``-m slow`` (or with RUNCONTROL_RUN_SLOW=1), so ``pytest tests/actors`` stays quick.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from actor_harness import RayHarness, poll, run_async
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


def _replace_hosts(runtime: Any, settings: Settings) -> None:
    """Stop the session's hosts for good and start them again with ``settings``."""
    import ray

    from actors.placement import NAMESPACE, host_name
    from actors.run_host import ensure_hosts

    def gone(name: str) -> bool:
        try:
            ray.get_actor(name, namespace=NAMESPACE)
        except ValueError:
            return True
        return False

    for handle in runtime.hosts:
        ray.kill(handle, no_restart=True)
    for k in range(settings.grains.host_count):
        name = host_name(k)
        run_async(poll(lambda n=name: gone(n), f"{name} to be gone", timeout=30), timeout=40)
    runtime.hosts = ensure_hosts(settings, runtime.owner_url)


@pytest.fixture(scope="module")
def long_leases(ray_runtime: Any) -> Iterator[dict[str, Any]]:
    """The hosts grant ``LONG_LEASE_S`` leases while the module runs (the session's last two
    seconds: shorter than a host's restart or a pg_dump under load); yields their config."""
    from actors.run_host import host_config

    raw = ray_runtime.settings.model_dump(mode="json")
    raw["leases"]["duration_seconds"] = LONG_LEASE_S
    settings = Settings.model_validate(raw)
    _replace_hosts(ray_runtime, settings)
    try:
        yield host_config(settings, ray_runtime.owner_url)
    finally:
        _replace_hosts(ray_runtime, ray_runtime.settings)
