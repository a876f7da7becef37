"""The worker session: one exchange per worker process per run host (DESIGN 10).

A worker process keeps one session with each run host. Each exchange carries, up, the
session's free slots as *credits* and its fenced commands (reports, renewals, approval
requests, progress, tool calls) in one batch; and answers, down, with the commands' answers,
the *grants* the host made to those credits, and the *cancels* of attempts it holds. A host
matches the attempts its own commits dispatch to the credits waiting on it, in memory: an
attempt has exactly one granting host and a claim costs no read.

The same messages travel in the cluster (an actor call per exchange, the dataclasses as they
are) and over gRPC (``Exchange``, a unary long poll per host, through Serve's gRPC ingress),
so the worker SDK (``runcontrol.sdk``) has one loop for both transports.

Rules both sides keep:

- A credit's ``claim_id`` is the command id of the ``AcquireLease`` that grants it: a credit
  resent after a lost exchange (``resent=True``) finds the lease it was granted by that id
  (the stored answer, ``store.queries.claimed``) instead of leaving it to expire unworked.
- ``credits`` in an exchange is the *whole* set the session now offers this host (it replaces
  the last one): a credit left out is withdrawn, unless it was granted meanwhile, in which
  case its grant comes down in this answer. A credit is offered to one host at a time, so no
  slot is ever granted twice; the worker moves idle credits towards hosts whose ``backlog``
  says they have dispatched attempts waiting.
- A grant is sent again in every answer until an exchange lists its claim id in ``acks``.
- A new exchange of the same session supersedes the one still waiting (it is answered at once
  with what it has); exchanges of one session are otherwise independent.
- Exchanges are not delivered in order (two in flight; Ray async actors and gRPC keep no
  order). ``seq`` increases per session and host: an exchange older than the newest its host
  saw is *late*; its commands and acks count, its credits do not (they would offer again a
  credit the newer one withdrew). An exchange that failed is not retried with the same
  ``seq``: the worker sends a newer one, the failed one's credits ``resent``.
- Commands in ``commands`` are answered by ``command_id``, each as if sent alone (a refusal
  answers that command, not the exchange).
- ``cancels``: attempts of this session's grants whose run is being cancelled; the worker
  stops the function and reports ``Cancelled``. The renewal's ``cancel_requested`` stays the
  fallback (a grant made by a host that has since restarted).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol
from uuid import UUID

from ..commands import Command
from ..domain import JournaledCall, LeaseGrant

# Longest a host holds an exchange with nothing to say (the worker asks for less).
MAX_WAIT_S = 30.0


@dataclass(frozen=True, slots=True)
class Credit:
    """One free worker slot offered to a host: lease one attempt of these agents to ``holder``.

    ``tenant_id`` set: only that tenant's attempts (a worker authenticated as a tenant's
    identity; over gRPC the server sets it from the token, never from the request)."""

    claim_id: str
    holder: str
    agent_ids: tuple[str, ...]
    tenant_id: str | None = None
    resent: bool = False


@dataclass(frozen=True, slots=True)
class Grant:
    """A lease granted to a credit, with what the function needs to start: the run's input
    and the results of the steps it depends on (by step name)."""

    claim_id: str
    tenant_id: str
    lease: LeaseGrant
    input: dict[str, Any] | None
    results: Mapping[str, Any] = field(default_factory=dict)
    # When the control plane cancels the run (its wall-clock budget or its lifetime, the
    # earlier: ``RunAggregate.deadline``); None for a grant found again in the store by its
    # claim id after its host restarted.
    deadline_at: datetime | None = None
    # The journaled calls its step recorded (``step.run``), oldest first; past the grant's
    # cap (RunControl:Calls:GrantMaxBytes) a call comes without its value, read when needed.
    calls: tuple[JournaledCall, ...] = ()

    def fenced(self) -> dict[str, Any]:
        """The fields a fenced command takes from this grant's lease:
        ``ReportOutcome(**grant.fenced(), outcome=..., outcome_hash=...)``."""
        return fenced_fields(self.tenant_id, self.lease)


def fenced_fields(tenant_id: str, lease: LeaseGrant) -> dict[str, Any]:
    """The fields a fenced command takes from a lease of a run of ``tenant_id``."""
    return {
        "tenant_id": tenant_id,
        "run_id": lease.run_id,
        "attempt_id": lease.attempt_id,
        "holder": lease.holder,
        "fencing_token": lease.fencing_token,
        "lease_id": lease.lease_id,
    }


@dataclass(frozen=True, slots=True)
class Answer:
    """A command's answer: its result, or the typed error that refused it."""

    command_id: str
    ok: bool
    value: Any


@dataclass(frozen=True, slots=True)
class SessionUp:
    session_id: str
    credits: Sequence[Credit] = ()
    commands: Sequence[Command[Any]] = ()
    acks: Sequence[str] = ()
    wait_s: float = 0.0
    # increasing per session and host (0: the worker keeps no order, each up counts)
    seq: int = 0


@dataclass(frozen=True, slots=True)
class SessionDown:
    answers: Sequence[Answer] = ()
    grants: Sequence[Grant] = ()
    cancels: Sequence[UUID] = ()
    # agent id -> attempts dispatched on this host that no credit has taken yet
    backlog: Mapping[str, int] = field(default_factory=dict)
    # how many run hosts there are: the worker keeps one session with each
    hosts: int = 1
    # the host is draining: it took none of the credits (offer them to another host) and
    # refused the commands (``errors.Draining``: send them to another host); grants and
    # cancels it still had come down as usual
    draining: bool = False


class SessionTransport(Protocol):
    """How a worker reaches run host ``host`` (0 <= host < hosts): an actor call in the
    cluster (the router, ``actors.placement.HostRouter``, or a ``RunControlClient`` over it),
    a gRPC ``Exchange`` anywhere else (``runcontrol.rpc.exchange.GrpcSessionTransport``)."""

    async def hosts(self) -> int: ...

    async def exchange(self, host: int, up: SessionUp) -> SessionDown: ...
