"""Domain dataclasses to and from protobuf messages, field by name, checked at import.

A ``Codec`` pairs a dataclass with a message: each field of the dataclass is the message field
of the same name (or of the name ``rename`` gives it), and how a value crosses follows from the
two types, so nothing is written out per field:

- ``UUID``, ``str`` and ``StrEnum`` fields are strings (an enum by its value); an ``Enum``
  field on a proto enum goes by member name (``AttemptOutcome.TIMED_OUT`` <-> ``TIMED_OUT``);
- ``datetime`` is a ``google.protobuf.Timestamp``; a JSON document (``dict``, or ``Any``: any
  JSON value) is its canonical JSON text, in the field ``<name>_json``; a tuple of dataclasses
  is a repeated message, through the dataclass's own codec;
- proto3 has no null for scalars: ``None`` is the empty string, 0 or an unset timestamp on the
  wire, and an empty wire value gives the field its default (``command_id``: a new one).

Building a codec checks both sides: a field of the dataclass the message lacks, a message
field nobody fills, or a pair of types with no rule is a ``TypeError`` when the module that
declares the codec loads, not a value silently lost on the wire. ``supplied`` names fields
the wire does not carry (the caller gives them when decoding: the tenant from the token);
``extra`` message fields the dataclass does not hold (the caller gives them when encoding).
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from enum import Enum
from typing import Any, Generic, TypeVar
from uuid import UUID

from google.protobuf import timestamp_pb2
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass

from ..domain import canonical_json, errors

T = TypeVar("T")
Encode = Callable[[Any], Any]
Decode = Callable[[Any], Any]

_FD = FieldDescriptor
_INTS = {_FD.TYPE_INT32, _FD.TYPE_INT64, _FD.TYPE_UINT32, _FD.TYPE_UINT64}
_ZERO: dict[int, Any] = {_FD.TYPE_STRING: "", _FD.TYPE_BOOL: False, _FD.TYPE_DOUBLE: 0.0}
_ZERO.update(dict.fromkeys(_INTS, 0))
_TIMESTAMP = "google.protobuf.Timestamp"


def _unwrap(hint: Any) -> tuple[Any, bool]:
    """(the type, whether None is allowed)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1:
            return args[0], len(args) < len(typing.get_args(hint))
    return hint, False


def uuid_field(value: str, name: str) -> UUID:
    """An id from a message; a malformed one is the sender's error."""
    try:
        return UUID(value)
    except ValueError:
        raise errors.ValidationFailed(f"{name} must be a UUID", field=name) from None


def _enum_by_value(cls: type[Enum], name: str) -> Decode:
    def decode(value: str) -> Enum:
        try:
            return cls(value)
        except ValueError:
            what = name.replace("_", " ")
            raise errors.ValidationFailed(f"unknown {what} {value!r}", field=name) from None

    return decode


def _json(name: str) -> Decode:
    def decode(text: str) -> Any:
        try:
            value = json.loads(text)
        except ValueError:
            raise errors.ValidationFailed(f"{name} must be JSON", field=name) from None
        if not isinstance(value, dict):
            raise errors.ValidationFailed(f"{name} must be a JSON object", field=name)
        return value

    return decode


def _json_value(name: str) -> Decode:
    def decode(text: str) -> Any:
        try:
            return json.loads(text)
        except ValueError:
            raise errors.ValidationFailed(f"{name} must be JSON", field=name) from None

    return decode


def json_object(text: str) -> dict[str, Any] | None:
    """A JSON object's text (an answer's), or None when empty or not an object."""
    value = json.loads(text) if text else None
    return value if isinstance(value, dict) else None


def json_text(value: Any) -> str:
    return "" if value is None else canonical_json(value).decode()


def timestamp(value: datetime | str) -> timestamp_pb2.Timestamp:
    """A time, or its ISO text (as a read model's JSON view holds it), as a Timestamp."""
    ts = timestamp_pb2.Timestamp()
    ts.FromDatetime(datetime.fromisoformat(value) if isinstance(value, str) else value)
    return ts


def _proto_enum(cls: type[Enum], fd: Any, where: str) -> tuple[Encode, Decode]:
    numbers = fd.enum_type.values_by_name
    missing = [m.name for m in cls if m.name not in numbers]
    if missing:
        raise TypeError(f"{where}: the proto enum {fd.enum_type.name} lacks {missing}")
    by_number = {numbers[m.name].number: m for m in cls}

    def decode(number: int) -> Enum:
        if number not in by_number:
            raise errors.ValidationFailed(f"unknown {fd.name} {number}", field=fd.name)
        return by_number[number]

    return (lambda v: numbers[v.name].number), decode


@dataclasses.dataclass(frozen=True, slots=True)
class _Field:
    attr: str  # the dataclass field
    wire: str  # the message field
    encode: Encode  # a non-None value -> what the message field takes
    decode: Decode  # a present wire value -> the field's value
    message: bool  # a message field (present: HasField), else a scalar or repeated
    repeated: bool
    zero: Any  # a scalar's proto3 default: the wire's "absent"
    absent: Decode  # the zero (or unset) wire value -> the field's value, or _OMIT


