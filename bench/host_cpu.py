"""``python -m bench.host_cpu``: a run host's Python CPU per completed 3-step run, without Ray
(issue 33). Two figures, each quick enough to run before and after a change:

- ``rules``: a run's rules and documents alone, no I/O and no event loop: accept, start, and
  per step a lease and a report that dispatches the next, each followed by the statement's
  document (``store.commit.prepare``), as the grain does. Microseconds of CPU per run, best
  and median of ``--rounds`` (the collector off). Deterministic enough for cachegrind:
  ``PYTHONHASHSEED=0 valgrind --tool=cachegrind --cache-sim=no python -m bench.host_cpu
  --rules-only --rounds 1 --runs N`` (N and 0: the difference is N runs' instructions).
- ``sessions``: the host's side of the SDK workers' path, driven in this process on an
  embedded PostgreSQL: ``HostSessions`` with the host's fused grants, real grains in mailboxes
  as ``RunHost`` keeps them (``Activation``), the host's config listener; ``--workers``
  sessions of ``--slots`` slots each report every grant at once and offer the slot again with
  the report (as the SDK does), with at most ``--in-flight`` runs submitted and not ended.
  CPU per completed run of this process (the host's Python and a minimal worker loop), and
  the cyclic collector's share (``gc.callbacks``), after ``collect_less`` as a host does.

The machine is shared: run before and after alternately, two or three times each, and compare
medians (or instructions, for ``rules``).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import resource
import statistics
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

from actors.run_host import Activation, collect_less
from runcontrol.bootstrap import build, build_database
from runcontrol.commands import (
    AcquireLease,
    Command,
    ReportOutcome,
    SubmitRequest,
    SubmitRun,
    fingerprint,
)
from runcontrol.config import Settings
from runcontrol.domain import (
    AttemptOutcome,
    CommandContext,
    LeaseGrant,
    Options,
    PolicyDocument,
    Principal,
    Release,
    Role,
    RunAggregate,
    Submission,
    WorkflowDefinition,
    canonical_hash,
)
from runcontrol.domain.run.leases import acquire_lease
from runcontrol.domain.run.outcomes import report_outcome
from runcontrol.domain.run.submission import accept_run, start_ready
from runcontrol.domain.run.values import FlowGate
from runcontrol.drain import Drain
from runcontrol.grain import RunGrain
from runcontrol.grain.env import GrainEnv
from runcontrol.store.commit import CONFIG_CHANNEL, StoredAnswer, prepare
from runcontrol.store.notify import Listener
from runcontrol.workers.book import CreditBook
from runcontrol.workers.protocol import Credit, SessionUp
from runcontrol.workers.sessions import FusedGrants, HostSessions, Mailboxes

from .common import private_database

T = TypeVar("T")
STEPS = 3
RESULT = {"ok": True}
OUTCOME = canonical_hash(RESULT)
DEFINITION = {"workflowId": "bench", "steps": [{"agentId": f"a{i}"} for i in range(STEPS)]}
AGENTS = tuple(f"a{i}" for i in range(STEPS))

# ---------------------------------------------------------------------- rules


def _context() -> CommandContext:
    return CommandContext(
        now=datetime.now(UTC), actor="bench", new_id=uuid.uuid4, uniform=lambda lo, hi: lo
    )


def _answer(command: Command[Any], value: Any) -> StoredAnswer:
    name = type(command).__name__
    return StoredAnswer(command.command_id, name, value, datetime.now(UTC), fingerprint(command))


def _one_run(release: Release, policy: PolicyDocument, options: Options) -> None:
    run_id = uuid.uuid4()
    submission = Submission(
        run_id=run_id,
        tenant_id="t",
        project_id="bench",
        idempotency_key=str(run_id),
        workflow_id="bench",
        model_profile_id="m",
        input_hash=canonical_hash({}),
        snapshot_id=uuid.uuid4(),
        requested_by="bench",
        input={},
    )
    agg = accept_run(submission, release, policy, options, _context())
    agg.run.budget_reservation_id = uuid.uuid4()  # the accepting statement's reservation
    start_ready(agg, _context(), FlowGate(), {}, options)
    prepare("t", agg, options)
    for _ in range(STEPS):
        attempt_id = agg.open_attempts()[0].attempt_id
        lease = AcquireLease(tenant_id="t", run_id=run_id, attempt_id=attempt_id, holder="w")
        grant = acquire_lease(agg, _context(), attempt_id, "w", options)
        prepare("t", agg, options, answer=_answer(lease, grant))
        fenced = {"attempt_id": attempt_id, "holder": "w", "fencing_token": grant.fencing_token}
        report = ReportOutcome(
            tenant_id="t",
            run_id=run_id,
            **fenced,  # type: ignore[arg-type]
            outcome=AttemptOutcome.SUCCEEDED,
            outcome_hash=OUTCOME,
            result=RESULT,
        )
        attempt = report_outcome(
            agg,
            _context(),
            **fenced,  # type: ignore[arg-type]
            outcome=AttemptOutcome.SUCCEEDED,
            options=options,
            outcome_hash=OUTCOME,
            result=RESULT,
        )
        start_ready(agg, _context(), FlowGate(), {}, options)  # the report's dispatch
        prepare("t", agg, options, answer=_answer(report, attempt))
    assert agg.run.state.terminal, agg.run.state


def rules(runs: int, rounds: int) -> dict[str, float]:
    definition = WorkflowDefinition.from_dict(DEFINITION)
    release = Release("rel-bench", "bench", definition.content_hash, definition)
    policy, options = PolicyDocument(policy_id="pol", revision="1"), Options()
    gc.disable()
    try:
        per_run = []
        for _ in range(rounds):
            started = time.process_time()
            for _ in range(runs):
                _one_run(release, policy, options)
            per_run.append(1e6 * (time.process_time() - started) / max(runs, 1))
    finally:
        gc.enable()
    return {"rules_us_per_run_best": min(per_run), "rules_us_per_run": statistics.median(per_run)}


# ---------------------------------------------------------------------- sessions


class _Mailboxes(Mailboxes):
    """The host's runs as ``RunHost`` keeps them: one activation and mailbox per run."""

    def __init__(self, env: GrainEnv) -> None:
        self.env = env
        self.activations: dict[uuid.UUID, Activation] = {}

    def _activation(self, tenant_id: str, run_id: uuid.UUID) -> Activation:
        act = self.activations.get(run_id)
        if act is None:
            act = self.activations[run_id] = Activation(RunGrain(self.env, tenant_id, run_id))
        return act

    async def command(self, command: Command[T]) -> T:
        act = self._activation(command.tenant_id, command.run_id)
        async with act.mailbox():
            return await act.grain.execute(command)

    async def lease(self, command: AcquireLease) -> tuple[LeaseGrant, RunAggregate]:
        lease = await self.command(command)
        return lease, await self.committed(command.tenant_id, command.run_id)

    async def committed(self, tenant_id: str, run_id: uuid.UUID) -> RunAggregate:
        act = self._activation(tenant_id, run_id)
        async with act.mailbox():
            return await act.grain.load_cached()


