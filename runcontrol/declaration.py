"""How a command is declared (``declare``), beside its fields in ``runcontrol.commands``.

A declaration names, once: who sends the command (``Sender``: the audit's actor), the rule
that decides it (a pure function of the run aggregate, ``runcontrol.domain.run``, called with
the command's fields by name and checked here when the module declaring it loads), whether its
statement also dispatches what became due, how its answer is read off the run, a refusal read
off the answer, its after-commit effect and its gRPC method. ``declare`` makes the class the
frozen dataclass of its fields. ``fingerprint`` hashes what a command asks (its type and
fields): stored with its answer, it tells a command id reused for another command apart from a
resend.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum, StrEnum
from types import MappingProxyType
from typing import Any, Protocol, TypeVar, dataclass_transform
from uuid import UUID

from .domain import Attempt, CommandContext, Principal, RunAggregate, canonical_hash, errors
from .domain.machines import RUN_COMMANDS, Guard, RunCommand
from .json_dumps import dumps


class Addressed(Protocol):
    """A command as its declaration sees it (``commands.Command``): the run it is for."""

    @property
    def tenant_id(self) -> str: ...

    @property
    def run_id(self) -> UUID: ...

    @property
    def command_id(self) -> str: ...


@dataclass(frozen=True, slots=True)
class Sender:
    """Who sends a command, and so the actor its journal entries and audits name: the
    command's field ``field`` (a principal's subject), or the fixed ``actor`` of a part of
    the system. ``foreign``: the refusal of a principal of another tenant than the run's (as
    if the thing it names were not there)."""

    role: str
    field: str | None = None
    actor: str | None = None
    foreign: Callable[[Addressed], errors.RunControlError] | None = None

    def actor_of(self, command: Addressed) -> str:
        if self.field is None:
            assert self.actor is not None
            return self.actor
        value = getattr(command, self.field)
        return value.subject if isinstance(value, Principal) else str(value)

    def admit(self, command: Addressed, tenant_id: str) -> None:
        if self.foreign is None or self.field is None:
            return
        if getattr(command, self.field).tenant_id != tenant_id:
            raise self.foreign(command)


LEASE_HOLDER = Sender("lease holder", "holder")
REVIEWER = Sender(
    "reviewer", "principal", foreign=lambda c: errors.ApprovalNotFound("approval not found")
)
OPERATOR = Sender(
    "operator", "principal", foreign=lambda c: errors.RunNotFound(f"run {c.run_id} not found")
)
SUBMITTER = Sender("submitter", "principal")


def caller(field: str) -> Sender:
    """A caller from outside the run (a client, a user) named by the command's ``field``."""
    return Sender("caller", field)


def system(actor: str) -> Sender:
    """A part of Run Control itself (the dispatcher, the reminder, restore-check)."""
    return Sender("system", actor=actor)


class AfterCommit(StrEnum):
    """An effect outside the run's statement, once the command committed (the grain's
    ``AFTER_COMMIT`` does it; never for a resend answered from the store)."""

    MOVE_RATE_BUCKET = "move-rate-bucket"  # the tenant's bucket of a named limit moves


# What the grain gives a rule besides the command's fields, by parameter name: the options,
# the run's pinned policy revision, the template version it was submitted from and a replay's
# original run (each read only for a rule that takes it).
GIVEN = frozenset({"options", "policy", "template", "replay"})
# A command's fields the rule is not given: the address and the id (the grain's business).
ADDRESS = frozenset({"tenant_id", "run_id", "command_id"})

Answer = Callable[[RunAggregate, Any, Any, "Attempt | None"], Any]


@dataclass(frozen=True, slots=True)
class Declaration:
    """What a command is, beyond its fields (``declare``).

    ``decide``: the rule, ``decide(run, ctx, **arguments)`` (None: the grain handles the
    command itself, ``grain.handlers.SPECIAL``); ``dispatches``: the same statement then
    dispatches what became due; ``answer``: the answer from (run, command, what ``decide``
    returned, the attempt dispatched), by default what ``decide`` returned; ``refuse``: a
    refusal read off the answer, a stored one too (a progress gap); ``rpc``: the gRPC method
    a worker sends it through (``rpc.table``)."""

    command: type[Any]  # a ``commands.Command``
    sender: Sender
    decide: Callable[..., Any] | None
    dispatches: bool
    answer: Answer | None
    refuse: Callable[[Any], errors.RunControlError | None] | None
    after_commit: AfterCommit | None
    rpc: str | None
    fields: tuple[str, ...]  # the rule's parameters the command's fields give
    given: frozenset[str]  # the rule's parameters of ``GIVEN``

    @property
    def policy(self) -> bool:
        """The rule takes the run's pinned policy revision (the grain reads it first)."""
        return "policy" in self.given

    @property
    def guard(self) -> Guard | None:
        """The run states that admit the command: its row of ``RUN_COMMANDS`` (the one source,
        beside the state machines; its rule checks it), None when only its rule's other checks
        limit it (a fenced command: its lease)."""
        try:
            return RUN_COMMANDS[RunCommand(self.command.__name__)]
        except ValueError:
            return None

    @property
    def answers(self) -> Any:
        """``R`` of the command's ``Command[R]``."""
        return typing.get_args(self.command.__orig_bases__[0])[0]

    def arguments(self, command: Addressed) -> dict[str, Any]:
        return {name: getattr(command, name) for name in self.fields}

    def decided(
        self,
        run: RunAggregate,
        ctx: CommandContext,
        command: Addressed,
        given: dict[str, Any],
        dispatch: Callable[[RunAggregate, CommandContext], Attempt | None],
    ) -> Any:
        """The rule on the run, then (when declared) the dispatch of what became due: the
        answer. Pure but for ``dispatch`` (the grain's: the run's next attempts)."""
        assert self.decide is not None
        value = self.decide(run, ctx, **self.arguments(command), **given)
        dispatched = dispatch(run, ctx) if self.dispatches else None
        return value if self.answer is None else self.answer(run, command, value, dispatched)


