"""Domain errors cross the Ray boundary as their own classes (never as a RayTaskError)."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Awaitable
from typing import Any

from actor_harness import REQUESTER, RayHarness, assert_typed, proposal_hash, run_async

from actors.placement import pack_answers, unpack
from runcontrol.commands import CancelRun, RequestApproval
from runcontrol.domain import Decision, Role, errors


async def raised(call: Awaitable[Any]) -> BaseException:
    try:
        await call
    except Exception as exc:
        return exc
    raise AssertionError("the call succeeded")


def test_domain_errors_arrive_as_their_own_classes(h: RayHarness) -> None:
    h.publish({"name": "apply", "agentId": "apply", "gate": "approval"})

    async def main() -> None:
        # IdempotencyConflict: the same key with a different payload (decided in a host).
        first = await h.submit(h.request(key="same-key", input={"n": 1}))
        again = await h.submit(h.request(key="same-key", input={"n": 1}))
        assert (again.run_id, again.created) == (first.run_id, False)
        exc = await raised(h.submit(h.request(key="same-key", input={"n": 2})))
        assert_typed(exc, errors.IdempotencyConflict)
        assert isinstance(exc, errors.IdempotencyConflict) and exc.code == "idempotency-conflict"

        # RunNotFound: from the client's read, and from a grain command in a host.
        unknown = uuid.uuid4()
        assert_typed(await raised(h.client.get(h.tenant, unknown)), errors.RunNotFound)
        exc = await raised(
            h.client.send(
                CancelRun(
                    tenant_id=h.tenant, run_id=unknown, requested_by=REQUESTER, reason="no such run"
                )
            )
        )
        assert_typed(exc, errors.RunNotFound)
        # Another tenant's run does not exist for this tenant (row-level security).
        other = await raised(h.client.get(f"{h.tenant}-other", first.run_id))
        assert_typed(other, errors.RunNotFound)

        # SeparationOfDuties: the run's requester may not decide, even holding Reviewer.
        claim = await h.claim("apply", holder="w-1")
        approval = await h.client.send(
            RequestApproval(**claim.fenced(), proposal_hash=proposal_hash())
        )
        assert approval is not None
        requester = h.principal("alice", Role.REQUESTER, Role.REVIEWER)
        exc = await raised(h.approve(approval, requester))
        assert_typed(exc, errors.SeparationOfDuties)
        assert isinstance(exc, errors.Forbidden)
        # ...and an unknown approval id is ApprovalNotFound.
        exc = await raised(
            h.decide(h.reviewer(), uuid.uuid4(), Decision.APPROVE, 1, approval.proposal_hash)
        )
        assert_typed(exc, errors.ApprovalNotFound)

        # The refused decision changed nothing; a Reviewer's decision then applies.
        decided = await h.approve(approval)
        assert str(decided.state) == "Approved" and decided.decided_by == "rita"
        exc = await raised(h.approve(approval, h.principal("bob", Role.REVIEWER)))
        assert_typed(exc, errors.ApprovalAlreadyDecided)
        cancelled = CancelRun(
            tenant_id=h.tenant, run_id=first.run_id, requested_by=REQUESTER, reason="done testing"
        )
        assert await h.client.send(cancelled) in (
            "Cancelling",
            "Cancelled",
        )

    run_async(main(), timeout=60)


def test_an_answer_that_will_not_pickle_fails_only_its_own_caller() -> None:
    """A batch's answers travel as one pickle (``pack_answers``): one that cannot be pickled at
    all (not even by cloudpickle) becomes a typed error for its own caller; the other answers,
    typed errors included, arrive as they were."""
    unpicklable = threading.Lock()
    stale = errors.StaleFencingToken("stale", run_id="r")
    answers = unpack(pack_answers([(True, 1), (True, unpicklable), (False, stale)]))

    assert answers[0] == (True, 1)
    ok, error = answers[1]
    assert ok is False and type(error) is errors.RunControlError
    assert "could not be sent back" in str(error)
    ok, error = answers[2]
    assert ok is False and type(error) is errors.StaleFencingToken
    assert error.details == {"run_id": "r"}
