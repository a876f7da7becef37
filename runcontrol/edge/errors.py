"""The one table from errors to statuses, for both edges.

A row names an error class and its HTTP and gRPC statuses; an error takes the row of the
nearest class along its MRO, for each protocol separately. So a family (``NotFound``,
``Conflict`` ...) has one row, and a leaf has a row only where it differs from its family, and
then only for the protocol where it differs (``OutcomeAlreadyRecorded`` is a 409 like every
conflict, but ``ALREADY_EXISTS`` rather than ``FAILED_PRECONDITION`` over gRPC). gRPC statuses
are ``grpc.StatusCode`` names, so the HTTP edge needs no gRPC package.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..domain import errors

# ---------------------------------------------------------------------- errors of the edges


class ApiError(errors.RunControlError):
    """An error raised by an edge itself (never by the domain)."""

    code = "bad-request"


class Unauthorized(ApiError):
    code = "unauthorized"


class InsufficientScope(ApiError):
    code = "insufficient-scope"


class IdempotencyKeyRequired(ApiError):
    code = "idempotency-key-required"


class InvalidCursor(ApiError):
    code = "invalid-cursor"


class RequestInvalid(ApiError):
    code = "request-invalid"


class TooManySubscribers(ApiError):
    """This replica already serves ``api.sse_max_streams`` live event streams."""

    code = "too-many-subscribers"


class PayloadTooLarge(ApiError):
    """The request body is over ``api.max_body_bytes``."""

    code = "payload-too-large"


class RateLimited(ApiError):
    """The tenant is over its command rate (``api.command_rate``) on this replica."""

    code = "rate-limited"


class Overloaded(ApiError):
    """This replica already waits on ``api.max_commands_in_flight`` commands: shed, not queued
    until the client times out (retry after the ``Retry-After`` seconds, maybe elsewhere)."""

    code = "overloaded"


# ---------------------------------------------------------------------- the table


@dataclass(frozen=True, slots=True)
class Status:
    """A row: None inherits the protocol's status from the parent class's row."""

    http: int | None = None
    grpc: str | None = None  # a grpc.StatusCode name


E = errors
STATUS: Mapping[type[errors.RunControlError], Status] = {
    # families
    E.RunControlError: Status(500, "INTERNAL"),
    E.ValidationFailed: Status(422, "INVALID_ARGUMENT"),
    E.NotFound: Status(404, "NOT_FOUND"),  # a run of another tenant is not found, too
    E.Conflict: Status(409, "FAILED_PRECONDITION"),  # e.g. the run has ended, a stale token
    E.Forbidden: Status(403, "PERMISSION_DENIED"),
    # A gap in a progress batch: what came before it is stored; resend from ackedSeq + 1.
    E.DataLoss: Status(409, "DATA_LOSS"),
    E.Unavailable: Status(503, "UNAVAILABLE"),
    ApiError: Status(400, "INVALID_ARGUMENT"),
    # leaves without a family
    E.ApprovalGone: Status(410, "FAILED_PRECONDITION"),
    E.ToolCallExpired: Status(410, "FAILED_PRECONDITION"),  # its result can never be stored
    E.BudgetReservationDenied: Status(409, "FAILED_PRECONDITION"),
    E.CapacityDenied: Status(429, "RESOURCE_EXHAUSTED"),
    E.FlowDenied: Status(429, "RESOURCE_EXHAUSTED"),
    E.Draining: Status(503, "UNAVAILABLE"),  # did nothing; retry (retry_after seconds)
    # leaves that differ from their family
    E.IdempotencyConflict: Status(grpc="ALREADY_EXISTS"),
    E.OutcomeAlreadyRecorded: Status(grpc="ALREADY_EXISTS"),
    E.ApprovalAlreadyDecided: Status(grpc="ALREADY_EXISTS"),
    E.ToolCallConflict: Status(grpc="ALREADY_EXISTS"),
    E.ConcurrencyConflict: Status(grpc="ABORTED"),
    E.PreApprovalUsedUp: Status(grpc="ABORTED"),
    E.ApprovalVersionMismatch: Status(grpc="ABORTED"),
    Unauthorized: Status(401, "UNAUTHENTICATED"),
    InsufficientScope: Status(403, "PERMISSION_DENIED"),
    RequestInvalid: Status(422),
    PayloadTooLarge: Status(413),
    # Over the inline cap: nothing stored, the attempt still open (report a reference).
    E.ResultTooLarge: Status(413),
    # Streamed output past its bounds (docs/streaming.md): a chunk, or the attempt's total.
    E.OutputChunkTooLarge: Status(413),
    E.OutputLimitExceeded: Status(413, "RESOURCE_EXHAUSTED"),
    TooManySubscribers: Status(429, "RESOURCE_EXHAUSTED"),
    RateLimited: Status(429, "RESOURCE_EXHAUSTED"),
    Overloaded: Status(503, "UNAVAILABLE"),
}


def _lookup(error: errors.RunControlError, protocol: str) -> int | str:
    for cls in type(error).__mro__:
        row = STATUS.get(cls)
        value = None if row is None else getattr(row, protocol)
        if value is not None:
            found: int | str = value
            return found
    raise AssertionError("RunControlError has a row for each protocol")


def http_status(error: errors.RunControlError) -> int:
    return int(_lookup(error, "http"))


def grpc_status_name(error: errors.RunControlError) -> str:
    return str(_lookup(error, "grpc"))
