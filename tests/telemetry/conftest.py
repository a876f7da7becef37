"""Telemetry fixtures: the service as ``runcontrol up`` starts it, in a child process with its
own Ray runtime (a known metrics export port) and its own database, exporting spans over
OTLP/HTTP to a receiver in this process (``otlp_receiver.py``).

It needs no session Ray runtime; it runs only when slow tests are selected (``-m slow`` or
RUNCONTROL_RUN_SLOW=1), like the chaos suite, because it starts a Ray cluster of its own.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE.parent / "api"))  # api_harness, grpc_harness

from api_harness import AUDIENCE, ISSUER, SECRET, Api, free_port  # noqa: E402
from otlp_receiver import OtlpReceiver  # noqa: E402
from support import new_database, skip_slow_unless_selected  # noqa: E402

from runcontrol.bootstrap import build  # noqa: E402
from runcontrol.config import Settings  # noqa: E402
from runcontrol.store import Database  # noqa: E402

LEASE_SECONDS = 4
RENEWAL_GRACE_SECONDS = 0.5
READY = "runcontrol is up at"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_slow_unless_selected(config, items, HERE)


@dataclass
class Service:
    api: Api
    grpc_target: str
    metrics_url: str
    db: Database
    container: Any  # what TenantView publishes releases with
    receiver: OtlpReceiver
    lease_seconds: float = LEASE_SECONDS


# Module-scoped: one module uses them, and the service stops when it ends, not at the end of
# the session (an idle cluster costs ~15 % of a core, shared with every later test).
@pytest.fixture(scope="module")
def otlp() -> Iterator[OtlpReceiver]:
    receiver = OtlpReceiver()
    receiver.start()
    try:
        yield receiver
    finally:
        receiver.stop()


@pytest.fixture(scope="module")
def service_db(owner_url: str) -> Iterator[Database]:
    """A database of the service's own: every event in its outbox is one of this suite's."""
    database = new_database(owner_url, "runcontrol_telemetry")
    yield database
    database.dispose()


def service_environment(db: Database, otlp: OtlpReceiver) -> dict[str, str]:
    """What an operator would set: the documented variables, short times for a test."""
    # Not this session's Ray variables: its HAProxy's stats and metrics ports and its replica
    # port windows are taken; the service's own Ray picks free ones (actors/ingress.py).
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(
        {
            "RUNCONTROL_DATABASE_URL": db.owner_url,
            "RUNCONTROL_AUTH__HS256_SECRET": SECRET,
            "RUNCONTROL_AUTH__ISSUER": ISSUER,
            "RUNCONTROL_AUTH__AUDIENCE": AUDIENCE,
            "RUNCONTROL_LEASES__DURATION_SECONDS": str(LEASE_SECONDS),
            "RUNCONTROL_LEASES__RENEWAL_GRACE_SECONDS": str(RENEWAL_GRACE_SECONDS),
            "RUNCONTROL_RETRIES__BASE_DELAY_SECONDS": "0.05",
            "RUNCONTROL_RETRIES__MAX_DELAY_SECONDS": "0.2",
            "RUNCONTROL_SCHEDULER__LEASE_EXPIRY_INTERVAL": "0.5",
            "RUNCONTROL_SCHEDULER__OUTBOX_RELAY_INTERVAL": "0.5",
            "RUNCONTROL_SCHEDULER__METRICS_SAMPLE_INTERVAL": "0.5",
            # traces: the standard OTLP variable (RUNCONTROL_TELEMETRY__OTLP_ENDPOINT works too)
            "OTEL_EXPORTER_OTLP_ENDPOINT": otlp.url,
            "OTEL_SERVICE_NAME": "runcontrol-telemetry-test",
            "OTEL_BSP_SCHEDULE_DELAY": "200",
            # Ray's metrics agent reports every 10 s by default; a test need not wait that long
            "RAY_metrics_report_interval_ms": "1000",
        }
    )
    return env


@pytest.fixture(scope="module")
def service(service_db: Database, otlp: OtlpReceiver) -> Iterator[Service]:
    http_port, grpc_port, metrics_port = free_port(), free_port(), free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "actors.cli",
            "up",
            "--no-workers",
            "--no-demo",
            "--port",
            str(http_port),
            "--grpc-port",
            str(grpc_port),
            "--metrics-export-port",
            str(metrics_port),
        ],
        cwd=ROOT,
        env=service_environment(service_db, otlp),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    seen: list[str] = []
    ready = threading.Event()

    def follow() -> None:  # keep draining its output, or the child blocks on a full pipe
        assert process.stdout is not None
        for line in process.stdout:
            seen.append(line)
            if READY in line:
                ready.set()
        ready.set()  # it exited

    reader = threading.Thread(target=follow, daemon=True)
    reader.start()
    try:
        ready.wait(300)
        assert process.poll() is None and any(READY in line for line in seen), "".join(seen)
        settings = Settings(database_url=service_db.owner_url)
        from api_harness import wait_live
        from grpc_harness import wait_serving

        base_url = f"http://127.0.0.1:{http_port}"
        wait_live(base_url)
        wait_serving(f"127.0.0.1:{grpc_port}")
        yield Service(
            Api(base_url, rsa_key=None),
            f"127.0.0.1:{grpc_port}",
            f"http://127.0.0.1:{metrics_port}/metrics",
            service_db,
            build(settings, db=service_db, migrate=False),
            otlp,
        )
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(120)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        reader.join(30)
        if process.stdout is not None:
            process.stdout.close()
