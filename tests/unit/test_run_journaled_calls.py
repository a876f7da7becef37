"""RunAggregate rules, driven purely in memory with a fixed clock and deterministic ids.

Journaled calls (``step.run``): the first value per (step, name, occurrence) is stored and
answered to every later record of the key; fenced by the lease; capped like results; limited
per step; carried by grants up to their cap.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from domain_harness import GRACE, LEASE, READ_STEP, WRITE_STEP, Harness, assert_refused_cleanly

from runcontrol.domain import LeaseGrant, Options, RecordedCall, canonical_hash, errors
from runcontrol.domain.run.journaled_calls import record_call

ERROR = {"type": "Permanent", "message": "refused", "failure_class": "permanent"}


def record(
    h: Harness,
    grant: LeaseGrant,
    name: str = "plan",
    occurrence: int = 1,
    value: Any = None,
    *,
    error: dict[str, Any] | None = None,
    read_only: bool = False,
    token: int | None = None,
) -> RecordedCall:
    answer = record_call(
        h.agg,
        h.ctx(grant.holder),
        grant.attempt_id,
        grant.holder,
        grant.fencing_token if token is None else token,
        name,
        occurrence,
        value,
        error,
        read_only,
        h.options,
        lease_id=grant.lease_id,
    )
    h.commit()
    return answer


class TestRecord:
    def test_the_first_value_is_stored_once_with_its_hash_and_size(self):
        h = Harness()
        _, grant = h.start()
        value = {"plan": "secret-plan"}
        answer = record(h, grant, value=value)
        assert answer.recorded and answer.value_json is None  # the caller has it
        assert answer.value_hash == canonical_hash(value)
        assert answer.bytes == len('{"plan":"secret-plan"}')
        (stored,) = h.batches[-1].calls
        assert stored.value_json == '{"plan":"secret-plan"}'
        assert stored.attempt_id == grant.attempt_id
        assert h.last_event_types() == ["CallRecorded"]
        payload = h.events[-1].payload
        assert payload["valueHash"] == answer.value_hash and payload["bytes"] == answer.bytes
        assert "secret-plan" not in str(payload)  # its hash and size, never its content

    def test_a_second_record_of_the_key_stores_nothing_and_answers_the_first(self):
        h = Harness()
        _, grant = h.start()
        record(h, grant, value={"plan": "A"})
        again = record(h, grant, value={"plan": "B"})
        assert not again.recorded and again.value_json == '{"plan":"A"}'
        assert h.batches[-1].empty

    def test_occurrences_and_names_are_separate_keys(self):
        h = Harness()
        _, grant = h.start()
        for n in (1, 2):
            assert record(h, grant, "model", n, value=n).recorded
        assert record(h, grant, "tool", 1, value="t").recorded
        assert len(h.agg.calls) == 3

    def test_a_retried_attempt_of_the_step_gets_the_value_and_its_grant_carries_it(self):
        h = Harness([{**READ_STEP, "maxAttempts": 3}])
        attempt, grant = h.start()
        record(h, grant, value=[1, 2])
        h.advance(LEASE + GRACE + 1)
        assert h.expire_lease(attempt)
        h.now = h.step(0).not_before
        retry = h.dispatch()
        second = h.lease(retry, "worker-2")
        (carried,) = h.agg.grant_calls(second.attempt_id, h.options.calls_grant_max_bytes)
        assert carried.value_json == "[1,2]"
        assert not record(h, second, value=[3]).recorded

    def test_an_error_is_stored_in_place_of_a_value(self):
        h = Harness()
        _, grant = h.start()
        answer = record(h, grant, error=ERROR)
        assert answer.recorded and answer.error == ERROR
        assert answer.value_hash == canonical_hash({"error": ERROR})
        assert h.events[-1].payload["failed"] is True
        assert record(h, grant, value=1).error == ERROR

    def test_a_read_answers_the_stored_value_and_refuses_a_missing_one(self):
        h = Harness()
        _, grant = h.start()
        record(h, grant, value="v")
        read = record(h, grant, read_only=True)
        assert not read.recorded and read.value_json == '"v"'
        with pytest.raises(errors.CallNotRecorded):
            record(h, grant, occurrence=2, read_only=True)
        assert_refused_cleanly(h)


class TestFence:
    def test_a_stale_token_is_refused_and_audited(self):
        h = Harness()
        _, grant = h.start()
        with pytest.raises(errors.StaleFencingToken):
            record(h, grant, value=1, token=grant.fencing_token + 1)
        assert_refused_cleanly(h, "stale-fencing-token")
        assert h.agg.calls == {}

    def test_a_holder_whose_lease_expired_is_refused_and_audited(self):
        h = Harness([{**READ_STEP, "maxAttempts": 3}])
        attempt, grant = h.start()
        h.advance(LEASE + GRACE + 1)
        assert h.expire_lease(attempt)
        with pytest.raises(errors.StaleFencingToken):
            record(h, grant, value=1)
        assert_refused_cleanly(h, "lease-rejected")

    def test_a_parked_attempt_records_nothing_until_leased_again(self):
        h = Harness([WRITE_STEP])
        _, grant = h.start()
        record(h, grant, value={"proposal": 1})
        h.request_approval(grant, canonical_hash({"proposal": 1}))
        with pytest.raises(errors.StaleFencingToken):
            record(h, grant, "later", value=1)
        assert_refused_cleanly(h, "lease-rejected")


class TestBounds:
    def test_a_value_over_the_results_cap_is_refused(self):
        h = Harness(options=Options(result_max_bytes=10))
        _, grant = h.start()
        with pytest.raises(errors.CallValueTooLarge) as refused:
            record(h, grant, value="x" * 20)
        assert refused.value.details["max_bytes"] == 10
        assert_refused_cleanly(h)

    def test_the_count_per_step_is_limited(self):
        h = Harness(options=Options(calls_max_per_step=2))
        _, grant = h.start()
        record(h, grant, value=1)
        record(h, grant, occurrence=2, value=2)
        with pytest.raises(errors.CallLimitReached):
            record(h, grant, occurrence=3, value=3)
        assert_refused_cleanly(h)
        assert not record(h, grant, value=9).recorded  # a stored key still answers

    def test_the_bytes_per_step_are_limited(self):
        h = Harness(options=Options(calls_max_bytes_per_step=8))
        _, grant = h.start()
        record(h, grant, value="abcd")  # 6 bytes
        with pytest.raises(errors.CallLimitReached):
            record(h, grant, occurrence=2, value="abcd")
        assert_refused_cleanly(h)

    @pytest.mark.parametrize(
        ("name", "occurrence", "value", "error"),
        [
            ("", 1, 1, None),
            ("x" * 201, 1, 1, None),
            ("plan", 0, 1, None),
            ("plan", 1, 1, ERROR),
            ("plan", 1, None, {"type": "X"}),
            ("plan", 1, None, {**ERROR, "failure_class": "nope"}),
            ("plan", 1, None, {**ERROR, "message": "m" * 2001}),
            ("plan", 1, float("nan"), None),
        ],
    )
    def test_malformed_records_are_refused(self, name, occurrence, value, error):
        h = Harness()
        _, grant = h.start()
        with pytest.raises(errors.ValidationFailed):
            record(h, grant, name, occurrence, value, error=error)
        assert_refused_cleanly(h)

    def test_a_grant_carries_values_up_to_its_cap_and_the_rest_without_content(self):
        h = Harness()
        _, grant = h.start()
        for n in (1, 2, 3):
            record(h, grant, occurrence=n, value="x" * 8)  # 10 bytes each
            h.advance(1)
        carried = h.agg.grant_calls(grant.attempt_id, 25)
        assert [c.value_json is not None for c in carried] == [True, True, False]
        assert [c.bytes for c in carried] == [10, 10, 10]
        assert carried[2] == replace(h.agg.step_calls(grant.step_id)[2], value_json=None)
