"""Error codes as gRPC statuses: the gRPC edge's twin of ``runcontrol.api.problems``.

Every refusal leaves as a status code from ``STATUS_BY_CODE`` plus the typed detail of gRPC's
rich error model: a ``google.rpc.Status`` in the ``grpc-status-details-bin`` trailer holding a
``google.rpc.ErrorInfo`` whose ``reason`` is the error's stable ``code`` (``stale-fencing-token``,
``outcome-already-recorded`` ...), ``domain`` is ``runcontrol.dev`` and ``metadata`` carries
``retryable`` and the error's scalar details. A client in any language reads it with its gRPC
library's status helpers; ``error_from_rpc`` turns it back into the typed error here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import grpc
from google.rpc import error_details_pb2, status_pb2

from ..domain import errors

DOMAIN = "runcontrol.dev"
DETAILS_KEY = "grpc-status-details-bin"

_S = grpc.StatusCode

# Looked up along the error's MRO, so a subclass without a row inherits its parent's status.
STATUS_BY_CODE: Mapping[str, grpc.StatusCode] = {
    # the edges (runcontrol.api.problems raises these for tokens and requests)
    "bad-request": _S.INVALID_ARGUMENT,
    "request-invalid": _S.INVALID_ARGUMENT,
    "unauthorized": _S.UNAUTHENTICATED,
    "insufficient-scope": _S.PERMISSION_DENIED,
    # the domain
    errors.ValidationFailed.code: _S.INVALID_ARGUMENT,
    errors.BreakGlassReasonRequired.code: _S.INVALID_ARGUMENT,
    errors.NotFound.code: _S.NOT_FOUND,  # a run of another tenant is not found, too
    errors.RunNotFound.code: _S.NOT_FOUND,
    errors.StepNotFound.code: _S.NOT_FOUND,
    errors.AttemptNotFound.code: _S.NOT_FOUND,
    errors.ApprovalNotFound.code: _S.NOT_FOUND,
    errors.WorkflowNotFound.code: _S.NOT_FOUND,
    errors.ReleaseNotFound.code: _S.NOT_FOUND,
    errors.WebhookNotFound.code: _S.NOT_FOUND,
    errors.InvalidWebhookUrl.code: _S.INVALID_ARGUMENT,
    errors.WebhookDisabled.code: _S.FAILED_PRECONDITION,
    errors.Conflict.code: _S.FAILED_PRECONDITION,
    errors.IllegalTransition.code: _S.FAILED_PRECONDITION,  # e.g. the run has ended
    errors.IdempotencyConflict.code: _S.ALREADY_EXISTS,
    errors.ConcurrencyConflict.code: _S.ABORTED,
    errors.RunTerminal.code: _S.FAILED_PRECONDITION,
    errors.LeaseHeld.code: _S.FAILED_PRECONDITION,
    errors.LeaseRejected.code: _S.FAILED_PRECONDITION,  # the attempt is settled / run moved on
    errors.StaleFencingToken.code: _S.FAILED_PRECONDITION,
    errors.LeaseNotHeld.code: _S.FAILED_PRECONDITION,
    errors.LeaseExpired.code: _S.FAILED_PRECONDITION,
    errors.OutcomeAlreadyRecorded.code: _S.ALREADY_EXISTS,
    errors.ApprovalVersionMismatch.code: _S.ABORTED,
    errors.ApprovalAlreadyDecided.code: _S.ALREADY_EXISTS,
    errors.ProposalHashMismatch.code: _S.FAILED_PRECONDITION,
    errors.ApprovalGone.code: _S.FAILED_PRECONDITION,
    errors.ToolCallNotFound.code: _S.NOT_FOUND,
    errors.ToolCallConflict.code: _S.ALREADY_EXISTS,
    errors.ToolCallRefused.code: _S.FAILED_PRECONDITION,
    errors.ToolCallExpired.code: _S.FAILED_PRECONDITION,
    errors.DataLoss.code: _S.DATA_LOSS,
    errors.ProgressGap.code: _S.DATA_LOSS,  # details: acked_seq (resend after it), gap_at
    errors.Forbidden.code: _S.PERMISSION_DENIED,
    errors.SeparationOfDuties.code: _S.PERMISSION_DENIED,
    errors.BudgetReservationDenied.code: _S.FAILED_PRECONDITION,
    errors.CapacityDenied.code: _S.RESOURCE_EXHAUSTED,
    errors.Unavailable.code: _S.UNAVAILABLE,
    errors.Draining.code: _S.UNAVAILABLE,  # did nothing; retry (metadata.retry_after seconds)
    errors.RunControlError.code: _S.INTERNAL,
}


def status_for(error: errors.RunControlError) -> grpc.StatusCode:
    for cls in type(error).__mro__:
        code = getattr(cls, "code", None)
        if isinstance(code, str) and code in STATUS_BY_CODE:
            return STATUS_BY_CODE[code]
    return _S.INTERNAL


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


def error_info(call: Any) -> error_details_pb2.ErrorInfo | None:
    """The ErrorInfo of a failed call (a ``grpc.RpcError``), if the server sent one."""
    for key, value in call.trailing_metadata() or ():
        if key == DETAILS_KEY:
            detail = status_pb2.Status.FromString(value)
            for item in detail.details:
                info = error_details_pb2.ErrorInfo()
                if item.Unpack(info) and info.domain == DOMAIN:
                    return info
    return None


def error_from_rpc(call: Any) -> errors.RunControlError:
    """The typed error a failed call (a ``grpc.RpcError``) stands for."""
    code: grpc.StatusCode = call.code()
    message = call.details() or code.name
    info = error_info(call)
    if info is not None:
        cls = _classes().get(info.reason)
        details: dict[str, Any] = {k: v for k, v in info.metadata.items() if k != "retryable"}
        if cls is not None:
            return cls(message, **details)
        return RpcFailed(message, status=code.name, reason=info.reason, **details)
    if code in _UNKNOWN_OUTCOME:
        return errors.Unavailable(message, status=code.name)
    return RpcFailed(message, status=code.name)
