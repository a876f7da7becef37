"""One event row for the outbox and the journal (issue 42, migration 0033; docs/write-path.md
section 7): a document's journal entries are carried by its last event (``outbox.journal``),
and ``recovery_journal`` is a view of them and of the entries written before 0033. The rules:
the entries travel on the document's last event and nowhere else; a previous release's document
(its entries apart) is stored alike; entries without an event are refused with nothing stored
(invariant 3); and the upgrade keeps the stored journal whole, readable through the view.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest
from sqlalchemy import create_engine
from support import drive
from test_schema_source import Prepared, everything, stored_template

from runcontrol import reconcilers
from runcontrol.config import Settings
from runcontrol.domain.run.changes import Changes
from runcontrol.store import Database, Store, rows
from runcontrol.store import webhooks as feed
from runcontrol.store.commit import conclude, prepare

JOURNAL = (
    "SELECT sequence, entity, entity_id, from_state, to_state, cause, actor, occurred_at"
    " FROM recovery_journal WHERE run_id = %s ORDER BY sequence"
)


def previous_release(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` as the release before 0033 sends it: its journal entries apart, whole rows."""
    carried = doc["outbox"][-1].pop("journal")
    run_id = doc["outbox"][-1]["run_id"]
    doc["journal"] = [{"tenant_id": doc["tenant"], "run_id": run_id, **e} for e in carried]
    return doc


@pytest.fixture
def store(db: Database) -> Iterator[Store]:
    found = Store(db.app_url, size=1)
    yield found
    drive(found.close())


def send(store: Store, doc: dict[str, Any]) -> Any:
    (answer,) = drive(store.send([orjson.dumps(doc).decode()]))
    return answer


def expected_journal(changes: Changes) -> list[tuple[Any, ...]]:
    return [
        (
            j.sequence,
            j.entity,
            j.entity_id,
            j.from_state,
            j.to_state,
            j.cause,
            j.actor,
            j.occurred_at,
        )
        for j in changes.journal
    ]


@pytest.mark.parametrize("release", ("this", "previous"))
def test_a_documents_journal_entries_are_carried_by_its_last_event(db, store, tenant, release):
    changes = everything(tenant)
    stored_template(db, tenant, changes)
    (event,) = changes.events  # and one before it: the entries go on the last
    changes.events.insert(0, dataclasses.replace(event, event_id=uuid.uuid4(), seq=event.seq - 1))
    assert changes.journal
    pending = prepare(tenant, Prepared(changes), Settings().options())
    assert pending is not None
    doc = orjson.loads(pending.doc)
    assert "journal" not in doc and all("journal" not in e for e in doc["outbox"][:-1])
    entries = orjson.loads(orjson.dumps(rows.journal_entries(changes.journal)))
    assert doc["outbox"][-1]["journal"] == entries
    conclude(pending, send(store, previous_release(doc) if release == "previous" else doc))

    run_id = changes.run.run_id
    with db.tenant(tenant) as conn:
        carried = conn.exec_driver_sql(
            "SELECT seq, journal FROM outbox WHERE run_id = %s ORDER BY seq", (run_id,)
        ).all()
        journal = [tuple(r) for r in conn.exec_driver_sql(JOURNAL, (run_id,))]
    assert [j is not None for _, j in carried] == [False] * (len(carried) - 1) + [True]
    assert carried[-1][1] == entries
    assert journal == expected_journal(changes)


def test_journal_entries_without_their_event_are_refused_and_nothing_is_stored(db, store, tenant):
    for release in ("this", "previous"):
        changes = everything(tenant)
        pending = prepare(tenant, Prepared(changes), Settings().options())
        assert pending is not None
        doc = orjson.loads(pending.doc)
        if release == "previous":
            doc = previous_release(doc)
        else:  # what prepare sends for a transition that recorded no event
            doc["journal"] = [rows.to_row(j) for j in changes.journal]
        del doc["outbox"]
        answer = send(store, doc)
        assert answer is not None and answer[0] == "23514", answer
        assert "a journal entry without its event" in answer[1]
        with db.tenant(tenant) as conn:
            stored = conn.exec_driver_sql(
                "SELECT count(*) FROM runs WHERE run_id = %s", (changes.run.run_id,)
            ).scalar_one()
        assert stored == 0


