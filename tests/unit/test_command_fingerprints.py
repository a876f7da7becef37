"""A command's fingerprint (``commands.fingerprint``) is stored with its answer: a resend is
told apart from another command reusing its id by it, so the same command must keep the same
fingerprint across releases (these were computed before issue 33 read each class's fields once)."""

from __future__ import annotations

from uuid import UUID

from runcontrol.commands import AcquireLease, ReportOutcome, fingerprint
from runcontrol.domain import AttemptOutcome

RUN = UUID("00000000-0000-4000-8000-00000000f00d")
ATTEMPT = UUID("00000000-0000-4000-8000-0000000000a1")


def report(**fields: object) -> ReportOutcome:
    return ReportOutcome(
        tenant_id="t", run_id=RUN, attempt_id=ATTEMPT, holder="w", fencing_token=3, **fields
    )


def test_the_same_command_keeps_its_stored_fingerprint() -> None:
    with_result = report(outcome=AttemptOutcome.SUCCEEDED, result={"ok": True, "n": [1, 2.0]})
    assert fingerprint(with_result) == (
        "adc08099f69df4f1ccf40a9a55c525be2d71a34f4096659b143edb8a1b9581f7"
    )
    assert fingerprint(report(outcome=AttemptOutcome.FAILED)) == (
        "68ace51d5f7fb35a20fca878769f0372873967c97207e04adbcf3544bfcba184"
    )
    lease = AcquireLease(tenant_id="t", run_id=RUN, attempt_id=ATTEMPT, holder="w")
    assert fingerprint(lease) == "b7ea7bd6cf3e8eabf6d1cae0a94788c9c8b5b49b5e8de085f0ae40719eab9bee"


def test_the_id_is_not_fingerprinted_and_a_json_field_is_by_its_value() -> None:
    one = report(outcome=AttemptOutcome.SUCCEEDED, result={"a": 1, "b": 2}, command_id="one")
    other = report(outcome=AttemptOutcome.SUCCEEDED, result={"b": 2, "a": 1}, command_id="two")
    assert fingerprint(one) == fingerprint(other)
    assert fingerprint(one) != fingerprint(report(outcome=AttemptOutcome.SUCCEEDED, result={}))
