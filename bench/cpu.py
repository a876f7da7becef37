"""Where the CPU goes: CPU seconds per committed command, by process, during the hosted run.

Usage: python -m bench.cpu [--runs 3000] [--window 15]

Starts the hosted benchmark (``bench.transitions.run``) in a child process, waits until commands
flow steadily, then reads every process's CPU time from /proc at both ends of a window and counts
the recovery-journal entries committed in it. Linux only. Prints CPU per state transition and
per command for the hosts, PostgreSQL, the driver and the rest.
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import time
from collections.abc import Collection

import psycopg

from runcontrol.embedded import DATABASE

from .common import private_database
from .transitions import STEPS

HZ = os.sysconf("SC_CLK_TCK")
CHILD = """
import ray, sys
from bench import transitions
ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
print(transitions.run(sys.argv[1], runs=int(sys.argv[2]), concurrency=32), flush=True)
"""


def _kind(pid: str, driver: int, workers: Collection[int] = ()) -> str:
    if int(pid) == driver:  # first: its command line names the database URL
        return "driver (load generator)"
    if int(pid) in workers:
        return "workers"
    with open(f"/proc/{pid}/cmdline", "rb") as fh:
        cmd = fh.read().replace(b"\0", b" ").decode(errors="replace")
    if "postgres" in cmd:
        return "postgres"
    if "RunHost" in cmd:
        return "run hosts"
    for marker, kind in KINDS:
        if marker in cmd:
            return kind
    return "ray and the rest"


# Ray names an actor's process after its class (``ray::ServeReplica:app:Deployment``).
KINDS = (
    ("ServeReplica:runcontrol", "API replica"),
    ("ServeReplica", "other Serve replicas"),
    ("Scheduler", "scheduler"),
    ("haproxy", "ingress (HAProxy)"),
    ("ProxyActor", "ingress (Serve proxy)"),
    ("ServeController", "Serve controller"),
    ("wrk", "driver (load generator)"),
)


Snapshot = dict[int, tuple[str, float]]  # pid -> (kind, CPU seconds so far)


def cpu_by_process(
    driver: int, workers: Collection[int] = (), roots: Collection[int] | None = None
) -> Snapshot:
    """CPU seconds so far of every live process, with its kind (``workers``: the pids of
    worker processes, counted apart). With ``roots``, only those processes and their
    descendants: on a shared machine, other people's processes are not ours to count."""
    stats: dict[int, tuple[int, float]] = {}  # pid -> (parent, CPU seconds)
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            stats[int(pid)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / HZ)
        except (OSError, IndexError, ValueError):
            continue  # it exited meanwhile
    wanted = set(stats) if roots is None else _descendants(stats, roots)
    found: Snapshot = {}
    for pid in wanted:
        try:
            found[pid] = (_kind(str(pid), driver, workers), stats[pid][1])
        except OSError:
            continue
    return found


def cpu_by_kind(
    driver: int, workers: Collection[int] = (), roots: Collection[int] | None = None
) -> collections.Counter[str]:
    """``cpu_by_process`` summed by kind."""
    totals: collections.Counter[str] = collections.Counter()
    for kind, seconds in cpu_by_process(driver, workers, roots).values():
        totals[kind] += seconds
    return totals


def _descendants(stats: dict[int, tuple[int, float]], roots: Collection[int]) -> set[int]:
    children: dict[int, list[int]] = collections.defaultdict(list)
    for pid, (parent, _) in stats.items():
        children[parent].append(pid)
    found, todo = set(), [r for r in roots if r in stats]
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children[pid])
    return found


def postmaster_pid(owner_url: str) -> int:
    """The pid of the PostgreSQL server behind ``owner_url`` (the parent of its backends)."""
    from sqlalchemy import create_engine, text

    engine = create_engine(owner_url)
    try:
        with engine.connect() as conn:
            backend = int(conn.execute(text("SELECT pg_backend_pid()")).scalar_one())
            with open(f"/proc/{backend}/stat", encoding="ascii") as fh:  # while it lives
                return int(fh.read().rsplit(")", 1)[1].split()[1])
    finally:
        engine.dispose()