# ---------------------------------------------------------------------- the upgrade


def test_the_upgrade_keeps_the_stored_journal_readable_and_its_retention(fresh_url, tenant):
    """A database at 0032 with a run's events (one published, with its feed row; one not yet)
    and journal entries as 0032 stored them: after 0033 the view reads the same entries, the
    published event holds its feed position and the other is published after it, nothing
    writes the old journal table or updates an event row as the app any more, and the
    journal's retention purges the old entries as before."""
    database = Database(fresh_url)
    owner = create_engine(fresh_url)
    run_id, when = uuid.uuid4(), datetime(1972, 1, 1, tzinfo=UTC)
    try:
        database.migrate("0032")
        with database.tenant(tenant) as conn:
            for seq, published in ((1, when), (2, None)):
                conn.exec_driver_sql(
                    "INSERT INTO outbox (event_id, tenant_id, project_id, run_id, seq, topic,"
                    " event_type, producer, schema_version, payload, occurred_at, published_at)"
                    " VALUES (%s, %s, 'p', %s, %s, 'run', 'RunStateChanged', 'test', 1,"
                    " '{\"n\": 1}', %s, %s)",
                    (uuid.uuid4(), tenant, run_id, seq, when, published),
                )
            for seq, state in ((1, "Accepted"), (2, "Running")):
                conn.exec_driver_sql(
                    "INSERT INTO recovery_journal (tenant_id, run_id, sequence, entity,"
                    " entity_id, from_state, to_state, cause, actor, occurred_at)"
                    " VALUES (%s, %s, %s, 'Run', %s, NULL, %s, 'c', 'alice', %s)",
                    (tenant, run_id, seq, run_id, state, when),
                )
            before = [tuple(r) for r in conn.exec_driver_sql(JOURNAL, (run_id,))]
        with database.system_tx() as conn:  # the published event's feed row, as 0032's relay
            position = conn.exec_driver_sql(
                "INSERT INTO event_feed (event_id, tenant_id, project_id, run_id, seq,"
                " published_at) SELECT event_id, tenant_id, project_id, run_id, seq, published_at"
                " FROM outbox WHERE run_id = %s AND seq = 1 RETURNING position",
                (run_id,),
            ).scalar_one()
        database.migrate()

        with database.tenant(tenant) as conn:
            assert [tuple(r) for r in conn.exec_driver_sql(JOURNAL, (run_id,))] == before
            events = conn.exec_driver_sql(
                "SELECT seq, payload, journal, feed_position FROM outbox"
                " WHERE run_id = %s ORDER BY seq",
                (run_id,),
            ).all()
        assert [tuple(e) for e in events] == [
            (1, {"n": 1}, None, position),
            (2, {"n": 1}, None, None),
        ]
        # the unpublished one is published after it, at the next position of the same counter
        assert reconcilers.relay_outbox(database, [], when).published == 1
        with database.tenant(tenant) as conn:
            fed = [(e["seq"], e["position"]) for e in feed.feed_after(conn, 0, 10)]
        assert fed == [(1, position), (2, position + 1)]
        with owner.connect() as conn:
            grants = conn.exec_driver_sql(
                "SELECT has_table_privilege('runcontrol_app', 'recovery_journal_legacy',"
                " 'INSERT'), has_table_privilege('runcontrol_app', 'outbox', 'UPDATE')"
            ).one()
        assert tuple(grants) == (False, False)
        with database.system_tx() as conn:
            removed = conn.exec_driver_sql(
                "SELECT runcontrol_purge_journal(%s)", (datetime(1973, 1, 1, tzinfo=UTC),)
            ).scalar_one()
        assert removed == 2
        with database.tenant(tenant) as conn:
            assert conn.exec_driver_sql(JOURNAL, (run_id,)).all() == []
    finally:
        owner.dispose()
        database.dispose()
