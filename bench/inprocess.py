"""The same grain commands without Ray: RunGrain objects driven on one event loop in this
process, one coroutine per concurrent driver.

Separates what the store and the rules cost from what the actor hop costs.
"""

from __future__ import annotations

import asyncio
import resource
import time
import uuid

from runcontrol.commands import AcquireLease, OpenAttempts, ReportOutcome, SubmitRequest, SubmitRun
from runcontrol.config import Settings
from runcontrol.domain import AttemptOutcome, Principal, canonical_hash
from runcontrol.grain import RunGrain

from .transitions import _tenant_with_workflow

OUTCOME = canonical_hash({"ok": True})


async def _drive(grain: RunGrain) -> int:
    commands = 0
    while True:
        tenant, run_id = grain.tenant_id, grain.run_id
        open_ids = await grain.execute(OpenAttempts(tenant_id=tenant, run_id=run_id))
        if not open_ids:
            return commands
        grant = await grain.execute(
            AcquireLease(
                tenant_id=tenant, run_id=run_id, attempt_id=open_ids[0], holder="bench-worker"
            )
        )
        await grain.execute(
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


async def _submit(grain: RunGrain, principal: Principal) -> None:
    await grain.execute(
        SubmitRun(
            tenant_id=grain.tenant_id,
            run_id=grain.run_id,
            principal=principal,
            request=SubmitRequest("bench", str(grain.run_id), "bench", "m", {}),
        )
    )


async def _each(grains: list[RunGrain], workers: int, work: object) -> list[int]:
    """Run ``work(grain)`` for every grain, ``workers`` at a time."""
    queue = list(grains)
    done: list[int] = []

    async def worker() -> None:
        while queue:
            found = await work(queue.pop())  # type: ignore[operator]
            done.append(found or 0)

    await asyncio.gather(*(worker() for _ in range(workers)))
    return done


def run(owner_url: str, *, runs: int = 300, drivers: int = 16) -> dict[str, float]:
    settings = Settings.model_validate({"pool_size": 8})
    container, tenant, principal = _tenant_with_workflow(settings, owner_url)
    figures: dict[str, float] = {}

    async def scenario() -> None:
        for label, workers in (("sequential", 1), (f"{drivers}_drivers", drivers)):
            grains = [RunGrain(container.env, tenant, uuid.uuid4()) for _ in range(runs)]
            started = time.perf_counter()
            await _each(grains, workers, lambda g: _submit(g, principal))
            submitted = time.perf_counter()
            before = resource.getrusage(resource.RUSAGE_SELF)
            commands = sum(await _each(grains, workers, _drive))
            done = time.perf_counter()
            after = resource.getrusage(resource.RUSAGE_SELF)
            cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
            figures[f"{label}_submits_per_s"] = runs / (submitted - started)
            figures[f"{label}_commands_per_s"] = commands / (done - submitted)
            figures[f"{label}_cpu_ms_per_command"] = 1000 * cpu / commands
        await container.store.close()

    try:
        asyncio.run(scenario())
    finally:
        container.db.dispose()
    return figures
