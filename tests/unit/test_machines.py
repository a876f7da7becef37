"""The four state machines: every legal pair is accepted, every other pair is refused; and
which command each run state admits (``RUN_COMMANDS``)."""

from __future__ import annotations

import itertools
import pickle
from collections import deque
from enum import StrEnum

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runcontrol.domain import errors
from runcontrol.domain.machines import (
    APPROVAL_TRANSITIONS,
    ATTEMPT_TRANSITIONS,
    RUN_COMMANDS,
    RUN_TRANSITIONS,
    STEP_CONTROLS,
    STEP_TRANSITIONS,
    SUSPENSION_TRANSITIONS,
    RunCommand,
    allows,
    check,
    refusal,
    require,
)
from runcontrol.domain.states import ApprovalState, AttemptState, RunState, StepState, Suspension

R, St, A, Ap = RunState, StepState, AttemptState, ApprovalState

# The seed's run stateDiagram, transcribed edge by edge (from, to, label).
SPEC_RUN_DIAGRAM = {
    (R.ACCEPTED, R.RUNNING): "FirstAttemptDispatched",
    (R.RUNNING, R.WAITING_FOR_APPROVAL): "ApprovalRequested",
    (R.WAITING_FOR_APPROVAL, R.RUNNING): "ApprovalGranted",
    (R.WAITING_FOR_APPROVAL, R.FAILED): "ApprovalRejectedOrExpired",
    (R.ACCEPTED, R.CANCELLED): "CancelRequestedBeforeDispatch",
    (R.RUNNING, R.CANCELLING): "CancelRequested",
    (R.WAITING_FOR_APPROVAL, R.CANCELLING): "CancelRequested",
    (R.CANCELLING, R.CANCELLED): "AllAttemptsSettled",
    (R.RUNNING, R.COMPLETED): "LastStepSucceeded",
    (R.RUNNING, R.FAILED): "StepFailedTerminally",
}
# The one documented addition: the BudgetReservationDenied handler fails a never-dispatched run.
DOCUMENTED_RUN_EXTRAS = {
    (R.ACCEPTED, R.FAILED): "BudgetReservationDenied",
    # issue 22: a graph's step failed while siblings were held; they settle as for a cancel
    (R.CANCELLING, R.FAILED): "SiblingsSettledAfterFailure",
}

# The seed's approval stateDiagram.
SPEC_APPROVAL_DIAGRAM = {
    (Ap.PENDING, Ap.APPROVED): "Approve",
    (Ap.PENDING, Ap.REJECTED): "Reject",
    (Ap.PENDING, Ap.EXPIRED): "ExpiryReminder",
    (Ap.PENDING, Ap.STALE): "ProposalChanged",
    (Ap.PENDING, Ap.CANCELLED): "RunCancelled",
}

MACHINES = {
    "Run": (RunState, RUN_TRANSITIONS, R.ACCEPTED),
    "Step": (StepState, STEP_TRANSITIONS, St.PENDING),
    "Attempt": (AttemptState, ATTEMPT_TRANSITIONS, A.DISPATCHED),
    "ApprovalRequest": (ApprovalState, APPROVAL_TRANSITIONS, Ap.PENDING),
}


def _all_pairs():
    for name, (enum, table, _initial) in MACHINES.items():
        for current, target in itertools.product(enum, enum):
            legal = (current, target) in table
            yield pytest.param(
                name, table, current, target, legal, id=f"{name}:{current}->{target}"
            )


ALL_PAIRS = list(_all_pairs())


@pytest.mark.parametrize(("name", "table", "current", "target", "legal"), ALL_PAIRS)
def test_every_pair_is_legal_or_raises(name, table, current, target, legal):
    if legal:
        assert check(name, table, current, target) == table[(current, target)]
    else:
        with pytest.raises(errors.IllegalTransition) as info:
            check(name, table, current, target)
        exc = info.value
        assert exc.details == {
            "entity": name,
            "from_state": str(current),
            "to_state": str(target),
        }
        assert name in str(exc) and str(current) in str(exc) and str(target) in str(exc)
        assert isinstance(exc, errors.Conflict)


def test_pair_enumeration_is_complete():
    expected = sum(len(enum) ** 2 for enum, _, _ in MACHINES.values())
    assert len(ALL_PAIRS) == expected == 7 * 7 + 6 * 6 + 8 * 8 + 6 * 6
    legal = sum(1 for p in ALL_PAIRS if p.values[-1])
    assert legal == sum(len(t) for _, t, _ in MACHINES.values())


