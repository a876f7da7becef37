"""The cross-scope fuzz test against a service on two databases: row-level security still holds
inside each shard (issue 41).

The session's Ray database is the first shard; a second database is made on the same server and
the virtual shards from ``SECOND_HALF`` on are put on it. The run hosts and a scheduler of this
module's own are started with both listed, and a Serve app of its own (at ``/shards``) serves
both. Tenant A's virtual shard is in the first half, tenant B's in the second, so each one's
runs, approvals and events are in its own database, and every id of the other tenant the fuzz
draws for a path is routed by its id to the other database, where row-level security must
keep it hidden.

The scopes are seeded and fuzzed by test_cross_scope_fuzz.py's own ``seeded_world`` and
``fuzz_as``, as each of its callers (a project of A, the operators of A and of B): no answer
names an id of a scope the caller may not see, none is a 5xx. About a minute in all.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from api_harness import Api, app_on
from support import counted, ray_on_two_databases, tenant_in
from test_cross_scope_fuzz import CALLERS, World, fuzz_as, seeded_world

APP = "shards"
TABLES = ("runs", "attempts", "approval_requests", "outbox", "recovery_journal", "releases")


@pytest.fixture(autouse=True)
def _session_hosts() -> None:
    """The module's hosts serve both databases until its ``two_databases`` ends: the session's
    own fixture of this name would start them on the one database again before each test."""


@pytest.fixture(scope="module")
def two_databases(ray_runtime: Any, owner_url: str) -> Iterator[Any]:
    """The runtime's hosts and a scheduler of this module's own on the Ray database and a
    second one (``support.ray_on_two_databases``)."""
    import ray

    from actors.scheduler import ensure_scheduler

    with ray_on_two_databases(ray_runtime, owner_url, "runcontrol_fuzz_shard1") as runtime:
        scheduler = ensure_scheduler(runtime.settings, ray_runtime.owner_url, name="fuzz-shards")
        try:
            yield runtime
        finally:
            ray.kill(scheduler, no_restart=True)


@pytest.fixture(scope="module")
def sharded_api(
    api: Api, two_databases: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Api]:
    """A Serve app of its own given both databases, on the session's Serve instance."""
    directory = tmp_path_factory.mktemp("shards")
    with app_on(api, two_databases, APP, directory, two_databases.first.owner_url) as base:
        yield Api(base, api.rsa_key)


@pytest.fixture(scope="module")
def world(sharded_api: Api, two_databases: Any) -> Iterator[World]:
    with seeded_world(sharded_api, two_databases, tenant_in(0), tenant_in(1)) as seeded:
        yield seeded


def test_each_tenant_is_wholly_on_its_own_database(world: World, two_databases: Any) -> None:
    tenant_a, tenant_b = (world.scopes[s].view.tenant for s in ("A/P1", "B/P1"))
    for table in TABLES:
        on_first = (counted(two_databases.first, table, t) for t in (tenant_a, tenant_b))
        on_second = (counted(two_databases.second, table, t) for t in (tenant_a, tenant_b))
        assert [n > 0 for n in on_first] == [True, False], table
        assert [n > 0 for n in on_second] == [False, True], table


@pytest.mark.parametrize("caller", sorted(CALLERS))
def test_no_answer_names_another_scopes_ids_on_two_databases(world: World, caller: str) -> None:
    tally = fuzz_as(world, caller)
    print(f"\n{caller}: {sum(tally.requests.values())} requests, statuses {dict(tally.statuses)}")
    assert not tally.leaks
    assert not [s for s in tally.statuses if s >= 500], tally.statuses
