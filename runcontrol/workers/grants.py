"""What a grant carries, computed once (docs/sessions.md).

A grant is a lease made for a credit by the ``AcquireLease`` whose command id is the credit's
claim id (``lease_command``), so a grant whose answer was lost is found again by that id. It
carries what the worker's function needs to start, all from the run as committed (``grant``):
the run's tenant and input, the lease, the results of the steps the attempt depends on (by
step name), and the run's deadline. Every grant is built here: by a run host's session for a
match (``runcontrol.workers.sessions``), for a resent credit found again in the store, and by
the grain's fused grant (``fuse``: the command dispatching the attempt leases it in the same
commit).

Pure: no Ray, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from ..commands import AcquireLease, fingerprint
from ..domain import Attempt, CommandContext, LeaseGrant, Options, RunAggregate, RunState, errors
from ..domain.run.leases import acquire_lease
from ..store.commit import StoredAnswer
from .book import Match, Offer
from .protocol import Grant


class Credits(Protocol):
    """Worker credits waiting in this process (a run host's sessions). A dispatch that finds
    one leases its attempt to it in the same commit (a fused grant): ``reserve`` takes the
    credit; then exactly one of ``granted`` (the commit is in) or ``refused``."""

    def reserve(self, offer: Offer) -> Match | None: ...

    def granted(self, match: Match, grant: Grant) -> None: ...

    def refused(self, match: Match) -> None: ...


@dataclass(frozen=True, slots=True)
class Fused:
    """A grant made by the commit of the command deciding now: the lease's ``AcquireLease``
    answer, stored with that commit under the credit's claim id, and the grant itself."""

    match: Match
    answer: StoredAnswer
    grant: Grant


def lease_command(match: Match) -> AcquireLease:
    """The lease a match makes: ``AcquireLease`` of the attempt to the credit's holder, its
    command id the credit's claim id."""
    offer, credit = match.offer, match.credit
    return AcquireLease(
        tenant_id=offer.tenant_id,
        run_id=offer.run_id,
        attempt_id=offer.attempt_id,
        holder=credit.holder,
        command_id=credit.claim_id,
    )


def grant(claim_id: str, agg: RunAggregate, lease: LeaseGrant, options: Options | None) -> Grant:
    """The grant of ``lease`` to the credit ``claim_id``, from its run as committed.
    ``options`` None: no deadline (a grant found again in the store by its claim id, after
    the host that made it restarted)."""
    run = agg.run
    deadline = agg.deadline(options) if options is not None else None
    results = agg.grant_results(lease.attempt_id)
    max_bytes = (options or Options()).calls_grant_max_bytes
    calls = agg.grant_calls(lease.attempt_id, max_bytes)
    return Grant(claim_id, run.tenant_id, lease, run.input, results, deadline, calls)


def fuse(
    credits: Credits | None,
    agg: RunAggregate,
    ctx: CommandContext,
    attempt: Attempt,
    agent_id: str,
    options: Options,
) -> Fused | None:
    """Lease the attempt just dispatched to a credit waiting for its agent, in the same
    commit (None: no credit takes it, or the run cannot lease now). The lease's answer is
    stored under the credit's claim id, as an ``AcquireLease`` of that id would be."""
    run = agg.run
    if credits is None or run.state is not RunState.RUNNING or run.suspended_at is not None:
        return None
    match = credits.reserve(Offer.of(agg, attempt, agent_id))
    if match is None:
        return None
    try:
        lease = acquire_lease(agg, ctx, attempt.attempt_id, match.credit.holder, options)
    except errors.RunControlError:
        credits.refused(match)
        return None
    claim_id = match.credit.claim_id
    command = lease_command(match)
    answer = StoredAnswer(claim_id, "AcquireLease", lease, ctx.now, fingerprint(command))
    return Fused(match, answer, grant(claim_id, agg, lease, options))
