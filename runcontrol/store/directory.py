"""The directory of virtual shards, as a process caches it (issue 41; docs/sharding.md).

Two tables in the first database say where things are: ``vshards`` (each virtual shard's
database, by its position in ``RUNCONTROL_SHARDS__DATABASES``) and ``tenant_placement`` (a
tenant's virtual shard, where one is set; else ``shards.hashed_vshard``). A process loads both
once and answers from memory (a command is never routed by a query); ``directory_version``,
bumped in the transaction of any change, which also NOTIFYs ``runcontrol_directory``, says when
to load them again: ``refresh`` is that check, one small read.

``store/shards.Shards`` routes by it (with one database, it is not read). A shard's move
(``store/move.py``) marks it ``moving``, then flips its database, here too."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from uuid import UUID

from sqlalchemy import Connection, Engine, select, text, update
from sqlalchemy.dialects.postgresql import insert

from ..domain import errors, shards
from .tables import directory_version, tenant_placement, vshards

CHANNEL = "runcontrol_directory"  # NOTIFYed, with the new version, by every change
FIRST_DATABASE = 0  # where the directory is, and every row stored before shards (LEGACY ids)
SERVING, MOVING = "serving", "moving"  # a virtual shard's states (``vshards.state``)
MOVING_RETRY_AFTER_S = 5  # what a submission refused while its shard moves is told to wait


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The directory at one version."""

    version: int
    databases: tuple[int, ...]  # a virtual shard's database, by the shard's number
    placement: Mapping[str, int]  # tenant -> its virtual shard, where placed
    moving: frozenset[int] = frozenset()  # the virtual shards being moved (state ``moving``)


class Directory:
    """The directory cached in this process. ``engine``: the first database's system engine
    (the placements of every tenant; the system role bypasses row-level security)."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._snapshot = self._load()

    @property
    def version(self) -> int:
        return self._snapshot.version

    def database_for(self, vshard: int) -> int:
        """The database (its position in the configured list) virtual shard ``vshard`` is on;
        ``shards.LEGACY`` (an id minted before shards): the first."""
        if vshard == shards.LEGACY:
            return FIRST_DATABASE
        return self._snapshot.databases[vshard]

    def database_of(self, id_: UUID) -> int:
        """The database the run (or entity of a run) ``id_`` is stored in, from its id alone."""
        return self.database_for(shards.vshard_of(id_))

    def vshard_for(self, tenant_id: str) -> int:
        """The virtual shard a new run of ``tenant_id`` is minted in: its placement, else the
        hash of its id (``ids.new_run_id`` takes this as its ``placement``)."""
        placed = self._snapshot.placement.get(tenant_id)
        return shards.hashed_vshard(tenant_id) if placed is None else placed

    def state_of(self, vshard: int) -> str:
        """``serving``, or ``moving`` while a move has it (docs/sharding.md)."""
        return MOVING if vshard in self._snapshot.moving else SERVING

    def placement(self, tenant_id: str) -> int:
        """The virtual shard a new run of ``tenant_id`` is minted in (``vshard_for``), as the
        edge takes it for a submission (``ids.new_run_id``'s ``placement``): while that shard
        moves, ``ShardMoving`` (503 with ``Retry-After``; nothing was stored, send it again)."""
        vshard = self.vshard_for(tenant_id)
        if vshard in self._snapshot.moving:
            raise errors.ShardMoving(
                f"tenant {tenant_id}'s virtual shard {vshard} is moving to another database: "
                f"send it again in {MOVING_RETRY_AFTER_S} s",
                retry_after=MOVING_RETRY_AFTER_S,
            )
        return vshard

    def refresh(self) -> bool:
        """Load the directory again if its version changed (on a NOTIFY of ``CHANNEL``, or
        periodically); whether it did."""
        with self._engine.connect() as conn:
            current = _version(conn)
        if current == self._snapshot.version:
            return False
        self._snapshot = self._load()
        return True

    def place(self, tenant_id: str, vshard: int) -> None:
        """Place ``tenant_id`` on virtual shard ``vshard`` (its runs minted from now on are
        there). Only for a tenant with no rows yet: moving one with rows is a move's
        (``store/move.py``)."""
        if not 0 <= vshard < shards.VSHARDS:
            raise ValueError(f"a virtual shard is 0 to {shards.VSHARDS - 1}, not {vshard}")
        row = {"tenant_id": tenant_id, "vshard": vshard}
        upsert = insert(tenant_placement).values(row)
        with self._engine.begin() as conn:
            conn.execute(upsert.on_conflict_do_update(index_elements=["tenant_id"], set_=row))
            _bump(conn)
        self.refresh()

    def _load(self) -> Snapshot:
        # The version first: a change committed between the reads leaves newer rows under an
        # older version, which the next refresh loads again (never older rows under a newer).
        with self._engine.connect() as conn:
            version = _version(conn)
            databases = dict(conn.execute(select(vshards.c.vshard, vshards.c.database)).all())
            moving = conn.execute(select(vshards.c.vshard).where(vshards.c.state == MOVING))
            moving_now = frozenset(moving.scalars())
            placed = select(tenant_placement.c.tenant_id, tenant_placement.c.vshard)
            placement = dict(conn.execute(placed).all())
        if sorted(databases) != list(range(shards.VSHARDS)):
            raise RuntimeError(
                f"the directory has {len(databases)} virtual shards, not 0 to "
                f"{shards.VSHARDS - 1}: is the first database migrated (0031)?"
            )
        ordered = tuple(databases[v] for v in range(shards.VSHARDS))
        return Snapshot(version, ordered, placement, moving_now)


def _version(conn: Connection) -> int:
    return int(conn.execute(select(directory_version.c.version)).scalar_one())


def _bump(conn: Connection) -> None:
    """In the transaction of a change: a new version, announced when it commits."""
    bumped = update(directory_version).values(version=directory_version.c.version + 1)
    version = conn.execute(bumped.returning(directory_version.c.version)).scalar_one()
    conn.execute(
        text("SELECT pg_notify(:channel, :version)"), {"channel": CHANNEL, "version": str(version)}
    )


def spread(engine: Engine, count: int) -> bool:
    """Put virtual shard ``v`` on database ``v % count``: for a new deployment of ``count``
    databases, while nothing is stored (``runcontrol up --shards``). Only while every virtual
    shard is still on the first database (the seed) and the first holds no run, release or
    policy: a shard with rows moves with them (``runcontrol shards move``), never by this.
    Whether it spread them."""
    with engine.begin() as conn:
        conn.execute(text("LOCK TABLE vshards IN EXCLUSIVE MODE"))
        seeded = conn.execute(text("SELECT bool_and(database = 0) FROM vshards")).scalar_one()
        stored = conn.execute(
            text(
                "SELECT EXISTS (SELECT 1 FROM runs) OR EXISTS (SELECT 1 FROM releases)"
                " OR EXISTS (SELECT 1 FROM policies)"
            )
        ).scalar_one()
        if not seeded or stored or count < 2:
            return False
        conn.execute(
            update(vshards).values(database=vshards.c.vshard % count, epoch=vshards.c.epoch + 1)
        )
        _bump(conn)
    return True


bump = _bump  # a shard's move changes the directory too (store/move.py)
