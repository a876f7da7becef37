"""A step's condition (``when``, issue 32): an expression over the run's input and the
results of the steps it depends on, in the concurrency keys' language (``flow``: paths and
string literals) with comparisons and logic added. Parsed here, never evaluated by Python:
publication refuses a bad one with the position of the error (a 422), and the dispatch
reads the parsed tree (``holds``).

    condition := or
    or        := and ("||" and)*
    and       := not ("&&" not)*
    not       := "!" not | compare
    compare   := value (("==" | "!=" | "<" | "<=" | ">" | ">=") value)?
    value     := "(" or ")" | string | number | true | false | null | path
    path      := ("input" | "results") ("." name | "[" string "]")+

``results.<step>`` is the result of a dependency by name (a dependency that sent none, or
was skipped, has none). A path the data lacks is null (a condition never refuses a run); a
value alone is true unless null, false, 0, "" or empty; ``<`` and its kin compare two numbers
or two strings and are false otherwise; ``true == 1`` is false (JSON's types, not Python's).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .errors import ValidationFailed
from .flow import MAX_EXPRESSION, Literal, Path, _Parser

ROOTS = ("input", "results")
COMPARISONS = ("==", "!=", "<=", ">=", "<", ">")  # longest first: "<=" before "<"


@dataclass(frozen=True, slots=True)
class Constant:
    value: Any  # a JSON scalar: a number, true, false, null


@dataclass(frozen=True, slots=True)
class Not:
    operand: Node


@dataclass(frozen=True, slots=True)
class Binary:
    op: str  # a comparison, "&&" or "||"
    left: Node
    right: Node


Node = Literal | Path | Constant | Not | Binary


class _ConditionParser(_Parser):
    ROOTS: tuple[str, ...] = ROOTS

    def condition(self) -> Node:
        node = self.either()
        self.skip()
        if self.i < len(self.text):
            raise self.fail("expected an operator or the end")
        return node

    def either(self) -> Node:
        node = self.both()
        while self.take("||"):
            node = Binary("||", node, self.both())
        return node

    def both(self) -> Node:
        node = self.negation()
        while self.take("&&"):
            node = Binary("&&", node, self.negation())
        return node

    def negation(self) -> Node:
        self.skip()
        if self.text.startswith("!", self.i) and not self.text.startswith("!=", self.i):
            self.i += 1
            return Not(self.negation())
        return self.compare()

    def compare(self) -> Node:
        left = self.value()
        for op in COMPARISONS:
            if self.take(op):
                return Binary(op, left, self.value())
        return left

    def value(self) -> Node:
        self.skip()
        if self.take("("):
            node = self.either()
            if not self.take(")"):
                raise self.fail("expected ')'")
            return node
        if self.i < len(self.text) and (self.text[self.i] in "-." or self.text[self.i].isdigit()):
            return self.number()
        for word, constant in (("true", True), ("false", False), ("null", None)):
            end = self.i + len(word)
            if self.text.startswith(word, self.i) and not _name_char(self.text, end):
                self.i = end
                return Constant(constant)
        return self.term()

    def number(self) -> Constant:
        start = self.i
        while self.i < len(self.text) and (
            self.text[self.i].isdigit() or self.text[self.i] in "-+.eE"
        ):
            self.i += 1
        source = self.text[start : self.i]
        for kind in (int, float):
            try:
                return Constant(kind(source))
            except ValueError:
                continue
        self.i = start
        raise self.fail("expected a number")

    def take(self, token: str) -> bool:
        self.skip()
        if self.text.startswith(token, self.i):
            self.i += len(token)
            return True
        return False


def _name_char(text: str, i: int) -> bool:
    return i < len(text) and (text[i].isalnum() or text[i] == "_")


def parse(text: Any, where: str = "when", roots: tuple[str, ...] = ROOTS) -> Node:
    """The condition's tree; ``ValidationFailed`` names the position of the first error.
    ``roots``: the names a path may start with (a template's proposal constraint:
    ``proposal``)."""
    if not isinstance(text, str) or not text.strip():
        raise ValidationFailed(f"{where}: a condition is a non-empty string")
    if len(text) > MAX_EXPRESSION:
        raise ValidationFailed(f"{where}: a condition has at most {MAX_EXPRESSION} characters")
    parser = _ConditionParser(text, where)
    parser.ROOTS = roots
    return parser.condition()


def evaluate(node: Node, run_input: Mapping[str, Any] | None, results: Mapping[str, Any]) -> Any:
    """The expression's value (a child run's input field)."""
    return _value(node, {"input": run_input or {}, "results": results})


def result_names(node: Node) -> set[str]:
    """The dependencies whose results the expression reads (``results.<name>``)."""
    if isinstance(node, Path):
        return {node.parts[0]} if node.root == "results" else set()
    if isinstance(node, Not):
        return result_names(node.operand)
    if isinstance(node, Binary):
        return result_names(node.left) | result_names(node.right)
    return set()


def holds(node: Node, run_input: Mapping[str, Any] | None, results: Mapping[str, Any]) -> bool:
    """Whether the condition is true of the run's input and its dependencies' results."""
    return _truthy(evaluate(node, run_input, results))


def holds_over(node: Node, roots: Mapping[str, Any]) -> bool:
    """Whether the condition is true of these named values (``{"proposal": ...}``)."""
    return _truthy(_value(node, roots))


def _value(node: Node, roots: Mapping[str, Any]) -> Any:
    if isinstance(node, Literal):
        return node.text
    if isinstance(node, Constant):
        return node.value
    if isinstance(node, Path):
        value: Any = roots[node.root]
        for part in node.parts:
            if not isinstance(value, Mapping):
                return None
            value = value.get(part)
        return value
    if isinstance(node, Not):
        return not _truthy(_value(node.operand, roots))
    if node.op == "&&":
        return _truthy(_value(node.left, roots)) and _truthy(_value(node.right, roots))
    if node.op == "||":
        return _truthy(_value(node.left, roots)) or _truthy(_value(node.right, roots))
    return _compare(node.op, _value(node.left, roots), _value(node.right, roots))


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    return type(value).__name__


def _compare(op: str, left: Any, right: Any) -> bool:
    same = _kind(left) == _kind(right)
    if op == "==":
        return same and left == right
    if op == "!=":
        return not (same and left == right)
    if not same or _kind(left) not in ("number", "str"):
        return False
    if op == "<":
        return bool(left < right)
    if op == "<=":
        return bool(left <= right)
    if op == ">":
        return bool(left > right)
    return bool(left >= right)


def _truthy(value: Any) -> bool:
    return value not in (None, False, 0, "") and value != [] and value != {}
