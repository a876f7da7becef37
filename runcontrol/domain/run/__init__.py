"""The run aggregate: the run's state as data (``core.RunAggregate``: its entities and what a
command records), and its rules as functions over it, one module per concern (``submission``,
``leases``, ``outcomes``, ``settlement``, ``approvals``, ``cancellation``, ``progress``,
``tool_calls``, ``journaled_calls``, ``controls``, ``restore``, ``waits``, ``children``,
``usage``), each taking the state first.

The rules are pure: they take a ``CommandContext`` (clock reading, id source, jitter, actor)
and ``Options``, change the in-memory entities, and record what must be persisted in one
transaction: changed entities, outbox events, journal entries and audit records. Validation
always happens before the first change, so a rule that raises leaves the state as it was,
except for audit records that must be kept even when the command is refused. Which command a
run's state admits is the ``RUN_COMMANDS`` table of ``runcontrol.domain.machines``.
"""

from .changes import Changes
from .core import RunAggregate
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
