"""What an A2A push notification is: the delivery job's format ``a2a``
(``runcontrol.webhooks.Deliverer.formats``) for a push config's subscription.

A config receives the run's events of ``STATUS_EVENTS`` (those after which the task's status
may differ), each POSTed as A2A's ``StreamResponse`` JSON: a ``statusUpdate`` with the task's
status as the delivery reads it (as a stream's update is), or, once the task has ended, the
``task`` with its artifacts. Headers: A2A's ``X-A2A-Notification-Token`` (the config's token)
and ``Authorization: {scheme} {credentials}`` (its authentication), with the webhooks'
``Runcontrol-Event-Id`` (receivers deduplicate on it: delivery is at-least-once) and
``Runcontrol-Delivery-Attempt``. Retries, backoff and dead letters are the webhooks'.
"""

from __future__ import annotations

import json
from typing import Any

from a2a.types.a2a_pb2 import StreamResponse
from google.protobuf.json_format import MessageToDict
from sqlalchemy import Connection

from ..domain.webhooks import Undeliverable
from ..store import push_configs as store
from ..store import queries as q
from . import tasks

FORMAT = "a2a"  # the webhook subscription format of a push config
TOKEN_HEADER = "X-A2A-Notification-Token"
# The run events after which the task's status may differ (``tasks.task_state`` reads the
# run's state, and a signal step's wait): a run state's change, and a wait's start and end.
STATUS_EVENTS = ("RunAccepted", "RunStateChanged", "StepWaiting", "StepWaitEnded")


def render(
    conn: Connection, delivery: dict[str, Any], event: dict[str, Any]
) -> tuple[bytes, dict[str, str]]:
    """One push notification (the delivery job's format ``a2a``): the task's status after
    ``event`` as a ``statusUpdate``, or the ended task whole, with the config's headers."""
    config = store.config_of(conn, delivery["subscription_id"])
    view = q.get_run(conn, delivery["run_id"], project_id=None)
    if config is None or view is None:
        raise Undeliverable("the push config or its task is gone")
    response = StreamResponse()
    if tasks.task_state(view) in tasks.TERMINAL:
        response.task.CopyFrom(tasks.task_of(view))
    else:
        response.status_update.CopyFrom(
            tasks.status_update(view, [{"seq": event["seq"], "type": event["type"]}])
        )
    headers = {"Content-Type": "application/json"}
    if config["token"]:
        headers[TOKEN_HEADER] = config["token"]
    if config["auth_scheme"] and config["auth_credentials"]:
        headers["Authorization"] = f"{config['auth_scheme']} {config['auth_credentials']}"
    return json.dumps(MessageToDict(response)).encode(), headers
