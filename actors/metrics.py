"""The spec's metrics, exported through Ray's metrics (Prometheus on each node's agent), and one
OpenTelemetry span per grain command.

Ray metric names allow no dots, so ``connectsoft.factory.runs.accepted`` is exported as
``connectsoft_factory_runs_accepted`` (what a Prometheus exporter would write anyway).
No prompt, input or artifact content is ever put in a tag, a span or a log line.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any
from uuid import UUID

from opentelemetry import trace
from ray.util.metrics import Counter, Gauge, Histogram

from runcontrol.commands import Command
from runcontrol.domain import Event, RunAggregate

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

    def observe(self, agg: RunAggregate, events: Sequence[Event]) -> None:
        """Count what a commit recorded (a grain observer: ``GrainEnv.observers``)."""
        tenant = agg.run.tenant_id
        for event in events:
            kind = event.event_type
            if kind == "RunAccepted":
                tags = {"tenant": tenant, "project": agg.run.project_id}
                self.runs_accepted.inc(1, {**tags, "workflow": agg.run.workflow_id})
            elif kind == "LeaseExpired":
                self.leases_expired.inc(1, {"tenant": tenant})
            elif kind == "AttemptOutcomeRecorded" and event.attempt_id in agg.attempts:
                attempt = agg.attempts[event.attempt_id]
                if attempt.settled_at is not None:
                    self.attempt_duration.observe(
                        (attempt.settled_at - attempt.dispatched_at).total_seconds(),
                        {
                            "tenant": tenant,
                            "agent": agg.step(attempt.step_id).agent_id,
                            "outcome": str(attempt.outcome),
                        },
                    )
            elif kind == "ApprovalDecided":
                approval = agg.approvals.get(UUID(event.payload["approvalId"]))
                if approval is not None and approval.decided_at is not None:
                    self.approval_age.observe(
                        (approval.decided_at - approval.created_at).total_seconds(),
                        {"tenant": tenant, "actionClass": str(approval.action_class)},
                    )


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
def command_span(command: Command[Any]) -> Iterator[Any]:
    """One span per command, with the ids the spec names (never payloads)."""
    with _tracer.start_as_current_span(f"RunGrain.{type(command).__name__}") as span:
        _describe(span, command)
        yield span


def start_command_span(command: Command[Any]) -> Any:
    """``command_span`` for a command that ends elsewhere (the caller ends the span): the
    commands a host commits together each keep their own span."""
    span = _tracer.start_span(f"RunGrain.{type(command).__name__}")
    _describe(span, command)
    return span


def _describe(span: Any, command: Command[Any]) -> None:
    span.set_attribute("tenant.id", command.tenant_id)
    span.set_attribute("run.id", str(command.run_id))
    span.set_attribute("command.id", command.command_id)
    for name in ("attempt_id", "approval_id"):
        value = getattr(command, name, None)
        if value is not None:
            span.set_attribute(name.replace("_", "."), str(value))
