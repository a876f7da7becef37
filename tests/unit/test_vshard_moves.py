"""A shard's move as a step machine (``domain/moves.py``): the order its journal follows, when it
may still be aborted, and when its tenants' rows count as quiet."""

from __future__ import annotations

import pytest

from runcontrol.domain.moves import ENDED, ORDER, Step, after, flipped, may_abort, quiet


def test_the_steps_run_in_one_order_to_done():
    step, seen = Step.MARKING, [Step.MARKING]
    while step is not Step.DONE:
        step = after(step)
        seen.append(step)
    assert tuple(seen) == ORDER
    assert seen.index(Step.FENCING) < seen.index(Step.COPYING) < seen.index(Step.VERIFYING)
    assert seen.index(Step.VERIFYING) < seen.index(Step.FLIPPING) < seen.index(Step.CLEANING)
    for ended in ENDED:
        with pytest.raises(ValueError, match="no next step"):
            after(ended)


def test_a_move_may_be_aborted_until_its_flip_has_run():
    before_flip = ORDER[: ORDER.index(Step.FLIPPING) + 1]  # a flip not journaled may not have run
    assert all(may_abort(s) and not flipped(s) for s in before_flip)
    assert not any(may_abort(s) for s in (*ORDER[len(before_flip) :], Step.ABORTED))
    assert flipped(Step.RESUMING) and flipped(Step.DONE) and not flipped(Step.ABORTED)


def test_quiet_needs_the_same_fingerprint_for_the_whole_window():
    assert not quiet([], 1.0)
    assert not quiet([(0.0, "a"), (0.5, "a")], 1.0)  # not watched for the window yet
    assert quiet([(0.0, "a"), (0.5, "a"), (1.0, "a")], 1.0)
    assert not quiet([(0.0, "a"), (0.5, "b"), (1.0, "b")], 1.0)  # changed inside it
    assert quiet([(0.0, "a"), (0.5, "b"), (1.0, "b"), (1.5, "b")], 1.0)
    assert not quiet([(0.0, "a"), (1.0, "a"), (1.2, "c")], 1.0)