def test_run_machine_is_exactly_the_spec_diagram_plus_budget_denial():
    assert dict(RUN_TRANSITIONS) == {**SPEC_RUN_DIAGRAM, **DOCUMENTED_RUN_EXTRAS}
    assert set(RUN_TRANSITIONS) - set(SPEC_RUN_DIAGRAM) == set(DOCUMENTED_RUN_EXTRAS)


def test_approval_machine_is_exactly_the_spec_diagram():
    assert dict(APPROVAL_TRANSITIONS) == SPEC_APPROVAL_DIAGRAM


def test_step_and_attempt_machines_are_the_designed_tables():
    assert set(STEP_TRANSITIONS) == {
        (St.PENDING, St.RUNNING),
        (St.RUNNING, St.PENDING),
        (St.RUNNING, St.SUCCEEDED),
        (St.RUNNING, St.FAILED),
        (St.RUNNING, St.CANCELLED),
        (St.PENDING, St.CANCELLED),
        (St.PENDING, St.SUCCEEDED),  # an operator resolved the attempt it awaited a retry after
        (St.PENDING, St.SKIPPED),  # its condition is false, or its dependencies were skipped
    }
    assert set(ATTEMPT_TRANSITIONS) == {
        (A.DISPATCHED, A.LEASED),
        (A.DISPATCHED, A.CANCELLED),
        (A.LEASED, A.SUCCEEDED),
        (A.LEASED, A.FAILED),
        (A.LEASED, A.UNCERTAIN),
        (A.LEASED, A.CANCELLED),
        (A.LEASED, A.TIMED_OUT),
        # Parked while a human decides (no lease), back to Dispatched after the decision.
        (A.LEASED, A.PARKED),
        (A.PARKED, A.DISPATCHED),
        (A.PARKED, A.CANCELLED),
    }
    # The attempt can reach every outcome a worker or reconciler records, and nothing else.
    assert {t for (_, t) in ATTEMPT_TRANSITIONS} == set(AttemptState)


@pytest.mark.parametrize("name", list(MACHINES))
def test_terminal_states_have_no_exits_and_non_terminal_states_do(name):
    enum, table, _ = MACHINES[name]
    sources = {current for (current, _) in table}
    for state in enum:
        if state.terminal:
            assert state not in sources, f"{name} terminal {state} has an exit"
        else:
            assert state in sources, f"{name} non-terminal {state} is a dead end"


@pytest.mark.parametrize("name", list(MACHINES))
def test_every_state_is_reachable_from_the_initial_state(name):
    enum, table, initial = MACHINES[name]
    seen = {initial}
    queue = deque([initial])
    while queue:
        current = queue.popleft()
        for source, target in table:
            if source is current and target not in seen:
                seen.add(target)
                queue.append(target)
    assert seen == set(enum)


@pytest.mark.parametrize("name", list(MACHINES))
def test_no_self_loops(name):
    _, table, _ = MACHINES[name]
    assert all(current is not target for (current, target) in table)


def test_terminal_vocabularies():
    assert {s for s in RunState if s.terminal} == {R.COMPLETED, R.FAILED, R.CANCELLED}
    assert {s for s in StepState if s.terminal} == {
        St.SUCCEEDED,
        St.FAILED,
        St.CANCELLED,
        St.SKIPPED,
    }
    assert {s for s in AttemptState if not s.terminal} == {A.DISPATCHED, A.LEASED, A.PARKED}
    assert {s for s in ApprovalState if not s.terminal} == {Ap.PENDING}


_machine_and_pair = st.sampled_from(list(MACHINES)).flatmap(
    lambda name: st.tuples(
        st.just(name),
        st.sampled_from(list(MACHINES[name][0])),
        st.sampled_from(list(MACHINES[name][0])),
    )
)


@given(_machine_and_pair)
def test_check_accepts_exactly_the_table(case):
    name, current, target = case
    _, table, _ = MACHINES[name]
    try:
        cause = check(name, table, current, target)
    except errors.IllegalTransition as exc:
        assert (current, target) not in table
        # The refusal crosses process boundaries as itself.
        clone = pickle.loads(pickle.dumps(exc))
        assert type(clone) is errors.IllegalTransition and clone.details == exc.details
    else:
        assert cause == table[(current, target)]


@given(st.lists(st.sampled_from(list(RunState)), min_size=1, max_size=12))
def test_a_run_walk_is_legal_iff_every_hop_is_in_the_table(path):
    walk = [R.ACCEPTED, *path]
    hops = list(itertools.pairwise(walk))
    legal = all(hop in RUN_TRANSITIONS for hop in hops)
    try:
        for current, target in hops:
            check("Run", RUN_TRANSITIONS, current, target)
    except errors.IllegalTransition:
        assert not legal
    else:
        assert legal
        # A legal walk never leaves a terminal state.
        assert all(not s.terminal for s in walk[:-1])


