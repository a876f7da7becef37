"""Nothing outlives ``runcontrol up``: every process it starts carries its tag, and a watchdog
stops them all when it ends, however it ends (SIGKILL included).

``runcontrol up`` puts ``RUNCONTROL_UP=<key>:<pid>`` into its environment before it starts
anything, where ``key`` names its data dir. Every process it starts inherits it, however far
down: the embedded PostgreSQL (``pg_ctl`` daemonises it, so it is nobody's child), Ray's GCS,
raylet and workers, and Serve's HAProxy (started by a Ray worker, and left behind when that
worker is killed). ``/proc/PID/environ`` is the environment a process was started with, so the
tag stays readable for the process's life, whoever its parent is by then.

The watchdog (``python -m runcontrol.lifeline KEY PID``, started first, in a session of its own
so a terminal's Ctrl-C does not reach it) holds the read end of a pipe whose write end only
``runcontrol up`` holds. The kernel closes that end when the process ends, for any reason, and
the watchdog's read returns: it stops every process carrying the tag (``reap``). A start that
finds processes tagged with its key whose owner is gone (a watchdog killed too, e.g. by
``kill -9`` of everything) stops them the same way and says so (``leftovers``).

The tag alone misses some: a process that rewrites its title (``setproctitle``, as Ray's agents
do) can overwrite the start of its environment, and with it the tag (seen: Ray's dashboard and
runtime-env agents survived a reap by tag). So the watchdog also records, every half second,
every descendant of ``runcontrol up`` (pid and start time, in ``<data dir>.processes.json``)
and stops those too; a start reads the record a dead owner left.

PostgreSQL is stopped through its postmaster only (SIGINT: a fast shutdown, which ends its
backends itself); signalling its backends one by one would look like a crash to it.
"""

from __future__ import annotations

import hashlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import psutil

TAG = "RUNCONTROL_UP"


def key_for(data_dir: str | Path) -> str:
    """The key of one install: its data dir (what a leftover of an earlier run shares)."""
    return key_of(str(Path(data_dir).expanduser().resolve()))


def key_of(identity: str) -> str:
    return hashlib.sha256(identity.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Tagged:
    process: psutil.Process
    owner: int  # the pid of the ``runcontrol up`` that started it
    name: str


def _environ_tag(proc: psutil.Process) -> str | None:
    try:
        tag: str | None = proc.environ().get(TAG)
    except (psutil.Error, OSError):
        return None
    return tag


def tagged(key: str) -> list[Tagged]:
    """Every live process carrying a tag of ``key`` (this process and its watchdog excepted)."""
    found = []
    me = os.getpid()
    for proc in psutil.process_iter(["name"]):
        if proc.pid == me:
            continue
        tag = _environ_tag(proc)
        if tag is None or not tag.startswith(key + ":"):
            continue
        try:
            owner = int(tag.rsplit(":", 1)[1])
        except ValueError:
            continue
        found.append(Tagged(proc, owner, str(proc.info["name"] or "?")))
    return found


def _is_postmaster(proc: psutil.Process) -> bool:
    try:
        parent = proc.parent()
        return bool(proc.name() == "postgres" and (parent is None or parent.name() != "postgres"))
    except psutil.Error:
        return False


def _name(proc: psutil.Process) -> str:
    try:
        return str(proc.name())
    except psutil.Error:
        return "?"


def reap(found: Iterable[psutil.Process], timeout_s: float = 2.0) -> Counter[str]:
    """Stop ``found``: SIGTERM (the postmaster SIGINT, PostgreSQL's children left to it), then
    SIGKILL what is left after ``timeout_s``. Answers how many of each name were stopped."""
    targets: dict[int, psutil.Process] = {}
    names: Counter[str] = Counter()
    for proc in found:
        if proc.pid in targets or proc.pid == os.getpid():
            continue
        name = _name(proc)
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                # Exited already, not yet reaped by its parent (a daemonised postmaster's is
                # PID 1, which in a container may be slow to): nothing left to stop. Counted,
                # it made a clean stop say "killed what Serve left: postgres" after waiting 2 s.
                continue
            if name == "postgres" and not _is_postmaster(proc):
                continue  # its postmaster ends it
            proc.send_signal(signal.SIGINT if name == "postgres" else signal.SIGTERM)
        except psutil.Error:
            continue
        targets[proc.pid] = proc
        names[name] += 1
    _, alive = psutil.wait_procs(list(targets.values()), timeout=timeout_s)
    for proc in alive:
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=2.0)
    return names


def describe(names: Counter[str]) -> str:
    return ", ".join(f"{name} x{n}" if n > 1 else name for name, n in sorted(names.items()))


def owner_alive(pid: int) -> bool:
    """Whether ``pid`` is a live ``runcontrol up`` (a pid reused by another program is not)."""
    try:
        cmdline = psutil.Process(pid).cmdline()
    except psutil.Error:
        return False
    return any("runcontrol" in part for part in cmdline) and "up" in cmdline


def record_path(data_dir: str | Path) -> Path:
    resolved = Path(data_dir).expanduser().resolve()
    return resolved.with_name(resolved.name + ".processes.json")


