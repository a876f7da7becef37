"""``runcontrol shards``: where the virtual shards are, and moving one (with its tenants) to
another database, straight on the databases as their owner (docs/sharding.md, "Moving a
tenant"). The databases are ``RUNCONTROL_SHARDS__DATABASES``, by position (0: the first, which
holds the directory); every one must be migrated (``runcontrol migrate``)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any, TextIO
from uuid import UUID

from sqlalchemy import func, select

from ..config import Settings
from ..domain.moves import Step
from ..store import Database
from ..store.directory import Directory
from ..store.move import Move, MoveError, Mover
from ..store.tables import vshards
from .output import emit_json, table

MOVE_COLUMNS = (
    ("MOVE", "move"),
    ("VSHARD", "vshard"),
    ("FROM", "from"),
    ("TO", "to"),
    ("STEP", "step"),
    ("TENANTS", "tenants"),
    ("UPDATED", "updated"),
    ("ERROR", "error"),
)


def databases(settings: Settings) -> list[Database]:
    """The configured shard databases, by position; each at this code's schema."""
    urls = settings.shard_databases()
    if not urls:
        raise MoveError("no shard databases: set RUNCONTROL_SHARDS__DATABASES (two or more)")
    found = []
    for position, url in enumerate(urls):
        first = position == 0  # the role URLs set apart are the first database's
        db = Database(
            url,
            app_url=settings.app_database_url if first else None,
            system_url=settings.system_database_url if first else None,
            role_password=settings.app_role_password,
            pool_size=2,
        )
        found.append(db)
        try:
            db.require_compatible_schema()
        except BaseException:
            for made in found:
                made.dispose()
            raise
    return found


def view(move: Move) -> dict[str, Any]:
    return {
        "move": str(move.move_id),
        "vshard": move.vshard,
        "from": move.source,
        "to": move.target,
        "step": move.step.value,
        "tenants": ",".join(move.tenants) or None,
        "started": move.started_at.isoformat(timespec="seconds"),
        "updated": move.updated_at.isoformat(timespec="seconds"),
        "error": move.error,
    }


def _progress(out: TextIO) -> Callable[[Step], None]:
    def done(step: Step) -> None:
        print(f"  {step.value:<10} done", file=out, flush=True)

    return done


def _move(args: argparse.Namespace, mover: Mover, out: TextIO) -> Move:
    if args.vshard is not None:
        vshard = args.vshard
    else:
        vshard = Directory(mover.databases[0].system).vshard_for(args.tenant)
        print(f"tenant {args.tenant} is on virtual shard {vshard}", file=out)
    print(f"moving virtual shard {vshard} (every tenant on it) to database {args.to}", file=out)
    return mover.start(vshard, args.to)


def _resume(args: argparse.Namespace, mover: Mover, out: TextIO) -> Move:
    print(f"resuming move {args.move}", file=out)
    return mover.resume(args.move)


def _abort(args: argparse.Namespace, mover: Mover, out: TextIO) -> Move:
    return mover.abort(args.move)


def _status(args: argparse.Namespace, mover: Mover, out: TextIO) -> None:
    with mover.databases[0].system.connect() as conn:
        per = select(vshards.c.database, vshards.c.state, func.count())
        counts = conn.execute(per.group_by(vshards.c.database, vshards.c.state)).all()
    shards = [{"database": d, "state": s, "vshards": n} for d, s, n in sorted(counts)]
    moves = [view(m) for m in mover.moves(args.limit)]
    if args.json:
        emit_json({"databases": len(mover.databases), "shards": shards, "moves": moves}, out)
        return
    print(f"{len(mover.databases)} shard databases; virtual shards by database:", file=out)
    table(shards, (("DATABASE", "database"), ("STATE", "state"), ("VSHARDS", "vshards")), out)
    print("\nmoves (open first):", file=out)
    table(moves, MOVE_COLUMNS, out)


def _run(action: Callable[[argparse.Namespace, Mover, TextIO], Any]) -> Callable[..., int]:
    """A ``shards`` command: its answer on stdout, a move that stops one line on stderr (the
    journal keeps where and why: ``runcontrol shards status``) and exit 1."""

    def command(args: argparse.Namespace) -> int:
        out = sys.stdout
        mover: Mover | None = None
        try:
            hook = None if getattr(args, "json", False) else _progress(out)
            mover = Mover(databases(Settings()), quiet_s=args.quiet, hook=hook)
            moved = action(args, mover, out)
        except MoveError as exc:
            print(f"runcontrol shards: {exc}", file=sys.stderr)
            return 1
        finally:
            if mover is not None:
                mover.close()
                for db in mover.databases:
                    db.dispose()
        if isinstance(moved, Move):
            if args.json:
                emit_json(view(moved), out)
            else:
                table([view(moved)], MOVE_COLUMNS, out)
        return 0

    return command


def add_shards(sub: Any) -> None:
    shards = sub.add_parser("shards", help="the virtual shards' databases; move one")
    verbs = shards.add_subparsers(dest="verb", required=True)

    def verb(name: str, action: Any, help_text: str) -> argparse.ArgumentParser:
        parser: argparse.ArgumentParser = verbs.add_parser(name, help=help_text)
        parser.add_argument("--json", action="store_true")
        parser.add_argument(
            "--quiet",
            type=float,
            default=2.0,
            help="seconds without a commit of the shard's tenants before it is fenced",
        )
        parser.set_defaults(func=_run(action))
        return parser

    move = verb("move", _move, "move a tenant's virtual shard (its tenants) to a database")
    which = move.add_mutually_exclusive_group(required=True)
    which.add_argument("--tenant", help="the virtual shard this tenant is on")
    which.add_argument("--vshard", type=int)
    move.add_argument(
        "--to", type=int, required=True, help="the database, by its position (0: the first)"
    )
    status = verb("status", _status, "where the virtual shards are, and the moves")
    status.add_argument("--limit", type=int, default=20)
    verb("resume", _resume, "take a stopped move on from its last step").add_argument(
        "move", type=UUID
    )
    verb("abort", _abort, "give up a move that has not flipped").add_argument("move", type=UUID)
