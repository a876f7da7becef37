"""Where each process's CPU goes while runs complete: py-spy on the processes of the e2e bench.

Usage: python -m bench.spy [--transport sdk] [--runs 3000] [--seconds 30] [--rate 20]
                           [--top 10] [--skip KIND] [--keep DIR]

Starts ``python -m bench --only e2e`` (one transport) in a child and waits for its measured
runs (more runs in its database than the warm-up submits). Then it starts
``py-spy record --gil --nonblocking`` on each of runcontrol's Python processes (run hosts, API
replica, scheduler, Serve's proxy) and on the workers: a sample only while a thread holds the
GIL, so the Python CPU and not the waits, read without stopping the process. After py-spy has
read each process's symbols (seconds of CPU for Ray's native libraries), for ``--seconds``:

- every process's CPU time from /proc at both ends (``bench.cpu``'s kinds), the bench's "CPU
  per completed run, by process" as shares of a core, and py-spy's own CPU beside them;
- PostgreSQL's processes with ``perf record`` when ``perf`` is installed.

Prints, per kind of process, its share of a core in the window, its functions by own samples,
and runcontrol's own functions by inclusive samples. py-spy comes with ``ray[serve]``; root, or
``kernel.yama.ptrace_scope`` 0, to read other processes. Linux only.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

import psycopg

from runcontrol.embedded import DATABASE, HANDLES

from . import cpu

HOLDER = "--holder="  # on the command line of every worker process bench.e2e starts
MEASURED_AFTER = 150  # runs in the database: bench.e2e's warm-up (50) and 100 measured
SKIPPED = {
    "postgres",
    "driver (load generator)",
    "ingress (HAProxy)",
    "Serve controller",
    "ray and the rest",
}
ATTACH_S = 8.0  # py-spy's start (its symbol tables), before the window
_LINE = re.compile(r":\d+\)$")
_PATH = re.compile(r"\((?:.*/site-packages/|.*/(?=runcontrol/|actors/|bench/))?")
OURS = ("runcontrol/", "actors/")


def frame_name(frame: str) -> str:
    """``fn (path:line)`` as ``fn (short/path)``: no line, the path from the package down."""
    return _PATH.sub("(", _LINE.sub(")", frame), count=1)


def fold(lines: Iterable[str]) -> tuple[int, collections.Counter[str], collections.Counter[str]]:
    """py-spy's raw (collapsed) stacks: the samples, and by function its own samples and its
    inclusive samples (a function counted once per stack however deep it recurses)."""
    total = 0
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    for line in lines:
        stack, _, count = line.rstrip().rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [frame_name(f) for f in stack.split(";")]
        total += n
        own[frames[-1]] += n
        for name in set(frames):
            inclusive[name] += n
    return total, own, inclusive


def _python(pid: int) -> bool:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return False
    return cmd.startswith("ray::") or "python" in cmd.split(" ", 1)[0]


def _spied(pid: int, kind: str) -> bool:
    """Whether to sample ``pid``: runcontrol's Python processes and the workers, not Ray's own
    (dashboard, monitors, Serve's controller: a few % of a core whatever the load, and each
    py-spy costs CPU). While two or more processes were sampled, gRPC workers' exchanges
    sometimes slowed to a tenth for as long as py-spy ran (hosts from 45 % of a core to 5 %;
    never with HTTP submissions, one process sampled, or no py-spy): read a gRPC window's
    shares against the bench's own figures."""
    return kind not in SKIPPED and _python(pid)


def _workers(pids: Iterable[int]) -> set[int]:
    found = set()
    for pid in pids:
        try:
            if HOLDER.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.add(pid)
        except OSError:
            continue
    return found


def _wait_for_runs(child: subprocess.Popen[bytes]) -> None:
    """Until the measured runs flow, or the bench ends: more runs in the bench's database than
    its warm-up submits (read as the server's superuser, over its socket)."""
    while child.poll() is None:
        time.sleep(1.0)
        for postmaster in _postmasters(child.pid):
            socket_dir = _arg(postmaster, "-k")
            if socket_dir is None:
                continue  # it ended, or listens on no socket
            try:
                with psycopg.connect(host=socket_dir, dbname=DATABASE, user="postgres") as conn:
                    row = conn.execute("SELECT count(*) FROM runs").fetchone()
            except psycopg.Error:
                continue  # not up yet, or not the schema yet
            if row and row[0] > MEASURED_AFTER:
                return


