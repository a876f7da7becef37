"""The same grain commands without Ray: RunGrain objects driven from threads in this process.

Separates what the store and the rules cost from what the actor hop costs.
"""

from __future__ import annotations

import resource
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

from runcontrol.commands import AcquireLease, OpenAttempts, ReportOutcome, SubmitRequest, SubmitRun
from runcontrol.config import Settings
from runcontrol.domain import AttemptOutcome, Principal, canonical_hash
from runcontrol.grain import RunGrain

from .transitions import _tenant_with_workflow

OUTCOME = canonical_hash({"ok": True})


def _drive(grain: RunGrain) -> int:
    commands = 0
    while True:
        tenant, run_id = grain.tenant_id, grain.run_id
        open_ids = grain.execute(OpenAttempts(tenant_id=tenant, run_id=run_id))
        if not open_ids:
            return commands
        grant = grain.execute(
            AcquireLease(
                tenant_id=tenant, run_id=run_id, attempt_id=open_ids[0], holder="bench-worker"
            )
        )
        grain.execute(
            ReportOutcome(
                tenant_id=tenant,
                run_id=run_id,
                attempt_id=open_ids[0],
                holder="bench-worker",
                fencing_token=grant.fencing_token,
                outcome=AttemptOutcome.SUCCEEDED,
                outcome_hash=OUTCOME,
            )
        )
        commands += 2


def _submit(grain: RunGrain, principal: Principal) -> None:
    grain.execute(
        SubmitRun(
            tenant_id=grain.tenant_id,
            run_id=grain.run_id,
            principal=principal,
            request=SubmitRequest("bench", str(grain.run_id), "bench", "m", {}),
        )
    )


def run(owner_url: str, *, runs: int = 300, threads: int = 16) -> dict[str, float]:
    settings = Settings.model_validate({"pool_size": max(threads, 4)})
    container, tenant, principal = _tenant_with_workflow(settings, owner_url)
    figures: dict[str, float] = {}
    try:
        for label, workers in (("sequential", 1), (f"{threads}_threads", threads)):
            grains = [RunGrain(container.env, tenant, uuid.uuid4()) for _ in range(runs)]
            started = time.perf_counter()
            with ThreadPoolExecutor(workers) as pool:
                list(pool.map(lambda g: _submit(g, principal), grains))
            submitted = time.perf_counter()
            before = resource.getrusage(resource.RUSAGE_SELF)
            with ThreadPoolExecutor(workers) as pool:
                commands = sum(pool.map(_drive, grains))
            done = time.perf_counter()
            after = resource.getrusage(resource.RUSAGE_SELF)
            cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
            figures[f"{label}_submits_per_s"] = runs / (submitted - started)
            figures[f"{label}_commands_per_s"] = commands / (done - submitted)
            figures[f"{label}_cpu_ms_per_command"] = 1000 * cpu / commands
    finally:
        container.db.dispose()
    return figures