def _recorded(path: Path) -> tuple[int | None, list[psutil.Process]]:
    """The owner and the still-running processes of a record (a pid whose start time differs
    is another process by now)."""
    try:
        data = json.loads(path.read_text())
        owner = int(data["owner"])
        entries = [(int(pid), float(created)) for pid, created in data["processes"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None, []
    found = []
    for pid, created in entries:
        try:
            proc = psutil.Process(pid)
            if abs(proc.create_time() - created) < 0.01:
                found.append(proc)
        except psutil.Error:
            continue
    return owner, found


def _owned(key: str, owner: int, record: Path) -> list[psutil.Process]:
    """What ``owner`` started and is still running: by tag and by its watchdog's record."""
    by_tag = [t.process for t in tagged(key) if t.owner == owner]
    recorded_owner, recorded = _recorded(record)
    return by_tag + (recorded if recorded_owner == owner else [])


def leftovers(key: str, record: Path) -> tuple[int | None, int | None, list[psutil.Process]]:
    """``(pid, None, [])`` when a live ``runcontrol up`` owns this key; else ``(None, owner,
    processes)`` left by ones that are gone (the owner as recorded, if a record was left)."""
    found = tagged(key)
    recorded_owner, recorded = _recorded(record)
    owners = {t.owner for t in found} | ({recorded_owner} if recorded_owner else set())
    for owner in sorted(owners):
        if owner != os.getpid() and owner_alive(owner):
            return owner, None, []
    procs = [t.process for t in found if t.owner != os.getpid()] + recorded
    return None, recorded_owner or min(owners, default=None), procs


class Lifeline:
    """The watchdog of this process: ``start`` tags this process's environment (so what it
    starts from now on carries the tag) and starts the watchdog."""

    def __init__(self, key: str, record: Path) -> None:
        self.key = key
        self.record = record
        self.tag = f"{key}:{os.getpid()}"
        self._write_fd: int | None = None
        self.watchdog: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        read_fd, write_fd = os.pipe()  # both close-on-exec: no other child holds the write end
        self.watchdog = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "runcontrol.lifeline",
                self.key,
                str(os.getpid()),
                str(self.record),
            ],
            stdin=read_fd,
            start_new_session=True,
        )
        os.close(read_fd)
        self._write_fd = write_fd
        os.environ[TAG] = self.tag  # after the watchdog: it must not reap itself

    def reap_now(self, timeout_s: float = 2.0, skip: tuple[str, ...] = ()) -> Counter[str]:
        """Stop what this process started and is still running (the end of a stop), but
        processes named in ``skip``."""
        mine = _owned(self.key, os.getpid(), self.record)
        me = psutil.Process()
        watchdog = self.watchdog.pid if self.watchdog else None
        return reap(
            (p for p in mine if p.pid != watchdog and p != me and _name(p) not in skip),
            timeout_s,
        )


def port_holder(port: int) -> tuple[int | None, str] | None:
    """``(pid, name)`` of the process listening on TCP ``port``, or None when it is free."""
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port:
            if conn.pid is None:
                return None, "unknown: not visible to this user"
            try:
                return conn.pid, psutil.Process(conn.pid).name()
            except psutil.Error:
                return conn.pid, "?"
    return None


# A reap's first pass gives each process this long to stop on SIGTERM; the passes after it
# stop what the first one's targets started meanwhile (Serve's HAProxy manager spawns a new
# HAProxy when its process dies, a Ray worker being stopped may start one), all within 5 s.
FIRST_PASS_S = 1.5
LATER_PASS_S = 0.5
PASSES_S = 4.5


def reap_all(key: str, owner: int, record: Path) -> Counter[str]:
    """Stop everything ``owner`` started, again until nothing of it is left (at most
    ``PASSES_S``): one pass missed a HAProxy started while it ran (issue 34: still running 5 s
    after a SIGKILL of ``runcontrol up``)."""
    deadline = time.monotonic() + PASSES_S
    names = reap(_owned(key, owner, record), FIRST_PASS_S)
    while time.monotonic() < deadline:
        left = [p for p in _owned(key, owner, record) if _running(p)]
        if not left:
            break
        names += reap(left, LATER_PASS_S)
    return names


def _running(proc: psutil.Process) -> bool:
    try:
        return bool(proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


def _watch(key: str, owner: int, record: Path) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is the owner's to handle
    me = os.getpid()
    seen: dict[int, float] = {}
    try:
        parent = psutil.Process(owner)
    except psutil.Error:
        parent = None
    while parent is not None:
        ready, _, _ = select.select([sys.stdin], [], [], 0.5)
        if ready and not os.read(sys.stdin.fileno(), 4096):
            break  # EOF: the owner has ended, however it ended
        try:
            now = {p.pid: p.create_time() for p in parent.children(recursive=True)}
        except psutil.Error:
            break
        now.pop(me, None)
        if not now.keys() <= seen.keys():
            seen.update(now)
            tmp = record.with_suffix(".tmp")
            tmp.write_text(json.dumps({"owner": owner, "processes": list(seen.items())}))
            tmp.replace(record)
    started = time.monotonic()
    names = reap_all(key, owner, record)
    record.unlink(missing_ok=True)
    if names:
        print(
            f"runcontrol: stopped what runcontrol up (pid {owner}) left running: "
            f"{describe(names)} ({time.monotonic() - started:.1f} s)",
            file=sys.stderr,
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(_watch(sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])))
