"""The answer a command's decision keeps for its resends (``grain.decision._as_stored``): a
copy of anything the run's later commands may change, a frozen answer as it is (issue 33:
copying a lease grant cost 17 us per lease)."""

from __future__ import annotations

from domain_harness import Harness

from runcontrol.domain import AttemptState
from runcontrol.grain.decision import _as_stored


def test_a_mutable_answer_is_copied_and_a_frozen_one_kept() -> None:
    h = Harness()
    attempt, grant = h.start(0)
    kept = _as_stored(attempt)
    assert kept is not attempt and kept == attempt
    h.report(grant)
    assert attempt.state is AttemptState.SUCCEEDED
    assert kept.state is not AttemptState.SUCCEEDED  # the resend's answer as it was
    assert _as_stored(grant) is grant  # frozen: nothing of it changes
    ids = [attempt.attempt_id]
    assert _as_stored(ids) == ids and _as_stored(ids) is not ids
