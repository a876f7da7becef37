"""A two-node run on ``ray.cluster_utils.Cluster``, driven by ``test_two_node.py``.

Run as a separate process (the pytest session already has a Ray runtime in its own process):

    python two_node_cluster.py OWNER_URL TENANT

It starts a head and a worker node, places ``runcontrol-host-0`` on the head and
``runcontrol-host-1`` on the worker, submits runs until both hosts own some, leases the first
step of every run, removes the worker node while those leases are held, then lets a simple
in-process worker loop finish every run. It prints one JSON line with what it observed and exits
0 only if every run reached a terminal state with a gap-free event sequence.

Placement uses custom resources through ``ensure_hosts``'s ``host_options`` hook (Ray's soft
node affinity and SPREAD were not deterministic here): both nodes offer one ``hostnode`` slot
and host-1 needs one; a placeholder holds the head's slot while host-1 is created, so host-1 can
only land on the worker; the placeholder then frees the slot, so host-1 restarts on the head
when the worker node goes (as it would after any node loss with spare capacity).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid
from typing import Any
from uuid import UUID

RUNS = 6
STEP_AGENTS = ("n1", "n2")
TERMINAL = {"Completed", "Failed", "Cancelled"}


def log(message: str) -> None:
    print(f"[two-node {time.monotonic() - START:6.1f}s] {message}", file=sys.stderr, flush=True)


START = time.monotonic()


def main(owner_url: str, tenant: str) -> int:
    import ray
    import ray._private.state as ray_state
    from ray.cluster_utils import Cluster

    from actors.placement import host_index
    from actors.run_host import ensure_hosts, host_config, make_router
    from actors.scheduler import ensure_scheduler
    from runcontrol.bootstrap import build
    from runcontrol.client import RunControlClient
    from runcontrol.config import Settings
    from runcontrol.domain import WorkflowDefinition
    from runcontrol.store import Database

    settings = Settings.model_validate(
        {
            "leases": {"duration_seconds": 6, "renewal_grace_seconds": 1},
            "retries": {"base_delay_seconds": 0.05, "max_delay_seconds": 0.2},
            "grains": {"idle_seconds": 30, "host_count": 2},
            "scheduler": {
                "lease_expiry_interval": 0.5,
                "approval_expiry_interval": 0.5,
                "dispatch_sweep_interval": 0.5,
                "outbox_relay_interval": 0.5,
            },
        }
    )
    db = Database(owner_url, pool_size=4)
    container = build(settings, db=db, migrate=False)
    agents = [f"{a}-{tenant}" for a in STEP_AGENTS]
    container.releases.publish(
        tenant,
        WorkflowDefinition.from_dict(
            {
                "workflowId": "two-node",
                "steps": [{"agentId": a, "maxAttempts": 5} for a in agents],
            }
        ),
        "tester",
        container.env.clock.now(),
    )

    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 1,
            "include_dashboard": False,
            "resources": {"head": 1, "hostnode": 1},
        },
    )
    result: dict[str, Any] = {}
    try:
        worker_node = cluster.add_node(num_cpus=1, resources={"worker": 1, "hostnode": 1})
        ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
        cluster.wait_for_nodes()
        node_ids = {
            name: n["NodeID"]
            for n in ray.nodes()
            if n["Alive"]
            for name in ("head", "worker")
            if name in n["Resources"]
        }
        log(f"cluster up: {node_ids}")

        @ray.remote(num_cpus=0, resources={"head": 0.01, "hostnode": 1})
        class Placeholder:
            def ready(self) -> bool:
                return True

        placeholder = Placeholder.remote()  # type: ignore[attr-defined]
        ray.get(placeholder.ready.remote(), timeout=60)
        hosts = ensure_hosts(
            settings,
            owner_url,
            host_options=lambda k: {"resources": {"head": 0.01} if k == 0 else {"hostnode": 1}},
        )
        ray.kill(placeholder)  # the head's slot is free again: host-1's place after failover

        def node_of(handle: Any) -> str:
            return str(ray_state.actors(handle._actor_id.hex())["Address"]["NodeID"])

        names = {node_id: name for name, node_id in node_ids.items()}
        result["hosts_before"] = [names.get(node_of(h), node_of(h)) for h in hosts]
        assert result["hosts_before"] == ["head", "worker"], result["hosts_before"]
        scheduler = ensure_scheduler(settings, owner_url)
        result["scheduler_node"] = names.get(node_of(scheduler), "?")
        log(f"hosts and scheduler up; scheduler on {result['scheduler_node']}")
        client = RunControlClient(make_router(host_config(settings, owner_url)))

        async def drive() -> None:
            from runcontrol.commands import ReportOutcome, SubmitRequest, SubmitRun
            from runcontrol.domain import AttemptOutcome, Principal, Role, canonical_hash, errors

            alice = Principal("alice", tenant, "p", frozenset({Role.REQUESTER}))
            run_ids: list[UUID] = []
            while len(run_ids) < RUNS or len({host_index(r, 2) for r in run_ids}) < 2:
                submitted = await client.send(
                    SubmitRun(
                        tenant_id=tenant,
                        run_id=uuid.uuid4(),
                        principal=alice,
                        request=SubmitRequest(
                            "p",
                            f"k-{len(run_ids)}",
                            "two-node",
                            "m",
                            {"i": len(run_ids)},
                            release_alias="latest",
                        ),
                    )
                )
                run_ids.append(submitted.run_id)
                assert len(run_ids) <= 20
            result["runs"] = len(run_ids)
            result["runs_on_worker_host"] = sum(host_index(r, 2) == 1 for r in run_ids)

            # Lease the first step of every run, and hold the leases.
            held: list[Any] = []
            while len(held) < len(run_ids):
                claim = await client.claim([agents[0]], f"w-{len(held)}", 10.0)
                assert claim is not None, "a dispatched first step was not claimable"
                held.append(claim)
            log(f"{len(held)} leases held; removing the worker node")

            t0 = time.monotonic()
            await asyncio.to_thread(cluster.remove_node, worker_node)
            result["remove_node_s"] = round(time.monotonic() - t0, 2)
            log("worker node removed")

            async def report(claim: Any) -> str:
                # One command, sent again as it is (same command id) while the answer is unknown.
                command = ReportOutcome(
                    **claim.fenced(),
                    outcome=AttemptOutcome.SUCCEEDED,
                    outcome_hash=canonical_hash([1]),
                )
                for _ in range(6):
                    try:
                        await client.send(command)
                        return "accepted"
                    except errors.Unavailable:
                        continue  # unknown whether it ran: the same report again is safe
                    except errors.LeaseRejected as exc:  # expired during the outage
                        return type(exc).__name__
                return "unavailable"

            t0 = time.monotonic()
            outcomes = await asyncio.gather(*(report(c) for c in held))
            result["held_lease_reports"] = sorted(outcomes)
            result["reports_after_removal_s"] = round(time.monotonic() - t0, 2)
            log(f"held leases reported: {outcomes}")

            done = asyncio.Event()
            worker_errors: list[str] = []

            async def worker(holder: str) -> None:
                while not done.is_set():
                    try:
                        claim = await client.claim(agents, holder, 1.0)
                        if claim is not None:
                            await client.send(
                                ReportOutcome(
                                    **claim.fenced(),
                                    outcome=AttemptOutcome.SUCCEEDED,
                                    outcome_hash=canonical_hash([2]),
                                )
                            )
                    except errors.RunControlError as exc:
                        worker_errors.append(type(exc).__name__)

            async def history(run_id: UUID) -> list[dict[str, Any]]:
                found = []
                async for event in client.watch(tenant, run_id, 0, wait_s=1.0):
                    found.append(event)
                return found

            workers = [asyncio.create_task(worker(f"loop-{i}")) for i in range(2)]
            try:
                async with asyncio.timeout(60):
                    histories = await asyncio.gather(*(history(r) for r in run_ids))
            finally:
                done.set()
                await asyncio.gather(*workers)
            result["worker_errors"] = worker_errors
            states, gap_free = [], []
            for run_id, events in zip(run_ids, histories, strict=True):
                view = await client.get(tenant, run_id)
                states.append(view["state"])
                seqs = [e["seq"] for e in events]
                gap_free.append(
                    seqs == list(range(1, len(seqs) + 1)) and view["lastEventSeq"] == len(seqs)
                )
            result["states"] = states
            result["gap_free"] = gap_free
            result["lease_expiries"] = sum(
                e["type"] == "LeaseExpired" for events in histories for e in events
            )

        asyncio.run(drive())
        result["hosts_after"] = [names.get(node_of(h), node_of(h)) for h in hosts]
        result["scheduler_after"] = names.get(node_of(scheduler), "?")
        result["elapsed_s"] = round(time.monotonic() - START, 1)
    finally:
        ray.shutdown()
        cluster.shutdown()
        db.dispose()
    print(json.dumps(result), flush=True)
    ok = all(s in TERMINAL for s in result.get("states", [None])) and all(
        result.get("gap_free", [False])
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
