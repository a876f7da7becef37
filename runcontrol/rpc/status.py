"""Errors as gRPC statuses (the HTTP edge's counterpart is ``runcontrol.api.problems``).

Every refusal leaves as its status code from ``runcontrol.edge.errors.STATUS`` plus the typed
detail of gRPC's rich error model: a ``google.rpc.Status`` in the ``grpc-status-details-bin``
trailer holding a ``google.rpc.ErrorInfo`` whose ``reason`` is the error's stable ``code``
(``stale-fencing-token``, ``outcome-already-recorded`` ...), ``domain`` is ``runcontrol.dev``
and ``metadata`` carries ``retryable`` and the error's scalar details. A client in any
language reads it with its gRPC library's status helpers; ``error_from_rpc`` turns it back
into the typed error here.
"""

from __future__ import annotations

from typing import Any

import grpc
from google.rpc import error_details_pb2, status_pb2

from ..domain import errors
from ..edge.errors import grpc_status_name

DOMAIN = "runcontrol.dev"
DETAILS_KEY = "grpc-status-details-bin"

_S = grpc.StatusCode


def status_for(error: errors.RunControlError) -> grpc.StatusCode:
    """The error's row of the edges' table (``runcontrol.edge.errors.STATUS``)."""
    return grpc.StatusCode[grpc_status_name(error)]


def _metadata(error: errors.RunControlError) -> dict[str, str]:
    found = {
        k: str(v)
        for k, v in error.details.items()
        if k != "oauth_error" and isinstance(v, str | int | float | bool)
    }
    found["retryable"] = "true" if error.retryable else "false"
    return found


def rich_status(error: errors.RunControlError) -> tuple[grpc.StatusCode, str, bytes]:
    """(status code, message, serialized google.rpc.Status with the ErrorInfo)."""
    code = status_for(error)
    info = error_details_pb2.ErrorInfo(reason=error.code, domain=DOMAIN, metadata=_metadata(error))
    detail = status_pb2.Status(code=code.value[0], message=str(error))
    detail.details.add().Pack(info)
    return code, str(error), detail.SerializeToString()


# ---------------------------------------------------------------------- the client side


class RpcFailed(errors.RunControlError):
    """A status this client has no typed error for (``details["status"]`` names it)."""

    code = "rpc-failed"


def _classes() -> dict[str, type[errors.RunControlError]]:
    found: dict[str, type[errors.RunControlError]] = {}
    stack: list[type[errors.RunControlError]] = [errors.RunControlError]
    while stack:
        cls = stack.pop()
        found.setdefault(cls.code, cls)
        stack.extend(cls.__subclasses__())
    return found


# Without a typed detail: the call may or may not have run (the transport failed, the deadline
# passed, Serve shed load); the same command sent again gets the stored answer.
_UNKNOWN_OUTCOME = {_S.UNAVAILABLE, _S.DEADLINE_EXCEEDED, _S.RESOURCE_EXHAUSTED, _S.CANCELLED}


def _info(detail: bytes) -> error_details_pb2.ErrorInfo | None:
    status = status_pb2.Status.FromString(detail)
    for item in status.details:
        info = error_details_pb2.ErrorInfo()
        if item.Unpack(info) and info.domain == DOMAIN:
            return info
    return None


def error_info(call: Any) -> error_details_pb2.ErrorInfo | None:
    """The ErrorInfo of a failed call (a ``grpc.RpcError``), if the server sent one."""
    for key, value in call.trailing_metadata() or ():
        if key == DETAILS_KEY:
            return _info(value)
    return None


def error_from_rpc(call: Any) -> errors.RunControlError:
    """The typed error a failed call (a ``grpc.RpcError``) stands for."""
    code: grpc.StatusCode = call.code()
    return _typed(code, call.details() or code.name, error_info(call))


def error_from_status(code: int, message: str, detail: bytes) -> errors.RunControlError:
    """The typed error of a refusal carried as data (an exchange's answer): the status code's
    number, its message and the serialized google.rpc.Status of ``rich_status``."""
    status = next((s for s in _S if s.value[0] == code), _S.UNKNOWN)
    return _typed(status, message or status.name, _info(detail) if detail else None)


def _typed(
    code: grpc.StatusCode, message: str, info: error_details_pb2.ErrorInfo | None
) -> errors.RunControlError:
    if info is not None:
        cls = _classes().get(info.reason)
        details: dict[str, Any] = {k: v for k, v in info.metadata.items() if k != "retryable"}
        if cls is not None:
            return cls(message, **details)
        return RpcFailed(message, status=code.name, reason=info.reason, **details)
    if code in _UNKNOWN_OUTCOME:
        return errors.Unavailable(message, status=code.name)
    return RpcFailed(message, status=code.name)
