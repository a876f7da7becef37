"""The spec's metrics, exported through Ray's metrics (Prometheus on each node's agent), and one
OpenTelemetry span per grain command.

Ray metric names allow no dots, so ``connectsoft.factory.runs.accepted`` is exported as
``connectsoft_factory_runs_accepted`` (what a Prometheus exporter would write anyway).
No prompt, input or artifact content is ever put in a tag, a span or a log line.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from uuid import UUID

from opentelemetry import trace
from ray.util.metrics import Counter, Gauge, Histogram

from runcontrol.domain import ApprovalRequest, Attempt, LeaseGrant
from runcontrol.grain import SubmitResult

SECONDS_BUCKETS = [0.05, 0.1, 0.5, 1, 5, 15, 60, 300, 1800, 3600, 21600, 86400, 259200]
_tracer = trace.get_tracer("runcontrol")


class HostMetrics:
    """Created once per host actor; records what its commands returned."""

    def __init__(self) -> None:
        self.runs_accepted = Counter(
            "connectsoft_factory_runs_accepted",
            description="Runs accepted.",
            tag_keys=("tenant", "project", "workflow"),
        )
        self.attempt_duration = Histogram(
            "connectsoft_factory_attempts_duration",
            description="Dispatch-to-settle duration of attempts (s).",
            boundaries=SECONDS_BUCKETS,
            tag_keys=("tenant", "agent", "outcome"),
        )
        self.leases_expired = Counter(
            "connectsoft_factory_leases_expired",
            description="Leases reconciled by expiry.",
            tag_keys=("tenant",),
        )
        self.approval_age = Histogram(
            "connectsoft_factory_approvals_pending_age",
            description="Age of pending approvals at decision or expiry (s).",
            boundaries=SECONDS_BUCKETS,
            tag_keys=("tenant", "actionClass"),
        )
        self._agents: dict[UUID, str] = {}

    def observe(self, tenant: str, name: str, args: tuple[Any, ...], result: Any) -> None:
        if name == "submit" and isinstance(result, SubmitResult) and result.created:
            request = args[1]
            self.runs_accepted.inc(
                1,
                {"tenant": tenant, "project": args[0].project_id, "workflow": request.workflow_id},
            )
        elif isinstance(result, LeaseGrant):
            self._agents[result.attempt_id] = result.agent_id
        elif isinstance(result, Attempt) and result.settled_at is not None:
            agent = self._agents.pop(result.attempt_id, "unknown")
            self.attempt_duration.observe(
                (result.settled_at - result.dispatched_at).total_seconds(),
                {"tenant": tenant, "agent": agent, "outcome": str(result.outcome)},
            )
        elif isinstance(result, ApprovalRequest) and result.decided_at is not None:
            self.approval_age.observe(
                (result.decided_at - result.created_at).total_seconds(),
                {"tenant": tenant, "actionClass": str(result.action_class)},
            )
        elif name == "wake" and isinstance(result, list):
            expired = sum(1 for item in result if str(item).startswith("lease-expired:"))
            if expired:
                self.leases_expired.inc(expired, {"tenant": tenant})


class SchedulerMetrics:
    def __init__(self) -> None:
        self.outbox_lag = Histogram(
            "connectsoft_factory_outbox_lag",
            description="Time between commit and publication (s).",
            boundaries=[0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10, 30, 60, 300],
            tag_keys=("host",),
        )
        self.runs_active = Gauge(
            "connectsoft_factory_runs_active",
            description="Runs by non-terminal state.",
            tag_keys=("tenant", "state"),
        )


@contextmanager
def command_span(tenant: str, run_id: UUID, name: str, args: tuple[Any, ...]) -> Iterator[Any]:
    """One span per command, with the ids the spec names (never payloads)."""
    with _tracer.start_as_current_span(f"RunGrain.{name}") as span:
        _describe(span, tenant, run_id, name, args)
        yield span


def start_command_span(tenant: str, run_id: UUID, name: str, args: tuple[Any, ...]) -> Any:
    """``command_span`` for a command that ends elsewhere (the caller ends the span): the
    commands a host commits together each keep their own span."""
    span = _tracer.start_span(f"RunGrain.{name}")
    _describe(span, tenant, run_id, name, args)
    return span


_ATTEMPT_COMMANDS = frozenset(
    {"acquire_lease", "renew_lease", "report_outcome", "request_approval"}
)


def _describe(span: Any, tenant: str, run_id: UUID, name: str, args: tuple[Any, ...]) -> None:
    span.set_attribute("tenant.id", tenant)
    span.set_attribute("run.id", str(run_id))
    if name in _ATTEMPT_COMMANDS:
        attempt = next((a for a in args if isinstance(a, UUID)), None)
        if attempt is not None:
            span.set_attribute("attempt.id", str(attempt))
