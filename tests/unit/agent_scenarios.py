"""What both agent adapters must do, as scenarios over a ``Subject``: an adapter with its
scripted coder agent (reads ``app.py``, proposes a patch worded ``plan #N`` by the model's N-th
call, then answers ``done``), run on a step kept in memory (durable_step.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from durable_step import MemoryStep
from scripted_agents import ScriptedPlanner

from runcontrol.domain import FailureClass, ToolCallStatus, canonical_hash
from runcontrol.sdk import CallFailed, Transient
from runcontrol.sdk._step import Parked

PROPOSED = ("propose", "plan #2: add a docstring")  # what the second model call proposes


@dataclass
class Subject:
    planner: ScriptedPlanner  # the scripted model
    ran: list[tuple[str, str]]  # the tools' calls, (tool, argument)
    run: Callable[..., Any]  # run(step, **options): the agent's final output
    provider_error: Exception  # what the framework raises when the provider is unreachable

    def model_calls(self) -> int:
        return self.planner.calls


def approval_parks_and_the_reentered_step_replays(s: Subject, *, stream: bool) -> MemoryStep:
    step, options = MemoryStep(), {"stream": stream}
    with pytest.raises(Parked):
        s.run(step, **options)
    (proposal,) = step.asked
    assert proposal == {"tool": "propose", "arguments": {"patch": PROPOSED[1]}}
    assert step.progress_data == [{"proposal": proposal}]  # what the reviewer is shown
    assert (s.model_calls(), s.ran) == (2, [("read_file", "app.py")])

    step.reenter(approved=canonical_hash(proposal))  # approved: the step runs from the start
    assert s.run(step, **options) == "done"
    # The two requests before the approval were replayed: the plan kept its first wording,
    # so the approval matched; only the request after the tool's result was new.
    assert s.model_calls() == 3
    assert s.ran == [("read_file", "app.py"), PROPOSED]
    assert step.asked == [proposal] and step.progress_data == [{"proposal": proposal}]

    step.reenter()  # a retry of the finished step: nothing runs again
    assert s.run(step, **options) == "done"
    assert s.model_calls() == 3 and len(s.ran) == 2
    # Streamed as the model wrote it, the first time only.
    assert step.chunks == (["plan #2: add a docstring", "done"] if stream else [])
    return step


def approval_binds_to_the_exact_arguments(s: Subject) -> None:
    step = MemoryStep()
    with pytest.raises(Parked):
        s.run(step)
    other = {"tool": "propose", "arguments": {"patch": "plan #3: add a docstring"}}
    step.reenter(approved=canonical_hash(other))  # approved: a call with other arguments
    with pytest.raises(Parked):
        s.run(step)
    assert step.asked[0] == step.asked[1] != other  # asked again for the call made
    assert PROPOSED not in s.ran


def tokens_are_consumed_once_per_model_request(s: Subject) -> None:
    step = MemoryStep()
    step.auto_approve = True  # the policy needs no human
    assert s.run(step, token_limit="model-tokens", stream=False) == "done"
    step.reenter()
    assert s.run(step, token_limit="model-tokens", stream=False) == "done"
    assert s.model_calls() == 3
    assert step.consumed == [("model-tokens", 15.0)] * 3  # the model's usage, once each


def side_effecting_tool_never_runs_twice(s: Subject, **options: Any) -> None:
    """``s`` proposes with ``push``, a side-effecting tool."""
    step = MemoryStep()
    assert s.run(step, **options) == "done"
    (call_id,) = step.claims
    assert call_id.startswith(f"{step.step_id}:coder:tool:push:")
    pushed = [("push", PROPOSED[1])]
    # A crash after the push and before its journal record: the claim holds the result.
    del step.journal[("coder:tool:push:propose-1", 1)]
    step.reenter()
    assert s.run(step, **options) == "done"
    assert [r for r in s.ran if r[0] == "push"] == pushed  # not pushed again
    # A crash during the push (claimed, never completed): it may have happened. The step
    # ends Uncertain, in this execution and every later one, and never pushes again.
    del step.journal[("coder:tool:push:propose-1", 1)]
    step.claims[call_id] = ToolCallStatus.IN_PROGRESS
    del step.claim_results[call_id]
    for _ in range(2):
        step.reenter()
        with pytest.raises(CallFailed) as failed:
            s.run(step, **options)
        assert failed.value.failure_class is FailureClass.UNCERTAIN
    assert [r for r in s.ran if r[0] == "push"] == pushed


def cancelled_run_stops_before_its_next_model_request(s: Subject) -> None:
    step = MemoryStep()
    step.cancelled = True
    with pytest.raises(asyncio.CancelledError):
        s.run(step)
    assert s.model_calls() == 0


def provider_failure_is_transient_and_the_retry_replays(s: Subject) -> None:
    step = MemoryStep()
    s.planner.failures[2] = s.provider_error  # the second request fails
    with pytest.raises(Transient):
        s.run(step, stream=False)
    step.reenter()  # the step's retry
    with pytest.raises(Parked):
        s.run(step, stream=False)
    # The first request was replayed; the failed one was made again, once.
    assert s.model_calls() == 3 and s.ran == [("read_file", "app.py")]
    assert step.asked[0]["arguments"] == {"patch": "plan #3: add a docstring"}
