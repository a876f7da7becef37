"""Typed errors: stable unique codes, and they pickle by value (they cross the Ray boundary)."""

from __future__ import annotations

import copy
import pickle

import pytest

from runcontrol.domain import errors
from runcontrol.domain.errors import RunControlError


def _subclasses(cls: type) -> list[type]:
    found = []
    for sub in cls.__subclasses__():
        found.append(sub)
        found.extend(_subclasses(sub))
    return found


ALL_ERRORS = [RunControlError, *_subclasses(RunControlError)]
# Only the classes defined by the domain module (tests elsewhere might subclass).
DOMAIN_ERRORS = [c for c in ALL_ERRORS if c.__module__ == errors.__name__]
ERROR_IDS = [c.__name__ for c in DOMAIN_ERRORS]


def test_every_error_class_in_the_module_is_discovered():
    declared = {
        obj
        for obj in vars(errors).values()
        if isinstance(obj, type) and issubclass(obj, RunControlError)
    }
    assert declared == set(DOMAIN_ERRORS)
    assert len(DOMAIN_ERRORS) >= 30


def test_codes_are_unique_and_well_formed():
    codes = [c.code for c in DOMAIN_ERRORS]
    assert len(codes) == len(set(codes)), sorted(codes)
    for code in codes:
        assert code == code.strip().lower()
        assert " " not in code and code


@pytest.mark.parametrize("cls", DOMAIN_ERRORS, ids=ERROR_IDS)
def test_each_subclass_declares_its_own_code(cls):
    if cls is not RunControlError:
        assert "code" in vars(cls), f"{cls.__name__} inherits its parent's code"


@pytest.mark.parametrize("cls", DOMAIN_ERRORS, ids=ERROR_IDS)
@pytest.mark.parametrize("protocol", [pickle.DEFAULT_PROTOCOL, pickle.HIGHEST_PROTOCOL, 2])
def test_pickles_by_value(cls, protocol):
    original = cls(
        f"{cls.__name__} happened",
        run_id="0000-1",
        attempt_id="0000-2",
        current_version=3,
        nested={"tokens": [1, 2], "ok": True},
    )
    clone = pickle.loads(pickle.dumps(original, protocol=protocol))
    assert type(clone) is cls
    assert clone is not original
    assert clone.message == original.message == f"{cls.__name__} happened"
    assert str(clone) == str(original)
    assert clone.args == original.args
    assert clone.details == original.details
    assert clone.details["nested"] == {"tokens": [1, 2], "ok": True}
    assert clone.code == cls.code
    assert clone.retryable == cls.retryable
    assert isinstance(clone, RunControlError)


@pytest.mark.parametrize("cls", DOMAIN_ERRORS, ids=ERROR_IDS)
def test_pickles_without_message_or_details(cls):
    original = cls()
    assert original.message == cls.code == str(original)
    assert original.details == {}
    clone = pickle.loads(pickle.dumps(original))
    assert type(clone) is cls
    assert clone.message == cls.code
    assert clone.details == {}


@pytest.mark.parametrize("cls", DOMAIN_ERRORS, ids=ERROR_IDS)
def test_copies_and_raises_as_itself(cls):
    clone = copy.deepcopy(cls("boom", key="value"))
    with pytest.raises(cls) as info:
        raise pickle.loads(pickle.dumps(clone))
    assert info.value.details == {"key": "value"}


def test_details_do_not_leak_between_instances():
    a = errors.StaleFencingToken("a", attempt_id="1")
    b = errors.StaleFencingToken("b")
    assert b.details == {}
    assert a.details == {"attempt_id": "1"}


def test_hierarchy_lets_edges_map_families():
    assert issubclass(errors.StaleFencingToken, errors.LeaseRejected)
    assert issubclass(errors.LeaseNotHeld, errors.LeaseRejected)
    assert issubclass(errors.LeaseExpired, errors.LeaseRejected)
    assert issubclass(errors.LeaseRejected, errors.Conflict)
    assert issubclass(errors.IllegalTransition, errors.Conflict)
    assert issubclass(errors.IdempotencyConflict, errors.Conflict)
    assert issubclass(errors.ApprovalVersionMismatch, errors.Conflict)
    assert issubclass(errors.ApprovalAlreadyDecided, errors.Conflict)
    assert issubclass(errors.ProposalHashMismatch, errors.Conflict)
    assert issubclass(errors.SeparationOfDuties, errors.Forbidden)
    assert issubclass(errors.BreakGlassReasonRequired, errors.ValidationFailed)
    assert issubclass(errors.RunNotFound, errors.NotFound)
    assert issubclass(errors.ApprovalNotFound, errors.NotFound)
    # 410 Gone is neither a conflict nor a not-found.
    assert not issubclass(errors.ApprovalGone, errors.Conflict | errors.NotFound)


def test_retryable_flags():
    retryable = {c for c in DOMAIN_ERRORS if c.retryable}
    assert retryable == {
        errors.ConcurrencyConflict,
        errors.LeaseHeld,
        errors.CapacityDenied,
        errors.FlowDenied,
        errors.Unavailable,
        errors.Draining,
        errors.PreApprovalUsedUp,
        errors.ShardMoving,  # its shard moves: send it again after Retry-After
        errors.ShardMoved,  # a fence refused it: route it again
    }
