"""API fixtures: one Ray Serve instance per session (on the session's Ray runtime and
database), serving ``serve_app.RunControlApi`` on a free local port.

The deployment gets the database URL and the test settings as init arguments (the same
settings the session's run hosts use, plus test auth and a short SSE heartbeat).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from api_harness import RSA_KID, Api, TenantView, api_settings, free_port, wait_live
from cryptography.hazmat.primitives.asymmetric import rsa

from runcontrol.api.auth import jwks_document
from runcontrol.store import Database

APP_NAME = "runcontrol"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Schemathesis names each operation's test ``test_x[GET /path]`` (test_schemathesis.py)
    but, on pytest 9.2, gives every one of them the same node id, ``...::test_x``: pytest-xdist
    (``make test``) schedules tests by node id and would run one operation of them. Their ids
    get the operation back."""
    for item in items:
        if (
            isinstance(item, pytest.Function)
            and item.name != item.originalname
            and item.nodeid.endswith(f"::{item.originalname}")
        ):
            operation = item.name[len(item.originalname) + 1 : -1]
            item._id = item.parent.id.child(item.originalname).with_params(operation)  # type: ignore[union-attr]


@pytest.fixture(scope="session")
def db(ray_runtime: Any) -> Database:
    """Tests here read the Ray runtime's own database (see ``ray_db`` in tests/conftest.py)."""
    database: Database = ray_runtime.container.db
    return database


@pytest.fixture(scope="session")
def grpc_port() -> int:
    """The free port of Serve's gRPC ingress (tests/api/test_grpc_*.py)."""
    return free_port()


@pytest.fixture(scope="session")
def serve_instance(ray_runtime: Any, grpc_port: int) -> Iterator[int]:
    """``serve.start`` on free ports (HTTP, gRPC); shut down before the session's Ray runtime."""
    from ray import serve

    from actors.grpc_ingress import grpc_options

    port = free_port()
    serve.start(
        http_options={"host": "127.0.0.1", "port": port}, grpc_options=grpc_options(grpc_port)
    )
    try:
        yield port
    finally:
        serve.shutdown()


@pytest.fixture(scope="session")
def api(
    serve_instance: int,
    ray_runtime: Any,
    tmp_path_factory: pytest.TempPathFactory,
    grpc_port: int,
) -> Api:
    from ray import serve

    from serve_app import RunControlApi

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwks_file = tmp_path_factory.mktemp("jwks") / "jwks.json"
    jwks_file.write_text(jwks_document({RSA_KID: key.public_key()}))
    settings = api_settings(ray_runtime, jwks_file)
    settings["api"]["a2a_grpc_address"] = f"127.0.0.1:{grpc_port}"  # in the A2A cards
    deployment = RunControlApi.bind(database_url=ray_runtime.owner_url, settings=settings)
    serve.run(deployment, name=APP_NAME, route_prefix="/")
    base_url = f"http://127.0.0.1:{serve_instance}"
    wait_live(base_url)
    return Api(base_url, key)


@pytest.fixture
def t(api: Api, ray_runtime: Any, tenant: str) -> Iterator[TenantView]:
    view = TenantView(api, ray_runtime, tenant)
    try:
        yield view
    finally:
        view.close()


@pytest.fixture(scope="session")
def channel(api: Api, grpc_port: int) -> Iterator[Any]:
    """A gRPC channel on loopback to Serve's gRPC ingress, once it reports SERVING."""
    import grpc
    from grpc_harness import wait_serving

    target = f"127.0.0.1:{grpc_port}"
    wait_serving(target)
    with grpc.insecure_channel(target) as opened:
        yield opened


@pytest.fixture
def g(t: TenantView, api: Api, channel: Any) -> Any:
    """``t`` plus its runtime workers over gRPC (``grpc_harness.GrpcTenant``)."""
    from grpc_harness import GrpcTenant

    return GrpcTenant(t, api, channel)
