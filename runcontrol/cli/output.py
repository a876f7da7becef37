"""What the commands print: a line of news, tables, fields and JSON."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from typing import Any, TextIO


def say(message: str) -> None:
    print(f"runcontrol: {message}", flush=True)


def table(rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str]], out: TextIO) -> None:
    """``rows`` as aligned columns: (header, key) pairs; nested keys with dots."""

    def cell(row: dict[str, Any], key: str) -> str:
        value: Any = row
        for part in key.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        return "-" if value is None else str(value)

    cells = [[cell(r, key) for _, key in columns] for r in rows]
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, (h, _) in enumerate(columns)]
    print(
        "  ".join(h.ljust(w) for (h, _), w in zip(columns, widths, strict=True)).rstrip(), file=out
    )
    for c in cells:
        print("  ".join(v.ljust(w) for v, w in zip(c, widths, strict=True)).rstrip(), file=out)
    if not rows:
        print("(none)", file=out)


def emit_json(value: Any, out: TextIO) -> None:
    print(json.dumps(value, indent=2, sort_keys=False), file=out)


def reply(value: Any, line: Callable[[Any], str], args: argparse.Namespace, out: TextIO) -> None:
    """A command's answer: ``value`` as JSON with ``--json``, else ``line(value)``."""
    if args.json:
        emit_json(value, out)
    else:
        print(line(value), file=out)


def listing(
    items: Sequence[dict[str, Any]],
    columns: Sequence[tuple[str, str]],
    args: argparse.Namespace,
    out: TextIO,
) -> None:
    """A list command's answer: the items as JSON with ``--json``, else as a table."""
    if args.json:
        emit_json(items, out)
    else:
        table(items, columns, out)


def fields(view: dict[str, Any], names: Sequence[tuple[str, str]], out: TextIO) -> None:
    width = max(len(label) for label, _ in names)
    for label, key in names:
        value = view.get(key)
        print(f"{label.ljust(width)}  {'-' if value is None else value}", file=out)


def bulk_outcomes(answer: dict[str, Any], key: str, args: argparse.Namespace, out: TextIO) -> int:
    """A bulk call's answer: one row per item (``key``: the item's id field), then the counts;
    answers how many items were refused."""
    if args.json:
        emit_json(answer, out)
    else:
        columns = (
            (key.upper(), key),
            ("OUTCOME", "outcome"),
            ("CODE", "code"),
            ("DETAIL", "detail"),
        )
        table(answer["items"], columns, out)
        print(", ".join(f"{n} {o}" for o, n in answer["counts"].items() if n), file=out)
    return sum(1 for i in answer["items"] if i["outcome"] not in ("decided", "accepted"))
