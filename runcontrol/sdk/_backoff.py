"""Pauses between tries, and which failures are worth the same command again."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from ..domain import errors
from ..domain.backoff import backoff_delay


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with full jitter, capped (``domain.backoff``); both the draw and the
    sleep are injectable, so tests move a clock instead of sleeping."""

    base_s: float = 0.2
    # Under a host's exchange deadline (5 s, workers.sessions): a retrying session stays live.
    cap_s: float = 4.0
    uniform: Callable[[float, float], float] = random.uniform
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep

    def delay(self, failures: int) -> float:
        return backoff_delay(
            failures, base_seconds=self.base_s, cap_seconds=self.cap_s, uniform=self.uniform
        )


def transient(exc: BaseException) -> bool:
    """Whether sending the same command again may succeed (the error says so, or the
    connection failed and nobody knows whether the command ran)."""
    return bool(getattr(exc, "retryable", False)) or isinstance(
        exc, errors.Unavailable | ConnectionError | TimeoutError
    )