class Codec(Generic[T]):
    """``cls`` <-> ``message``, field by name (see the module docstring)."""

    def __init__(
        self,
        cls: type[T],
        message: type[Message],
        *,
        rename: Mapping[str, str] | None = None,
        supplied: tuple[str, ...] = (),
        extra: tuple[str, ...] = (),
    ) -> None:
        rename = rename or {}
        self.cls = cls
        self.message = message
        self.supplied = frozenset(supplied)
        where = f"{cls.__name__} <-> {message.DESCRIPTOR.full_name}"
        hints = typing.get_type_hints(cls)
        wire_fields = message.DESCRIPTOR.fields_by_name
        fields = [f for f in dataclasses.fields(cls) if f.name not in self.supplied]  # type: ignore[arg-type]
        wire_of = {f.name: rename.get(f.name) or _wire_name(f.name, wire_fields) for f in fields}
        wires = set(wire_of.values())
        unknown = sorted(wires - set(wire_fields))
        unfilled = sorted(set(wire_fields) - wires - set(extra))
        if unknown or unfilled or not self.supplied <= set(hints):
            raise TypeError(
                f"{where}: fields the message lacks {unknown}, "
                f"message fields without a field {unfilled}"
            )
        self._fields = tuple(
            self._field(f, hints[f.name], wire_fields[wire_of[f.name]], where) for f in fields
        )

    @staticmethod
    def _field(f: dataclasses.Field[Any], hint: Any, fd: Any, where: str) -> _Field:
        """``fd``: the message field's ``FieldDescriptor``."""
        kind, optional = _unwrap(hint)
        name = fd.name
        encode: Encode = _same
        decode: Decode = _same
        ok = False
        if fd.is_repeated:
            (item,) = typing.get_args(kind)[:1] or (None,)
            if typing.get_origin(kind) is tuple and dataclasses.is_dataclass(item):
                nested = Codec(item, GetMessageClass(fd.message_type))  # type: ignore[arg-type]
                encode = lambda v: [nested.encode(i) for i in v]  # noqa: E731
                decode = lambda v: tuple(nested.decode(i) for i in v)  # noqa: E731
                ok = fd.type == _FD.TYPE_MESSAGE
        elif fd.type == _FD.TYPE_MESSAGE:
            ok = kind is datetime and fd.message_type.full_name == _TIMESTAMP
            encode, decode = timestamp, lambda v: v.ToDatetime(tzinfo=UTC)
        elif fd.type == _FD.TYPE_ENUM:
            ok = isinstance(kind, type) and issubclass(kind, Enum)
            if ok:
                encode, decode = _proto_enum(kind, fd, f"{where} {name}")
        elif fd.type == _FD.TYPE_STRING:
            if kind is UUID:
                ok, encode, decode = True, str, lambda v: uuid_field(v, name)
            elif isinstance(kind, type) and issubclass(kind, Enum):
                ok, encode, decode = True, lambda v: v.value, _enum_by_value(kind, name)
            elif kind is str:
                ok = True
            elif typing.get_origin(kind) is dict or kind is dict:
                ok, encode, decode = True, json_text, _json(name)
            elif kind is Any:  # any JSON value (a result)
                ok, encode, decode = True, json_text, _json_value(name)
        elif fd.type in _INTS:
            ok = kind is int
        elif fd.type == _FD.TYPE_BOOL:
            ok = kind is bool
        elif fd.type == _FD.TYPE_DOUBLE:
            ok = kind is float
        if not ok:
            raise TypeError(f"{where}: no rule for {f.name}: {hint} <-> {name} ({fd.type})")
        absent: Decode = decode
        if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING:
            absent = _omit  # the dataclass's default
        elif optional:
            absent = _none
        elif fd.type == _FD.TYPE_MESSAGE or fd.type == _FD.TYPE_ENUM:
            absent = _required(name)  # no wire value stands for "absent"
        elif decode is not _same and encode is json_text:
            absent = _empty_object
        return _Field(
            attr=f.name,
            wire=name,
            encode=encode,
            decode=decode,
            message=fd.type == _FD.TYPE_MESSAGE and not fd.is_repeated,
            repeated=fd.is_repeated,
            zero=_ZERO.get(fd.type, 0),
            absent=absent,
        )

    @property
    def fields(self) -> tuple[tuple[str, str], ...]:
        """(dataclass field, message field) of each field that crosses."""
        return tuple((f.attr, f.wire) for f in self._fields)

    def encode(self, value: T, **extra: Any) -> Any:
        """The message of ``value``; ``extra``: the message fields the dataclass lacks."""
        return self.encode_values({f.attr: getattr(value, f.attr) for f in self._fields}, extra)

    def encode_values(self, values: Mapping[str, Any], extra: Mapping[str, Any]) -> Any:
        """The message of the dataclass's field values (ids may be their text)."""
        found = dict(extra)
        for f in self._fields:
            v = values.get(f.attr)
            if v is not None:
                found[f.wire] = f.encode(v)
        return self.message(**found)

    def decode(self, message: Any, **supplied: Any) -> T:
        """The dataclass of ``message``; ``supplied``: the fields the wire does not carry."""
        found = dict(supplied)
        for f in self._fields:
            v = getattr(message, f.wire)
            present = f.repeated or (message.HasField(f.wire) if f.message else v != f.zero)
            value = f.decode(v) if present else f.absent(v)
            if value is not _OMIT:
                found[f.attr] = value
        return self.cls(**found)


_OMIT = object()


def _wire_name(name: str, wire_fields: Mapping[str, Any]) -> str:
    """The field of the same name; a JSON document's is ``<name>_json``."""
    return name if name in wire_fields or name + "_json" not in wire_fields else name + "_json"


def _same(value: Any) -> Any:
    return value


def _omit(_: Any) -> Any:
    return _OMIT


def _none(_: Any) -> None:
    return None


def _empty_object(_: Any) -> dict[str, Any]:
    return {}


def _required(name: str) -> Decode:
    def absent(_: Any) -> Any:
        raise errors.ValidationFailed(f"{name} is required", field=name)

    return absent
