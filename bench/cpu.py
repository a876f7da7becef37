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


def _kind(pid: str, driver: int) -> str:
    if int(pid) == driver:  # first: its command line names the database URL
        return "driver (load generator)"
    with open(f"/proc/{pid}/cmdline", "rb") as fh:
        cmd = fh.read().replace(b"\0", b" ").decode(errors="replace")
    if "postgres" in cmd:
        return "postgres"
    if "RunHost" in cmd:
        return "run hosts"
    return "ray and the rest"


def cpu_by_kind(driver: int) -> collections.Counter[str]:
    """CPU seconds so far of every live process, summed by kind."""
    totals: collections.Counter[str] = collections.Counter()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            totals[_kind(pid, driver)] += (int(fields[11]) + int(fields[12])) / HZ
        except (OSError, IndexError, ValueError):
            continue  # it exited meanwhile
    return totals


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
