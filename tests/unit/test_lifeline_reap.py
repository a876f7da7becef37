"""``lifeline.reap``, what a stop of ``runcontrol up`` ends with: it stops what is running and
leaves alone (and does not count) what has exited already."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil

from runcontrol import lifeline


def test_an_exited_process_not_yet_reaped_is_not_stopped_nor_counted() -> None:
    """The embedded postmaster, daemonised, exits at the database's stop and stays a zombie
    until PID 1 reaps it; a stop that counted it reported a postgres it had to kill (and
    waited 2 s for a process that could not go away)."""
    exited = subprocess.Popen([sys.executable, "-c", "pass"])
    proc = psutil.Process(exited.pid)
    os.waitid(os.P_PID, exited.pid, os.WEXITED | os.WNOWAIT)  # until it exits; not reaped
    assert proc.status() == psutil.STATUS_ZOMBIE
    try:
        began = time.monotonic()
        assert lifeline.reap([proc]) == {}
        assert time.monotonic() - began < 0.5
    finally:
        exited.wait()


def test_a_running_process_is_stopped_and_counted() -> None:
    running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        proc = psutil.Process(running.pid)
        name = lifeline._name(proc)
        assert lifeline.reap([proc]) == {name: 1}
        assert not proc.is_running()  # stopped (and reaped: it was this process's child)
    finally:
        running.kill()
        running.wait()
