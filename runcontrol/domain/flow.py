"""Flow control's definitions (issue 21): concurrency limits a release declares, the small
expression language their keys are written in, and the keys a run's input gives them.

A key expression is a path into the run input (``input.repository``, ``input["a-b"].c``), a
string literal (``"repo:"``), or several of those joined by ``+`` (each value rendered as a
string). It is parsed here, never evaluated by Python: publication refuses a bad one with the
position of the error, and submission refuses an input that lacks a field a key reads.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .errors import ValidationFailed

QUEUE = "queue"  # wait for a slot, released in order (priority, then arrival)
CANCEL_NEWEST = "cancel-newest"  # the run that finds the key busy is cancelled
CANCEL_OLDEST = "cancel-oldest"  # it waits, and the key's holders are cancelled
STRATEGIES = (QUEUE, CANCEL_NEWEST, CANCEL_OLDEST)
RUN = "run"  # a workflow-wide limit: a slot from the run's first dispatch to its end
ATTEMPT = "attempt"  # a step's limit, and the tenant's cap: a slot per open attempt
CONCURRENCY = "concurrency"  # the kinds of hold a step shows
CAPACITY = "capacity"
# The tenant's cap on open attempts as a key: no workflow id is empty, so it names no release's.
CAPACITY_NAME = ""
CAPACITY_KEY = "max-open-attempts"
MAX_LIMIT = 100_000
MAX_EXPRESSION = 500
MAX_KEY = 500  # characters of an evaluated key
PRIORITIES = range(1, 6)
DEFAULT_PRIORITY = 3


# ---------------------------------------------------------------------- expressions


@dataclass(frozen=True, slots=True)
class Literal:
    text: str


@dataclass(frozen=True, slots=True)
class Path:
    parts: tuple[str, ...]  # after the root
    root: str = "input"  # a key reads the input; a step's condition also ``results``

    @property
    def source(self) -> str:
        return self.root + "".join(
            f".{p}" if p.isidentifier() else f"[{json.dumps(p)}]" for p in self.parts
        )


Term = Literal | Path


class _Parser:
    """A key's terms; ``conditions.Condition`` parses its own operators over the same terms,
    with one more root (``results``)."""

    ROOTS: tuple[str, ...] = ("input",)

    def __init__(self, text: str, where: str) -> None:
        self.text, self.where, self.i = text, where, 0

    def fail(self, message: str) -> ValidationFailed:
        return ValidationFailed(
            f"{self.where}: {message} at position {self.i} of {self.text!r}",
            position=self.i,
            expression=self.text,
        )

    def skip(self) -> None:
        while self.i < len(self.text) and self.text[self.i] in " \t":
            self.i += 1

    def parse(self) -> tuple[Term, ...]:
        terms = [self.term()]
        self.skip()
        while self.i < len(self.text):
            if self.text[self.i] != "+":
                raise self.fail("expected '+' or the end")
            self.i += 1
            terms.append(self.term())
            self.skip()
        return tuple(terms)

    def term(self) -> Term:
        self.skip()
        if self.i >= len(self.text):
            raise self.fail("expected a path (input.field) or a string")
        if self.text[self.i] in "\"'":
            return Literal(self.string())
        start = self.i
        name = self.ident()
        if name not in self.ROOTS:
            self.i = start
            roots = " or ".join(self.ROOTS)
            raise self.fail(f"unknown name {name!r} (a path starts with {roots})")
        parts: list[str] = []
        while self.i < len(self.text) and self.text[self.i] in ".[":
            if self.text[self.i] == ".":
                self.i += 1
                parts.append(self.ident())
            else:
                self.i += 1
                self.skip()
                if self.i >= len(self.text) or self.text[self.i] not in "\"'":
                    raise self.fail("expected a string inside [ ]")
                parts.append(self.string())
                self.skip()
                if self.i >= len(self.text) or self.text[self.i] != "]":
                    raise self.fail("expected ']'")
                self.i += 1
        if not parts:
            raise self.fail(f"a path needs a field after {name}")
        return Path(tuple(parts), name)

    def ident(self) -> str:
        start = self.i
        while self.i < len(self.text) and (self.text[self.i].isalnum() or self.text[self.i] == "_"):
            self.i += 1
        if self.i == start or self.text[start].isdigit():
            self.i = start
            raise self.fail("expected a name")
        return self.text[start : self.i]

    def string(self) -> str:
        quote = self.text[self.i]
        self.i += 1
        out: list[str] = []
        while self.i < len(self.text):
            c = self.text[self.i]
            if c == "\\":
                if self.i + 1 >= len(self.text) or self.text[self.i + 1] not in (quote, "\\"):
                    raise self.fail("a backslash escapes only the quote or a backslash")
                out.append(self.text[self.i + 1])
                self.i += 2
                continue
            if c == quote:
                self.i += 1
                return "".join(out)
            out.append(c)
            self.i += 1
        raise self.fail("unterminated string")


def parse(text: Any, where: str = "key") -> tuple[Term, ...]:
    """The expression's terms; ``ValidationFailed`` names the position of the first error."""
    if not isinstance(text, str) or not text.strip():
        raise ValidationFailed(f"{where}: a key expression is a non-empty string")
    if len(text) > MAX_EXPRESSION:
        raise ValidationFailed(f"{where}: a key expression has at most {MAX_EXPRESSION} characters")
    return _Parser(text, where).parse()


