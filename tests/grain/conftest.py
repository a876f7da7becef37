"""Grain-layer fixtures: a container on the session database with a ManualClock, wrapped in a
``Harness`` (see ``grain_harness``) bound to the test's fresh tenant."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from grain_harness import Harness
from support import drive

from runcontrol.bootstrap import build
from runcontrol.clock import ManualClock
from runcontrol.config import Settings
from runcontrol.store import Database


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def make_harness(db: Database, tenant: str, clock: ManualClock) -> Iterator[Callable[..., Harness]]:
    """Build a harness with other settings (budget, retries) or for another tenant."""
    made: list[Harness] = []

    def make(settings: Settings | None = None, tenant_id: str | None = None) -> Harness:
        container = build(settings or Settings(), db=db, clock=clock, migrate=False)
        made.append(Harness(container, tenant_id or tenant, clock))
        return made[-1]

    yield make
    for harness in made:
        drive(harness.c.store.close())


@pytest.fixture
def h(make_harness: Callable[..., Harness]) -> Harness:
    return make_harness()
