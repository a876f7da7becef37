"""Placement: runId -> host is stable across processes and spreads runs; the opt-in dedicated
placement hosts a run in its own ``run-{runId}`` actor with the same behaviour."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path
from uuid import UUID

import ray
from actor_harness import RayHarness, outcome_hash, run_async

from actors.placement import NAMESPACE, HostRouter, dedicated_name, host_index, host_name
from actors.run_host import host_config, make_router
from runcontrol.client import Claim, RunControlClient
from runcontrol.commands import AcquireLease, RenewLease, ReportOutcome
from runcontrol.config import Settings
from runcontrol.domain import AttemptOutcome, errors

ROOT = Path(__file__).resolve().parents[2]
COUNTS = (1, 2, 3, 7)


def test_host_index_is_stable_across_processes() -> None:
    ids = [uuid.uuid4() for _ in range(200)]
    here = {n: [host_index(i, n) for i in ids] for n in COUNTS}
    script = (
        "import json, sys, uuid\n"
        "from actors.placement import host_index\n"
        "ids = [uuid.UUID(s) for s in json.load(sys.stdin)]\n"
        f"print(json.dumps({{n: [host_index(i, n) for i in ids] for n in {COUNTS!r}}}))\n"
    )
    for seed in ("0", "12345"):  # hash() would differ between these; host_index must not
        env = dict(os.environ, PYTHONHASHSEED=seed, PYTHONPATH=str(ROOT))
        out = subprocess.run(
            [sys.executable, "-c", script],
            input=json.dumps([str(i) for i in ids]),
            capture_output=True,
            text=True,
            env=env,
            cwd=ROOT,
            timeout=60,
            check=True,
        )
        there = {int(k): v for k, v in json.loads(out.stdout).items()}
        assert there == here


def test_host_index_spreads_runs_over_hosts() -> None:
    ids = [uuid.uuid4() for _ in range(3000)]
    for n in (2, 3, 5):
        counts = Counter(host_index(i, n) for i in ids)
        assert set(counts) == set(range(n))
        expected = len(ids) / n
        assert all(abs(c - expected) < 0.15 * expected for c in counts.values()), counts
    router = HostRouter(2)
    assert all(router.name_for(i) == host_name(host_index(i, 2)) for i in ids[:50])
    assert HostRouter(2, placement="dedicated").name_for(ids[0]) == f"run-{ids[0]}"


def test_runs_are_activated_on_the_host_their_id_names(h: RayHarness) -> None:
    h.publish({"name": "only", "agentId": "a"})
    hosts = h.rt.hosts

    async def main() -> None:
        for host in hosts:
            await host.deactivate_all.remote()
        before = [(await host.stats.remote())["activations"] for host in hosts]
        run_ids = [(await h.submit()).run_id for _ in range(12)]
        after = [(await host.stats.remote())["activations"] for host in hosts]
        expected = Counter(h.host_of(r) for r in run_ids)
        # Each submitted run is activated once, on its placement host only.
        assert [a - b for a, b in zip(after, before, strict=True)] == [
            expected[k] for k in range(len(hosts))
        ]

    run_async(main(), timeout=60)


def dedicated_client(h: RayHarness) -> tuple[RunControlClient, dict[str, object]]:
    raw = h.rt.settings.model_dump(mode="json")
    raw["grains"]["placement"] = "dedicated"
    settings = Settings.model_validate(raw)
    config = host_config(settings, h.rt.owner_url)
    return RunControlClient(make_router(config)), config


def test_dedicated_placement_hosts_a_run_in_its_own_actor(h: RayHarness) -> None:
    h.publish({"name": "one", "agentId": "a"}, {"name": "two", "agentId": "b"})
    client, config = dedicated_client(h)
    run_ids: list[UUID] = []

    async def main() -> None:
        submitted = await h.submit(client=client)
        run_id = submitted.run_id
        run_ids.append(run_id)
        assert submitted.created and submitted.state == "Running"
        actor = ray.get_actor(dedicated_name(run_id), namespace=NAMESPACE)
        assert actor is not None

        router = make_router(config)
        assert router.name_for(run_id) == f"run-{run_id}"
        view = await client.get(h.tenant, run_id)
        (attempt,) = view["steps"][0]["attempts"]

        # Step 1 leased and reported through the run's own actor.
        grant = await router.call(
            run_id,
            "command",
            AcquireLease(
                tenant_id=h.tenant,
                run_id=run_id,
                attempt_id=UUID(attempt["attemptId"]),
                holder="w-dedicated",
            ),
        )
        claim = Claim(grant, h.tenant, view["input"])
        await client.send(RenewLease(**claim.fenced()))
        await client.send(
            ReportOutcome(
                **claim.fenced(), outcome=AttemptOutcome.SUCCEEDED, outcome_hash=outcome_hash(1)
            )
        )
        try:  # the same rules: a second, different outcome is refused with its typed error
            await client.send(ReportOutcome(**claim.fenced(), outcome=AttemptOutcome.FAILED))
        except errors.OutcomeAlreadyRecorded as exc:
            assert type(exc) is errors.OutcomeAlreadyRecorded
        else:
            raise AssertionError("a second outcome was accepted")

        # Step 2 is claimed through the shared hosts (their claim loop leases it there), then
        # reported through the dedicated actor: a dedicated + shared mix of activations.
        claim_2 = await h.claim("b", holder="w-shared", client=client)
        await client.send(
            ReportOutcome(
                **claim_2.fenced(), outcome=AttemptOutcome.SUCCEEDED, outcome_hash=outcome_hash(2)
            )
        )
        history = await h.history(run_id, client=client)
        assert history[-1]["type"] == "RunCompleted"
        assert [e["seq"] for e in history] == list(range(1, len(history) + 1))
        stats = await actor.stats.remote()
        assert stats["commands"] >= 5  # submit, acquire, renew, two reports (+ events)
        shared = [await host.stats.remote() for host in h.rt.hosts]
        assert stats["pid"] not in {s["pid"] for s in shared}  # its own process
        h.assert_consistent(run_id)

    try:
        run_async(main(), timeout=90)
    finally:
        for run_id in run_ids:
            try:
                ray.kill(ray.get_actor(dedicated_name(run_id), namespace=NAMESPACE))
            except ValueError:
                pass
