"""``RunAggregate``: every rule about a run, its steps, attempts, leases and approvals.

The aggregate is pure: commands take a ``CommandContext`` (clock reading, id source, jitter,
actor) and ``Options``, mutate the in-memory entities, and record what must be persisted in one
transaction: changed entities, outbox events, journal entries and audit records. Validation
always happens before the first mutation, so a command that raises leaves the aggregate as it
was, except for audit records that must be kept even when the command is refused.

Each concern is a module of its own, built on ``settlement`` (how attempts and the run settle),
``leases`` and ``core`` (state, bookkeeping, the machines' moves); which command a run's state
admits is the ``RUN_COMMANDS`` table of ``runcontrol.domain.machines``.
"""

from __future__ import annotations

from .approvals import Approvals
from .cancellation import Cancellation
from .controls import Controls
from .outcomes import Outcomes
from .progress import Progress
from .restore import Restore
from .submission import Submissions
from .tool_calls import ToolCalls
from .usage import RateUsage


class RunAggregate(
    Submissions,
    Outcomes,
    Approvals,
    Cancellation,
    Progress,
    ToolCalls,
    Controls,
    Restore,
    RateUsage,
):
    """One run's rules, by concern (see the modules of ``runcontrol.domain.run``)."""
