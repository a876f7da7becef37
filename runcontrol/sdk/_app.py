"""``--app package.module:attribute``: find the ``Worker`` a user's code declares."""

from __future__ import annotations

import importlib

from ._worker import Worker


class AppNotFound(Exception):
    """The ``--app`` path does not name a ``Worker`` (the message is one line)."""


def load_app(path: str) -> Worker:
    """The ``Worker`` at ``package.module:attribute`` (``attribute`` may be dotted)."""
    module_name, sep, attribute = path.partition(":")
    if not sep or not module_name or not attribute:
        raise AppNotFound(f"--app {path!r}: expected package.module:attribute")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise AppNotFound(f"--app {path!r}: cannot import {module_name!r}: {_line(exc)}") from None
    except Exception as exc:  # noqa: BLE001 - the user's module failed while importing
        raise AppNotFound(
            f"--app {path!r}: importing {module_name!r} failed: {type(exc).__name__}: {_line(exc)}"
        ) from None
    value: object = module
    for part in attribute.split("."):
        try:
            value = getattr(value, part)
        except AttributeError:
            raise AppNotFound(f"--app {path!r}: {module_name!r} has no {attribute!r}") from None
    if not isinstance(value, Worker):
        raise AppNotFound(
            f"--app {path!r}: {attribute!r} is a {type(value).__name__}, not a Worker"
        )
    return value


def _line(exc: BaseException) -> str:
    return " ".join(str(exc).split())