def test_check_works_on_any_strenum_table():
    class Light(StrEnum):
        RED = "red"
        GREEN = "green"

    table = {(Light.RED, Light.GREEN): "Go"}
    assert check("Light", table, Light.RED, Light.GREEN) == "Go"
    with pytest.raises(errors.IllegalTransition):
        check("Light", table, Light.GREEN, Light.RED)


# ---------------------------------------------------------------------- commands by run state

# Which run states admit each command, written out: a change to RUN_COMMANDS is a change here.
LIVE = {R.ACCEPTED, R.RUNNING, R.WAITING_FOR_APPROVAL, R.CANCELLING}
ADMITTED = {
    RunCommand.DISPATCH: {R.ACCEPTED, R.RUNNING},  # invariant 4
    RunCommand.ACQUIRE_LEASE: {R.RUNNING},
    RunCommand.REQUEST_APPROVAL: {R.RUNNING, R.WAITING_FOR_APPROVAL},
    RunCommand.CANCEL: {R.ACCEPTED, R.RUNNING, R.WAITING_FOR_APPROVAL},
    RunCommand.SUSPEND: {R.RUNNING, R.WAITING_FOR_APPROVAL},
    RunCommand.RESUME: {R.ACCEPTED, R.RUNNING, R.WAITING_FOR_APPROVAL},
    RunCommand.RETRY_STEP: {R.RUNNING},
    RunCommand.USE_TOOL_CALL: LIVE,
    RunCommand.START_TOOL_CALL: LIVE - {R.CANCELLING},
    RunCommand.ENFORCE_DEADLINES: LIVE - {R.WAITING_FOR_APPROVAL},
    RunCommand.EXPIRE_LEASE: set(RunState) - {R.WAITING_FOR_APPROVAL},
    RunCommand.SIGNAL: LIVE - {R.CANCELLING},  # issue 22: a finished run takes no signal
}


def test_every_command_has_its_guard():
    assert set(RUN_COMMANDS) == set(RunCommand) == set(ADMITTED)
    assert {c: set(g.allowed) for c, g in RUN_COMMANDS.items()} == ADMITTED


@pytest.mark.parametrize(
    ("command", "state"), list(itertools.product(RunCommand, RunState)), ids=str
)
def test_a_command_is_admitted_or_refused_by_its_table(command, state):
    admitted = state in ADMITTED[command]
    assert allows(command, state) is admitted
    error = refusal(command, state)
    if admitted:
        assert error is None
        require(command, state)
        return
    assert isinstance(error, errors.RunControlError)
    with pytest.raises(type(error)):
        require(command, state)
    # A refusal crosses process boundaries as itself.
    clone = pickle.loads(pickle.dumps(error))
    assert type(clone) is type(error) and clone.details == error.details


@pytest.mark.parametrize("command", [RunCommand.SUSPEND, RunCommand.RESUME, RunCommand.RETRY_STEP])
def test_an_operator_control_refuses_a_finished_run_as_terminal(command):
    for state in RunState:
        error = refusal(command, state)
        if state.terminal:
            assert isinstance(error, errors.RunTerminal), state
            assert "rerun it instead" in str(error)
        elif state is R.CANCELLING:
            assert type(error) is errors.IllegalTransition
            assert error.details == {"run_state": "Cancelling"}


def test_refusals_name_the_state_they_refuse_in():
    error = refusal(RunCommand.ACQUIRE_LEASE, R.WAITING_FOR_APPROVAL)
    assert isinstance(error, errors.LeaseRejected)
    assert str(error) == "no lease while the run is WaitingForApproval"
    assert error.details == {"run_state": "WaitingForApproval"}
    refused = refusal(RunCommand.START_TOOL_CALL, R.CANCELLING)
    assert isinstance(refused, errors.ToolCallRefused) and refused.details == {}


def test_the_tables_beside_the_machines():
    """An operator's suspension is a machine of its own (Active <-> Suspended); a retry of a
    Pending step is a journaled self-loop, kept out of the step machine (which has none)."""
    assert dict(SUSPENSION_TRANSITIONS) == {
        (Suspension.ACTIVE, Suspension.SUSPENDED): "SuspendRequested",
        (Suspension.SUSPENDED, Suspension.ACTIVE): "ResumeRequested",
    }
    assert dict(STEP_CONTROLS) == {(St.PENDING, St.PENDING): "RetryRequested"}
    assert not set(STEP_CONTROLS) & set(STEP_TRANSITIONS)
    with pytest.raises(errors.IllegalTransition):
        check("Run", SUSPENSION_TRANSITIONS, Suspension.SUSPENDED, Suspension.SUSPENDED)