def _rendered(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def evaluate(terms: Sequence[Term], run_input: Mapping[str, Any] | None, where: str) -> str:
    """The key the run input gives: a field the expression reads and the input lacks (or holds
    null) is refused, so no run is stored with a key nobody chose."""
    out: list[str] = []
    for term in terms:
        if isinstance(term, Literal):
            out.append(term.text)
            continue
        value: Any = run_input or {}
        for part in term.parts:
            if not isinstance(value, Mapping) or value.get(part) is None:
                raise ValidationFailed(
                    f"{where}: the run input has no {term.source} (the key reads it)",
                    field=term.source,
                )
            value = value[part]
        out.append(_rendered(value))
    key = "".join(out)
    if len(key) > MAX_KEY:
        raise ValidationFailed(f"{where}: the key is longer than {MAX_KEY} characters")
    return key


# ---------------------------------------------------------------------- definitions


@dataclass(frozen=True, slots=True)
class ConcurrencySpec:
    """One limit a release declares: at most ``limit`` holders of each key ``key`` gives."""

    key: str  # the expression's source, as published
    limit: int
    strategy: str = QUEUE
    name: str | None = None  # the key's family; None: the workflow's id

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"key": self.key, "limit": self.limit, "strategy": self.strategy}
        if self.name is not None:
            out["name"] = self.name
        return out


def concurrency_specs(raw: Any, where: str) -> tuple[ConcurrencySpec, ...] | None:
    """A definition's ``concurrency`` (the workflow's or a step's), validated; None: absent."""
    if raw is None:
        return None
    if not isinstance(raw, list) or not raw:
        raise ValidationFailed(f"{where}: concurrency must be a non-empty list")
    specs = []
    for i, item in enumerate(raw):
        at = f"{where}[{i}]"
        if not isinstance(item, dict):
            raise ValidationFailed(f"{at}: a limit is an object with key and limit")
        unknown = set(item) - {"key", "limit", "strategy", "name"}
        if unknown:
            raise ValidationFailed(f"{at}: unknown fields {sorted(unknown)}")
        parse(item.get("key"), f"{at}.key")
        limit = item.get("limit")
        if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_LIMIT:
            raise ValidationFailed(f"{at}.limit: an integer from 1 to {MAX_LIMIT}")
        strategy = item.get("strategy", QUEUE)
        if strategy not in STRATEGIES:
            raise ValidationFailed(f"{at}.strategy: one of {STRATEGIES}")
        name = item.get("name")
        if name is not None and (not isinstance(name, str) or not name or len(name) > 200):
            raise ValidationFailed(f"{at}.name: a name of 1 to 200 characters")
        specs.append(ConcurrencySpec(item["key"], limit, strategy, name))
    return tuple(specs)


def keys(
    specs: Sequence[ConcurrencySpec] | None,
    workflow_id: str,
    run_input: Mapping[str, Any] | None,
    scope: str,
    where: str,
) -> list[dict[str, Any]] | None:
    """The keys a run's input gives these limits, as the run and step rows hold them:
    ``{"name", "key", "limit", "strategy", "scope"}`` (None: no limits)."""
    if not specs:
        return None
    return [
        {
            "name": s.name or workflow_id,
            "key": evaluate(parse(s.key, f"{where}[{i}].key"), run_input, f"{where}[{i}].key"),
            "limit": s.limit,
            "strategy": s.strategy,
            "scope": scope,
        }
        for i, s in enumerate(specs)
    ]


def lock_order(k: Mapping[str, Any]) -> tuple[bool, str, str]:
    """The order a statement takes its keys' locks in (the same in every statement, so two
    never wait for each other): concurrency keys by (name, key), the tenant's cap last, so a
    run a key holds back is never queued for (nor promoted on) the cap meanwhile."""
    return (k.get("kind") == CAPACITY, str(k["name"]), str(k["key"]))


def check_priority(priority: Any) -> int:
    if not isinstance(priority, int) or isinstance(priority, bool) or priority not in PRIORITIES:
        raise ValidationFailed("priority must be an integer from 1 to 5", priority=str(priority))
    return priority


def waits_for_slot(held: Mapping[str, Any] | None) -> bool:
    """Whether a step's hold waits for a slot (a concurrency key's, the tenant's cap): not due
    until the transaction freeing one makes it so (a rate limit's hold is due at its instant)."""
    return held is not None and held.get("kind") in (CONCURRENCY, CAPACITY)


def held_label(held: Mapping[str, Any] | None) -> str | None:
    """What the API shows of a hold: ``concurrency-key repo-x 1/1``, ``rate-limit
    agent:planner until <instant>``."""
    if not held:
        return None
    if held.get("kind") == "rate-limit":
        return f"rate-limit {held.get('bucket')} until {held.get('until')}"
    if held.get("kind") == CAPACITY:
        return f"capacity max-open-attempts {held.get('holders')}/{held.get('limit')}"
    return f"concurrency-key {held.get('key')} {held.get('holders')}/{held.get('limit')}"
