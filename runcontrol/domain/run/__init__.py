"""The run aggregate, by concern: ``RunAggregate`` and what its commands take and answer."""

from .aggregate import RunAggregate
from .usage import RateConsumed
from .values import (
    APPROVAL_EXPIRY,
    LIFETIME_EXCEEDED,
    PROGRESS_BATCH_MAX,
    RESTORE_CHECK,
    RESTORED_FROM_BACKUP,
    RUN_CONTROL,
    WALL_CLOCK_EXCEEDED,
    WORKER_OUTCOMES,
    Changes,
    CommandContext,
    FlowGate,
    LeaseGrant,
    Options,
    Principal,
    Submission,
)

__all__ = [
    "APPROVAL_EXPIRY",
    "LIFETIME_EXCEEDED",
    "PROGRESS_BATCH_MAX",
    "RESTORED_FROM_BACKUP",
    "RESTORE_CHECK",
    "RUN_CONTROL",
    "WALL_CLOCK_EXCEEDED",
    "WORKER_OUTCOMES",
    "Changes",
    "CommandContext",
    "FlowGate",
    "LeaseGrant",
    "Options",
    "Principal",
    "RateConsumed",
    "RunAggregate",
    "Submission",
]
