"""A virtual shard's move between databases, as a step machine (issue 41; docs/sharding.md,
"Moving a tenant"; docs/write-path.md section 7). Pure: ``store/move.py`` runs the steps and
journals each one in ``vshard_moves``.

A move's ``step`` is the next step to run; each step is safe to run again (a crash after its
effect and before its journal entry runs it once more), so a move resumes from its journal:

1. ``marking``: the shard is marked ``moving`` in the directory (new submissions of its
   tenants are answered 503 with ``Retry-After``).
2. ``quiescing``: until none of its tenants' rows has changed for a quiet window (bounded).
3. ``fencing``: a fence row per tenant in the source (``shard_fences``): from its commit on the
   source refuses every document of those tenants, in the document's own transaction.
4. ``copying``: every row of its tenants into the target, in one transaction.
5. ``verifying``: per table, the count and a digest of the rows; per run, a gap-free event
   sequence, the same on both sides.
6. ``flipping``: ``vshards.database`` set to the target, the epoch bumped.
7. ``resuming``: the shard ``serving`` again, on the target.
8. ``cleaning``: the source's copy of the rows removed (the fence rows stay).

Until ``flipping`` has run the shard is wholly on the source (the directory names it, and the
target's copy is not read by anyone); from then on wholly on the target. A move that failed
before the flip may be aborted (the target's copy removed, the fence lifted, the shard serving
on the source again); after it, only resumed.
"""

from __future__ import annotations

from enum import StrEnum


class Step(StrEnum):
    MARKING = "marking"
    QUIESCING = "quiescing"
    FENCING = "fencing"
    COPYING = "copying"
    VERIFYING = "verifying"
    FLIPPING = "flipping"
    RESUMING = "resuming"
    CLEANING = "cleaning"
    DONE = "done"
    ABORTED = "aborted"


ORDER = tuple(Step)[: tuple(Step).index(Step.DONE) + 1]  # marking .. done
ENDED = frozenset({Step.DONE, Step.ABORTED})


def after(step: Step) -> Step:
    """The step that follows ``step`` once it has run."""
    if step in ENDED:
        raise ValueError(f"a move that is {step.value} has no next step")
    return ORDER[ORDER.index(step) + 1]


def flipped(step: Step) -> bool:
    """Whether the journal knows the flip has run (the directory names the target). At
    ``flipping`` it may have run too, its journal entry lost: the directory says."""
    return step is not Step.ABORTED and ORDER.index(step) > ORDER.index(Step.FLIPPING)


def may_abort(step: Step) -> bool:
    """A move may be aborted until its flip: the source still holds every row (at
    ``flipping``, only while the directory still names the source)."""
    return step not in ENDED and not flipped(step)


def quiet(samples: list[tuple[float, object]], window_s: float) -> bool:
    """Whether the fingerprints sampled (``(monotonic seconds, fingerprint)``, oldest first)
    show nothing changed for ``window_s``: the last sample taken at least ``window_s`` before
    the newest one, and every sample since, equal the newest."""
    if not samples:
        return False
    newest_at, newest = samples[-1]
    start = [i for i, (at, _) in enumerate(samples) if at <= newest_at - window_s]
    return bool(start) and all(f == newest for _, f in samples[start[-1] :])