def own_processes(owner_url: str) -> tuple[int, int]:
    """The roots of this benchmark's processes: itself (Ray, Serve, wrk are its descendants)
    and its embedded PostgreSQL server."""
    return os.getpid(), postmaster_pid(owner_url)


def ms_per_unit(before: Snapshot, after: Snapshot, units: float) -> dict[str, float]:
    """CPU milliseconds per unit of work (a submission, a completed run) by process kind,
    between two ``cpu_by_process`` snapshots, with their sum as ``all``. A process that
    exited in between is left out (its CPU in the window is unknown); one that started in
    between counts whole."""
    used: collections.Counter[str] = collections.Counter()
    for pid, (kind, seconds) in after.items():
        used[kind] += seconds - before.get(pid, (kind, 0.0))[1]
    out = {k: 1000 * v / max(units, 1) for k, v in sorted(used.items(), key=lambda kv: -kv[1])}
    out["all"] = sum(out.values())
    return out


OUTSIDE = ("driver (load generator)", "workers")  # not the service's own CPU


def server_side(figures: dict[str, float]) -> dict[str, float]:
    """``ms_per_unit`` figures with ``server side``: every process but the load generator and
    the workers (the service: PostgreSQL, hosts, replicas, ingress, scheduler, Ray)."""
    outside = sum(figures.get(kind, 0.0) for kind in OUTSIDE)
    return {**figures, "server side": figures["all"] - outside}


def print_ms_per_unit(title: str, figures: dict[str, float]) -> None:
    print(f"{title:<44}{'CPU ms':>14}")
    for kind, ms in figures.items():
        print(f"{'  ' + kind:<44}{ms:>14.2f}")


def journal_entries(socket_dir: str) -> int:
    with psycopg.connect(host=socket_dir, dbname=DATABASE, user="postgres") as conn:
        row = conn.execute("SELECT count(*) FROM recovery_journal").fetchone()
        return int(row[0]) if row else 0


def main() -> int:
    parser = argparse.ArgumentParser(prog="bench.cpu")
    parser.add_argument("--runs", type=int, default=3000)
    parser.add_argument("--window", type=float, default=15.0)
    args = parser.parse_args()
    with private_database() as url:
        socket_dir = url.split("host=")[1].replace("%2F", "/")
        child = subprocess.Popen([sys.executable, "-c", CHILD, url, str(args.runs)])
        try:
            while True:  # wait for the steady part: commands flowing
                time.sleep(1)
                try:
                    first = journal_entries(socket_dir)
                    time.sleep(1)
                    if journal_entries(socket_dir) - first > 200:
                        break
                except psycopg.Error:
                    continue  # the schema is not there yet
            time.sleep(3)
            before, entries, started = (
                cpu_by_kind(child.pid),
                journal_entries(socket_dir),
                time.time(),
            )
            time.sleep(args.window)
            after = cpu_by_kind(child.pid)
            entries = journal_entries(socket_dir) - entries
            seconds = time.time() - started
        finally:
            child.wait()
    # Per run: a lease per step (1 transition each), an outcome per step (4 each: the attempt,
    # its step, the next attempt and step; 3 on the last: the attempt, its step, the run).
    per_command = (STEPS + 4 * (STEPS - 1) + 3) / (2 * STEPS)
    commands = entries / per_command
    print(f"{entries} state transitions ({commands:.0f} commands) in {seconds:.1f} s")
    print(f"{'process':<28}{'CPU s':>8}{'ms/transition':>15}{'ms/command':>12}")
    total = 0.0
    for kind in sorted(after, key=lambda k: before.get(k, 0) - after[k]):
        used = after[kind] - before.get(kind, 0)
        total += used
        print(
            f"{kind:<28}{used:>8.2f}{1000 * used / entries:>15.3f}{1000 * used / commands:>12.3f}"
        )
    print(
        f"{'all':<28}{total:>8.2f}{1000 * total / entries:>15.3f}{1000 * total / commands:>12.3f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
