"""The HTTP benchmarks' set-up: run hosts, Ray Serve (the ingress in this process's
environment, `bench.__main__` sets the fast one), the API app and, beside it, a trivial route
on the same ingress; a tenant with one published workflow and a bearer token for it."""

from __future__ import annotations

import os
import secrets
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import ray
from fastapi import FastAPI
from ray import serve

from actors.ingress import ACCESS_LOG_OFF, free_port
from actors.run_host import ensure_hosts, host_config, make_router
from runcontrol.api.auth import mint_dev_token
from runcontrol.bootstrap import Container, build, build_database, shards_of
from runcontrol.client import RunControlClient
from runcontrol.config import Settings
from runcontrol.domain import WorkflowDefinition

trivial_app = FastAPI()


@trivial_app.get("/")
async def trivial() -> dict[str, bool]:
    return {"ok": True}


@serve.deployment(
    num_replicas=1,
    ray_actor_options={"num_cpus": 0},
    max_ongoing_requests=256,
    logging_config=ACCESS_LOG_OFF,
)
@serve.ingress(trivial_app)
class Trivial:
    pass


@dataclass
class Stack:
    base: str  # http://127.0.0.1:PORT, the ingress
    tenant: str
    workflow_id: str
    agents: list[str]
    headers: dict[str, str]  # a Requester's bearer token
    settings: Settings
    container: Container
    client: RunControlClient  # in-cluster, on actor handles (what a worker in Ray uses)
    hosts: list[Any]
    grpc_target: str  # Serve's gRPC ingress, 127.0.0.1:PORT
    worker_token: str  # a Worker's bearer token of the tenant (gRPC workers)
    secret: str  # the API's HS256 secret (this run's own)

    def host_stats(self) -> list[dict[str, Any]]:
        return list(ray.get([h.stats.remote() for h in self.hosts]))

    def another_tenant(self, tenant: str | None = None) -> tuple[str, dict[str, str]]:
        """A second tenant (``tenant``, else a new name) with the same workflow on the same
        agents (one worker pool can serve both) and a Requester's headers for it."""
        tenant = tenant or f"bench-{uuid.uuid4().hex[:8]}"
        definition = {
            "workflowId": self.workflow_id,
            "steps": [{"agentId": a} for a in self.agents],
        }
        self.container.releases.publish(
            tenant,
            WorkflowDefinition.from_dict(definition),
            "bench",
            self.container.env.clock.now(),
        )
        token = mint_dev_token(self.secret, tenant, "bench", "bench-user", ["Requester"])
        return tenant, {"Authorization": f"Bearer {token}"}


@contextmanager
def api_stack(
    owner_url: str,
    *,
    steps: int = 1,
    settings: dict[str, Any] | None = None,
    api_settings: dict[str, Any] | None = None,
    trivial: bool = True,
) -> Iterator[Stack]:
    """Hosts (with ``settings``), Serve with the API app at ``/`` (``api_settings`` merged into
    its settings) and (``trivial``) the trivial route at ``/trivial/``; all stopped
    afterwards."""
    from serve_app import RunControlApi

    secret = secrets.token_urlsafe(48)  # this run's own: there is no built-in secret
    # the hosts check the tokens of the gRPC exchanges they serve themselves
    config = Settings(**{"auth": {"hs256_secret": secret}, **(settings or {})})
    db = build_database(config, owner_url=owner_url)
    # several shard databases (``settings``' shards): the virtual shards spread over them, as
    # ``runcontrol up --shards N`` does while nothing is stored
    shards_of(db, config.pool_size).spread()
    container = build(config, db=db, migrate=False)
    tenant = f"bench-{uuid.uuid4().hex[:8]}"
    agents = [f"a{k}-{tenant}" for k in range(steps)]
    definition = {"workflowId": "bench", "steps": [{"agentId": a} for a in agents]}
    container.releases.publish(
        tenant, WorkflowDefinition.from_dict(definition), "bench", container.env.clock.now()
    )
    from actors.grpc_ingress import grpc_options

    hosts = ensure_hosts(config, owner_url)
    port = free_port()
    grpc_port = free_port()
    os.environ["RUNCONTROL_DATABASE_URL"] = owner_url
    try:
        serve.start(
            http_options={"host": "127.0.0.1", "port": port},
            grpc_options=grpc_options(grpc_port),
            logging_config=ACCESS_LOG_OFF,
        )
        if trivial:
            serve.run(Trivial.bind(), name="trivial", route_prefix="/trivial")
        app_settings = {**(api_settings or {}), "auth": {"hs256_secret": secret}}
        serve.run(
            RunControlApi.bind(database_url=owner_url, settings=app_settings),
            name="runcontrol",
            route_prefix="/",
        )
        token = mint_dev_token(secret, tenant, "bench", "bench-user", ["Requester"])
        worker_token = mint_dev_token(secret, tenant, "bench", "bench-worker", ["Worker"])
        yield Stack(
            base=f"http://127.0.0.1:{port}",
            tenant=tenant,
            workflow_id="bench",
            agents=agents,
            headers={"Authorization": f"Bearer {token}"},
            settings=config,
            container=container,
            client=RunControlClient(make_router(host_config(config, owner_url))),
            hosts=hosts,
            grpc_target=f"127.0.0.1:{grpc_port}",
            worker_token=worker_token,
            secret=secret,
        )
    finally:
        serve.shutdown()
        _proxies_gone()
        for host in hosts:
            ray.kill(host)
        db.dispose()


def _proxies_gone(timeout_s: float = 30.0) -> None:
    """Wait until Serve's proxy actors of the shutdown are gone: their names are freed only
    once they are dead, and the next stack's ``serve.start`` looking one up by name while it
    is being killed gets it dead (``HAProxyManager ... killed by ray.kill``: seen twice in
    four stack restarts at load 15-45)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        named = ray.util.list_named_actors(all_namespaces=True)
        if not any(str(a["name"]).startswith("SERVE_PROXY_ACTOR") for a in named):
            return
        time.sleep(0.2)
