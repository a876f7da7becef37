"""``RecordCall`` through a real grain and PostgreSQL: a journaled call's first value is stored
under (run, step, name, occurrence), survives the attempt (a retry's grant carries it), a
second record of the key gets the stored value back, a resend gets the stored answer, and a
stale holder's record is refused and audited."""

from __future__ import annotations

import pytest
from grain_harness import CeilingRandom, Harness
from support import fenced

from runcontrol.commands import RecordCall, WakeResult
from runcontrol.domain import RunAggregate, StepSpec, errors
from runcontrol.store.tables import journaled_calls
from runcontrol.workers.grants import grant


def record(h: Harness, lease, name: str = "plan", occurrence: int = 1, **fields) -> RecordCall:
    token = {"fencing_token": fields.pop("fencing_token")} if "fencing_token" in fields else {}
    fenced_fields = fenced(lease, h.tenant, **token)
    return RecordCall(**fenced_fields, name=name, occurrence=occurrence, **fields)


def test_the_first_value_is_stored_and_a_retried_attempt_gets_it(h: Harness):
    h.env.rng = CeilingRandom()
    grain, first = h.start_run(StepSpec("s", "agent-a", max_attempts=3))
    command = record(h, first, value={"plan": "A"})

    answer = grain.execute(command)
    assert answer.recorded and answer.value_json is None and answer.bytes == len('{"plan":"A"}')
    assert grain.execute(command) == answer  # a resend: the stored answer
    again = grain.execute(record(h, first, value={"plan": "B"}))  # another execution's
    assert not again.recorded and again.value_json == '{"plan":"A"}'
    assert again.value_hash == answer.value_hash
    assert len(h.rows(journaled_calls, grain.run_id)) == 1
    assert h.event_types(grain.run_id)[-1] == "CallRecorded"

    h.clock.advance(200)  # the lease expires; the reminder settles it and retries the step
    h.wake(grain)
    h.clock.advance(5)
    assert h.wake(grain) == WakeResult(dispatched=True)
    second = h.lease(grain, "worker-2")
    agg: RunAggregate = h.load(grain.run_id)
    (carried,) = grant("claim", agg, second, None).calls
    assert (carried.name, carried.occurrence, carried.value_json) == ("plan", 1, '{"plan":"A"}')
    assert carried.attempt_id == first.attempt_id


def test_a_stale_holder_s_record_is_refused_and_audited(h: Harness):
    grain, first = h.start_run(StepSpec("s", "agent-a", max_attempts=3))
    with pytest.raises(errors.StaleFencingToken):
        grain.execute(record(h, first, fencing_token=first.fencing_token + 1, value=1))
    assert [a.kind for a in h.audits(grain.run_id)] == ["stale-fencing-token"]
    assert h.rows(journaled_calls, grain.run_id) == []


def test_an_error_is_stored_and_a_read_answers_it(h: Harness):
    grain, first = h.start_run(StepSpec("s", "agent-a"))
    error = {"type": "Permanent", "message": "no", "failure_class": "permanent"}
    assert grain.execute(record(h, first, error=error)).recorded
    read = grain.execute(record(h, first, read_only=True))
    assert not read.recorded and read.error == error and read.value_json is None
    with pytest.raises(errors.CallNotRecorded):
        grain.execute(record(h, first, occurrence=2, read_only=True))
