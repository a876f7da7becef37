"""Shared fixtures: one real PostgreSQL per test session (embedded unless a URL is given).

Tests isolate by tenant: every test gets fresh tenant ids, and row-level security keeps the
tenants apart, so no test truncates tables another might be reading.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool
from support import (
    AUDIENCE,
    ISSUER,
    SECOND_HALF,
    SECRET,
    Faults,
    drive,
    drop_database,
    new_database,
)

from runcontrol import embedded
from runcontrol.config import Settings
from runcontrol.store import Database
from runcontrol.store.shards import Shards

# Hypothesis checks properties, not speed: on a shared 2-core machine an example can take longer
# than its default 200 ms deadline while another process runs (a flaky DeadlineExceeded).
settings.register_profile("runcontrol", deadline=None)
settings.load_profile("runcontrol")

# Each pytest-xdist worker starts its own Ray runtime (and its tests start services): its local
# ports come from a slice of their own (actors.ingress.SHARD_VARIABLE), so two workers starting
# clusters at the same moment never pick the same free port. Child processes inherit it.
if os.environ.get("PYTEST_XDIST_WORKER", "").startswith("gw"):
    os.environ.setdefault(
        "RUNCONTROL_LOCAL_PORT_SHARD",
        f"{int(os.environ['PYTEST_XDIST_WORKER'][2:])}/{os.environ['PYTEST_XDIST_WORKER_COUNT']}",
    )

# The files that start a service of their own (PostgreSQL, Ray, `runcontrol up`, Chromium) and
# take a minute or more each, longest first. They run before the rest: `make test` runs two
# pytest-xdist workers that each take whole files in this order, and one of these left for the
# end would keep one worker busy long after the other has run out of files.
LONGEST_FILES = (
    "chaos/test_chaos.py",
    "console/test_console.py",
    "chaos/test_up_lifecycle.py",
    "telemetry/test_telemetry.py",
    "actors/test_two_node.py",
    "chaos/test_up_shards.py",
    "chaos/test_chaos_shards.py",
)


def _file_rank(item: pytest.Item) -> int:
    """``LONGEST_FILES`` first; then the tests on hosts with long leases (``long_leases``), so
    that their hosts are replaced once, not once per module; then the rest."""
    path = Path(str(item.path)).as_posix()
    for rank, name in enumerate(LONGEST_FILES):
        if path.endswith(f"tests/{name}"):
            return rank
    return len(LONGEST_FILES) + ("long_leases" not in getattr(item, "fixturenames", ()))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The longest files first (``_file_rank``; every file's tests keep their order).

    Tests marked ``long`` (the long variants: minutes each) run only when selected (``-m
    long``, or RUNCONTROL_RUN_LONG=1 as ``make test-long`` sets); ``make test`` runs their short
    variants."""
    items.sort(key=_file_rank)  # stable: the rest keep the order they were collected in
    if "long" in (config.getoption("-m") or "") or os.environ.get("RUNCONTROL_RUN_LONG"):
        return
    skip = pytest.mark.skip(reason="long: make test-long (or -m long)")
    for item in items:
        if item.get_closest_marker("long"):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def owner_url() -> Iterator[str]:
    configured = os.environ.get("RUNCONTROL_DATABASE_URL")
    if configured:
        name = f"runcontrol_test_{uuid.uuid4().hex[:8]}"
        admin = create_engine(configured, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text(f"CREATE DATABASE {name}"))
        yield make_url(configured).set(database=name).render_as_string(hide_password=False)
        with admin.connect() as conn:
            conn.execute(text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        admin.dispose()
        return
    # Short path: the server's unix socket lives in it and socket paths are limited to ~100 bytes.
    root = tempfile.mkdtemp(prefix="rc-", dir="/tmp")
    data_dir = os.path.join(root, "pg")
    try:
        yield embedded.start(data_dir, delete_on_exit=True)
    finally:
        # Stopped before its directory goes: the wheel finds its server by that directory.
        embedded.stop(data_dir)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def db(owner_url: str) -> Iterator[Database]:
    database = Database(owner_url, pool_size=8)
    database.migrate()
    yield database
    database.dispose()


@pytest.fixture(scope="session")
def two_shards(owner_url: str) -> Iterator[Shards]:
    """Two shard databases of their own on the session's server (issue 41): the virtual
    shards from ``SECOND_HALF`` on are on the second, as the directory in the first says."""
    first = new_database(owner_url, "runcontrol_shard0")
    second = new_database(owner_url, "runcontrol_shard1")
    with first.system_tx() as conn:
        conn.execute(text("UPDATE vshards SET database = 1 WHERE vshard >= :v"), {"v": SECOND_HALF})
        conn.execute(text("UPDATE directory_version SET version = version + 1"))
    shards = Shards([first, second], pool_size=4)
    try:
        yield shards
    finally:
        drive(shards.close())
        for database in (first, second):
            drop_database(owner_url, database)


@pytest.fixture
def tenant() -> str:
    return f"t-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def faults(db: Database) -> Iterator[Faults]:
    """Faults injected inside the database at a checkpoint of a run's write (``support.Faults``):
    installed for this test only, so no other test's statements ever meet the triggers."""
    owner = create_engine(db.owner_url, poolclass=NullPool)
    injected = Faults(owner)
    injected.install()
    try:
        yield injected
    finally:
        injected.uninstall()
        owner.dispose()


# ---------------------------------------------------------------------- Ray (one per session)

# Short times so reconcilers act within a test; every other option keeps the spec's default.
RAY_TEST_SETTINGS = {
    "leases": {"duration_seconds": 2, "renewal_grace_seconds": 0.5},
    "retries": {"base_delay_seconds": 0.05, "max_delay_seconds": 0.2},
    "grains": {"idle_seconds": 30, "host_count": 2},
    # the hosts check the tokens of the workers' exchanges they serve themselves
    "auth": {"hs256_secret": SECRET, "issuer": ISSUER, "audience": AUDIENCE},
    "scheduler": {
        "lease_expiry_interval": 0.5,
        "approval_expiry_interval": 0.5,
        "dispatch_sweep_interval": 0.5,
        "outbox_relay_interval": 0.5,
        "webhook_delivery_interval": 0.2,
        "schedule_sweep_interval": 0.25,
    },
    # test receivers listen on loopback; retries come within a test
    "webhooks": {
        "allow_private_addresses": True,
        "base_delay_seconds": 0.05,
        "max_delay_seconds": 0.2,
    },
}


class RayRuntime:
    """The session's Ray runtime with run hosts and the scheduler deployed on it."""

    def __init__(self, owner_url: str, db: Database) -> None:
        import ray

        from actors.run_host import ensure_hosts, host_config, make_router
        from actors.scheduler import ensure_scheduler
        from runcontrol.bootstrap import build
        from runcontrol.client import RunControlClient

        self.ray = ray
        self.owner_url = owner_url
        self.settings = Settings.model_validate(RAY_TEST_SETTINGS)
        self.container = build(self.settings, db=db, migrate=False)
        self.hosts = ensure_hosts(self.settings, owner_url)
        self.host_settings = self.settings  # what the hosts run with now (``use_hosts``)
        self.scheduler = ensure_scheduler(self.settings, owner_url)
        self.config = host_config(self.settings, owner_url)
        self.client = RunControlClient(make_router(self.config))

    def use_hosts(self, settings: Settings, *, check: bool = False) -> None:
        """Run hosts with ``settings``: stopped for good and started again only when they run
        with others, or (``check``) when one of them does not answer (a test left it dead)."""
        if settings == self.host_settings and not (check and not self._hosts_answer()):
            return
        from actors.placement import NAMESPACE, host_name
        from actors.run_host import ensure_hosts

        def gone(name: str) -> bool:
            try:
                self.ray.get_actor(name, namespace=NAMESPACE)
            except ValueError:
                return True
            return False

        for handle in self.hosts:
            self.ray.kill(handle, no_restart=True)
        deadline = time.monotonic() + 30
        for k in range(self.host_settings.grains.host_count):
            while not gone(host_name(k)):
                assert time.monotonic() < deadline, f"{host_name(k)} is still there"
                time.sleep(0.1)
        self.hosts = ensure_hosts(settings, self.owner_url)
        self.host_settings = settings

    def _hosts_answer(self) -> bool:
        try:
            self.ray.get([host.stats.remote() for host in self.hosts], timeout=30)
        except Exception:  # dead, refused to start, or not answering: replaced
            return False
        return True


@pytest.fixture(scope="session")
def ray_db(owner_url: str) -> Iterator[Database]:
    """A second database on the same server for the Ray runtime.

    The session's scheduler sweeps every tenant of its database with the real clock; tests
    driven by a ManualClock (grain, store) must not share a database with it.
    """
    database = new_database(owner_url, "runcontrol_ray")
    yield database
    database.dispose()


@pytest.fixture(scope="session")
def ray_runtime(ray_db: Database) -> Iterator[RayRuntime]:
    import ray

    from actors.ingress import use_fast_ingress

    os.environ.setdefault("RAY_worker_maximum_startup_concurrency", "4")
    # Serve runs behind the same ingress as `make run` (HAProxy direct ingress); its variables
    # must be set before ray.init. A replica being replaced drains for 30 s by default
    # (so load balancers notice): tests replace replicas on purpose and need not wait.
    use_fast_ingress(local_ports=True, RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S="0")
    ray.init(
        # "local": a cluster of this session's own, even when another one on this machine
        # was started with `ray start` (ray.init would join that one, without our settings).
        address="local",
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
    )
    try:
        yield RayRuntime(ray_db.owner_url, ray_db)
    finally:
        ray.shutdown()  # before the database fixture stops PostgreSQL


@pytest.fixture(autouse=True)
def _session_hosts(request: pytest.FixtureRequest) -> None:
    """A test on the session's Ray runtime meets run hosts with the session's settings, unless
    it asks for others (``long_leases`` in tests/actors/conftest.py). Hosts are replaced only
    when the settings change: the modules that want long leases run one after another
    (``pytest_collection_modifyitems``) on one replacement."""
    if "ray_runtime" in request.fixturenames and "long_leases" not in request.fixturenames:
        runtime: RayRuntime = request.getfixturevalue("ray_runtime")
        runtime.use_hosts(runtime.settings)
