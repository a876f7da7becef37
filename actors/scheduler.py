"""The singleton scheduler actor: APScheduler jobs that call the reconcilers and wake grains.

Nothing here is durable on purpose: reminders are rows in Postgres, so a restarted scheduler
(``max_restarts``) re-creates its jobs in ``__init__`` and the next sweep finds everything due.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import ray
from apscheduler.schedulers.asyncio import AsyncIOScheduler

from runcontrol import reconcilers, schedules, shard_sweeps
from runcontrol.bootstrap import build
from runcontrol.commands import WakeRun
from runcontrol.config import Settings
from runcontrol.store.commit import EVENTS_CHANNEL
from runcontrol.store.notify import Listener
from runcontrol.store.queries import RunKey
from runcontrol.store.shards import follow_directory
from runcontrol.webhooks import Deliverer, HttpTransport, delivery_formats

from .metrics import SchedulerMetrics, job_span
from .placement import SCHEDULER_NAME, get_or_create
from .run_host import actor_start, make_router

# How long a sweep waits for its wakes. A run whose host is restarting answers only once the
# host is back (seconds): waiting for it would hold every later sweep (``max_instances=1``)
# behind that one host, and the other host's due runs with it (measured with rate-limited
# runs: ~9 s without a dispatch while two hosts restarted one after the other).
WAKE_WAIT_S = 1.0

log = logging.getLogger(__name__)
T = TypeVar("T")

# The scheduler's events LISTEN connection closes once no sweep waited on it for this long.
EVENTS_IDLE_S = 30.0

SCHEDULER_OPTIONS: dict[str, Any] = {
    "num_cpus": 0,
    "max_restarts": -1,
    "max_task_retries": 0,
    "max_concurrency": 64,
}


class Scheduler:
    def __init__(self, config: dict[str, Any]) -> None:
        self.settings, db = actor_start(config, "scheduler")
        self._container = build(self.settings, db=db, migrate=False)
        self._db = db  # every shard's, routed by tenant (a scheduled run's placement)
        self._directory = follow_directory(db)  # a wake's run routed by its id
        self._clock = self._container.env.clock
        self._options = self._container.env.options
        self._router = make_router(config)
        sinks: list[reconcilers.Sink] = [reconcilers.LogSink()]
        if self.settings.outbox.jsonl_path:
            sinks.append(reconcilers.JsonLinesSink(self.settings.outbox.jsonl_path))
        self._sinks = sinks
        # Each shard database's lock and relay floor (runcontrol/shard_sweeps.py): a job runs
        # on every shard whose lock this scheduler holds; a second scheduler takes the others.
        self._sweeps = shard_sweeps.ShardSweep.of(db)
        transport = HttpTransport(self.settings.webhooks.timeout_seconds)
        self._deliverers = {
            s.index: Deliverer(
                s.db, transport, self.settings.webhooks, self._clock.now, formats=delivery_formats()
            )
            for s in self._sweeps
        }
        self.counters: dict[str, int] = {}
        # Wakes still under way (a restarting host): not sent again until they land.
        self._waking: set[RunKey] = set()
        self._wakes: set[asyncio.Task[None]] = set()
        self.last_outbox_lag = 0.0
        self._metrics = SchedulerMetrics()
        # The dispatch sweep's signals (reconcilers.DispatchSignal): the due channel always,
        # every commit's events only while a run its wake left due waits for one.
        self._listener = Listener(db.system_urls, (reconcilers.DUE_CHANNEL,))
        self._listener.start()
        self._events = Listener(
            db.system_urls,
            (EVENTS_CHANNEL,),
            application_name="runcontrol-scheduler-events",
            idle_s=EVENTS_IDLE_S,
        )
        self._running: set[str] = set()
        s = self.settings.scheduler
        self._aps = AsyncIOScheduler(event_loop=asyncio.get_running_loop())
        jobs: list[tuple[Callable[[], Any], float, str]] = [
            (self.lease_expiry, s.lease_expiry_interval, "LeaseExpiryReconciler"),
            (self.approval_expiry, s.approval_expiry_interval, "ApprovalExpiryReconciler"),
            (self.dispatch_sweep, s.dispatch_sweep_interval, "RunDispatcher"),
            (self.outbox_relay, s.outbox_relay_interval, "OutboxRelay"),
            (self.retention, s.retention_interval, "RetentionCleanup"),
            (self.webhook_delivery, s.webhook_delivery_interval, "WebhookDelivery"),
            (self.schedule_sweep, s.schedule_sweep_interval, "ScheduleSweep"),
            (self.sample_gauges, s.metrics_sample_interval, "MetricsSampler"),
        ]
        for fn, seconds, name in jobs:
            self._aps.add_job(
                fn,
                "interval",
                seconds=seconds,
                id=name,
                name=name,
                max_instances=1,
                coalesce=True,
            )
        self._aps.start()
        # Run everything once now: whatever came due while no scheduler ran is handled at once.
        for fn, _, _ in jobs:
            asyncio.get_running_loop().create_task(fn())
        self._signal = reconcilers.DispatchSignal(
            self._listener, self._events, self._clock.now, s.dispatch_sweep_interval
        )
        self._signals_task = asyncio.get_running_loop().create_task(self._on_signals())

    async def _each(self, job: str, fn: Callable[[shard_sweeps.ShardSweep], T]) -> list[T]:
        """``fn`` on every shard whose scheduler lock this scheduler holds, in a thread each,
        not while ``job`` still runs there (an event-driven sweep, ``run_now`` and the interval
        may meet): what each found (``shard_sweeps.each_held``)."""
        return await shard_sweeps.each_held(self._sweeps, job, fn, self._running)

    async def _wake(self, job: str, keys: Sequence[RunKey] | None) -> int:
        if not keys:
            return 0

        async def one(key: RunKey) -> None:
            tenant_id, run_id = key
            try:
                await self._router.send(WakeRun(tenant_id=tenant_id, run_id=run_id))
            except Exception:
                log.warning("%s could not wake run %s", job, run_id, exc_info=True)
            finally:
                self._waking.discard(key)

        fresh = [k for k in keys if k not in self._waking]
        self._waking.update(fresh)
        with job_span(job, len(keys)):
            # created inside the job's span: each wake's command is its child (a task copies
            # the context it is created in)
            tasks = [asyncio.get_running_loop().create_task(one(k)) for k in fresh]
            for task in tasks:
                self._wakes.add(task)
                task.add_done_callback(self._wakes.discard)
            if tasks:  # a wake still under way after this goes on; the run stays due till then
                await asyncio.wait(tasks, timeout=WAKE_WAIT_S)
        self.counters[job] = self.counters.get(job, 0) + len(keys)
        return len(keys)

    async def lease_expiry(self) -> int:
        found = await self._each(
            "LeaseExpiryReconciler",
            lambda s: reconcilers.lease_expiries(s.db, self._clock.now(), self._options),
        )
        return await self._wake("LeaseExpiryReconciler", [k for keys in found for k in keys])

    async def approval_expiry(self) -> int:
        found = await self._each(
            "ApprovalExpiryReconciler",
            lambda s: reconcilers.approval_expiries(s.db, self._clock.now()),
        )
        return await self._wake("ApprovalExpiryReconciler", [k for keys in found for k in keys])

    async def dispatch_sweep(self) -> int:
        found = await self._each(
            "RunDispatcher", lambda s: reconcilers.due_dispatches(s.db, self._clock.now())
        )
        if not found:
            return 0
        due = shard_sweeps.due(found)
        self._signal.observe(due)
        return await self._wake("RunDispatcher", due.keys)

    async def _on_signals(self) -> None:
        """The dispatch sweep when a reminder comes near or due (``DispatchSignal``)."""
        while True:
            mark = self._signal.mark()
            await self.dispatch_sweep()
            await self._signal.wait(mark)
            await asyncio.sleep(0.2)  # debounce bursts of commits into one sweep

    async def outbox_relay(self) -> int:
        found = await self._each(
            "OutboxRelay",
            lambda s: reconcilers.relay_backlog(s.db, self._sinks, self._clock.now),
        )
        report = shard_sweeps.relayed(found)
        if report.published == 0:
            return 0
        self.last_outbox_lag = report.max_lag_seconds
        self._metrics.observe_relay(report.lags)
        self.counters["OutboxRelay"] = self.counters.get("OutboxRelay", 0) + report.published
        asyncio.get_running_loop().create_task(self.webhook_delivery())  # at once, not next tick
        return int(report.published)

    async def webhook_delivery(self) -> int:
        found = await self._each("WebhookDelivery", lambda s: self._deliverers[s.index].run())
        for name, n in (
            ("WebhookDelivered", sum(r.delivered for r in found)),
            ("WebhookFailed", sum(r.failed for r in found)),
            ("WebhookDeadLettered", sum(r.dead_lettered for r in found)),
        ):
            if n:
                self.counters[name] = self.counters.get(name, 0) + n
        return sum(r.delivered for r in found)

    async def schedule_sweep(self) -> int:
        """Decide the due schedules' fire times, then submit the started ones (both halves
        read and write only the store: ``runcontrol.schedules``)."""
        decided = await self._each(
            "ScheduleSweep", lambda s: (s, schedules.decide_due(s.db, self._clock.now()))
        )
        submitted = sum(await asyncio.gather(*(self._submit(s) for s, _ in decided)))
        if submitted:
            self.counters["ScheduleSweep"] = self.counters.get("ScheduleSweep", 0) + submitted
        return submitted

    async def _submit(self, sweep: shard_sweeps.ShardSweep) -> int:
        """A shard's started fires submitted (after its sweep decided them)."""
        job = f"ScheduleSubmit@{sweep.index}"
        if job in self._running:
            return 0
        self._running.add(job)
        try:
            return await schedules.submit_started(
                sweep.db, self._router.send, self._clock.now, routed=self._db
            )
        except Exception:
            log.exception("ScheduleSweep's submissions failed; they run again at its next interval")
            return 0
        finally:
            self._running.discard(job)

    async def sample_gauges(self) -> int:
        found = await self._each(
            "MetricsSampler",
            lambda s: reconcilers.sample_gauges(
                s.db, self._clock.now(), self.settings.api.dispatch_stall_seconds
            ),
        )
        if not found:
            return 0
        sample = shard_sweeps.gauges(found)
        self._metrics.sample(sample)
        return len(sample.runs_active)

    async def retention(self) -> int:
        found = await self._each(
            "RetentionCleanup",
            lambda s: reconcilers.retention(
                s.db,
                self._clock.now(),
                self.settings.journal.retention_days,
                self.settings.outbox.retention_days,
                self.settings.commands.answer_retention_hours,
            ),
        )
        return sum(found)

    @ray.method(concurrency_group="control")
    async def status(self) -> dict[str, Any]:
        held = await asyncio.to_thread(shard_sweeps.held, self._sweeps)
        return {
            "counters": dict(self.counters),
            "outbox_lag_s": self.last_outbox_lag,
            # the shards whose scheduler lock this one holds (their jobs run here)
            "shards_held": held,
            "holds_lock": bool(held),
            "jobs": [job.id for job in self._aps.get_jobs()],
            "time": time.time(),
        }

    async def run_now(self, job: str) -> int:
        """Run one job immediately (operators and tests)."""
        fn = {
            "LeaseExpiryReconciler": self.lease_expiry,
            "ApprovalExpiryReconciler": self.approval_expiry,
            "RunDispatcher": self.dispatch_sweep,
            "OutboxRelay": self.outbox_relay,
            "RetentionCleanup": self.retention,
            "WebhookDelivery": self.webhook_delivery,
            "ScheduleSweep": self.schedule_sweep,
            "MetricsSampler": self.sample_gauges,
        }[job]
        result: int = await fn()
        return result


def ensure_scheduler(
    settings: Settings, owner_url: str, *, detached: bool = False, name: str = SCHEDULER_NAME
) -> Any:
    from .run_host import host_config

    options = dict(SCHEDULER_OPTIONS, concurrency_groups={"control": 4})
    if detached:
        options["lifetime"] = "detached"
    handle = get_or_create(name, Scheduler, host_config(settings, owner_url), **options)
    ray.get(handle.status.remote())
    return handle
