"""A tenant's configuration written over HTTP while its virtual shard moves (docs/sharding.md
"Moving a tenant"; migration 0040): from the fence to the flip, a release published or a
policy revision is answered 503 problem+json with ``Retry-After`` (``ShardMoved``) and stored in
neither database, and another tenant's write on the same database goes through; once the shard
serves on the new database, the same write is stored there. The schedules' sweep: a fire
submitted as its tenant is fenced is marked later, with the run it started."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from grain_harness import PROJECT, Harness
from sqlalchemy import create_engine
from sqlalchemy.pool import NullPool
from support import AUDIENCE, ISSUER, SECRET, drive, scratch_database, tenant_in

from runcontrol import schedules as rules
from runcontrol.api import create_app
from runcontrol.bootstrap import build
from runcontrol.client import RunControlClient
from runcontrol.clock import ManualClock
from runcontrol.config import Settings
from runcontrol.domain import Principal, Role, StepSpec, WorkflowDefinition
from runcontrol.domain.moves import Step
from runcontrol.edge.auth import Caller, mint_dev_token
from runcontrol.grain import RunGrain
from runcontrol.store import schedules as schedule_rows
from runcontrol.store.move import Mover
from runcontrol.store.move_rows import fence, unfence
from runcontrol.store.shards import Shards

VSHARD = 110  # on the first database (100 and 101: test_shard_move_routed and _legacy move them)
RELEASE = {"definition": WorkflowDefinition("wf", (StepSpec("only", "agent-a"),)).to_dict()}
POLICY = {"approvalRequiredFor": ["shared-write"], "approverRoles": ["Reviewer"]}


def _post(app: Any, tenant: str, path: str, body: dict[str, Any]) -> httpx.Response:
    token = mint_dev_token(
        SECRET, tenant, "proj-1", "ada", [Role.WORKSPACE_ADMIN], issuer=ISSUER, audience=AUDIENCE
    )

    async def send() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        headers = {"Authorization": f"Bearer {token}"}
        async with httpx.AsyncClient(
            transport=transport, base_url="http://replica", headers=headers, timeout=30
        ) as http:
            return await http.post(path, json=body)

    return asyncio.run(send())


def _stored(shards: Shards, table: str, tenant: str) -> list[int]:
    counts = []
    for shard in shards.all():
        with shard.db.system.connect() as conn:
            found = conn.exec_driver_sql(
                f"SELECT count(*) FROM {table} WHERE tenant_id = %s", (tenant,)
            ).scalar_one()
            counts.append(int(found))
    return counts


def test_a_configuration_write_during_a_move_is_503_with_retry_after_and_lost_nowhere(
    two_shards: Shards,
) -> None:
    first, second = two_shards.all()
    moving = tenant_in(0)
    two_shards.directory.place(moving, VSHARD)
    staying = tenant_in(0)  # another virtual shard on the first database
    two_shards.directory.place(staying, VSHARD + 1)
    settings = Settings(auth={"hs256_secret": SECRET, "issuer": ISSUER, "audience": AUDIENCE})
    app = create_app(RunControlClient(router=None), two_shards.db, settings)  # type: ignore[arg-type]
    assert _post(app, moving, "/factory/releases", RELEASE).status_code == 201
    during: dict[str, httpx.Response] = {}

    def meanwhile(step: Step) -> None:
        if step is Step.FENCING:  # fenced, not yet copied: the directory names the source
            during["release"] = _post(
                app, moving, "/factory/releases", {**RELEASE, "aliases": ["b"]}
            )
            during["policy"] = _post(app, moving, "/factory/policies", POLICY)
            during["other"] = _post(app, staying, "/factory/policies", POLICY)

    moved = Mover([first.db, second.db], quiet_s=0.05, hook=meanwhile).start(VSHARD, 1)
    assert moved.step is Step.DONE

    for kind in ("release", "policy"):
        answer = during[kind]
        assert answer.status_code == 503, answer.text
        assert answer.headers["content-type"] == "application/problem+json"
        assert answer.headers["Retry-After"] and answer.json()["code"] == "shard-moved"
    assert during["other"].status_code == 201, during["other"].text
    assert _stored(two_shards, "policies", moving) == [0, 0]  # the refused one stored nowhere
    assert _stored(two_shards, "release_aliases", moving) == [0, 1]  # "latest" only, moved
    assert _stored(two_shards, "policies", staying) == [1, 0]

    two_shards.directory.refresh()  # the flip heard of: the write is sent again, and lands
    assert _post(app, moving, "/factory/policies", POLICY).status_code == 201
    assert _post(app, moving, "/factory/releases", {**RELEASE, "aliases": ["b"]}).status_code == 201
    assert _stored(two_shards, "policies", moving) == [0, 1]
    assert _stored(two_shards, "release_aliases", moving) == [0, 2]


def test_a_fire_submitted_as_its_tenant_is_fenced_is_marked_later_with_the_same_run(
    owner_url: str,
) -> None:
    """The schedules' sweep submits a started fire, and the tenant is fenced before the fire is
    marked: the mark is refused, the sweep marks the other tenant's fire, and the next sweep
    (on the database the tenant moved to) submits it again with its key and finds the run."""
    with scratch_database(owner_url) as db:
        clock = ManualClock()
        container = build(Settings(), db=db, clock=clock, migrate=False)
        moving, staying = f"{tenant_in(0)}-m", f"{tenant_in(0)}-s"
        for tenant in (moving, staying):
            Harness(container, tenant, clock).publish()
            caller = Caller(
                Principal("alice", tenant, PROJECT, frozenset({Role.REQUESTER})),
                frozenset({"factory.runs.write"}),
            )
            doc = {
                "run": {"workflowId": "wf", "modelProfileId": "code-agent"},
                "intervalSeconds": 60,
            }
            with db.tenant(tenant) as conn:
                schedule_rows.insert_schedule(
                    conn, rules.new_row(caller, doc, False, None, clock.now())
                )
        clock.advance(61)
        assert rules.decide_due(db, clock.now()) == 2
        owner = create_engine(db.owner_url, poolclass=NullPool)
        moved: list[Any] = []

        async def send(command: Any) -> Any:
            result = await RunGrain(container.env, command.tenant_id, command.run_id).execute(
                command
            )
            if command.tenant_id == moving and not moved:  # the move fences it meanwhile
                with owner.begin() as conn:
                    fence(conn, [moving], vshard=3, to=1, epoch=1)
                moved.append(command.run_id)
            return result

        try:
            assert drive(rules.submit_started(db, send, clock.now)) == 1  # the other's marked
            with owner.begin() as conn:  # the tenant served again (as on the new database)
                unfence(conn, [moving])
            assert drive(rules.submit_started(db, send, clock.now)) == 1
        finally:
            with owner.begin() as conn:
                unfence(conn, [moving])
            owner.dispose()
            drive(container.store.close())
        with db.system.connect() as conn:
            fires = conn.exec_driver_sql(
                "SELECT tenant_id, run_id FROM schedule_fires WHERE submitted_at IS NOT NULL"
            ).all()
            runs = conn.exec_driver_sql("SELECT tenant_id, run_id FROM runs").all()
        assert sorted(fires) == sorted(runs) and len(runs) == 2  # one run each, each marked
