"""The run is the task: a run as the read model shows it (``store.queries.get_run``), as an
A2A ``Task``; and the ask of a task waiting for input. The table in docs/a2a.md is this
module's; a change here changes it."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import uuid4

from a2a.types.a2a_pb2 import (
    Artifact,
    Message,
    Part,
    Role,
    Task,
    TaskState,
    TaskStatus,
    TaskStatusUpdateEvent,
)
from google.protobuf.json_format import MessageToDict, ParseDict
from google.protobuf.struct_pb2 import Struct, Value

from ..domain import FailureClass, RunState
from ..domain.workflow import SIGNAL

RESULT_ARTIFACT = "result"  # the one artifact: the run's result
META = "runcontrol"  # the key of what a task's metadata says of its run

# An A2A task state per run state (the interrupted one, INPUT_REQUIRED, is the ask's).
_BY_RUN_STATE = {
    RunState.ACCEPTED: TaskState.TASK_STATE_SUBMITTED,
    RunState.RUNNING: TaskState.TASK_STATE_WORKING,
    RunState.WAITING_FOR_APPROVAL: TaskState.TASK_STATE_INPUT_REQUIRED,
    RunState.CANCELLING: TaskState.TASK_STATE_WORKING,  # CANCELED only once settled
    RunState.COMPLETED: TaskState.TASK_STATE_COMPLETED,
    RunState.FAILED: TaskState.TASK_STATE_FAILED,
    RunState.CANCELLED: TaskState.TASK_STATE_CANCELED,
}
TERMINAL = frozenset(
    {
        TaskState.TASK_STATE_COMPLETED,
        TaskState.TASK_STATE_FAILED,
        TaskState.TASK_STATE_CANCELED,
        TaskState.TASK_STATE_REJECTED,
    }
)
INTERRUPTED = frozenset({TaskState.TASK_STATE_INPUT_REQUIRED, TaskState.TASK_STATE_AUTH_REQUIRED})


@dataclass(frozen=True, slots=True)
class Ask:
    """What a task waiting for input asks: a signal (``name``) or an approval's decision
    (``approval``: the pending request as the read model shows it)."""

    kind: str  # "signal" or "approval"
    name: str | None = None
    approval: dict[str, Any] | None = None

    @property
    def key(self) -> str:
        """Which ask this is: a new one (another step, another request) has another key."""
        if self.approval is not None:
            return f"approval:{self.approval['approvalId']}:{self.approval['version']}"
        return f"signal:{self.name}"

    def to_dict(self) -> dict[str, Any]:
        if self.approval is None:
            return {"kind": "signal", "signal": self.name}
        a = self.approval
        return {
            "kind": "approval",
            "approvalId": a["approvalId"],
            "proposalHash": a["proposalHash"],
            "version": a["version"],
            "actionClass": a.get("actionClass"),
            "expiresAt": a.get("expiresAt"),
        }

    def text(self) -> str:
        if self.approval is None:
            return (
                f"The run waits for the signal {self.name!r}: reply on this task with its "
                "body (a data part, or text)."
            )
        return (
            f"The run waits for a decision on proposal {self.approval['proposalHash']}: a "
            'reviewer replies on this task with a data part {"decision": "approve" | '
            '"reject" | "request-changes", "proposalHash": ...}.'
        )


def ask_of(view: dict[str, Any]) -> Ask | None:
    """What the run waits for from outside, if anything: an approval pending (the run is
    WaitingForApproval), or a signal step waiting (Running, no worker holds it)."""
    state = RunState(view["state"])
    if state.terminal or state is RunState.CANCELLING:
        return None
    pending = view.get("pendingApprovals") or []
    if pending:
        return Ask("approval", approval=pending[0])
    for step in view.get("steps") or []:
        if step.get("kind") == SIGNAL and step.get("state") == "Running":
            return Ask("signal", name=(step.get("wait") or {}).get("signal") or step["name"])
    return None


def task_state(view: dict[str, Any]) -> TaskState:
    """The task's state: the run's (``_BY_RUN_STATE``), INPUT_REQUIRED while it asks for
    something, REJECTED for a run failed by a refusal (policy, budget, an approval rejected)."""
    state = RunState(view["state"])
    if state is RunState.FAILED and view.get("failureClass") == FailureClass.POLICY_DENIED:
        return TaskState.TASK_STATE_REJECTED
    if not state.terminal and ask_of(view) is not None:
        return TaskState.TASK_STATE_INPUT_REQUIRED
    return _BY_RUN_STATE[state]


def context_id(view: dict[str, Any]) -> str:
    """The A2A context: the one a submission named (kept as the run's correlation id), else
    the run's own."""
    return str(view.get("correlationId") or view["runId"])


def _agent_message(view: dict[str, Any], text: str, data: dict[str, Any] | None) -> Message:
    parts = [Part(text=text)]
    if data is not None:
        parts.append(Part(data=ParseDict(data, Value())))
    return Message(
        message_id=f"{view['runId']}:{view['lastEventSeq']}",
        task_id=str(view["runId"]),
        context_id=context_id(view),
        role=Role.ROLE_AGENT,
        parts=parts,
    )


def restated(view: dict[str, Any], ask: Ask, reply_to: Message) -> Message:
    """The agent's reply to a message that does not answer ``ask`` (free text on an
    approval): the ask again, under the task; nothing changed and nothing is stored."""
    message = _agent_message(view, ask.text(), ask.to_dict())
    message.message_id = f"{view['runId']}:reply:{reply_to.message_id}"
    return message


def status_of(view: dict[str, Any]) -> TaskStatus:
    state = task_state(view)
    status = TaskStatus(state=state)
    status.timestamp.FromDatetime(datetime.fromisoformat(view["updatedAt"]))
    ask = ask_of(view)
    if state == TaskState.TASK_STATE_INPUT_REQUIRED and ask is not None:
        status.message.CopyFrom(_agent_message(view, ask.text(), ask.to_dict()))
    elif state in (TaskState.TASK_STATE_FAILED, TaskState.TASK_STATE_REJECTED):
        reason = view.get("failureReason") or view.get("failureClass") or "failed"
        status.message.CopyFrom(
            _agent_message(view, str(reason), {"failureClass": view.get("failureClass")})
        )
    return status


def artifacts_of(view: dict[str, Any]) -> list[Artifact]:
    """The run's result as the task's one artifact, once Completed (a result kept elsewhere,
    ``resultRef``, is the artifact's url part)."""
    if RunState(view["state"]) is not RunState.COMPLETED:
        return []
    part: Part
    if view.get("resultRef"):
        part = Part(url=str(view["resultRef"].get("uri", "")), media_type="application/json")
    else:
        part = Part(data=ParseDict(view.get("result"), Value()))  # type: ignore[arg-type]
    return [
        Artifact(
            artifact_id=f"{view['runId']}:{RESULT_ARTIFACT}",
            name=RESULT_ARTIFACT,
            description="The run's result (its final step's).",
            parts=[part],
        )
    ]


def run_metadata(view: dict[str, Any]) -> dict[str, Any]:
    return {
        META: {
            "runId": str(view["runId"]),
            "runState": view["state"],
            "releaseId": view["releaseId"],
            "lastEventSeq": view["lastEventSeq"],
        }
    }


def history_of(view: dict[str, Any], status: TaskStatus) -> list[Message]:
    """The task's messages as the run keeps them (no transcript is stored): the submission,
    as the run took it (its input, a data part), then what the agent says now (the status
    message: the ask, the failure), if anything."""
    submitted = Message(
        message_id=f"{view['runId']}:input",
        task_id=str(view["runId"]),
        context_id=context_id(view),
        role=Role.ROLE_USER,
        parts=[Part(data=ParseDict(view.get("input") or {}, Value()))],
    )
    return [submitted, status.message] if status.HasField("message") else [submitted]


def task_of(view: dict[str, Any], *, with_artifacts: bool = True) -> Task:
    status = status_of(view)
    task = Task(
        id=str(view["runId"]),
        context_id=context_id(view),
        status=status,
        artifacts=artifacts_of(view) if with_artifacts else [],
        history=history_of(view, status),
    )
    task.metadata.update(run_metadata(view))
    return task


def rejected(message: Message, error: Exception) -> Task:
    """The answer to a submission refused before a run existed (a rate limit, capacity,
    budget): a REJECTED task under a new id, stored nowhere (a read of it is not found)."""
    task_id = str(uuid4())
    code = getattr(error, "code", type(error).__name__)
    reason = Message(
        message_id=f"{task_id}:rejected",
        task_id=task_id,
        context_id=message.context_id or task_id,
        role=Role.ROLE_AGENT,
        parts=[Part(text=str(error)), Part(data=ParseDict({"code": code}, Value()))],
    )
    status = TaskStatus(state=TaskState.TASK_STATE_REJECTED, message=reason)
    status.timestamp.GetCurrentTime()
    return Task(id=task_id, context_id=reason.context_id, status=status)


def status_update(view: dict[str, Any], events: list[dict[str, Any]]) -> TaskStatusUpdateEvent:
    """The task's status after ``events`` (the run's, in order: each ``{seq, type}`` in the
    metadata, so a reader sees every event once and resumes after the last seq it saw)."""
    update = TaskStatusUpdateEvent(
        task_id=str(view["runId"]), context_id=context_id(view), status=status_of(view)
    )
    meta = run_metadata(view)
    meta[META]["events"] = [{"seq": e["seq"], "type": e["type"]} for e in events]
    update.metadata.update(meta)
    return update


def part_values(parts: Any) -> list[tuple[str, Any]]:
    """A message's parts as (kind, value): ``text`` with its text, ``data`` with its JSON
    value; a file part (raw bytes or a url) as ``file``."""
    out: list[tuple[str, Any]] = []
    for part in parts:
        which = part.WhichOneof("content")
        if which == "text":
            out.append(("text", part.text))
        elif which == "data":
            out.append(("data", MessageToDict(part.data)))
        else:
            out.append(("file", None))
    return out


def struct_value(struct: Struct, key: str) -> Any:
    """A key of a metadata struct as plain JSON (None when absent)."""
    return MessageToDict(struct).get(key)
