"""Moving a virtual shard to another database with its runs in flight (issue 41, point 5;
docs/sharding.md "Moving a tenant", docs/write-path.md section 7).

The steps and their order are ``domain/moves.py``'s. Each move is a ``vshard_moves`` row in the
directory's database (the first), holding the next step to run: a step's effect commits, then
the journal records the step after it, so a crash between the two runs that step again, and
every step may run again (the copy removes any earlier copy first, the flip and the fences are
checked before they are written). ``resume_move`` takes a move on from its journal; one process
at a time runs a move (an advisory lock per shard, held while it runs).

The databases are given by their position in ``RUNCONTROL_SHARDS__DATABASES`` (the directory's
``vshards.database``), first the directory's; a move is run as their owner, as migrations are.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID, uuid4

from sqlalchemy import Connection, Engine, create_engine, func, select, text, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.pool import NullPool

from ..domain import moves, shards
from ..domain.moves import Step
from . import move_rows
from .database import Database
from .directory import MOVING, SERVING, bump
from .tables import vshard_moves, vshards

_MOVE_LOCK = 72616042  # one process runs a shard's move, with the shard
QUIET_S = 2.0  # nothing of the shard's tenants changed for this long: quiescent
QUIESCE_TIMEOUT_S = 60.0
FENCE_LOCK_TIMEOUT = "30s"  # how long the fence waits for the documents in flight

Hook = Callable[[Step], None]  # after a step's effect, before its journal entry (tests: a crash)


class MoveError(Exception):
    """A move could not start or go on; its journal says where it stopped and why."""


@dataclass(frozen=True, slots=True)
class Move:
    """A ``vshard_moves`` row."""

    move_id: UUID
    vshard: int
    source: int
    target: int
    step: Step
    tenants: tuple[str, ...]
    started_at: datetime
    updated_at: datetime
    error: str | None


class Mover:
    """Moves between ``databases`` (by position; the first holds the directory)."""

    def __init__(
        self,
        databases: Sequence[Database],
        *,
        quiet_s: float = QUIET_S,
        quiesce_timeout_s: float = QUIESCE_TIMEOUT_S,
        hook: Hook | None = None,
    ) -> None:
        if not databases:
            raise ValueError("a move needs the shard databases, the directory's first")
        self.databases = tuple(databases)
        self.quiet_s = quiet_s
        self.quiesce_timeout_s = quiesce_timeout_s
        self.hook = hook
        self._owners: dict[int, Engine] = {}

    # ------------------------------------------------------------------ the operations

    def start(self, vshard: int, target: int) -> Move:
        """Journal a move of ``vshard`` to database ``target`` and run it (``MoveError`` if it
        stops; its journal then says why, and ``resume`` takes it on)."""
        if not 0 <= vshard < shards.VSHARDS:
            raise MoveError(f"a virtual shard is 0 to {shards.VSHARDS - 1}, not {vshard}")
        if not 0 <= target < len(self.databases):
            raise MoveError(
                f"database {target} is not configured (RUNCONTROL_SHARDS__DATABASES lists "
                f"{len(self.databases)}: 0 to {len(self.databases) - 1})"
            )
        with self._directory().begin() as conn:
            source = self._on(vshard, conn)
            if source == target:
                raise MoveError(f"virtual shard {vshard} is on database {target} already")
            move_id = uuid4()
            row = {"move_id": move_id, "vshard": vshard, "source": source, "target": target}
            added = conn.execute(
                insert(vshard_moves)
                .values(**row, step=Step.MARKING.value, started_at=_NOW, updated_at=_NOW)
                .on_conflict_do_nothing()
            )
            if added.rowcount == 0:
                open_move = self._open_move(conn, vshard)
                raise MoveError(
                    f"virtual shard {vshard} has an open move {open_move}: resume or abort it"
                )
        return self.resume(move_id)

    def resume(self, move_id: UUID) -> Move:
        """Run the move from the step its journal names to its end."""
        with self._running(self.get(move_id).vshard):
            move = self.get(move_id)
            while move.step not in moves.ENDED:
                try:
                    tenants = self._run(move)
                except Exception as exc:  # recorded, then raised as the move's error
                    self._journal(move, move.step, error=f"{type(exc).__name__}: {exc}")
                    raise MoveError(f"move {move_id} stopped at {move.step.value}: {exc}") from exc
                if self.hook is not None:
                    self.hook(move.step)
                move = self._journal(move, moves.after(move.step), tenants=tenants)
        return move

    def abort(self, move_id: UUID) -> Move:
        """Give up a move that has not flipped: the target's copy removed, the fences lifted,
        the shard serving on the source again."""
        with self._running(self.get(move_id).vshard):
            move = self.get(move_id)
            if not moves.may_abort(move.step):
                raise MoveError(
                    f"move {move_id} is {move.step.value}: past its flip it can only be resumed"
                )
            if self._on(move.vshard) != move.source:  # a flip whose journal entry was lost
                raise MoveError(f"move {move_id} has flipped: it can only be resumed")
            reached = moves.ORDER.index(move.step)
            if reached >= moves.ORDER.index(Step.COPYING):  # a copy, whole or not: removed
                with self._owner(move.target).begin() as conn:
                    move_rows.discard(conn, move.tenants)
            if reached >= moves.ORDER.index(Step.FENCING):  # (maybe not journaled yet)
                tenants = move.tenants or tuple(self._tenants(move))
                with self._owner(move.source).begin() as conn:
                    move_rows.unfence(conn, tenants, to=move.target)
            with self._directory().begin() as conn:
                conn.execute(_set_state(move.vshard, SERVING, database=move.source))
                bump(conn)
            return self._journal(move, Step.ABORTED, error=move.error)

    def get(self, move_id: UUID) -> Move:
        with self._directory().connect() as conn:
            row = conn.execute(select(vshard_moves).where(vshard_moves.c.move_id == move_id))
            found = row.mappings().one_or_none()
        if found is None:
            raise MoveError(f"no move {move_id}")
        return _move(found)

    def moves(self, limit: int = 20) -> list[Move]:
        """The open moves, then the latest ended ones."""
        is_open = vshard_moves.c.step.notin_([s.value for s in moves.ENDED])
        query = select(vshard_moves).order_by(is_open.desc(), vshard_moves.c.updated_at.desc())
        with self._directory().connect() as conn:
            return [_move(r) for r in conn.execute(query.limit(limit)).mappings()]

    def close(self) -> None:
        for engine in self._owners.values():
            engine.dispose()
        self._owners.clear()

    # ------------------------------------------------------------------ the steps

    def _run(self, move: Move) -> tuple[str, ...] | None:
        """Run ``move.step``; the tenants it fenced (the fence step), else None."""
        if move.step is Step.MARKING:
            with self._directory().begin() as conn:
                marked = conn.execute(_set_state(move.vshard, MOVING, database=move.source))
                if marked.rowcount != 1:
                    raise MoveError(f"virtual shard {move.vshard} is not on {move.source}")
                bump(conn)
        elif move.step is Step.QUIESCING:
            self._quiesce(move)
        elif move.step is Step.FENCING:
            return self._fence(move)
        elif move.step is Step.COPYING:
            with self._owner(move.target).begin() as conn:
                move_rows.discard(conn, move.tenants)  # an earlier copy, left by a crash
                move_rows.copy(self._system(move.source), conn, move.tenants)
        elif move.step is Step.VERIFYING:
            late = set(self._tenants(move)) - set(move.tenants)
            if late:
                raise MoveError(f"tenants came to the shard during the move: {sorted(late)}")
            source, target = self._system(move.source), self._system(move.target)
            move_rows.verify(source, target, move.tenants)
        elif move.step is Step.FLIPPING:
            self._flip(move)
        elif move.step is Step.RESUMING:
            with self._owner(move.target).begin() as conn:  # fences of an earlier move away
                move_rows.unfence(conn, move.tenants)
            with self._directory().begin() as conn:
                conn.execute(_set_state(move.vshard, SERVING, database=move.target))
                bump(conn)
        elif move.step is Step.CLEANING:
            with self._owner(move.source).begin() as conn:
                move_rows.discard(conn, move.tenants)
        return None

    def _quiesce(self, move: Move) -> None:
        """Until none of the shard's tenants' rows changed for ``quiet_s`` (the hosts hold its
        commands, workers keep their leases); ``MoveError`` past ``quiesce_timeout_s``."""
        tenants = self._tenants(move)
        source = self._system(move.source)
        started = time.monotonic()
        samples: list[tuple[float, object]] = []
        interval = min(0.25, self.quiet_s / 4) or 0.01
        while True:
            samples.append((time.monotonic(), move_rows.fingerprint(source, tenants)))
            if moves.quiet(samples, self.quiet_s):
                return
            if time.monotonic() - started > self.quiesce_timeout_s:
                raise MoveError(
                    f"virtual shard {move.vshard}'s rows kept changing for "
                    f"{self.quiesce_timeout_s:g} s (no {self.quiet_s:g} s without a commit): "
                    "are its commands still sent to an old host?"
                )
            time.sleep(interval)

    def _fence(self, move: Move) -> tuple[str, ...]:
        """A fence row per tenant in the source: once it commits no document of theirs commits
        there (``runcontrol_check_fence``); it waits for those in flight."""
        tenants = tuple(self._tenants(move))
        with self._directory().connect() as conn:
            epoch = conn.execute(
                select(vshards.c.epoch).where(vshards.c.vshard == move.vshard)
            ).scalar_one()
        with self._owner(move.source).begin() as conn:
            conn.execute(text(f"SET LOCAL lock_timeout = '{FENCE_LOCK_TIMEOUT}'"))
            move_rows.fence(conn, tenants, vshard=move.vshard, to=move.target, epoch=epoch + 1)
        return tenants

    def _on(self, vshard: int, conn: Connection | None = None) -> int:
        """The database the directory names for ``vshard`` (in ``conn``: locked)."""
        query = select(vshards.c.database).where(vshards.c.vshard == vshard)
        if conn is not None:
            found: int = conn.execute(query.with_for_update()).scalar_one()
            return found
        with self._directory().connect() as own:
            found = own.execute(query).scalar_one()
        return found

    def _flip(self, move: Move) -> None:
        """The directory names the target, the epoch bumped (once: a flip run again finds it)."""
        with self._directory().begin() as conn:
            now_on = self._on(move.vshard, conn)
            if now_on == move.target:
                return
            if now_on != move.source:
                raise MoveError(f"virtual shard {move.vshard} is on {now_on}, not {move.source}")
            conn.execute(
                update(vshards)
                .where(vshards.c.vshard == move.vshard)
                .values(database=move.target, epoch=vshards.c.epoch + 1)
            )
            bump(conn)

    # ------------------------------------------------------------------ the journal

    def _journal(
        self,
        move: Move,
        step: Step,
        *,
        tenants: tuple[str, ...] | None = None,
        error: str | None = None,
    ) -> Move:
        values: dict[str, Any] = {"step": step.value, "updated_at": _NOW, "error": error}
        if tenants is not None:
            values["tenants"] = list(tenants)
        with self._directory().begin() as conn:
            written = conn.execute(
                update(vshard_moves)
                .where(vshard_moves.c.move_id == move.move_id, vshard_moves.c.step == move.step)
                .values(**values)
            )
            if written.rowcount != 1:
                raise MoveError(f"move {move.move_id} went on elsewhere meanwhile")
        return self.get(move.move_id)

    def _open_move(self, conn: Connection, vshard: int) -> UUID | None:
        is_open = vshard_moves.c.step.notin_([s.value for s in moves.ENDED])
        query = select(vshard_moves.c.move_id).where(vshard_moves.c.vshard == vshard, is_open)
        found: UUID | None = conn.execute(query).scalar_one_or_none()
        return found

    @contextmanager
    def _running(self, vshard: int) -> Iterator[None]:
        """This process alone runs the shard's move while it holds this (a session lock)."""
        with self._directory().connect() as conn:
            taken = conn.execute(
                text("SELECT pg_try_advisory_lock(:lock, :vshard)"),
                {"lock": _MOVE_LOCK, "vshard": vshard},
            ).scalar_one()
            conn.commit()  # the lock is the session's: no transaction held open meanwhile
            if not taken:
                raise MoveError(f"virtual shard {vshard}'s move is running in another process")
            try:
                yield
            finally:
                conn.execute(
                    text("SELECT pg_advisory_unlock(:lock, :vshard)"),
                    {"lock": _MOVE_LOCK, "vshard": vshard},
                )
                conn.commit()

    # ------------------------------------------------------------------ connections

    def _tenants(self, move: Move) -> list[str]:
        return move_rows.tenants_on(self._system(0), self._system(move.source), move.vshard)

    def _database(self, position: int) -> Database:
        if not 0 <= position < len(self.databases):
            raise MoveError(f"database {position} is not configured")
        return self.databases[position]

    def _system(self, position: int) -> Engine:
        return self._database(position).system

    def _owner(self, position: int) -> Engine:
        if position not in self._owners:
            url = self._database(position).owner_url
            self._owners[position] = create_engine(url, poolclass=NullPool)
        return self._owners[position]

    def _directory(self) -> Engine:
        return self._owner(0)


_NOW = func.now()


def _set_state(vshard: int, state: str, *, database: int) -> Any:
    return (
        update(vshards)
        .where(vshards.c.vshard == vshard, vshards.c.database == database)
        .values(state=state)
    )


def _move(row: Any) -> Move:
    return Move(
        move_id=row["move_id"],
        vshard=row["vshard"],
        source=row["source"],
        target=row["target"],
        step=Step(row["step"]),
        tenants=tuple(row["tenants"] or ()),
        started_at=row["started_at"],
        updated_at=row["updated_at"],
        error=row["error"],
    )


def move_vshard(databases: Sequence[Database], vshard: int, target: int, **options: Any) -> Move:
    """Move virtual shard ``vshard`` (its tenants' rows) to database ``target``."""
    mover = Mover(databases, **options)
    try:
        return mover.start(vshard, target)
    finally:
        mover.close()


def resume_move(databases: Sequence[Database], move_id: UUID, **options: Any) -> Move:
    """Take move ``move_id`` on from the step its journal names."""
    mover = Mover(databases, **options)
    try:
        return mover.resume(move_id)
    finally:
        mover.close()
