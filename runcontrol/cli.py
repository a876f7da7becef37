"""The ``runcontrol`` command."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading

from .bootstrap import build_database
from .config import Settings


def _cmd_db(args: argparse.Namespace) -> int:
    settings = Settings()
    db = build_database(settings)
    print(f"database ready and migrated: {db.owner_url}")
    print(f"  app role:    {db.app_url}")
    print(f"  system role: {db.system_url}")
    return 0


def _cmd_up(args: argparse.Namespace) -> int:
    settings = Settings()
    print("runcontrol: starting PostgreSQL "
          + ("(configured URL)" if settings.database_url else "(embedded)") + " ...", flush=True)
    db = build_database(settings)
    print(f"runcontrol: database ready at {db.owner_url}", flush=True)
    print("runcontrol: running; Ctrl-C stops it.", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass
    db.dispose()
    return 0


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    parser = argparse.ArgumentParser(prog="runcontrol", description="Run-control plane for agent runs")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("up", help="start the whole service").set_defaults(func=_cmd_up)
    sub.add_parser("db", help="start/attach the database and apply migrations").set_defaults(
        func=_cmd_db
    )
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
