"""The platform's own setup, straight on the database (or, for a release, over the HTTP API):
``runcontrol db`` (``migrate``), ``release``, ``policy`` and ``restore-check``."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from datetime import UTC, datetime
from typing import Any

from ..bootstrap import build, build_database
from ..config import Settings
from ..domain import WorkflowDefinition, errors
from ..ports.policy import DEFAULT_POLICY_ID, document_from_dict, document_to_dict, publish_policy
from . import http_api
from .output import say


def _cmd_db(args: argparse.Namespace) -> int:
    db = build_database(Settings())  # every shard database (RUNCONTROL_SHARDS__DATABASES)
    databases = db.databases()
    for index, each in enumerate(databases):
        version = each.schema_version()
        shard = f" (shard database {index})" if len(databases) > 1 else ""
        print(f"database ready and migrated{shard}: {each.owner_url}")
        print(
            f"  schema:      revision {version.revision}, runs code from {version.oldest_code} on"
        )
        print(f"  app role:    {each.app_url}")
        print(f"  system role: {each.system_url}")
    return 0


def _cmd_release(args: argparse.Namespace) -> int:
    """Publish a workflow definition: over the HTTP API with ``--url`` (the token's tenant;
    ``POST /factory/releases`` checks it again), otherwise straight into the database
    (``--tenant``). Bad input is one line on stderr and exit 2, never a traceback."""
    try:
        with open(args.file, encoding="utf-8") as fh:
            data = json.load(fh)
        definition = WorkflowDefinition.from_dict(data)
    except OSError as exc:
        print(f"runcontrol release: cannot read {args.file}: {exc.strerror}", file=sys.stderr)
        return 2
    except json.JSONDecodeError as exc:
        print(f"runcontrol release: {args.file} is not JSON: {exc}", file=sys.stderr)
        return 2
    except errors.ValidationFailed as exc:
        print(f"runcontrol release: invalid workflow definition: {exc}", file=sys.stderr)
        return 2
    aliases = args.alias or ["latest"]
    if args.url:
        body = {"definition": data, "aliases": aliases}

        def publish(api: http_api.Api, _: argparse.Namespace, out: Any) -> None:
            found = api.call("POST", "/factory/releases", json=body)
            release = {"releaseId": found["releaseId"], "contentHash": found["contentHash"]}
            print(json.dumps(release), file=out)

        return http_api.run(publish, args)
    if not args.tenant:
        print("runcontrol release: --tenant is required without --url", file=sys.stderr)
        return 2
    container = build(Settings())
    try:
        release = container.releases.publish(
            args.tenant, definition, args.publisher, container.env.clock.now(), aliases=aliases
        )
    finally:
        container.db.dispose()
    print(json.dumps({"releaseId": release.release_id, "contentHash": release.content_hash}))
    return 0


def _cmd_policy(args: argparse.Namespace) -> int:
    """Publish an approval policy revision (the JSON of ``POST /factory/policies``)."""
    try:
        with open(args.file, encoding="utf-8") as fh:
            data = json.load(fh)
        doc = document_from_dict(DEFAULT_POLICY_ID, "", data)
    except (OSError, json.JSONDecodeError, errors.ValidationFailed) as exc:
        print(f"runcontrol policy: {exc}", file=sys.stderr)
        return 2
    db = build_database(Settings())
    try:
        published = publish_policy(db, args.tenant, doc, datetime.now(UTC))
    finally:
        db.dispose()
    print(
        json.dumps(
            {
                "policyId": published.policy_id,
                "revision": published.revision,
                "document": document_to_dict(published),
            }
        )
    )
    return 0


def _cmd_restore_check(args: argparse.Namespace) -> int:
    """After a restore from a backup: settle the open leases it holds (docs/operations.md)."""
    from ..restore import restore_check

    container = build(Settings())

    async def main() -> list[Any]:
        try:
            return await restore_check(container)
        finally:
            await container.store.close()

    try:
        settled = asyncio.run(main())
    finally:
        container.db.dispose()
    for run in settled:
        print(
            json.dumps(
                {
                    "tenantId": run.tenant_id,
                    "runId": str(run.run_id),
                    "settledUncertain": run.attempts,
                    "runState": run.run_state,
                }
            ),
            flush=True,
        )
    attempts = sum(len(run.attempts) for run in settled)
    say(f"restore-check: {attempts} open lease(s) of {len(settled)} run(s) settled Uncertain")
    return 0


def add_db(sub: Any) -> None:
    sub.add_parser(
        "db",
        aliases=["migrate"],
        help="start/attach the database and apply migrations (the first step of an upgrade)",
    ).set_defaults(func=_cmd_db)


def add_release(sub: Any) -> None:
    release = sub.add_parser("release", help="publish a workflow definition (JSON) as a release")
    release.add_argument("file")
    release.add_argument("--tenant", help="straight into the database (without --url)")
    release.add_argument("--publisher", default="cli")
    release.add_argument("--alias", action="append", default=None)
    release.add_argument(
        "--url", default=None, help="publish through the HTTP API (a WorkspaceAdmin's token)"
    )
    release.add_argument("--token", default=None, help="with --url: bearer (RUNCONTROL_TOKEN)")
    release.set_defaults(func=_cmd_release)


def add_policy(sub: Any) -> None:
    policy = sub.add_parser(
        "policy", help="publish an approval policy revision (JSON) for a tenant"
    )
    policy.add_argument("file")
    policy.add_argument("--tenant", required=True)
    policy.set_defaults(func=_cmd_policy)


def add_restore_check(sub: Any) -> None:
    sub.add_parser(
        "restore-check",
        help="after restoring the database from a backup: settle its open leases as Uncertain",
    ).set_defaults(func=_cmd_restore_check)
