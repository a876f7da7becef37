"""After each commit the grain publishes one ``Committed`` notice to its subscribers: once per
statement, with the command, the run as committed and the answer stored; never for a resend
answered from the store, nor for a refusal."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from grain_harness import WORKER, Harness
from support import fenced

from runcontrol.commands import AcquireLease, RenewLease, SubmitRun
from runcontrol.domain import StepSpec, errors
from runcontrol.grain import RunGrain
from runcontrol.grain.bus import SUBSCRIBERS, Committed


@pytest.fixture
def told() -> Iterator[list[Committed]]:
    notices: list[Committed] = []

    def record(grain: RunGrain, notice: Committed) -> None:
        assert grain.agg is notice.run  # the activation already holds the run as committed
        notices.append(notice)

    SUBSCRIBERS.append(record)
    yield notices
    SUBSCRIBERS.remove(record)


def test_each_commit_publishes_one_notice_and_a_resend_none(
    h: Harness, told: list[Committed]
) -> None:
    grain, grant = h.start_run(StepSpec("read", "agent-a"))
    assert [type(n.command) for n in told] == [SubmitRun, AcquireLease]
    assert told[0].answer.value.run_id == grain.run_id
    assert "RunAccepted" in [e.event_type for e in told[0].changes.events]

    told.clear()
    renew = RenewLease(**fenced(grant, h.tenant))
    first = grain.execute(renew)
    assert grain.execute(renew) == first  # the stored answer: nothing committed again
    (notice,) = told
    assert notice.command == renew and notice.answer.value == first
    assert notice.run.run.version == h.load(grain.run_id).run.version


def test_a_refusal_publishes_nothing(h: Harness, told: list[Committed]) -> None:
    grain, grant = h.start_run(StepSpec("read", "agent-a"))
    told.clear()
    with pytest.raises(errors.StaleFencingToken):
        grain.execute(RenewLease(**fenced(grant, h.tenant, fencing_token=99)))
    with pytest.raises(errors.LeaseHeld):
        h.lease(grain, holder=f"{WORKER}-other")
    assert told == []
