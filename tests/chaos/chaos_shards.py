"""The chaos run on two databases (issue 41; docs/sharding.md, docs/reliability.md): which
tenants, where; a tenant moved to the other database while its runs are in flight; and the
checks per tenant on the database that holds it, with nothing of one tenant in a database that
does not serve it.

The tenants (``choose_tenants``): one on the first database, one on the second, and (with a
move) a third on the first, on a virtual shard of its own, moved to the second mid-run
(``TenantMove``). The virtual shards are spread before anything is stored, as ``runcontrol up
--shards 2`` spreads them (shard ``v`` on database ``v % 2``), and a tenant is picked by where
its id hashes.

The move is ``runcontrol shards move``'s own (``cli/shards.databases`` and ``store/move.Mover``,
against the live databases, while faults strike): from its mark on, the tenant's submissions are
answered 503 (the driver sends them again) and the reviewer leaves its approvals pending, so its
runs park at the approval gate and stay in flight through the move (a run whose rows keep
changing would hold the move at ``quiescing``). A move that stops (a database crashed under it)
is resumed from its journal until it is done; then the reviewer decides the parked runs'
approvals, which the directory now routes to the second database, where they complete. Once in
every run the target crashes right after the fence committed (``CRASH_AFTER``): the copy fails,
the move stops, and is resumed once the server is back.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from chaos_checks import TERMINAL, check
from sqlalchemy import Engine, text

from runcontrol.config import Settings, ShardOptions
from runcontrol.domain.moves import ENDED, Step
from runcontrol.domain.shards import hashed_vshard

if TYPE_CHECKING:
    from chaos import Chaos

# Tenant tables whose rows may stay in a database that no longer serves the tenant: the
# directory's placements (only the first database's are read) and a move's fences.
KEPT = frozenset({"tenant_placement", "shard_fences"})
CRASH_AFTER = Step.FENCING  # the step after which the move's target crashes, once
CRASH_OUTAGE_S = 2.0
TENANT_TABLES = (
    "SELECT c.table_name FROM information_schema.columns c JOIN information_schema.tables t "
    "USING (table_schema, table_name) WHERE c.table_schema = 'public' "
    "AND c.column_name = 'tenant_id' AND t.table_type = 'BASE TABLE' ORDER BY 1"
)


def shard_settings(urls: Sequence[str]) -> Settings:
    """The settings of one database, or of the listed ones (``RUNCONTROL_SHARDS__DATABASES``)."""
    if len(urls) == 1:
        return Settings()
    return Settings(shards=ShardOptions(databases=list(urls)))


def choose_tenants(databases: int, move: bool) -> dict[str, int]:
    """Fresh tenants and the database each is on once the shards are spread: one per database,
    and with ``move`` one more on the first (to be moved), each on a virtual shard of its own."""

    def fresh() -> str:
        return f"chaos-{uuid.uuid4().hex[:8]}"

    if databases == 1:
        return {fresh(): 0}
    found: dict[str, int] = {}
    for database in (*range(databases), *((0,) if move else ())):
        while True:
            tenant = fresh()
            vshard = hashed_vshard(tenant)
            if vshard % databases == database and vshard not in map(hashed_vshard, found):
                found[tenant] = database
                break
    return found


class TenantMove:
    """``runcontrol shards move --tenant T --to DB`` mid-run (see the module's text)."""

    def __init__(self, chaos: Chaos, tenant: str, target: int, *, at: float = 0.4) -> None:
        self.chaos = chaos
        self.tenant = tenant
        self.source = chaos.home[tenant]
        self.target = target
        self.vshard = hashed_vshard(tenant)
        self.at = at  # the share of the submissions made when it starts
        self.deadline_s = chaos.options.recover_timeout_s * 2
        self.started_at_s: float | None = None
        self.took_s: float | None = None
        self.steps: list[dict[str, Any]] = []  # each step as it finished, seconds in
        self.stops: list[dict[str, Any]] = []  # the move stopped (then resumed): why
        self.unfinished_at_start: int | None = None
        self.in_flight_moved: int | None = None  # unfinished runs copied to the target
        self.crashed: dict[str, Any] | None = None  # the target's crash during the move
        self.done = False
        self._began = 0.0

    async def drive(self) -> None:
        chaos = self.chaos
        while chaos.submitted < int(chaos.options.runs * self.at):
            await asyncio.sleep(0.1)
        chaos.held.add(self.tenant)
        self.started_at_s = chaos._now()
        chaos.say(f"moving tenant {self.tenant} (shard {self.vshard}) to database {self.target}")
        try:
            await asyncio.to_thread(self._move)
        finally:
            chaos.held.discard(self.tenant)
        chaos.say(f"move: done={self.done} in {self.took_s}s, steps {self.steps}")

    def _move(self) -> None:
        from runcontrol.cli.shards import databases
        from runcontrol.store.move import Mover

        self._began = time.monotonic()
        with contextlib.suppress(Exception):
            self.unfinished_at_start = self._unfinished(self.source)
        while not self.done:
            mover = None
            try:
                mover = Mover(databases(shard_settings(self.chaos.urls)), hook=self._step)
                mine = [m for m in mover.moves(100) if m.vshard == self.vshard]
                if mine and mine[0].step is Step.DONE:
                    self.done = True  # it ended, its answer lost with a database
                elif mine and mine[0].step not in ENDED:
                    self.done = mover.resume(mine[0].move_id).step is Step.DONE
                else:
                    self.done = mover.start(self.vshard, self.target).step is Step.DONE
            except Exception as exc:  # a database crashed under it: resumed from its journal
                self.stops.append({"at_s": self._since(), "error": repr(exc)[:300]})
                if time.monotonic() - self._began > self.deadline_s:
                    break
                time.sleep(2.0)
            finally:
                if mover is not None:
                    mover.close()
                    for db in mover.databases:
                        db.dispose()
        self.took_s = self._since()
        if self.done:
            self.chaos.home[self.tenant] = self.target

    def _step(self, step: Step) -> None:
        self.steps.append({"step": step.value, "s": self._since()})
        if step is CRASH_AFTER and self.crashed is None:
            pg = self.chaos.pgs[self.target]
            pg.outage.acquire()  # not while a fault has it down
            pg.crash()  # the next step's connection fails: the move stops, to be resumed
            self.crashed = {"database": self.target, "after": step.value, "at_s": self._since()}
            threading.Timer(CRASH_OUTAGE_S, self._restart, (pg,)).start()
        if step is Step.COPYING:
            with contextlib.suppress(Exception):
                self.in_flight_moved = self._unfinished(self.target)

    def _restart(self, pg: Any) -> None:
        assert self.crashed is not None
        try:
            self.crashed["start_s"] = round(pg.start(), 2)
        finally:
            pg.outage.release()
        self.crashed["up_at_s"] = self._since()

    def _since(self) -> float:
        return round(time.monotonic() - self._began, 2)

    def _unfinished(self, database: int) -> int:
        with self.chaos.owners[database].connect() as conn:
            found = conn.execute(
                text("SELECT count(*) FROM runs WHERE tenant_id = :t AND NOT state = ANY(:done)"),
                {"t": self.tenant, "done": list(TERMINAL)},
            )
            return int(found.scalar_one())

    def report(self) -> dict[str, Any]:
        return {
            "tenant": self.tenant,
            "vshard": self.vshard,
            "from": self.source,
            "to": self.target,
            "done": self.done,
            "started_at_s": self.started_at_s,
            "took_s": self.took_s,
            "steps": self.steps,
            "stops": self.stops,
            "runs_unfinished_at_start": self.unfinished_at_start,
            "runs_in_flight_moved": self.in_flight_moved,
            "target_crashed": self.crashed,
            "submissions_answered_503": self.chaos.tally.submit_unavailable.get(self.tenant, 0),
        }


def checked(chaos: Chaos) -> dict[str, Any]:
    """``check`` per tenant on the database that holds it, merged (lists joined, counts
    added), with each tenant's figures, and the rows of a tenant found in a database that does
    not serve it (``rows_outside_home``) or runs the directory routes elsewhere
    (``misrouted_runs``)."""
    per = {
        t: check(chaos.home_of(t), t, chaos.accepted_of(t), chaos.refusals) for t in chaos.tenants
    }
    merged: dict[str, Any] = {}
    for found in per.values():
        for key, value in found.items():
            if isinstance(value, list):
                merged[key] = [*merged.get(key, []), *value]
            elif isinstance(value, dict):
                into = merged.setdefault(key, {})
                for k, n in value.items():
                    into[k] = into.get(k, 0) + n
            else:
                merged[key] = merged.get(key, 0) + value
    merged["per_tenant"] = {
        t: {
            "database": chaos.home[t],
            **{k: v for k, v in found.items() if isinstance(v, int)},
            **{k: len(found[k]) for k in ("lost", "double_outcomes", "event_gaps", "uncertain")},
        }
        for t, found in per.items()
    }
    merged["rows_outside_home"], merged["tenant_tables_read"] = rows_outside_home(
        chaos.owners, chaos.home
    )
    merged["misrouted_runs"] = misrouted_runs(chaos.owners, chaos.home)
    return merged


def rows_outside_home(
    owners: Sequence[Engine], home: dict[str, int]
) -> tuple[list[dict[str, Any]], list[int]]:
    """Every tenant table's rows in a database other than the one its tenant is on (or of a
    tenant the run does not know), but for those that stay (``KEPT``); and how many tables
    were read in each database."""
    found = []
    read = []
    for database, owner in enumerate(owners):
        with owner.connect() as conn:
            tables = [t for (t,) in conn.execute(text(TENANT_TABLES)) if t not in KEPT]
            read.append(len(tables))
            for table in tables:
                counts = conn.execute(text(f"SELECT tenant_id, count(*) FROM {table} GROUP BY 1"))
                for tenant, n in counts:
                    if tenant is not None and home.get(tenant) != database:
                        found.append(
                            {"database": database, "table": table, "tenant": tenant, "rows": n}
                        )
    return found, read


def misrouted_runs(owners: Sequence[Engine], home: dict[str, int]) -> list[str]:
    """The runs whose id the directory routes to another database than the one holding them."""
    from runcontrol.store.directory import Directory

    directory = Directory(owners[0])
    found = []
    for database, owner in enumerate(owners):
        with owner.connect() as conn:
            for run_id, tenant in conn.execute(text("SELECT run_id, tenant_id FROM runs")):
                if home.get(tenant) == database and directory.database_of(run_id) != database:
                    found.append(str(run_id))
    return found