def _arg(pid: int, flag: str) -> str | None:
    """The value after ``flag`` on ``pid``'s command line (None: it ended, or has none)."""
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
        return args[args.index(flag) + 1]
    except (OSError, ValueError, IndexError):
        return None


def _perf_report(data: Path, top: int) -> list[str]:
    out = subprocess.run(
        ["perf", "report", "-i", str(data), "--no-children", "--sort", "symbol", "--stdio"],
        capture_output=True,
        text=True,
    ).stdout
    rows = [ln.strip() for ln in out.splitlines() if ln.strip() and not ln.startswith("#")]
    return [r for r in rows if "%" in r.split(" ", 1)[0]][:top]


def _print_kind(kind: str, share: float, files: list[Path], top: int) -> None:
    total = 0
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    for path in files:
        n, o, i = fold(path.read_text().splitlines())
        total += n
        own.update(o)
        inclusive.update(i)
    print(f"\n{kind}: {share:.1f}% of a core, {len(files)} process(es), {total} GIL samples")
    if not total:
        return
    ours = [(f, n) for f, n in inclusive.most_common() if any(p in f for p in OURS)]
    print(f"  {'own samples':<72} inclusive, runcontrol's own frames")
    left = [f"{100 * n / total:5.1f}% {f}" for f, n in own.most_common(top)]
    right = [f"{100 * n / total:5.1f}% {f}" for f, n in ours[:top]]
    left += [""] * (top - len(left))
    right += [""] * (top - len(right))
    for a, b in zip(left, right, strict=True):
        print(f"  {a[:72]:<72} {b[:90]}")


