"""The peer in the same window: Restate 1.7 running the e2e bench's work, beside our figures.

``../shared/peers/README.md`` installs it (the server from its npm package, the Python SDK and
hypercorn in a venv of their own) into ``$RESTATE_DIR``; ``restate_bench.py`` there starts the
server and a service of 3-step runs, drives them over HTTP with 32 connections and prints a
markdown table. When ``RESTATE_DIR`` holds an installed peer, ``make bench``'s e2e part runs that
script right before its own transports and prints each transport's completed runs/s and CPU per
run as a ratio of Restate's: the comparison the engine's targets are stated in (issue 42).
Without it the part says so and goes on: the peer is an optional download, never a dependency.

Restate's "server + service" CPU is held against our "server side" (every process but the load
generator and the workers); its "all three" against our "all".
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

# The script beside the checkout (``../shared/peers``), or where ``RESTATE_BENCH`` says.
SCRIPT = Path(__file__).resolve().parents[2] / "shared" / "peers" / "restate_bench.py"
SERVER = Path("node_modules/@restatedev/restate-server")
TIMEOUT_S = 900.0


@dataclass(frozen=True)
class Peer:
    completed_runs_per_s: float
    p50_ms: float
    p95_ms: float
    server_ms: float  # CPU per run
    service_ms: float
    load_generator_ms: float

    @property
    def server_side_ms(self) -> float:
        return self.server_ms + self.service_ms

    @property
    def all_ms(self) -> float:
        return self.server_side_ms + self.load_generator_ms

    def as_dict(self) -> dict[str, float]:
        return {**asdict(self), "server_side_ms": self.server_side_ms, "all_ms": self.all_ms}


def restate_setup() -> tuple[Path, Path] | None:
    """(the peer's python, the script) when both are installed, else None."""
    home = os.environ.get("RESTATE_DIR")
    script = Path(os.environ.get("RESTATE_BENCH") or SCRIPT)
    if not home or not script.is_file():
        return None
    python = Path(home) / "venv" / "bin" / "python"
    if not python.is_file() or not (Path(home) / SERVER).is_dir():
        return None
    return python, script


_ROWS = {
    "rate": re.compile(r"\| completed 3-step runs/s \| ([\d,.]+) \|"),
    "latency": re.compile(r"\| latency p50 / p95 / p99 \(ms\) \| ([\d.]+) / ([\d.]+) / [\d.]+ \|"),
    "cpu": re.compile(
        r"\| CPU per run: server / service / load generator \(ms\) \| "
        r"([\d.]+) / ([\d.]+) / ([\d.]+) \|"
    ),
}


def parse(text: str) -> Peer:
    """The figures of ``restate_bench.py``'s table; ValueError naming a missing row."""
    found: dict[str, re.Match[str]] = {}
    for name, pattern in _ROWS.items():
        match = pattern.search(text)
        if match is None:
            raise ValueError(f"the peer's output has no {name} row:\n{text[-2000:]}")
        found[name] = match
    return Peer(
        completed_runs_per_s=float(found["rate"][1].replace(",", "")),
        p50_ms=float(found["latency"][1]),
        p95_ms=float(found["latency"][2]),
        server_ms=float(found["cpu"][1]),
        service_ms=float(found["cpu"][2]),
        load_generator_ms=float(found["cpu"][3]),
    )


def restate(runs: int, concurrency: int) -> Peer | None:
    """Restate's figures for ``runs`` runs at ``concurrency``, measured now; None (said) when
    the peer is not installed or its run failed: the bench goes on without it."""
    setup = restate_setup()
    if setup is None:
        print("Restate: not installed (RESTATE_DIR, ../shared/peers/README.md): no peer figures")
        return None
    python, script = setup
    print(f"Restate 1.7 (the peer, same window): {runs} runs x 3 steps, c={concurrency} ...")
    env = {**os.environ, "PATH": f"{python.parent}:{os.environ.get('PATH', '')}"}
    try:
        done = subprocess.run(
            [str(python), str(script), "-n", str(runs), "-c", str(concurrency)],
            cwd=os.environ["RESTATE_DIR"],
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            check=True,
        )
        return parse(done.stdout)
    except (subprocess.SubprocessError, ValueError) as exc:
        print(f"Restate: the peer's run failed ({type(exc).__name__}): no peer figures")
        return None


def report(peer: Peer, ours: dict[str, dict[str, Any]]) -> None:
    """Each transport's completed runs/s and CPU per run as ratios of the peer's."""
    print()
    print(
        f"beside Restate (same window): {peer.completed_runs_per_s:.1f} runs/s, p50 "
        f"{peer.p50_ms:.1f} ms, CPU per run server + service {peer.server_side_ms:.2f} ms "
        f"(server {peer.server_ms:.2f}, service {peer.service_ms:.2f}), all "
        f"{peer.all_ms:.2f} ms"
    )
    print(f"{'transport':<16}{'runs/s':>10}{'x Restate':>11}{'CPU/run ms':>12}{'x Restate':>11}")
    for transport, figures in ours.items():
        rate = figures["completed_runs_per_s"]
        cpu = figures["cpu_ms_per_completed_run"]
        # Inside the cluster the workers are ours too, but the targets hold the server side
        # against Restate's server + service; over gRPC, all-in against all three.
        mine, theirs = (
            (cpu["all"], peer.all_ms)
            if transport.startswith("grpc")
            else (cpu["server side"], peer.server_side_ms)
        )
        print(
            f"{transport:<16}{rate:>10.1f}{rate / peer.completed_runs_per_s:>11.2f}"
            f"{mine:>12.2f}{mine / theirs:>11.2f}"
        )
