"""Ids that carry their virtual shard (issue 41; docs/write-path.md section 7, docs/sharding.md).

There are ``VSHARDS`` virtual shards, fixed at creation. Every id minted for a run and its
entities is a UUIDv7 (RFC 9562) whose 12 ``rand_a`` bits hold the virtual shard in their top
10::

    48 bits unix ms | ver 0111 | vshard (10) + 2 random | var 10 | 62 random (rand_b)

so any process routes a command by its id alone, and the 48-bit time prefix keeps B-tree
inserts at the index's right edge. Pure: the caller gives the time and the random bits.

**Legacy ids.** An id that is not a UUIDv7 (every id stored before this scheme: version 4; a
child run's before it, version 5) says nothing of a shard: ``vshard_of`` answers ``LEGACY``,
which the directory routes to the first database, where every such row was written. An entity
of a legacy run gets a legacy id too (``beside``, ``derive``), so a legacy run's rows route as
one. A real UUIDv7 minted elsewhere would be read as ours; no id of ours comes from elsewhere.

**A tenant's virtual shard** without a directory entry is ``hashed_vshard(tenant_id)``: a
stable hash (the first bytes of its SHA-256), the same in every process and release. The
directory's ``tenant_placement`` row, where there is one, overrides it."""

from __future__ import annotations

import hashlib
from uuid import UUID

VSHARDS = 1024  # fixed at creation: an id keeps its shard for ever
VSHARD_BITS = 10
# What ``vshard_of`` answers for an id minted before this scheme: not a virtual shard (an
# index of a VSHARDS-long table fails on it), routed to the first database.
LEGACY = VSHARDS

_VERSION = 7
_TIME_BITS = 48
_RAND_A_BITS = 12
_RAND_B_BITS = 62
_SPARE_A_BITS = _RAND_A_BITS - VSHARD_BITS  # rand_a's random bits below the shard
RAND_BITS = _SPARE_A_BITS + _RAND_B_BITS  # the random bits an id takes (64)
_MS_MAX = (1 << _TIME_BITS) - 1


def mint(vshard: int, now_ms: int, rand: int) -> UUID:
    """A UUIDv7 in virtual shard ``vshard``, at unix time ``now_ms`` (milliseconds), with the
    low ``RAND_BITS`` bits of ``rand`` as its random part."""
    if not 0 <= vshard < VSHARDS:
        raise ValueError(f"a virtual shard is 0 to {VSHARDS - 1}, not {vshard}")
    if not 0 <= now_ms <= _MS_MAX:
        raise ValueError(f"a UUIDv7 holds a unix time of 0 to {_MS_MAX} ms, not {now_ms}")
    spare = (rand >> _RAND_B_BITS) & ((1 << _SPARE_A_BITS) - 1)
    rand_a = (vshard << _SPARE_A_BITS) | spare
    rand_b = rand & ((1 << _RAND_B_BITS) - 1)
    value = (now_ms << 80) | (_VERSION << 76) | (rand_a << 64) | (0b10 << 62) | rand_b
    return UUID(int=value)


def carries_vshard(id_: UUID) -> bool:
    """Whether ``id_`` was minted by this scheme (a UUIDv7 of RFC 9562's variant)."""
    return _ours(id_.int)


def _ours(value: int) -> bool:
    """``carries_vshard`` of the id whose integer is ``value``: its variant bits 10 (RFC
    9562's, where ``UUID.version`` is read) and its version 7, read off the integer once
    (every id of a run's entities asks: ``beside``)."""
    return (value >> 62) & 0b11 == 0b10 and (value >> 76) & 0xF == _VERSION


def vshard_of(id_: UUID) -> int:
    """The virtual shard ``id_`` carries; ``LEGACY`` for an id minted before this scheme."""
    value = id_.int
    if not _ours(value):
        return LEGACY
    return (value >> (64 + _SPARE_A_BITS)) & (VSHARDS - 1)


def unix_ms(id_: UUID) -> int:
    """When a UUIDv7 was minted (unix ms)."""
    return id_.int >> 80


def beside(run_id: UUID, now_ms: int, rand: int) -> UUID:
    """A new id for an entity of the run ``run_id``: in the run's virtual shard; for a legacy
    run a version-4 id made of ``rand`` (its low 122 bits), as the run's own was."""
    vshard = vshard_of(run_id)
    if vshard != LEGACY:
        return mint(vshard, now_ms, rand)
    return _version4(rand)


def derive(run_id: UUID, id_: UUID) -> UUID:
    """``id_`` (a name-based id: the same for the same name) moved into the virtual shard of
    ``run_id`` and given its time, so it routes as the run does and stays the same for the
    same name; for a legacy run ``id_`` itself (as such ids were before this scheme)."""
    if not carries_vshard(run_id):
        return id_
    return mint(vshard_of(run_id), unix_ms(run_id), id_.int)


def hashed_vshard(tenant_id: str) -> int:
    """The virtual shard of a tenant the directory has no placement for: a stable hash."""
    digest = hashlib.sha256(tenant_id.encode()).digest()
    return int.from_bytes(digest[:4], "big") % VSHARDS


def _version4(rand: int) -> UUID:
    value = rand & ((1 << 128) - 1)
    value &= ~(0xF << 76) & ~(0b11 << 62)
    return UUID(int=value | (4 << 76) | (0b10 << 62))
