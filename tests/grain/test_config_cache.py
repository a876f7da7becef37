"""What a submission pins (the current policy, a release alias) is cached per process while
its LISTEN connection proves nothing changed, and re-read once a change is notified
(``runcontrol/ports/cache.py``, migration 0007's ``runcontrol_config`` NOTIFY).

Two containers stand for two processes on one database: ``here`` caches (it has a listener),
``there`` publishes, so ``here`` learns of the change only through the database's NOTIFY.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from support import drive

from runcontrol.bootstrap import Container, build
from runcontrol.clock import ManualClock
from runcontrol.config import Settings
from runcontrol.domain import PolicyDocument, SideEffectClass, StepSpec, WorkflowDefinition
from runcontrol.store import Database
from runcontrol.store.commit import CONFIG_CHANNEL
from runcontrol.store.notify import Listener


@pytest.fixture
def listener(db: Database) -> Iterator[Listener]:
    found = Listener(db.system_url, (CONFIG_CHANNEL,))

    async def listening() -> None:
        found.start()
        while not found.listening:
            await asyncio.sleep(0.01)

    drive(asyncio.wait_for(listening(), 30))
    yield found
    drive(found.close())


@pytest.fixture
def here(db: Database, listener: Listener) -> Iterator[Container]:
    container = build(Settings(), db=db, clock=ManualClock(), migrate=False, listener=listener)
    yield container
    drive(container.store.close())


@pytest.fixture
def there(db: Database) -> Iterator[Container]:
    container = build(Settings(), db=db, clock=ManualClock(), migrate=False)
    yield container
    drive(container.store.close())


def wait_for_notice(listener: Listener, tenant: str, since: int) -> None:
    """Until the tenant's change reached this process (or fail after 30 s)."""

    async def noticed() -> None:
        while listener.generation(CONFIG_CHANNEL, (tenant,)) == since:
            await asyncio.sleep(0.01)

    drive(asyncio.wait_for(noticed(), 30))


def publish(container: Container, tenant: str, agent: str) -> str:
    definition = WorkflowDefinition("wf", (StepSpec(name="only", agent_id=agent),))
    clock = container.env.clock
    return container.releases.publish(tenant, definition, "ops", clock.now()).release_id


def test_an_alias_is_read_once_and_again_after_it_moved_elsewhere(
    here: Container, there: Container, listener: Listener, tenant: str
) -> None:
    since = listener.generation(CONFIG_CHANNEL, (tenant,))
    first = publish(there, tenant, "agent-a")
    wait_for_notice(listener, tenant, since)  # else its NOTIFY may drop the first entry
    resolve = here.releases.resolve
    assert drive(resolve(tenant, "wf", alias="latest", release_id=None)).release_id == first
    reads = here.store.reads
    assert drive(resolve(tenant, "wf", alias="latest", release_id=None)).release_id == first
    assert here.store.reads == reads  # cached: no round trip

    since = listener.generation(CONFIG_CHANNEL, (tenant,))
    second = publish(there, tenant, "agent-b")  # another process moves the alias
    wait_for_notice(listener, tenant, since)
    assert second != first
    assert drive(resolve(tenant, "wf", alias="latest", release_id=None)).release_id == second


def test_the_current_policy_is_read_again_after_a_new_revision(
    here: Container, there: Container, listener: Listener, tenant: str
) -> None:
    current = here.policies.current
    builtin = drive(current(tenant))
    reads = here.store.reads
    assert drive(current(tenant)) == builtin
    assert here.store.reads == reads

    since = listener.generation(CONFIG_CHANNEL, (tenant,))
    doc = PolicyDocument(
        "default", "0", approval_required_for=frozenset({SideEffectClass.SHARED_WRITE})
    )
    published = there.policies.publish(tenant, doc, ManualClock().now())
    wait_for_notice(listener, tenant, since)
    assert drive(current(tenant)).revision == published.revision != builtin.revision


def test_without_a_listening_connection_nothing_is_cached(there: Container, tenant: str) -> None:
    publish(there, tenant, "agent-a")
    reads = there.store.reads
    for _ in range(2):
        drive(there.releases.resolve(tenant, "wf", alias="latest", release_id=None))
        drive(there.policies.current(tenant))
    # the alias and the policy read each time; the (immutable) release by id only once
    assert there.store.reads == reads + 2 + 2 + 1


def test_a_change_made_by_this_process_is_seen_at_once(here: Container, tenant: str) -> None:
    """The publishing process forgets its own entries before the NOTIFY even arrives."""
    first = publish(here, tenant, "agent-a")
    assert (
        drive(here.releases.resolve(tenant, "wf", alias="latest", release_id=None)).release_id
        == first
    )
    second = publish(here, tenant, "agent-b")
    assert (
        drive(here.releases.resolve(tenant, "wf", alias="latest", release_id=None)).release_id
        == second
    )
