"""The spec's metrics on the Prometheus endpoint, and the spans over OTLP, after one scripted
run of the real service (``runcontrol up`` in a child process, ``conftest.py``).

The script, all over HTTP and gRPC as users and a worker would do it, in one fresh tenant:

- run A (approval gate): submitted, leased, approval requested, approved, completed;
- run B (approval gate): submitted, leased, approval requested and left pending;
- run C (no gate): submitted, leased, and the lease left to expire (then retried).

Ray's metrics agent exports what each process recorded with a delay: every assertion polls
the endpoint until the values are there (a bounded wait), never a fixed sleep.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import httpx
import pytest
from api_harness import TenantView, decision, new_tenant, proposal, wait_until
from grpc_harness import GrpcTenant
from otlp_receiver import ReceivedSpan
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import text

from runcontrol.api.auth import RUNTIME
from runcontrol.domain import Role, SideEffectClass
from runcontrol.store.queries import UNPUBLISHED_SQL
from schemas import runcontrol_pb2 as pb
from schemas import runcontrol_pb2_grpc as pb_grpc

pytestmark = pytest.mark.slow

TERMINAL = {"Completed", "Failed", "Cancelled"}


@dataclass
class Script:
    tenant: str
    gated_workflow: str
    plain_workflow: str
    runs: dict[str, str]  # "A", "B", "C" -> runId
    approvals: dict[str, str] = field(default_factory=dict)  # "A", "B" -> approvalId
    times: dict[str, float] = field(default_factory=dict)  # wall-clock marks (time.time())


@dataclass
class _Runtime:
    """What ``TenantView`` needs of a runtime: the container it publishes releases with."""

    container: Any


@pytest.fixture(scope="module")
def script(service: Any) -> Iterator[Script]:
    tenant = new_tenant()
    runtime = _Runtime(service.container)
    gated = TenantView(service.api, runtime, tenant)
    plain = TenantView(service.api, runtime, tenant)
    gated.publish(gate="approval", side_effect=SideEffectClass.READ)
    plain.publish()
    with grpc.insecure_channel(service.grpc_target) as channel:
        worker = GrpcTenant(gated, service.api, channel).worker()
        facts = Script(tenant, gated.workflow, plain.workflow, {})
        try:
            for name in ("A", "B"):
                run_id = gated.submit()
                facts.runs[name] = run_id
                lease = worker.claimed([gated.agent], run_id)
                facts.times[f"{name}.requested.before"] = time.time()
                response = worker.request_approval(worker.approval_request(lease, proposal()))
                facts.times[f"{name}.requested.after"] = time.time()
                facts.approvals[name] = response.approval.approval_id
                pending = gated.wait_state(run_id, "WaitingForApproval")["pendingApprovals"]
                if name == "A":
                    answer = gated.reviewer().post(
                        f"/factory/approvals/{facts.approvals['A']}/decision",
                        json=decision(pending[0]),
                    )
                    assert answer.status_code == 200, answer.text
                    facts.times["A.decided.after"] = time.time()
                    gated.wait_state(run_id, "Running")
                    # the decision resumed the parked attempt: claim it again and report
                    resumed = worker.claimed([gated.agent], run_id)
                    worker.report(worker.report_request(resumed))
                    gated.wait_state(run_id, "Completed")
            run_c = plain.submit()
            facts.runs["C"] = run_c
            worker.claimed([plain.agent], run_c)  # and never renewed
            wait_until(lambda: _events(plain, run_c, "LeaseExpired"), timeout=60)
            yield facts
        finally:
            gated.close()
            plain.close()


def _events(view: TenantView, run_id: str, kind: str) -> list[dict[str, Any]]:
    answer = view.requester().get(f"/factory/runs/{run_id}/events/history")
    assert answer.status_code == 200, answer.text
    body = answer.json()
    items = body["items"] if isinstance(body, dict) else body
    return [e for e in items if e["type"] == kind]


# ---------------------------------------------------------------------- Prometheus


Samples = list[tuple[str, dict[str, str], float]]


def scrape(url: str) -> Samples:
    answer = httpx.get(url, timeout=10)
    assert answer.status_code == 200
    return [
        (sample.name, dict(sample.labels), float(sample.value))
        for family in text_string_to_metric_families(answer.text)
        for sample in family.samples
    ]


def value(samples: Samples, name: str, **labels: str) -> float | None:
    """The sum of the samples named ``ray_<name>`` whose labels include ``labels``."""
    found = [
        v
        for n, tags, v in samples
        if n == f"ray_{name}" and all(tags.get(k) == w for k, w in labels.items())
    ]
    return sum(found) if found else None


def at_most(samples: Samples, name: str, bound: float, **labels: str) -> float:
    """How many observations of histogram ``ray_<name>`` the buckets show at or below their
    largest boundary not above ``bound``. (Ray approximates a histogram's ``_sum`` from its
    bucket midpoints, so durations are checked on the buckets, never on the sum.)"""
    below = [
        (float(tags["le"]), v)
        for n, tags, v in samples
        if n == f"ray_{name}_bucket"
        and all(tags.get(k) == w for k, w in labels.items())
        and float(tags["le"]) <= bound
    ]
    return max(below)[1] if below else 0.0


def up_to(samples: Samples, name: str, bound: float, **labels: str) -> float | None:
    """How many observations are at most the smallest boundary at or above ``bound``."""
    above = [
        (float(tags["le"]), v)
        for n, tags, v in samples
        if n == f"ray_{name}_bucket"
        and all(tags.get(k) == w for k, w in labels.items())
        and float(tags["le"]) >= bound
    ]
    return min(above)[1] if above else None


def poll(url: str, check: Callable[[Samples], Any], timeout: float = 90.0) -> Any:
    """Scrape until ``check`` answers something truthy (Ray exports with a delay)."""
    deadline = time.monotonic() + timeout
    while True:
        samples = scrape(url)
        found = check(samples)
        if found:
            return found
        assert time.monotonic() < deadline, "the metrics did not reach the expected values"
        time.sleep(0.5)


def test_the_specs_metrics_show_the_scripted_run(service: Any, script: Script) -> None:
    url, tenant = service.metrics_url, script.tenant

    # runs.accepted: a counter per (tenant, project, workflow)
    def accepted(s: Samples) -> bool:
        gated = value(
            s,
            "connectsoft_factory_runs_accepted_total",
            tenant=tenant,
            workflow=script.gated_workflow,
        )
        plain = value(
            s,
            "connectsoft_factory_runs_accepted_total",
            tenant=tenant,
            workflow=script.plain_workflow,
        )
        return (gated, plain) == (2, 1)

    poll(url, accepted)

    # attempts.duration: one settled by its outcome (A), one timed out by lease expiry (C)
    def durations(s: Samples) -> bool:
        name = "connectsoft_factory_attempts_duration_count"
        return (
            value(s, name, tenant=tenant, outcome="Succeeded") == 1
            and value(s, name, tenant=tenant, outcome="TimedOut") == 1
            and value(s, name, tenant=tenant) == 2
        )

    samples = poll(url, lambda s: s if durations(s) else None)
    # C's attempt lived from its dispatch to the expiry: at least its lease and grace
    short = at_most(
        samples, "connectsoft_factory_attempts_duration", service.lease_seconds, outcome="TimedOut"
    )
    assert short == 0, "the timed-out attempt is counted shorter than its lease"

    # leases.expired: C's lease, exactly once
    poll(url, lambda s: value(s, "connectsoft_factory_leases_expired_total", tenant=tenant) == 1)

    # approvals.pending_age: A's request, observed at its decision
    samples = poll(
        url,
        lambda s: (
            s
            if value(s, "connectsoft_factory_approvals_pending_age_count", tenant=tenant) == 1
            else None
        ),
    )
    waited = script.times["A.decided.after"] - script.times["A.requested.before"]
    assert up_to(samples, "connectsoft_factory_approvals_pending_age", waited, tenant=tenant) == 1

    # runs.active: the gauge per (tenant, state) is what the runs' own views say
    views = [
        httpx.get(
            f"{service.api.base_url}/factory/runs/{run_id}",
            headers={"Authorization": f"Bearer {service.api.token(tenant)}"},
        ).json()
        for run_id in script.runs.values()
    ]
    expected = Counter(v["state"] for v in views if v["state"] not in TERMINAL)
    assert expected["WaitingForApproval"] == 1  # B

    def active(s: Samples) -> bool:
        shown = {
            tags["state"]: v
            for n, tags, v in s
            if n == "ray_connectsoft_factory_runs_active" and tags.get("tenant") == tenant and v
        }
        return shown == dict(expected)

    poll(url, active)

    # pending approvals now: B, waiting since its request; a sample taken after this moment
    # shows an age of at least the time since B's request ended, at most since it began
    started = time.time()

    def pending(s: Samples) -> float | None:
        count = value(s, "connectsoft_factory_approvals_pending", tenant=tenant)
        oldest = value(s, "connectsoft_factory_approvals_pending_oldest_age", tenant=tenant)
        if (
            count == 1
            and oldest is not None
            and oldest >= started - script.times["B.requested.after"]
        ):
            return oldest
        return None

    oldest = poll(url, pending)
    assert oldest <= time.time() - script.times["B.requested.before"]

    # outbox.lag: one observation per published event; this service's database holds only
    # this script's events, so the histogram's count is the number published, exactly
    def published() -> tuple[int, int]:
        with service.db.system_tx() as conn:
            row = conn.execute(
                text(
                    f"SELECT count(*) FILTER (WHERE NOT ({UNPUBLISHED_SQL})),"
                    f" count(*) FILTER (WHERE {UNPUBLISHED_SQL}) FROM outbox"
                )
            ).one()
        return int(row[0]), int(row[1])

    def lag(s: Samples) -> Samples | None:
        before = published()
        count = value(s, "connectsoft_factory_outbox_lag_count", host="scheduler")
        backlog = value(s, "connectsoft_factory_outbox_unpublished", host="scheduler")
        quiet = before[1] == 0 and published() == before
        return s if quiet and count == before[0] and backlog == 0 else None

    samples = poll(url, lag)
    # Every event published so far was observed, each with a positive lag (commit to publish).
    assert (value(samples, "connectsoft_factory_outbox_lag_count", host="scheduler") or 0) > 0
    assert (value(samples, "connectsoft_factory_outbox_lag_sum", host="scheduler") or 0) > 0
    assert (
        value(samples, "connectsoft_factory_outbox_unpublished_oldest_age", host="scheduler") == 0
    )


# ---------------------------------------------------------------------- spans


def _one(spans: list[ReceivedSpan], name: str, **attributes: Any) -> ReceivedSpan | None:
    for span in spans:
        if span.name == name and all(span.attributes.get(k) == v for k, v in attributes.items()):
            return span
    return None


def test_edge_spans_parent_the_command_spans(service: Any, script: Script) -> None:
    tenant, run_a = script.tenant, script.runs["A"]

    # HTTP: POST /factory/runs (route template, status, tenant) -> RunGrain.SubmitRun
    def submitted(spans: list[ReceivedSpan]) -> tuple[ReceivedSpan, ReceivedSpan] | None:
        command = _one(spans, "RunGrain.SubmitRun", **{"run.id": run_a, "tenant.id": tenant})
        if command is None:
            return None
        edge = next((s for s in spans if s.span_id == command.parent_span_id), None)
        return None if edge is None else (edge, command)

    edge, command = service.receiver.wait_for(submitted)
    assert edge.name == "POST /factory/runs"
    assert edge.trace_id == command.trace_id
    assert edge.attributes["http.route"] == "/factory/runs"
    assert edge.attributes["http.request.method"] == "POST"
    assert edge.attributes["http.response.status_code"] == 202
    assert edge.attributes["tenant.id"] == tenant
    assert edge.resource["runcontrol.role"] == "api"
    assert command.resource["runcontrol.role"] == "host"
    assert edge.resource["service.name"] == "runcontrol-telemetry-test"

    # HTTP: the decision -> RunGrain.DecideApproval, with the approval's id
    def decided(spans: list[ReceivedSpan]) -> tuple[ReceivedSpan, ReceivedSpan] | None:
        command = _one(spans, "RunGrain.DecideApproval", **{"approval.id": script.approvals["A"]})
        edge = command and next((s for s in spans if s.span_id == command.parent_span_id), None)
        return None if edge is None else (edge, command)

    edge, command = service.receiver.wait_for(decided)
    assert edge.name == "POST /factory/approvals/{approvalId}/decision"
    assert edge.attributes["http.response.status_code"] == 200
    assert command.attributes["run.id"] == run_a

    # gRPC: ReportAttemptOutcome -> RunGrain.ReportOutcome with run, step, attempt, tenant
    def reported(spans: list[ReceivedSpan]) -> tuple[ReceivedSpan, ReceivedSpan] | None:
        command = _one(spans, "RunGrain.ReportOutcome", **{"run.id": run_a})
        edge = command and next((s for s in spans if s.span_id == command.parent_span_id), None)
        return None if edge is None else (edge, command)

    edge, command = service.receiver.wait_for(reported)
    assert edge.name == "runcontrol.v1.RunControl/ReportAttemptOutcome"
    assert edge.attributes["rpc.system"] == "grpc"
    assert edge.attributes["rpc.grpc.status_code"] == 0
    assert edge.attributes["tenant.id"] == tenant
    assert edge.trace_id == command.trace_id
    for key in ("tenant.id", "run.id", "attempt.id", "step.id", "command.id"):
        assert command.attributes.get(key), (key, command.attributes)

    # The lease expiry: the scheduler job's span parents the command that settled it. The
    # job is the LeaseExpiryReconciler, or the RunDispatcher's sweep, which now runs at the
    # earliest reminder ahead (an expiring lease is one: migration 0020) and often gets there
    # first.
    def expired(spans: list[ReceivedSpan]) -> ReceivedSpan | None:
        jobs = ("Scheduler.LeaseExpiryReconciler", "Scheduler.RunDispatcher")
        job = [s for s in spans if s.name in jobs]
        wakes = [
            s
            for s in spans
            if s.name == "RunGrain.WakeRun" and s.attributes.get("run.id") == script.runs["C"]
        ]
        return next((w for w in wakes if any(w.parent_span_id == j.span_id for j in job)), None)

    service.receiver.wait_for(expired)

    # A caller's own trace continues: traceparent in an HTTP header and in gRPC metadata
    trace_id, parent_id = uuid.uuid4().hex, uuid.uuid4().hex[:16]
    traceparent = f"00-{trace_id}-{parent_id}-01"
    answer = httpx.get(
        f"{service.api.base_url}/factory/runs/{run_a}",
        headers={
            "Authorization": f"Bearer {service.api.token(tenant)}",
            "traceparent": traceparent,
        },
    )
    assert answer.status_code == 200
    with grpc.insecure_channel(service.grpc_target) as channel:
        stub = pb_grpc.RunControlStub(channel)  # type: ignore[no-untyped-call]
        claim = pb.AcquireLeaseRequest(
            worker_instance_id="inst-2",
            claim_next=pb.ClaimNext(agent_ids=["nobody-runs-this"], wait_seconds=0),
        )
        token = service.api.token(tenant, "svc-worker", [Role.WORKER], [RUNTIME])
        response = stub.AcquireLease(
            claim,
            metadata=(("authorization", f"Bearer {token}"), ("traceparent", traceparent)),
            timeout=30,
        )
        assert not response.granted

    def continued(spans: list[ReceivedSpan]) -> dict[str, ReceivedSpan] | None:
        mine = {s.name: s for s in spans if s.trace_id == trace_id}
        wanted = ("GET /factory/runs/{runId}", "runcontrol.v1.RunControl/AcquireLease")
        return mine if all(name in mine for name in wanted) else None

    for span in service.receiver.wait_for(continued).values():
        assert span.parent_span_id == parent_id
        assert span.attributes["tenant.id"] == tenant

    # No payload ever: not the run's input, not a token
    for span in service.receiver.spans:
        for value in span.attributes.values():
            assert "ConnectSoft.CaseManagement" not in str(value)
            assert "Bearer" not in str(value) and "eyJ" not in str(value)
