"""The ``runcontrol`` command, one module per audience:

- the service, which runs on the Ray runtime handed in (``cluster``): ``up`` and ``hosts``
  (``service``, with the demo ``up`` runs in ``demo``) and ``worker`` (``workers``);
- the platform's setup: ``token`` (``tokens``), ``db``/``migrate``, ``release``, ``policy`` and
  ``restore-check`` (``admin``), and ``shards`` (where the virtual shards are; moving one);
- people, over the HTTP API (``http_api``): ``runs`` and ``events`` (``runs``), ``approvals``,
  ``schedules``, ``webhooks``, ``templates``, and for operators ``queues`` and ``ops`` (``ops``).

runcontrol never imports ``actors``: the console script (``actors/cli.py``) calls ``main``
with the Ray runtime's loader; ``python -m runcontrol.cli`` runs every command but those.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from ..domain import errors
from ..store.schema import SchemaMismatch
from . import (
    admin,
    approvals,
    ops,
    runs,
    schedules,
    service,
    shards,
    templates,
    tokens,
    webhooks,
    workers,
)
from .cluster import ClusterLoader

# A refusal that may succeed when sent again exits 75 (sysexits' EX_TEMPFAIL), as mail and
# backup tools do, so a script can tell "retry" from "wrong" (exit 1) and bad usage (exit 2).
EX_TEMPFAIL = 75


def main(argv: list[str] | None = None, cluster: ClusterLoader | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    parser = argparse.ArgumentParser(
        prog="runcontrol", description="Run-control plane for agent runs"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    service.add_up(sub, cluster)
    service.add_hosts(sub, cluster)
    workers.add_worker(sub, cluster)
    tokens.add_token(sub)
    admin.add_db(sub)
    admin.add_release(sub)
    admin.add_policy(sub)
    admin.add_restore_check(sub)
    shards.add_shards(sub)
    runs.add_runs(sub)
    approvals.add_approvals(sub)
    schedules.add_schedules(sub)
    webhooks.add_webhooks(sub)
    templates.add_templates(sub)
    ops.add_queues(sub)
    runs.add_events(sub)
    ops.add_ops(sub)

    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except BrokenPipeError:
        # The reader went away (``| head``): stop quietly, as a Unix tool does; what is still
        # buffered for stdout goes nowhere rather than failing again at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE
    except SchemaMismatch as exc:  # a process that may not run on this schema: say why, once
        raise SystemExit(f"runcontrol: {exc}") from None
    except errors.RunControlError as exc:  # refused: its code and why, one line, no traceback
        again = " (nothing was done: send it again)" if exc.retryable else ""
        print(f"runcontrol {args.command}: {exc.code}: {exc.message}{again}", file=sys.stderr)
        return EX_TEMPFAIL if exc.retryable else 1
