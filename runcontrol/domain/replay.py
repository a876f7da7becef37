"""Replay of a run against a newer release (issue 44, docs/replay.md): the rules a replay
run's commands follow, and its divergence report. Pure: the original run is read by the grain
and handed in as an ``Original``.

A replay run is a new run of another release with the original's input, marked
``replay_of``. Its journaled calls (``step.run``) are answered from the original's journal
when the original recorded a call of the same step name, call name and occurrence with the
same arguments (``request_hash``, the canonical hash of the call's arguments; a call without
arguments is matched by its name alone); any other call is refused (``ReplayDiverged``: the
step fails ``replay-diverged``) unless the replay makes calls live (``liveCalls``: the
worker calls the function, a model request; a side effect is never claimed in a replay).
An approval the original approved for a proposal of the same hash (and step name) is approved
at once (``decidedBy: replay:{original run}``); another proposal waits for a human
(``approvals: park``) or fails the step (``fail``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any
from uuid import UUID

from . import errors
from .model import ApprovalRequest, AttemptResult, JournaledCall, Run, Step
from .states import ApprovalState

REPLAY_DECIDER = "replay:"  # a decision reused from the original: replay:{original run id}
CallKey = tuple[str, str, int]  # (step name, call name, occurrence)
# A result larger than this (canonical JSON characters) is compared by hash only.
DIFF_MAX_CHARS = 16_384
DIFF_MAX_ENTRIES = 50


class ReplayApprovals(StrEnum):
    """What a replay does with an approval whose proposal the original never decided."""

    PARK = "park"  # wait for a human, as any run
    FAIL = "fail"  # the step fails replay-diverged


@dataclass(frozen=True, slots=True)
class ReplayOptions:
    """How a replay run answers what the original did not record (pinned on the run)."""

    live_calls: bool = False
    approvals: ReplayApprovals = ReplayApprovals.PARK

    def to_dict(self) -> dict[str, Any]:
        return {"liveCalls": self.live_calls, "approvals": str(self.approvals)}

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any] | None) -> ReplayOptions:
        doc = doc or {}
        return cls(bool(doc.get("liveCalls", False)), ReplayApprovals(doc.get("approvals", "park")))

    @property
    def lease_mode(self) -> str:
        """What a worker's lease says of the run: ``live`` or ``refuse`` (its unmatched calls)."""
        return "live" if self.live_calls else "refuse"


def replay_mode(options: Mapping[str, Any] | None) -> str:
    """A replay run's lease mode from its pinned options (``ReplayOptions.lease_mode``)."""
    return ReplayOptions.from_dict(options).lease_mode


@dataclass(frozen=True, slots=True)
class Original:
    """What a replay reads of its original run: its journaled calls and approvals, by the
    name of their step (step ids differ between the two runs), and its steps' results."""

    run_id: UUID
    calls: Mapping[CallKey, JournaledCall] = field(default_factory=dict)
    approvals: Mapping[str, tuple[ApprovalRequest, ...]] = field(default_factory=dict)

    @classmethod
    def of(
        cls,
        run: Run,
        steps: Iterable[Step],
        calls: Iterable[JournaledCall],
        approvals: Iterable[ApprovalRequest],
    ) -> Original:
        names = {s.step_id: s.name for s in steps}
        by_step: dict[str, list[ApprovalRequest]] = {}
        for a in approvals:
            by_step.setdefault(names[a.step_id], []).append(a)
        return cls(
            run.run_id,
            {(names[c.step_id], c.name, c.occurrence): c for c in calls},
            {name: tuple(found) for name, found in by_step.items()},
        )


def answer_call(
    original: Original, step: str, name: str, occurrence: int, request_hash: str | None
) -> JournaledCall:
    """The original's call a replay's call is answered with; ``ReplayDiverged`` says why none
    is (the original never made it, or made it with other arguments)."""
    found = original.calls.get((step, name, occurrence))
    if found is None:
        raise errors.ReplayDiverged(
            f"the original run made no call {name!r} #{occurrence} in step {step!r}",
            step=step,
            name=name,
            occurrence=occurrence,
            why="not-in-original",
        )
    if found.request_hash != request_hash:
        raise errors.ReplayDiverged(
            f"the original run made call {name!r} #{occurrence} in step {step!r} with other "
            "arguments",
            step=step,
            name=name,
            occurrence=occurrence,
            why="other-arguments",
        )
    return found


def original_approval(original: Original, step: str, proposal_hash: str) -> ApprovalRequest | None:
    """The original's Approved request of this proposal in this step, or None: the replay's
    request is then one a human decides (a proposal the original never had approved)."""
    for approval in original.approvals.get(step, ()):
        if approval.proposal_hash == proposal_hash and approval.state is ApprovalState.APPROVED:
            return approval
    return None


# ---------------------------------------------------------------------- the report


def json_diff(before: Any, after: Any, path: str = "$") -> list[dict[str, Any]]:
    """The differences between two JSON values: ``{path, before, after}`` per changed leaf
    (a key or item only one side has: the other's value is absent), at most
    ``DIFF_MAX_ENTRIES``."""
    found: list[dict[str, Any]] = []
    _diff(before, after, path, found)
    return found[:DIFF_MAX_ENTRIES]


