"""New ids for runs and their entities, each carrying its run's virtual shard
(``domain/shards.py``; docs/sharding.md): the time and the random bits the pure rules take."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from datetime import datetime
from uuid import UUID

from .domain import shards

# A tenant's virtual shard. Without a directory it is the stable hash of its id; the
# directory's ``tenant_placement`` (``store/directory.Directory.vshard_for``) overrides it.
Placement = Callable[[str], int]


def new_run_id(tenant_id: str, placement: Placement = shards.hashed_vshard) -> UUID:
    """A new run's id, in its tenant's virtual shard."""
    return shards.mint(placement(tenant_id), time.time_ns() // 1_000_000, _rand())


def beside(run_id: UUID, now: datetime) -> UUID:
    """A new id for an entity of the run ``run_id`` (step, attempt, lease, approval, event,
    reservation ...), in the run's virtual shard; ``now``: the command's time."""
    return shards.beside(run_id, int(now.timestamp() * 1000), _rand())


def _rand() -> int:
    return secrets.randbits(128)
