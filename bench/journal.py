"""``python -m bench --only journal``: the server-side CPU of a journaled call (``RecordCall``,
``step.run``) beside a progress report (``ReportProgress``) of the same size, through the
same grains and group commit.

Both are fenced commands of a lease holder that store one row and emit one event: a journaled
call should cost no more than a progress report (issue 30). RunGrain objects are driven on
one event loop in this process (no Ray, as ``bench.inprocess``: the actor hop and the session
exchange are the same for both commands and left out), ``drivers`` at a time; each run is
submitted and leased first (not measured), then gets ``calls`` commands of one kind, each
carrying ``value_bytes`` of text. CPU is read per process (``bench.cpu``) over each kind's
window: this process (the grains, the store client and the driver, which does the same for
both kinds) and PostgreSQL.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from typing import Any

from runcontrol.commands import AcquireLease, Command, OpenAttempts, RecordCall, ReportProgress
from runcontrol.config import Settings
from runcontrol.domain import LeaseGrant, ProgressMessage
from runcontrol.grain import RunGrain

from .cpu import cpu_by_kind, postmaster_pid
from .inprocess import _each, _submit
from .transitions import _tenant_with_workflow

KINDS = ("progress", "journal")


def _command(kind: str, grant: LeaseGrant, tenant: str, n: int, text: str) -> Command[Any]:
    fenced = {
        "tenant_id": tenant,
        "run_id": grant.run_id,
        "attempt_id": grant.attempt_id,
        "holder": grant.holder,
        "fencing_token": grant.fencing_token,
        "lease_id": grant.lease_id,
    }
    if kind == "progress":
        return ReportProgress(**fenced, messages=(ProgressMessage(n, text),))
    return RecordCall(**fenced, name="model", occurrence=n, value={"text": text})


async def _lease(grain: RunGrain) -> LeaseGrant:
    tenant, run_id = grain.tenant_id, grain.run_id
    (attempt_id,) = await grain.execute(OpenAttempts(tenant_id=tenant, run_id=run_id))
    grant: LeaseGrant = await grain.execute(
        AcquireLease(tenant_id=tenant, run_id=run_id, attempt_id=attempt_id, holder="bench-w")
    )
    return grant


def run(
    owner_url: str, *, runs: int = 200, calls: int = 20, drivers: int = 16, value_bytes: int = 512
) -> dict[str, Any]:
    settings = Settings.model_validate({"pool_size": 8})
    container, tenant, principal = _tenant_with_workflow(settings, owner_url)
    postgres = postmaster_pid(owner_url)
    text = "x" * value_bytes
    figures: dict[str, Any] = {"runs": runs, "calls_per_run": calls, "value_bytes": value_bytes}

    async def scenario() -> None:
        for kind in KINDS:
            grains = [RunGrain(container.env, tenant, uuid.uuid4()) for _ in range(runs)]
            await _each(grains, drivers, lambda g: _submit(g, principal))
            grants = {g.run_id: await _lease(g) for g in grains}
            statements = container.store.statements_sent

            async def work(
                grain: RunGrain, kind: str = kind, grants: dict[Any, LeaseGrant] = grants
            ) -> int:
                grant = grants[grain.run_id]
                for n in range(1, calls + 1):
                    await grain.execute(_command(kind, grant, tenant, n, text))
                return calls

            before = cpu_by_kind(os.getpid(), roots=(os.getpid(), postgres))
            started = time.perf_counter()
            commands = sum(await _each(grains, drivers, work))
            seconds = time.perf_counter() - started
            after = cpu_by_kind(os.getpid(), roots=(os.getpid(), postgres))
            cpu = {k: 1000 * (after[k] - before[k]) / commands for k in after}
            grain_ms = cpu.get("driver (load generator)", 0.0)
            figures[kind] = {
                "commands": commands,
                "commands_per_s": commands / seconds,
                "commands_per_statement": commands
                / max(1, container.store.statements_sent - statements),
                "cpu_ms_per_command": {
                    "grains (this process)": grain_ms,
                    "postgres": cpu.get("postgres", 0.0),
                    "all": grain_ms + cpu.get("postgres", 0.0),
                },
            }
        await container.store.close()

    try:
        asyncio.run(scenario())
    finally:
        container.db.dispose()
    journal, progress = figures["journal"], figures["progress"]
    figures["journal_cpu_per_progress_cpu"] = (
        journal["cpu_ms_per_command"]["all"] / progress["cpu_ms_per_command"]["all"]
    )
    return figures


def report(figures: dict[str, Any]) -> None:
    print(
        f"journaled calls vs progress reports: {figures['runs']} runs x "
        f"{figures['calls_per_run']} commands, {figures['value_bytes']} bytes each"
    )
    for kind in KINDS:
        f = figures[kind]
        cpu = f["cpu_ms_per_command"]
        print(
            f"  {kind:<9} {f['commands_per_s']:>8.0f} commands/s  "
            f"{f['commands_per_statement']:>5.1f} per statement  CPU/command "
            f"{cpu['grains (this process)']:.3f} ms grains + {cpu['postgres']:.3f} ms postgres"
            f" = {cpu['all']:.3f} ms"
        )
    print(
        f"  a journaled call costs {figures['journal_cpu_per_progress_cpu']:.2f}x "
        "the server CPU of a progress report (the ceiling: 1.0)"
    )
