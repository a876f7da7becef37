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

from opentelemetry import trace
from ray.util.metrics import Counter, Gauge, Histogram

from runcontrol.commands import Command
from runcontrol.domain import Event, RunAggregate
from runcontrol.domain.events import ApprovalDecided
from runcontrol.domain.replay import REPLAY_DECIDER
from runcontrol.domain.run.values import APPROVAL_EXPIRY
from runcontrol.domain.templates import TEMPLATE_DECIDER
from runcontrol.reconcilers import GaugeSample
from runcontrol.telemetry import Carrier, parent_context, tracing

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
        # By whom a request was decided: a human, a run template's pre-approval (issue 44),
        # the expiry reconciler (its policy's expiry action).
        self.approvals_decided = Counter(
            "connectsoft_factory_approvals_decided",
            description="Approval requests decided, by who decided them.",
            tag_keys=("tenant", "by"),
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
            elif isinstance(event.body, ApprovalDecided):
                approval = agg.approvals.get(event.body.approval_id)
                if approval is not None and approval.decided_at is not None:
                    self.approval_age.observe(
                        (approval.decided_at - approval.created_at).total_seconds(),
                        {"tenant": tenant, "actionClass": str(approval.action_class)},
                    )
                    by = decided_by(approval.decided_by)
                    self.approvals_decided.inc(1, {"tenant": tenant, "by": by})


def decided_by(subject: str | None) -> str:
    """The ``by`` tag of a decision: ``template``, ``replay`` (the original run's decision
    reused, docs/replay.md), ``expiry`` or ``human``."""
    if subject is not None and subject.startswith(TEMPLATE_DECIDER):
        return "template"
    if subject is not None and subject.startswith(REPLAY_DECIDER):
        return "replay"
    return "expiry" if subject == APPROVAL_EXPIRY else "human"


class SchedulerMetrics:
    """The scheduler's instruments: the outbox lag of each published event, and gauges
    sampled from the database (``Scheduler.sample_gauges``)."""

    def __init__(self) -> None:
        self.outbox_lag = Histogram(
            "connectsoft_factory_outbox_lag",
            description="Time between commit and publication (s), per published event.",
            boundaries=[0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10, 30, 60, 300],
            tag_keys=("host",),
        )
        self.runs_active = Gauge(
            "connectsoft_factory_runs_active",
            description="Runs by non-terminal state.",
            tag_keys=("tenant", "state"),
        )
        # The spec's pending_age histogram sees an approval only once decided or expired;
        # these say how long the ones still waiting have waited (an alert wants that).
        self.approvals_pending = Gauge(
            "connectsoft_factory_approvals_pending",
            description="Approval requests still pending.",
            tag_keys=("tenant",),
        )
        self.approvals_pending_oldest = Gauge(
            "connectsoft_factory_approvals_pending_oldest_age",
            description="Age of the oldest pending approval request (s).",
            tag_keys=("tenant",),
        )
        # Likewise the lag histogram sees an event once published: a stuck relay shows here.
        self.outbox_unpublished = Gauge(
            "connectsoft_factory_outbox_unpublished",
            description="Committed events not yet published.",
            tag_keys=("host",),
        )
        self.outbox_unpublished_oldest = Gauge(
            "connectsoft_factory_outbox_unpublished_oldest_age",
            description="Age of the oldest committed event not yet published (s); 0: none.",
            tag_keys=("host",),
        )
        # Work no worker takes, per tenant and agent: readiness no longer says it (a tenant
        # without workers made every replica unready for all tenants: issue 23).
        self.dispatch_stalled = Gauge(
            "runcontrol_dispatch_stalled_attempts",
            description="Dispatched attempts waiting over api.dispatch_stall_seconds while no "
            "attempt of that tenant's agent was claimed.",
            tag_keys=("tenant", "agent"),
        )
        # Flow control (issue 21): runs held for a concurrency key's slot (or the tenant's
        # cap), per key family; the oldest's age says a queue does not move.
        self.flow_waiting = Gauge(
            "runcontrol_flow_waiting_runs",
            description="Runs held for a slot of a concurrency key (kind capacity: the "
            "tenant's cap on open attempts), summed over the family's keys.",
            tag_keys=("tenant", "kind", "name"),
        )
        self.flow_waiting_oldest = Gauge(
            "runcontrol_flow_waiting_oldest_age",
            description="Age of the oldest run held for a slot of the family's keys (s).",
            tag_keys=("tenant", "kind", "name"),
        )
        # Pending steps a hold keeps waiting (a rate limit: kind rate-limit), per tenant.
        self.steps_held = Gauge(
            "runcontrol_steps_held",
            description="Pending steps held until their reservation's instant (rate limits).",
            tag_keys=("tenant", "kind"),
        )
        # Each rate-limit bucket's units a dispatch could take now (0: dispatches wait).
        self.rate_tokens = Gauge(
            "runcontrol_rate_limit_tokens",
            description="Units a rate-limit bucket would admit now without waiting.",
            tag_keys=("tenant", "bucket"),
        )
        self._sampled: dict[str, set[tuple[tuple[str, str], ...]]] = {}

    def observe_relay(self, lags: Sequence[float]) -> None:
        # One observation per event: 8-23 us each measured here (2 cores, load ~48), so at
        # the commit ceiling (~5,000 events/s) well under a tenth of the scheduler's CPU.
        for lag in lags:
            self.outbox_lag.observe(lag, {"host": "scheduler"})

    def sample(self, gauges: GaugeSample) -> None:
        """Set every sampled gauge; a series sampled before and absent now (no run of that
        tenant in that state any more) is set to 0 rather than left at its last value."""
        self._set(
            "runs_active",
            self.runs_active,
            {(("tenant", t), ("state", s)): n for (t, s), n in gauges.runs_active.items()},
        )
        pending = gauges.approvals_pending
        self._set(
            "approvals_pending",
            self.approvals_pending,
            {(("tenant", t),): n for t, (n, _) in pending.items()},
        )
        self._set(
            "approvals_pending_oldest",
            self.approvals_pending_oldest,
            {(("tenant", t),): age for t, (_, age) in pending.items()},
        )
        self._set(
            "dispatch_stalled",
            self.dispatch_stalled,
            {(("tenant", t), ("agent", a)): n for (t, a), n in gauges.stalled.items()},
        )
        waiting = {
            (("tenant", t), ("kind", k), ("name", n or "-")): v
            for (t, k, n), v in gauges.flow_waiting.items()
        }
        self._set("flow_waiting", self.flow_waiting, {t: n for t, (n, _) in waiting.items()})
        self._set(
            "flow_waiting_oldest",
            self.flow_waiting_oldest,
            {t: age for t, (_, age) in waiting.items()},
        )
        self._set(
            "steps_held",
            self.steps_held,
            {(("tenant", t), ("kind", k)): n for (t, k), n in gauges.held.items()},
        )
        self._set(
            "rate_tokens",
            self.rate_tokens,
            {(("tenant", t), ("bucket", b)): n for (t, b), n in gauges.rate_tokens.items()},
        )
        host = (("host", "scheduler"),)
        self.outbox_unpublished.set(gauges.outbox_unpublished, dict(host))
        self.outbox_unpublished_oldest.set(gauges.outbox_oldest_age, dict(host))

    def _set(
        self, name: str, gauge: Gauge, values: dict[tuple[tuple[str, str], ...], float]
    ) -> None:
        for tags in self._sampled.get(name, set()) - values.keys():
            gauge.set(0, dict(tags))
        for tags, value in values.items():
            gauge.set(value, dict(tags))
        self._sampled[name] = set(values)


@contextmanager
def command_span(command: Command[Any], carrier: Carrier | None = None) -> Iterator[Any]:
    """One span per command, with the ids the spec names (never payloads); the child of the
    edge span that sent the command when its trace context came along (``carrier``). None
    while this process exports no spans: the no-op tracer's span and context switch still
    cost ~5% of a run host's samples (py-spy, issue 33)."""
    if not tracing():
        yield trace.INVALID_SPAN
        return
    with _tracer.start_as_current_span(
        f"RunGrain.{type(command).__name__}", context=parent_context(carrier)
    ) as span:
        _describe(span, command)
        yield span


@contextmanager
def job_span(job: str, runs: int) -> Iterator[None]:
    """One span per scheduler job that found runs to wake: their commands are its children."""
    with _tracer.start_as_current_span(f"Scheduler.{job}", attributes={"runs.woken": runs}):
        yield


def _describe(span: Any, command: Command[Any]) -> None:
    span.set_attribute("tenant.id", command.tenant_id)
    span.set_attribute("run.id", str(command.run_id))
    span.set_attribute("command.id", command.command_id)
    for name in ("attempt_id", "approval_id"):
        value = getattr(command, name, None)
        if value is not None:
            span.set_attribute(name.replace("_", "."), str(value))