_ABSENT: Any = object()


def _diff(before: Any, after: Any, path: str, found: list[dict[str, Any]]) -> None:
    if len(found) >= DIFF_MAX_ENTRIES:
        return
    if isinstance(before, dict) and isinstance(after, dict):
        for key in sorted(set(before) | set(after)):
            _diff(before.get(key, _ABSENT), after.get(key, _ABSENT), f"{path}.{key}", found)
        return
    if isinstance(before, list) and isinstance(after, list):
        for i in range(max(len(before), len(after))):
            b = before[i] if i < len(before) else _ABSENT
            a = after[i] if i < len(after) else _ABSENT
            _diff(b, a, f"{path}[{i}]", found)
        return
    if before is _ABSENT or after is _ABSENT or before != after or type(before) is not type(after):
        entry: dict[str, Any] = {"path": path}
        if before is not _ABSENT:
            entry["before"] = before
        if after is not _ABSENT:
            entry["after"] = after
        found.append(entry)


@dataclass(frozen=True, slots=True)
class Outcome:
    """A step's outcome as the report compares it: its hash (None: the step has none yet) and
    its result's canonical JSON when one is stored inline."""

    hash: str | None = None
    result_json: str | None = None

    @classmethod
    def of(cls, outcome_hash: str | None, result: AttemptResult | None) -> Outcome:
        if result is not None:
            return cls(result.outcome_hash, result.result_json)
        return cls(outcome_hash)


@dataclass(frozen=True, slots=True)
class RunRecord:
    """One run as the report compares it: per step name, its outcome, its journaled calls and
    its approvals."""

    run_id: UUID
    state: str
    results: Mapping[str, Outcome]
    calls: Mapping[CallKey, JournaledCall]
    approvals: Mapping[str, tuple[ApprovalRequest, ...]]
    failures: Mapping[str, str | None] = field(default_factory=dict)  # a step's failure class


def _step_entry(name: str, before: Outcome, after: Outcome) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "step": name,
        "equal": before.hash == after.hash,
        "originalHash": before.hash,
        "replayHash": after.hash,
    }
    b, a = before.result_json, after.result_json
    if before.hash != after.hash and b and a and max(len(b), len(a)) <= DIFF_MAX_CHARS:
        entry["diff"] = json_diff(json.loads(b), json.loads(a))
    return entry


def _call_entry(key: CallKey, call: JournaledCall) -> dict[str, Any]:
    step, name, occurrence = key
    return {
        "step": step,
        "name": name,
        "occurrence": occurrence,
        "requestHash": call.request_hash,
        "valueHash": call.value_hash,
    }


def report(original: RunRecord, replay: RunRecord) -> dict[str, Any]:
    """The divergence report of ``replay`` against ``original``: per step of either, whether
    its result is equal (both hashes, a JSON diff of small results); the replay's calls the
    original did not make (or made with other arguments or another value); the original's
    calls the replay did not make; the approvals whose proposal changed."""
    names = list(dict.fromkeys([*original.results, *replay.results]))
    steps = []
    for name in names:
        none = Outcome()
        entry = _step_entry(name, original.results.get(name, none), replay.results.get(name, none))
        failure = replay.failures.get(name)
        if failure:
            entry["replayFailureClass"] = failure
        steps.append(entry)
    made = [
        _call_entry(key, call)
        for key, call in replay.calls.items()
        if key not in original.calls
        or original.calls[key].request_hash != call.request_hash
        or original.calls[key].value_hash != call.value_hash
    ]
    not_made = [_call_entry(k, c) for k, c in original.calls.items() if k not in replay.calls]
    changed = []
    for name in names:
        before = {a.proposal_hash for a in original.approvals.get(name, ())}
        after = {a.proposal_hash for a in replay.approvals.get(name, ())}
        for proposal in sorted(after - before):
            changed.append(
                {"step": name, "proposalHash": proposal, "originalProposalHashes": sorted(before)}
            )
    diverged = bool(made or not_made or changed or not all(s["equal"] for s in steps))
    return {
        "originalRunId": str(original.run_id),
        "replayRunId": str(replay.run_id),
        "originalState": original.state,
        "replayState": replay.state,
        "diverged": diverged,
        "steps": steps,
        "callsNotInOriginal": made,
        "originalCallsNotMade": not_made,
        "approvalsChanged": changed,
    }


def summary(reports: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The batch form's summary: per step name, how many replays were equal and diverged."""
    per_step: dict[str, dict[str, int]] = {}
    runs = 0
    diverged = 0
    for r in reports:
        runs += 1
        diverged += bool(r["diverged"])
        for s in r["steps"]:
            counts = per_step.setdefault(s["step"], {"equal": 0, "diverged": 0})
            counts["equal" if s["equal"] else "diverged"] += 1
    return {"runs": runs, "diverged": diverged, "steps": per_step}
