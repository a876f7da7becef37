"""The upgrade across migration 0033 with runs in flight, the previous release's code committing
through it (issue 42; docs/operations.md, "Upgrades with runs in flight").

The previous release is the last commit before 0033 (``OLD_REV``, schema head 0032): its code
(``runcontrol``, ``actors``, ``schemas``, ``serve_app.py``, ``tests``) is taken from git
(``git archive``) into a directory of its own, and runs in this venv (its dependencies are this
release's: ``pyproject.toml`` changed no requirement since) with ``PYTHONPATH`` and its working
directory there (Ray puts the driver's directory on its workers' path), so every process of the
old service (run hosts, scheduler, Serve replica, reference workers) imports the old code. The
order is the one docs/operations.md gives:

1. the old release migrates a new database to its head (0032) and publishes the demo workflow;
   the old service (its own ``tests/chaos/service.py``) starts on it;
2. runs are put in flight of every kind, no reviewer deciding: attempts leased to a worker mid
   step (each takes ``WORK_S``), runs parked waiting for an approval, attempts dispatched that
   no worker has claimed yet;
3. this release migrates the live database to ``BRIDGE`` (0035, the newest revision that keeps
   0032's code: 0033 to 0035 each declare ``oldest_code`` 0032) while the old service commits:
   its documents, their journal entries apart, are folded onto their last event
   (``runcontrol_fold_journal``); its relay and retention passes are refused until it is
   replaced (0033's comment), nothing is lost;
4. the old service goes on: the reviewer approves, more runs are submitted and complete; then
   runs are put in flight again (approvals left waiting, attempts pending) and the old service
   is stopped as an orchestrator stops it (SIGTERM: its workers finish the attempts in hand);
5. this release migrates to head (0036 on keep no 0032 code: the old release is gone by now)
   and its service starts, finishes every run and publishes every event.

Then the chaos run's checks (``chaos_checks.check`` and ``breaches``: 0 lost, 0 double outcomes,
0 event gaps, every stale report audited, and the journal checked row by row against the events,
``tests/journal_check.py``), and that the upgrade really was crossed with work in flight: runs
of each kind open when the migration began, documents of the old code committed (and folded)
after it, runs whose journal is partly in the old table and partly on event rows.

``make upgrade-check`` runs it (``test_upgrade_across_0033.py``, marked ``long``); it writes its
figures to RUNCONTROL_UPGRADE_REPORT when set.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import subprocess
import sys
import tarfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
from chaos import (
    PROJECT,
    ROOT,
    SECRET,
    SERVICE_ENV,
    ServiceProcess,
    approve_pending,
    demo_request,
    free_port,
)
from chaos_checks import breaches, check, wait_published
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.pool import NullPool

OLD_REV = "3cf097a"  # the last commit before 0033 (`git log --oneline -- runcontrol/store`)
OLD_HEAD = "0032"
BRIDGE = "0035"  # the newest revision whose schema keeps OLD_HEAD's code working
WORK_S = 3.0  # each step's work: long enough to find attempts leased mid-step
ZOMBIE_RATE = 0.02  # as the chaos run: stale reports sent, each refusal audited

# The old release's own set-up, run with its code: its head, the demo workflow published.
OLD_SETUP = """
import sys
from runcontrol.bootstrap import build
from runcontrol.cli.demo import DEMO_WORKFLOW
from runcontrol.config import Settings
from runcontrol.domain import WorkflowDefinition
from runcontrol.store import Database