def main() -> int:
    parser = argparse.ArgumentParser(prog="bench.spy", description=__doc__.split("\n")[0])
    parser.add_argument("--transport", default="sdk", help="one of bench.e2e's transports")
    parser.add_argument("--runs", type=int, default=3000, help="enough to outlast the window")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--rate", type=int, default=20, help="py-spy samples per second")
    parser.add_argument("--top", type=int, default=10)
    parser.add_argument("--skip", action="append", default=[], help="a kind not to sample")
    parser.add_argument("--keep", metavar="DIR", help="copy the raw stacks (<pid>.txt) there")
    args = parser.parse_args()
    SKIPPED.update(args.skip)
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(spy).exists():
        print("bench.spy needs py-spy (ray[serve] brings it)", file=sys.stderr)
        return 2
    bench = [sys.executable, "-m", "bench", "--only", "e2e", "--e2e-transport", args.transport]
    bench += ["--e2e-runs", str(args.runs), "--pgbench-seconds", "2"]
    with tempfile.TemporaryDirectory(prefix="bench-spy-") as tmp:
        with open(f"{tmp}/bench.log", "wb") as log:  # the bench's output, kept with --keep
            child = subprocess.Popen(bench, stdout=log, stderr=subprocess.STDOUT)
        try:
            workers: set[int] = set()
            while not workers and child.poll() is None:
                time.sleep(0.5)
                workers = _workers(cpu.cpu_by_process(child.pid, roots=[child.pid]))
            if not workers:
                print("the bench ended before its workers started", file=sys.stderr)
                return 1
            _wait_for_runs(child)
            if child.poll() is not None:
                print("the bench ended before its measured runs:", file=sys.stderr)
                print(Path(f"{tmp}/bench.log").read_text()[-3000:], file=sys.stderr)
                return 1
            roots = [child.pid, *_postmasters(child.pid)]
            data_dirs = [d for pid in roots[1:] if (d := _arg(pid, "-D"))]
            found = cpu.cpu_by_process(child.pid, workers, roots)
            # py-spy reads each process's symbols when it attaches (seconds of CPU for Ray's
            # native libraries): the window starts after that.
            spies = {
                pid: subprocess.Popen(
                    [spy, "record", "--gil", "--nonblocking", "-r", str(args.rate)]
                    + ["-d", str(int(args.seconds + ATTACH_S)), "-f", "raw"]
                    + ["-o", f"{tmp}/{pid}.txt", "-p", str(pid)],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                for pid, (kind, _) in found.items()
                if _spied(pid, kind)
            }
            postgres = [pid for pid, (kind, _) in found.items() if kind == "postgres"]
            time.sleep(ATTACH_S)
            perf = None
            if shutil.which("perf") and postgres:
                perf = subprocess.Popen(
                    ["perf", "record", "-F", "199", "-o", f"{tmp}/perf.data"]
                    + ["-p", ",".join(map(str, postgres)), "--", "sleep", str(args.seconds)],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            before = cpu.cpu_by_process(child.pid, workers, roots)
            spy_pids = [p.pid for p in spies.values()]
            spying = sum(cpu.cpu_by_kind(-1, roots=spy_pids).values())
            started = time.monotonic()
            time.sleep(args.seconds)
            after = cpu.cpu_by_process(child.pid, workers, roots)
            window = time.monotonic() - started
            spying = sum(cpu.cpu_by_kind(-1, roots=spy_pids).values()) - spying
            for proc in [*spies.values(), *([perf] if perf else [])]:
                proc.wait()
        finally:
            child.terminate()
            child.wait()
        share: dict[str, float] = collections.defaultdict(float)  # % of a core
        files: dict[str, list[Path]] = collections.defaultdict(list)
        for pid, (kind, seconds) in after.items():
            share[kind] += 100 * (seconds - before.get(pid, (kind, 0.0))[1]) / window
            if (Path(tmp) / f"{pid}.txt").exists():
                files[kind].append(Path(tmp) / f"{pid}.txt")
        print(
            f"bench.spy: {args.transport} workers, {window:.0f} s window, py-spy --gil at "
            f"{args.rate}/s; CPU by kind of process (% of one core):"
        )
        for kind, pct in sorted(share.items(), key=lambda kv: -kv[1]):
            print(f"  {kind:<40}{pct:>7.1f}%")
        print(f"  {'py-spy itself (not counted above)':<40}{100 * spying / window:>7.1f}%")
        for kind, pct in sorted(share.items(), key=lambda kv: -kv[1]):
            if files.get(kind):
                _print_kind(kind, pct, files[kind], args.top)
        if args.keep:
            shutil.copytree(tmp, args.keep, dirs_exist_ok=True)
            for pid, (kind, _) in after.items():
                if (Path(tmp) / f"{pid}.txt").exists():
                    (Path(args.keep) / f"{pid}.kind").write_text(kind)
        if perf:
            print(f"\npostgres: {share['postgres']:.1f}% of a core (perf, own samples by symbol)")
            for row in _perf_report(Path(tmp) / "perf.data", args.top * 2):
                print(f"  {row[:110]}")
    # The bench stops its server as it ends, on the SIGTERM above too (embedded.start).
    print(f"\nthe bench's PostgreSQL: {' '.join(data_dirs)}")
    return 0


def _started(pid: int) -> int:
    """When ``pid`` started, in clock ticks since boot (/proc/<pid>/stat, field 22)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[19])


def _postmasters(root: int) -> list[int]:
    """The PostgreSQL servers the bench started (its embedded server daemonises, so it is not
    the child's descendant): postmasters (``bin/postgres -D``) started after the child whose
    data directory's handle list (the wheel's holders) names it, not another's server."""
    try:
        found, since = [], _started(root)
    except OSError:
        return []  # the bench ended
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            if b"bin/postgres\0-D" not in cmd or _started(int(pid)) < since:
                continue
            data_dir = _arg(int(pid), "-D")
            if data_dir and root in json.loads((Path(data_dir) / HANDLES).read_text()):
                found.append(int(pid))
        except (OSError, IndexError, ValueError):
            continue
    return found


if __name__ == "__main__":
    raise SystemExit(main())
