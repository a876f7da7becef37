"""A2A push notification configs: ``CreateTaskPushNotificationConfig``, Get, List and
Delete on a task, stored in PostgreSQL (``store.push_configs``), each delivered through a
webhook subscription of its run by the scheduler's delivery job (what it sends:
``notify``). A config is its owner's (the token's subject): another caller, of the tenant or
not, neither reads nor deletes it; every config of a task is delivered.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from a2a.types.a2a_pb2 import (
    AuthenticationInfo,
    ListTaskPushNotificationConfigsResponse,
    TaskPushNotificationConfig,
)
from a2a.utils.errors import InvalidParamsError, TaskNotFoundError
from sqlalchemy import Connection

from ..api.context import Services
from ..domain import errors
from ..domain.webhooks import check_url
from ..store import push_configs as store
from ..store.webhooks import RunScope
from ..webhooks import resolve_host
from .notify import FORMAT, STATUS_EVENTS
from .store import Call, RunTaskStore

MAX_CONFIGS = 10  # per task and owner
MAX_ID = 200
MAX_HEADER = 4096  # a token's, a scheme's or credentials' characters


class PushConfigs:
    """The push config methods of ``RunTaskHandler``: each on a task the caller can read
    (``TaskNotFound`` otherwise), on the caller's own configs."""

    def __init__(self, services: Services, task_store: RunTaskStore) -> None:
        self.svc = services
        self.tasks = task_store

    async def set(
        self, call: Call, view: dict[str, Any], config: TaskPushNotificationConfig
    ) -> TaskPushNotificationConfig:
        """Store ``config`` for the task ``view`` shows (a config of that id replaced)."""
        run_id = UUID(view["runId"])
        config_id = config.id or str(run_id)  # A2A: an id left out is the task's
        options = self.svc.settings.webhooks
        token = _header_value("token", config.token)
        scheme = _header_value("authentication.scheme", config.authentication.scheme)
        credentials = _header_value("authentication.credentials", config.authentication.credentials)
        if len(config_id) > MAX_ID:
            raise InvalidParamsError(f"a push config id is at most {MAX_ID} characters")
        if credentials and not scheme:
            raise InvalidParamsError("authentication.credentials needs its scheme")
        try:  # the webhooks' rule: http(s), no credentials in it, no private address
            await asyncio.to_thread(
                check_url,
                config.url,
                allow_private=options.allow_private_addresses,
                resolve=resolve_host,
            )
        except errors.InvalidWebhookUrl as exc:
            raise InvalidParamsError(f"push notification url: {exc}") from None
        owner = call.caller.principal.subject

        def write(conn: Connection) -> bool:
            return store.set_config(
                conn,
                tenant_id=call.caller.tenant_id,
                run_id=run_id,
                owner=owner,
                config_id=config_id,
                url=config.url,
                token=token,
                auth_scheme=scheme,
                auth_credentials=credentials,
                scope=RunScope(run_id, STATUS_EVENTS, FORMAT),
                max_attempts=options.max_attempts,
                max_configs=MAX_CONFIGS,
                now=datetime.now(UTC),
            )

        if not await self.tasks.read(call, write):
            raise InvalidParamsError(f"a task holds at most {MAX_CONFIGS} push configs per caller")
        return await self.get(call, str(run_id), config_id)

    async def get(self, call: Call, task_id: str, config_id: str) -> TaskPushNotificationConfig:
        found = await self._configs(call, task_id, config_id or task_id)
        if not found:
            raise TaskNotFoundError(f"task {task_id} has no push config {config_id!r}")
        return found[0]

    async def list_configs(
        self, call: Call, task_id: str
    ) -> ListTaskPushNotificationConfigsResponse:
        return ListTaskPushNotificationConfigsResponse(configs=await self._configs(call, task_id))

    async def delete(self, call: Call, task_id: str, config_id: str) -> None:
        """Remove the caller's config (none of that id: nothing to do, as A2A's own store)."""
        run_id = UUID((await self.tasks.view(call, task_id))["runId"])
        owner = call.caller.principal.subject
        now = datetime.now(UTC)
        await self.tasks.read(
            call, lambda conn: store.delete_config(conn, run_id, owner, config_id, now)
        )

    async def _configs(
        self, call: Call, task_id: str, config_id: str | None = None
    ) -> list[TaskPushNotificationConfig]:
        run_id = UUID((await self.tasks.view(call, task_id))["runId"])
        owner = call.caller.principal.subject
        rows = await self.tasks.read(
            call, lambda conn: store.configs(conn, run_id, owner, config_id)
        )
        return [_config(row) for row in rows]


def _config(row: dict[str, Any]) -> TaskPushNotificationConfig:
    config = TaskPushNotificationConfig(
        id=row["config_id"], task_id=str(row["run_id"]), url=row["url"], token=row["token"] or ""
    )
    if row["auth_scheme"]:
        config.authentication.CopyFrom(
            AuthenticationInfo(scheme=row["auth_scheme"], credentials=row["auth_credentials"] or "")
        )
    return config


def _header_value(name: str, value: str) -> str | None:
    """A value sent as a header: printable ASCII (no line break to smuggle another header),
    at most ``MAX_HEADER`` characters; empty is none."""
    if not value:
        return None
    if len(value) > MAX_HEADER or not all(" " <= c <= "~" for c in value):
        raise InvalidParamsError(
            f"{name} must be printable ASCII of at most {MAX_HEADER} characters"
        )
    return value
