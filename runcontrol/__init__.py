"""runcontrol: the run-control plane for agent and workflow runs, on Ray and PostgreSQL.

The public surface: the typed commands a client sends, the client and its ``Router`` port, the
settings, the domain's typed errors and the reference worker. Everything else is internal.
"""

from __future__ import annotations

import importlib
from typing import Any

# name -> the module that defines it. Loaded on first use, so importing one part (the pure
# domain, say) pulls in nothing else: ``runcontrol.domain`` stays free of every framework.
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
            "AcquireLease",
            "CancelRun",
            "Command",
            "DecideApproval",
            "DispatchRun",
            "OpenAttempts",
            "RenewLease",
            "ReportOutcome",
            "RequestApproval",
            "StartRun",
            "SubmitRequest",
            "SubmitResult",
            "SubmitRun",
            "WakeResult",
            "WakeRun",
        ),
        "commands",
    ),
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'runcontrol' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)


__all__ = [
    "AcquireLease",
    "CancelRun",
    "Claim",
    "Command",
    "DecideApproval",
    "DispatchRun",
    "EchoExecutor",
    "OpenAttempts",
    "ReferenceWorker",
    "RenewLease",
    "ReportOutcome",
    "RequestApproval",
    "Router",
    "RunControlClient",
    "Settings",
    "StartRun",
    "SubmitRequest",
    "SubmitResult",
    "SubmitRun",
    "TransientError",
    "WakeResult",
    "WakeRun",
    "errors",
]

assert sorted(__all__) == sorted(_WHERE), "__all__ and _WHERE name the same surface"