db = Database(sys.argv[1], pool_size=2)
db.migrate()
container = build(Settings(), db=db, migrate=False)
definition = WorkflowDefinition.from_dict(DEMO_WORKFLOW)
container.releases.publish(sys.argv[2], definition, "chaos", container.env.clock.now())
print(db.schema_revision())
db.dispose()
"""

STATES = (
    "SELECT (SELECT jsonb_object_agg(state, n) FROM (SELECT state, count(*) AS n FROM runs"
    " WHERE tenant_id = :t GROUP BY state) r) AS runs, (SELECT jsonb_object_agg(state, n) FROM"
    " (SELECT state, count(*) AS n FROM attempts WHERE tenant_id = :t GROUP BY state) a)"
    " AS attempts"
)
OPEN = (
    "SELECT (SELECT count(*) FROM attempts WHERE tenant_id = :t AND state = 'Leased') AS leased,"
    " (SELECT count(*) FROM runs WHERE tenant_id = :t AND state = 'WaitingForApproval')"
    " AS waiting_approval,"
    " (SELECT count(*) FROM attempts WHERE tenant_id = :t AND state = 'Dispatched') AS pending,"
    " (SELECT count(*) FROM runs WHERE tenant_id = :t AND state IN"
    " ('Completed', 'Failed', 'Cancelled')) AS terminal,"
    " (SELECT coalesce(max(id), 0) FROM outbox) AS last_event"
)


def previous_release(into: Path, rev: str = OLD_REV) -> Path:
    """The previous release's code, from git, in ``into`` (a clone with history has it)."""
    got = subprocess.run(
        ["git", "archive", rev, "runcontrol", "actors", "schemas", "serve_app.py", "tests"],
        cwd=ROOT,
        capture_output=True,
        check=False,
    )
    if got.returncode:
        raise RuntimeError(
            f"the previous release ({rev}) is not in this clone (shallow? `git fetch "
            f"--unshallow`): {got.stderr.decode().strip()}"
        )
    archive = got.stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into


