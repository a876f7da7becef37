"""Backoff delays: exponential backoff with full jitter (AWS architecture blog, 2015)."""

from __future__ import annotations

from collections.abc import Callable


def backoff_delay(
    attempt_number: int,
    *,
    base_seconds: float,
    cap_seconds: float,
    uniform: Callable[[float, float], float],
) -> float:
    """Delay before attempt ``attempt_number + 1``: uniform(0, min(cap, base * 2**(n-1)))."""
    exponent = max(attempt_number - 1, 0)
    ceiling = min(cap_seconds, base_seconds * (2 ** min(exponent, 62)))
    return uniform(0.0, ceiling)
