"""The same grain commands without Ray: RunGrain objects driven from threads in this process.

Separates what the store and the rules cost from what the actor hop costs.
"""

from __future__ import annotations

import resource
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

from runcontrol.config import Settings
from runcontrol.domain import AttemptOutcome, canonical_hash
from runcontrol.grain import RunGrain, SubmitRequest

from .transitions import _tenant_with_workflow

OUTCOME = canonical_hash({"ok": True})


def _drive(grain: RunGrain) -> int:
    commands = 0
    while True:
        open_ids = grain.open_attempts()
        if not open_ids:
            return commands
        grant = grain.acquire_lease(open_ids[0], "bench-worker")
        grain.report_outcome(
            open_ids[0],
            "bench-worker",
            grant.fencing_token,
            AttemptOutcome.SUCCEEDED,
            outcome_hash=OUTCOME,
        )
        commands += 2


def run(owner_url: str, *, runs: int = 300, threads: int = 16) -> dict[str, float]:
    settings = Settings.model_validate({"pool_size": max(threads, 4)})
    container, tenant, principal = _tenant_with_workflow(settings, owner_url)
    figures: dict[str, float] = {}
    try:
        for label, workers in (("sequential", 1), (f"{threads}_threads", threads)):
            grains = [RunGrain(container.env, tenant, uuid.uuid4()) for _ in range(runs)]
            started = time.perf_counter()
            with ThreadPoolExecutor(workers) as pool:
                list(
                    pool.map(
                        lambda g: g.submit(
                            principal, SubmitRequest("bench", str(g.run_id), "bench", "m", {})
                        ),
                        grains,
                    )
                )
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