class Upgrade:
    def __init__(self, root: Path, runs_per_phase: int = 32) -> None:
        from chaos_pg import CrashablePostgres

        from runcontrol.api import mint_dev_token

        self.root = root
        self.per_phase = runs_per_phase
        self.old = previous_release(root / "old")
        self.tenant = f"upgrade-{uuid.uuid4().hex[:8]}"
        self.pg = CrashablePostgres(root)
        self.owner: Engine = create_engine(self.pg.owner_url, poolclass=NullPool)
        self.refusals = root / "refusals.jsonl"
        self.refusals.touch()
        self.requester = mint_dev_token(
            SECRET, self.tenant, PROJECT, "alice", ["Requester"], ttl_s=86400
        )
        self.reviewer = mint_dev_token(
            SECRET, self.tenant, PROJECT, "rita", ["Reviewer"], ttl_s=86400
        )
        self.accepted: dict[str, str] = {}
        self.reviewing = False
        self.decided = 0
        self.figures: dict[str, Any] = {"old_tree": str(self.old)}
        self.http_port = free_port()
        self.base_url = f"http://127.0.0.1:{self.http_port}"

    def say(self, message: str) -> None:
        print(f"[upgrade] {message}", file=sys.stderr, flush=True)

    def service(self, tree: Path, name: str) -> ServiceProcess:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
        env.update(SERVICE_ENV)
        env.update(
            {
                "PYTHONPATH": os.pathsep.join(
                    (str(tree), str(tree / "tests"), str(tree / "tests" / "chaos"))
                ),
                "RUNCONTROL_DATABASE_URL": self.pg.owner_url,
                "CHAOS_TENANT": self.tenant,
                "CHAOS_REFUSALS": str(self.refusals),
                "CHAOS_ZOMBIE_RATE": str(ZOMBIE_RATE),
                "CHAOS_WORK_SECONDS": str(WORK_S),
                "CHAOS_WORKERS": "2",
                "CHAOS_NODES": "1",
            }
        )
        log = self.root / f"{name}.log"
        return ServiceProcess(env, self.http_port, free_port(), log, root=tree)

    def migrate(self, revision: str) -> dict[str, Any]:
        from runcontrol.store import Database

        db = Database(self.pg.owner_url, pool_size=1)
        began = time.monotonic()
        try:
            db.migrate(revision)
            version = db.schema_version()
        finally:
            db.dispose()
        return {
            "revision": version.revision,
            "oldest_code": version.oldest_code,
            "s": round(time.monotonic() - began, 2),
        }

    def read(self, sql: str) -> Any:
        with self.owner.connect() as conn:
            return conn.execute(text(sql), {"t": self.tenant}).one()

    # ------------------------------------------------------------------ the upgrade

    async def run(self) -> None:
        setup = subprocess.run(
            [sys.executable, "-c", OLD_SETUP, self.pg.owner_url, self.tenant],
            cwd=self.old,
            env={**os.environ, "PYTHONPATH": str(self.old)},
            capture_output=True,
            text=True,
            check=True,
        )
        self.figures["old_schema"] = setup.stdout.strip().splitlines()[-1]
        old = self.service(self.old, "old-service")
        try:
            self.figures["old_start_s"] = round(await asyncio.to_thread(old.start), 1)
            async with httpx.AsyncClient(base_url=self.base_url, timeout=10.0) as http:
                reviewer = asyncio.create_task(self._review(http))
                try:
                    await self._upgrade(http, old)
                finally:
                    self.reviewing = False
                    reviewer.cancel()
        finally:
            old.kill()  # stopped already, unless the upgrade stopped before it

    async def _upgrade(self, http: httpx.AsyncClient, old: ServiceProcess) -> None:
        submitting = asyncio.create_task(self._submit(http, self.per_phase))
        self.figures["in_flight_at_migration"] = await self._in_flight()
        mark = self.read(OPEN).last_event
        self.figures["migration"] = await asyncio.to_thread(self.migrate, BRIDGE)  # submitting
        await submitting
        self.say(f"migrated under the old service: {self.figures['migration']}")
        self.reviewing = True  # the old service goes on: approvals, new runs, completions
        terminal = self.read(OPEN).terminal
        await self._submit(http, self.per_phase)
        await self._until(lambda o: o.terminal >= terminal + self.per_phase, 240.0)
        self.reviewing = False
        submitting = asyncio.create_task(self._submit(http, self.per_phase))
        self.figures["in_flight_at_replacement"] = await self._in_flight()
        await submitting
        self.figures["old_processes"] = self._processes()
        code = await asyncio.to_thread(old.terminate)
        self.figures["old_stop"] = {"exit_code": code, "drained": old.drained}
        self.figures["old_code_events_after_migration"] = self._old_code_events(mark)
        self.figures["head_migration"] = await asyncio.to_thread(self.migrate, "head")
        new = self.service(ROOT, "new-service")
        try:
            self.figures["new_start_s"] = round(await asyncio.to_thread(new.start), 1)
            self.reviewing = True
            await self._submit(http, self.per_phase)
            ids = list(self.accepted.values())
            await self._until(lambda o: o.terminal >= len(ids), 300.0)
            self.figures["unpublished"] = await asyncio.to_thread(
                wait_published, self.owner, self.tenant, 60.0
            )
        finally:
            await asyncio.to_thread(new.terminate)

    async def _in_flight(self) -> dict[str, int]:
        """Waits until runs are open of every kind (leased mid-step, waiting for an approval,
        pending); answers how many of each."""
        o = await self._until(lambda o: o.leased and o.waiting_approval and o.pending, 120.0)
        return {"leased": o.leased, "waiting_approval": o.waiting_approval, "pending": o.pending}

    async def _until(self, done: Any, timeout_s: float) -> Any:
        deadline = time.monotonic() + timeout_s
        while True:
            found = await asyncio.to_thread(self.read, OPEN)
            if done(found):
                return found
            if time.monotonic() > deadline:
                states = await asyncio.to_thread(self.read, STATES)
                raise RuntimeError(f"not within {timeout_s:g}s: {found._asdict()} {states}")
            await asyncio.sleep(0.1)

    def _old_code_events(self, after_id: int) -> dict[str, int]:
        """What the old code committed after the migration to ``BRIDGE`` began (the new code
        had not started yet): its events, those carrying its documents' folded entries, and
        those its relay left unpublished (0033 refuses the old relay's feed insert: proof that
        the old scheduler ran the old code)."""
        found = self.read(
            "SELECT count(*) AS events, count(journal) AS carrying, count(*) FILTER (WHERE"
            " published_at IS NULL) AS unpublished FROM outbox WHERE tenant_id = :t"
            f" AND id > {int(after_id)}"
        )
        return {
            "events": found.events,
            "carrying_folded_entries": found.carrying,
            "left_unpublished_by_the_old_relay": found.unpublished,
        }

    def _processes(self) -> dict[str, list[str]]:
        """Each process of the service (Ray's workers included: they inherit its environment),
        by name, with its working directory and the head of its PYTHONPATH."""
        found: dict[str, list[str]] = {}
        for proc in Path("/proc").iterdir():
            try:
                env = dict(
                    v.split("=", 1) for v in (proc / "environ").read_text().split("\0") if "=" in v
                )
                if env.get("CHAOS_TENANT") != self.tenant:
                    continue
                name = (proc / "cmdline").read_text().split("\0")[0].split("/")[-1][:40]
                where = (
                    f"{os.readlink(proc / 'cwd')} {env.get('PYTHONPATH', '').split(os.pathsep)[0]}"
                )
            except (OSError, ValueError):
                continue
            found.setdefault(where, []).append(name)
        return found

    async def _submit(self, http: httpx.AsyncClient, n: int) -> None:
        headers = {"Authorization": f"Bearer {self.requester}"}
        for _ in range(n):
            i = len(self.accepted)
            body = demo_request(i)
            key = f"upgrade-{i}"
            for _attempt in range(120):
                try:
                    r = await http.post(
                        "/factory/runs", json=body, headers={**headers, "Idempotency-Key": key}
                    )
                    if r.status_code in (200, 201, 202):
                        self.accepted[key] = r.json()["runId"]
                        break
                except httpx.TransportError:
                    pass
                await asyncio.sleep(0.5)
            else:
                raise RuntimeError(f"submission {key} was never accepted")

    async def _review(self, http: httpx.AsyncClient) -> None:
        headers = {"Authorization": f"Bearer {self.reviewer}"}
        while True:
            await asyncio.sleep(0.25)
            if not self.reviewing:
                continue
            try:
                async for d in approve_pending(http, headers, "upgrade reviewer"):
                    self.decided += d.status_code == 200
            except (httpx.TransportError, ValueError, KeyError):
                pass

    # ------------------------------------------------------------------ the checks

    def report(self, error: str | None) -> dict[str, Any]:
        found = check(self.owner, self.tenant, self.accepted, self.refusals)
        found["outbox_unpublished"] = self.figures.get("unpublished")
        found["journal_across_the_upgrade"] = self.read(
            "SELECT (SELECT count(*) FROM recovery_journal_legacy WHERE tenant_id = :t)"
            " AS old_table_entries, (SELECT count(DISTINCT run_id) FROM recovery_journal_legacy"
            " l WHERE tenant_id = :t AND EXISTS (SELECT 1 FROM outbox o WHERE o.run_id = l.run_id"
            " AND o.journal IS NOT NULL)) AS runs_in_both"
        )._asdict()
        return {
            # what chaos_checks.breaches reads
            "options": {"zombie_rate": ZOMBIE_RATE, "old_rev": OLD_REV, "bridge": BRIDGE},
            "error": error,
            "settled": error is None,
            "faults": [],
            "submit_refused": [],
            "decided": self.decided,
            **self.figures,
            "checks": found,
        }

    def close(self) -> None:
        self.owner.dispose()
        self.pg.stop()