def _plain(value: Any) -> Any:
    if isinstance(value, frozenset | set):
        return sorted(str(v.value if isinstance(v, Enum) else v) for v in value)
    return str(value)


# A command's field holding any JSON value (a result): ``fingerprint`` takes its canonical hash
# (orjson cannot write every JSON number, and the document would be as large as the value).
JSON_VALUE: dict[str, bool] = {"json": True}


_FINGERPRINTED: dict[type[Any], tuple[tuple[str, bool], ...]] = {}


def _fingerprinted(cls: type[Any]) -> tuple[tuple[str, bool], ...]:
    """The fields a command of ``cls`` is fingerprinted by, each with whether it is a JSON
    value (read once per class: every command is fingerprinted, issue 33)."""
    found = _FINGERPRINTED.get(cls)
    if found is None:
        found = _FINGERPRINTED[cls] = tuple(
            (f.name, bool(f.metadata.get("json")))
            for f in dataclasses.fields(cls)
            if f.name != "command_id"
        )
    return found


def fingerprint(command: Addressed) -> str:
    """A hash of what the command asks (its type and fields, not its id): a command id reused
    for a different command is told apart from a resend of the same one."""
    fields: dict[str, Any] = {}
    for name, json_value in _fingerprinted(type(command)):
        value = getattr(command, name)
        fields[name] = canonical_hash(value) if json_value and value is not None else value
    body = dumps([type(command).__name__, fields], _plain, sort_keys=True)
    return hashlib.sha256(body).hexdigest()


_DECLARED: dict[type[Any], Declaration] = {}
C = TypeVar("C")


@dataclass_transform(frozen_default=True, kw_only_default=True)
def declare(
    sender: Sender,
    decide: Callable[..., Any] | None = None,
    *,
    dispatches: bool = False,
    answer: Answer | None = None,
    refuse: Callable[[Any], errors.RunControlError | None] | None = None,
    after_commit: AfterCommit | None = None,
    rpc: str | None = None,
) -> Callable[[type[C]], type[C]]:
    """Declare a command (see ``Declaration``): the class becomes a frozen, slotted,
    keyword-only dataclass, its fields the message's. The rule's parameters are the command's
    fields by name (of the same type) and ``GIVEN``; every field but the address is read by
    the rule or names the sender. A mismatch is a ``TypeError`` when this module loads."""

    def declared(cls: type[C]) -> type[C]:
        cls = dataclass(frozen=True, slots=True, kw_only=True)(cls)
        fields, given = _bind(cls, sender, decide)
        _DECLARED[cls] = Declaration(
            cls, sender, decide, dispatches, answer, refuse, after_commit, rpc, fields, given
        )
        return cls

    return declared


def _bind(
    cls: type[Any], sender: Sender, decide: Callable[..., Any] | None
) -> tuple[tuple[str, ...], frozenset[str]]:
    """The rule's parameters the command gives, and those of ``GIVEN``."""
    if decide is None:
        return (), frozenset()
    name = f"{cls.__name__} -> {decide.__qualname__}"
    hints = typing.get_type_hints(cls)
    rule_hints = typing.get_type_hints(decide)
    params = list(inspect.signature(decide).parameters.values())[2:]  # after (run, ctx)
    fields: list[str] = []
    for p in params:
        if p.name in hints and p.name not in ADDRESS:
            if not _fits(hints[p.name], rule_hints.get(p.name, Any)):
                raise TypeError(f"{name}: {p.name} is {hints[p.name]}, the rule takes another type")
            fields.append(p.name)
        elif p.name not in GIVEN and p.default is inspect.Parameter.empty:
            raise TypeError(f"{name}: no field or given value for the rule's {p.name!r}")
    unread = set(hints) - ADDRESS - set(fields) - {sender.field}
    if unread:
        raise TypeError(f"{name}: the rule reads no field {sorted(unread)}")
    return tuple(fields), frozenset(p.name for p in params) & GIVEN


def _fits(field_type: Any, param_type: Any) -> bool:
    if param_type is Any or field_type == param_type:
        return True
    outer, inner = typing.get_origin(field_type), typing.get_origin(param_type)
    return isinstance(outer, type) and isinstance(inner, type) and issubclass(outer, inner)


def declared() -> Mapping[type[Any], Declaration]:
    """Every command declared so far (``commands.DECLARATIONS``, once that module loaded)."""
    return MappingProxyType(dict(_DECLARED))
