"""Exponential backoff with full jitter: delay = uniform(0, min(cap, base * 2**(n-1)))."""

from __future__ import annotations

import random
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runcontrol.domain.backoff import backoff_delay

positive = st.floats(min_value=1e-6, max_value=1e6, allow_nan=False, allow_infinity=False)


def exact_ceiling(n: int, base: float, cap: float) -> float:
    return float(min(Fraction(cap), Fraction(base) * 2 ** (n - 1)))


class Recorder:
    def __init__(self, fraction: float) -> None:
        self.fraction = fraction
        self.calls: list[tuple[float, float]] = []

    def __call__(self, lo: float, hi: float) -> float:
        self.calls.append((lo, hi))
        return lo + (hi - lo) * self.fraction


@given(
    n=st.integers(min_value=1, max_value=2000),
    base=positive,
    cap=positive,
    fraction=st.floats(min_value=0.0, max_value=1.0),
)
def test_delay_is_within_zero_and_the_capped_exponential(n, base, cap, fraction):
    uniform = Recorder(fraction)
    delay = backoff_delay(n, base_seconds=base, cap_seconds=cap, uniform=uniform)
    ceiling = exact_ceiling(n, base, cap)
    assert 0.0 <= delay <= ceiling
    assert delay <= cap
    # Full jitter: exactly one draw over the whole interval [0, ceiling].
    assert len(uniform.calls) == 1
    lo, hi = uniform.calls[0]
    assert lo == 0.0
    assert hi == pytest.approx(ceiling, rel=1e-12)


@given(
    n=st.integers(min_value=1, max_value=200),
    base=positive,
    cap=positive,
    seed=st.integers(min_value=0, max_value=2**32),
)
def test_delay_is_bounded_with_a_real_random_source(n, base, cap, seed):
    delay = backoff_delay(
        n, base_seconds=base, cap_seconds=cap, uniform=random.Random(seed).uniform
    )
    assert 0.0 <= delay <= exact_ceiling(n, base, cap)


@pytest.mark.parametrize(
    ("n", "expected_ceiling"),
    [(1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0), (5, 16.0), (9, 256.0), (10, 300.0), (60, 300.0)],
)
def test_ceiling_doubles_until_the_cap(n, expected_ceiling):
    upper = backoff_delay(n, base_seconds=1.0, cap_seconds=300.0, uniform=lambda lo, hi: hi)
    lower = backoff_delay(n, base_seconds=1.0, cap_seconds=300.0, uniform=lambda lo, hi: lo)
    assert upper == expected_ceiling
    assert lower == 0.0


@given(n=st.integers(min_value=1, max_value=500), base=positive, cap=positive)
def test_ceiling_never_decreases_with_the_attempt_number(n, base, cap):
    def top(k: int) -> float:
        return backoff_delay(k, base_seconds=base, cap_seconds=cap, uniform=lambda lo, hi: hi)

    assert top(n) <= top(n + 1)


@pytest.mark.parametrize("n", [0, -1, -100])
def test_attempt_numbers_below_one_use_the_base(n):
    assert backoff_delay(n, base_seconds=2.5, cap_seconds=60.0, uniform=lambda lo, hi: hi) == 2.5


def test_huge_attempt_numbers_do_not_overflow():
    delay = backoff_delay(10**9, base_seconds=1.0, cap_seconds=30.0, uniform=lambda lo, hi: hi)
    assert delay == 30.0


def test_the_injected_uniform_decides_the_value():
    assert backoff_delay(3, base_seconds=1, cap_seconds=100, uniform=lambda lo, hi: 1.25) == 1.25