def run(root: Path, runs_per_phase: int = 32) -> dict[str, Any]:
    """The upgrade, then its checks: the report is printed (shown with ``-s``) and written to
    RUNCONTROL_UPGRADE_REPORT when set."""
    upgrade = Upgrade(root, runs_per_phase)
    try:
        error = None
        try:
            asyncio.run(upgrade.run())
        except Exception as exc:  # reported with the checks, which still run
            error = repr(exc)
            upgrade.say(f"stopped: {error}")
        report = upgrade.report(error)
    finally:
        upgrade.close()
    shown = json.dumps(report, indent=2, default=str)
    print(shown)
    if os.environ.get("RUNCONTROL_UPGRADE_REPORT"):
        Path(os.environ["RUNCONTROL_UPGRADE_REPORT"]).write_text(shown + "\n")
    return report


def upgrade_breaches(report: dict[str, Any]) -> list[str]:
    """``breaches`` of the chaos run, and what proves the upgrade was crossed with work in
    flight (runs open of every kind at the migration, the old code committing after it)."""
    found = breaches(report)
    if report.get("old_schema") != OLD_HEAD:
        found.append(f"the old release migrated to {report.get('old_schema')}, not {OLD_HEAD}")
    migration = report.get("migration") or {}
    if migration.get("oldest_code") != OLD_HEAD:
        found.append(f"{BRIDGE} does not keep {OLD_HEAD}'s code: {migration}")
    old_code = report.get("old_code_events_after_migration") or {}
    if not old_code.get("carrying_folded_entries"):
        found.append(f"the old code committed no journal entry after the migration: {old_code}")
    if not old_code.get("left_unpublished_by_the_old_relay"):
        found.append(f"the old relay published after the migration: not the old code? {old_code}")
    places = report.get("old_processes") or {"": []}
    if any(where.split()[-1:] != [report["old_tree"]] or str(ROOT) in where for where in places):
        found.append(f"the old service's processes ran the new code: {places}")
    if (report.get("old_stop") or {}).get("exit_code") != 0:
        found.append(f"the old service did not stop cleanly: {report.get('old_stop')}")
    across = report["checks"]["journal_across_the_upgrade"]
    if not across["runs_in_both"]:
        found.append(f"no run's journal spans the upgrade: {across}")
    return found
