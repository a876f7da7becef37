"""The results of steps no worker executes (issue 32 part 4): a signal's body is its step's
result, a wait's says when it ended, a timed-out signal's is its default; each reaches the
steps depending on it and is the run's when its step is last."""

from __future__ import annotations

from domain_harness import Harness

from runcontrol.domain import RunState, StepState
from runcontrol.domain.run.waits import fire_due_waits, receive_signal


def test_a_signals_body_reaches_its_dependants_and_can_be_the_runs_result() -> None:
    h = Harness(
        [
            {"name": "review", "kind": "signal"},
            {"name": "apply", "agentId": "x", "dependsOn": ["review"]},
        ]
    )
    h.start_ready()
    receive_signal(h.agg, h.ctx("bob"), "review", {"approved": True, "by": "bob"}, "bob")
    h.commit()
    assert h.agg.dependency_results(h.step(1)) == {"review": {"approved": True, "by": "bob"}}
    last = Harness([{"name": "review", "kind": "signal"}])
    last.start_ready()
    receive_signal(last.agg, last.ctx("bob"), "review", [1, "two"], "bob")
    last.commit()
    assert last.run.state is RunState.COMPLETED
    result = last.agg.run_result()
    assert result is not None and result.value == [1, "two"]
    assert last.run.result_hash == result.outcome_hash and last.run.result_bytes == 9


def test_a_waits_result_says_when_it_ended() -> None:
    h = Harness([{"name": "pause", "kind": "wait", "seconds": 30}])
    h.start_ready()
    due = h.step(0).due_at
    h.advance(45)  # the reminder comes late (downtime): the result says both
    fire_due_waits(h.agg, h.ctx("reminder"), h.options)
    h.commit()
    assert h.step(0).state is StepState.SUCCEEDED
    assert h.agg.run_result().value == {  # type: ignore[union-attr]
        "firedAt": due.isoformat(),  # type: ignore[union-attr]
        "endedAt": h.now.isoformat(),
    }


def test_a_timed_out_signals_default_is_its_result() -> None:
    h = Harness(
        [
            {
                "name": "review",
                "kind": "signal",
                "timeoutSeconds": 60,
                "onTimeout": "continue",
                "default": {"approved": False},
            }
        ]
    )
    h.start_ready()
    h.advance(61)
    fire_due_waits(h.agg, h.ctx("reminder"), h.options)
    h.commit()
    assert h.agg.run_result().value == {"approved": False}  # type: ignore[union-attr]