async def _in_thread(fn: Callable[..., T], *args: Any) -> T:
    return await asyncio.to_thread(fn, *args)


class _Collector:
    """The cyclic collector's CPU while it runs (``gc.callbacks``)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._began = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._began = time.process_time()
        else:
            self.seconds += time.process_time() - self._began


def sessions(
    owner_url: str, runs: int, workers: int, slots: int, in_flight: int
) -> dict[str, float]:
    settings = Settings.model_validate({"pool_size": 8})
    db = build_database(settings, owner_url=owner_url)
    listener = Listener(db.system_url, (CONFIG_CHANNEL,))
    container = build(settings, db=db, migrate=False, listener=listener)
    env = container.env
    tenant = f"bench-{uuid.uuid4().hex[:8]}"
    definition = WorkflowDefinition.from_dict(DEFINITION)
    container.releases.publish(tenant, definition, "bench", env.clock.now())
    principal = Principal("bench-user", tenant, "bench", frozenset({Role.REQUESTER}))
    figures: dict[str, float] = {}

    async def scenario() -> None:
        listener.start()
        drain, boxes = Drain(), _Mailboxes(env)
        host = HostSessions(
            book=CreditBook(),
            runs=boxes,
            drain=drain,
            db=db,
            read=_in_thread,
            clock=env.clock,
            options=env.options,
            hosts=1,
            sweep_interval=0.05,
            own=lambda run_id: True,
        )
        env.observers[:] = [host.observe]
        env.credits = FusedGrants(host, drain)
        sweep = asyncio.create_task(host.sweep())
        await asyncio.sleep(1.0)  # the listener listens: the submissions' config is cached
        done, progress = asyncio.Event(), asyncio.Event()
        reports, issued = [0], [0]

        async def worker(n: int) -> None:
            sid, holder = f"bench-{n}-{uuid.uuid4().hex[:6]}", f"w{n}"
            free = [Credit(f"c-{uuid.uuid4()}", holder, AGENTS) for _ in range(slots)]
            commands: list[Command[Any]] = []
            acks: list[str] = []
            seq = 0
            while not done.is_set():
                seq += 1
                up = SessionUp(sid, tuple(free), tuple(commands), tuple(acks), 0.2, seq)
                down = await host.exchange(up)
                reports[0] += sum(1 for a in down.answers if a.ok)
                progress.set()
                if reports[0] >= runs * STEPS:
                    done.set()
                taken = {g.claim_id for g in down.grants}
                free = [c for c in free if c.claim_id not in taken]
                acks = [g.claim_id for g in down.grants]
                commands = [
                    ReportOutcome(
                        **g.fenced(),
                        outcome=AttemptOutcome.SUCCEEDED,
                        outcome_hash=OUTCOME,
                        result=RESULT,
                    )
                    for g in down.grants
                ]
                free += [Credit(f"c-{uuid.uuid4()}", holder, AGENTS) for _ in down.grants]

        async def submitter(count: int) -> None:
            for _ in range(count):
                while issued[0] - reports[0] / STEPS >= in_flight:
                    progress.clear()
                    await progress.wait()
                issued[0] += 1
                run_id = uuid.uuid4()
                request = SubmitRequest("bench", str(run_id), "bench", "m", {})
                submit = SubmitRun(
                    tenant_id=tenant, run_id=run_id, principal=principal, request=request
                )
                await boxes.command(submit)

        collect_less()
        collector = _Collector()
        gc.callbacks.append(collector)
        before, started = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        looping = [asyncio.create_task(worker(n)) for n in range(workers)]
        await asyncio.gather(*(submitter(runs // 8 + (i < runs % 8)) for i in range(8)))
        await asyncio.wait_for(done.wait(), 60 + runs)
        after, ended = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        gc.callbacks.remove(collector)
        for task in [*looping, sweep]:
            task.cancel()
        await asyncio.gather(*looping, sweep, return_exceptions=True)
        cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
        figures["sessions_runs_per_s"] = runs / (ended - started)
        figures["sessions_cpu_ms_per_run"] = 1000 * cpu / runs
        figures["sessions_collector_ms_per_run"] = 1000 * collector.seconds / runs
        figures["sessions_exchanges_per_run"] = host.exchanges / runs
        await listener.close()
        await container.store.close()

    try:
        asyncio.run(scenario())
    finally:
        db.dispose()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.host_cpu", description=__doc__)
    parser.add_argument("--runs", type=int, default=1500)
    parser.add_argument("--rounds", type=int, default=7, help="rules: rounds of --runs")
    parser.add_argument("--workers", type=int, default=8, help="sessions")
    parser.add_argument("--slots", type=int, default=4, help="slots per session")
    parser.add_argument("--in-flight", type=int, default=32, help="runs submitted, not ended")
    parser.add_argument("--rules-only", action="store_true")
    args = parser.parse_args()
    figures = rules(max(args.runs // 5, 1) if not args.rules_only else args.runs, args.rounds)
    if not args.rules_only:
        with private_database() as url:
            figures |= sessions(url, args.runs, args.workers, args.slots, args.in_flight)
    for name, value in figures.items():
        print(f"{name:<36}{value:>12.3f}")


if __name__ == "__main__":
    main()
