"""runcontrol: the run-control plane for agent and workflow runs, on Ray and PostgreSQL.

The public surface: the typed commands a client sends, the client and its ``Router`` port, the
settings, the domain's typed errors, the worker SDK (``Worker``, ``Step``, the errors an
agent raises) and the reference worker. Everything else is internal.
"""

from __future__ import annotations

import importlib
from typing import Any

from . import commands as _commands

# name -> the module that defines it. Loaded on first use, so importing one part (the pure
# domain, say) pulls in nothing else: ``runcontrol.domain`` stays free of every framework.
# The commands (pure, like the domain they are made of) are named by ``commands.__all__``.
_WHERE = {
    "Claim": "client",
    "Router": "client",
    "RunControlClient": "client",
    "Settings": "config",
    "errors": "domain",
    "EchoExecutor": "worker",
    "ReferenceWorker": "worker",
    "TransientError": "worker",
    **dict.fromkeys(
        (
            "Worker",
            "Step",
            "SyncStep",
            "Transient",
            "Permanent",
            "Uncertain",
            "Approval",
            "ToolCall",
        ),
        "sdk",
    ),
    **dict.fromkeys(_commands.__all__, "commands"),
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'runcontrol' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)


__all__ = sorted(_WHERE)  # noqa: PLE0605 - the surface is _WHERE's keys
