"""Grain-layer fixtures: a container on the session database with a ManualClock, wrapped in a
``Harness`` (see ``grain_harness``) bound to the test's fresh tenant."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from grain_harness import Harness

from runcontrol.bootstrap import build
from runcontrol.clock import ManualClock
from runcontrol.config import Settings
from runcontrol.store import Database


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def make_harness(db: Database, tenant: str, clock: ManualClock) -> Callable[..., Harness]:
    """Build a harness with other settings (budget, retries) or for another tenant."""

    def make(settings: Settings | None = None, tenant_id: str | None = None) -> Harness:
        container = build(settings or Settings(), db=db, clock=clock, migrate=False)
        return Harness(container, tenant_id or tenant, clock)

    return make


@pytest.fixture
def h(make_harness: Callable[..., Harness]) -> Harness:
    return make_harness()
