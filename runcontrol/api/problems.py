"""RFC 9457 problem details: the one place where error codes become HTTP statuses.

Every failure leaves the API as ``application/problem+json`` with a stable ``type`` URI built
from the error's ``code``. Domain errors arrive typed (they cross the Ray boundary as
themselves); the HTTP edge adds a few errors of its own (authentication, headers, cursors).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..domain import errors

log = logging.getLogger(__name__)

PROBLEM_BASE = "https://runcontrol.dev/problems/"
MEDIA_TYPE = "application/problem+json"


# ---------------------------------------------------------------------- errors of the HTTP edge


class ApiError(errors.RunControlError):
    """An error raised by the HTTP edge itself (never by the domain)."""

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

# Looked up along the error's MRO, so a subclass without a row inherits its parent's status.
STATUS_BY_CODE: Mapping[str, int] = {
    # the HTTP edge
    ApiError.code: 400,
    IdempotencyKeyRequired.code: 400,
    InvalidCursor.code: 400,
    Unauthorized.code: 401,
    InsufficientScope.code: 403,
    RequestInvalid.code: 422,
    TooManySubscribers.code: 429,
    PayloadTooLarge.code: 413,
    RateLimited.code: 429,
    Overloaded.code: 503,
    # the domain
    errors.ValidationFailed.code: 422,
    errors.BreakGlassReasonRequired.code: 422,
    errors.NotFound.code: 404,
    errors.RunNotFound.code: 404,
    errors.StepNotFound.code: 404,
    errors.AttemptNotFound.code: 404,
    errors.ApprovalNotFound.code: 404,
    errors.WorkflowNotFound.code: 404,
    errors.ReleaseNotFound.code: 404,
    errors.WebhookNotFound.code: 404,
    errors.InvalidWebhookUrl.code: 422,
    errors.WebhookDisabled.code: 409,
    errors.Conflict.code: 409,
    errors.IllegalTransition.code: 409,
    errors.IdempotencyConflict.code: 409,
    errors.ConcurrencyConflict.code: 409,
    errors.RunTerminal.code: 409,
    errors.LeaseHeld.code: 409,
    errors.LeaseRejected.code: 409,
    errors.OutcomeAlreadyRecorded.code: 409,
    errors.ApprovalVersionMismatch.code: 409,
    errors.ApprovalAlreadyDecided.code: 409,
    errors.ProposalHashMismatch.code: 409,
    errors.ApprovalGone.code: 410,
    errors.ToolCallNotFound.code: 404,
    errors.ToolCallConflict.code: 409,
    errors.ToolCallRefused.code: 409,
    errors.ToolCallExpired.code: 410,  # the claim was closed: its result can never be stored
    # A gap in a progress batch: what came before it is stored; resend from ackedSeq + 1.
    errors.DataLoss.code: 409,
    errors.ProgressGap.code: 409,
    errors.Forbidden.code: 403,
    errors.SeparationOfDuties.code: 403,
    errors.BudgetReservationDenied.code: 409,
    errors.CapacityDenied.code: 429,
    errors.Unavailable.code: 503,
    errors.Draining.code: 503,
    errors.RunControlError.code: 500,
}

# Statuses after which the same request may succeed later: tell the client when to retry.
_RETRY_AFTER = {429: "1", 503: "1"}


def status_for(error: errors.RunControlError) -> int:
    for cls in type(error).__mro__:
        code = getattr(cls, "code", None)
        if isinstance(code, str) and code in STATUS_BY_CODE:
            return STATUS_BY_CODE[code]
    return 500


def type_uri(code: str) -> str:
    return PROBLEM_BASE + code


def _title(code: str) -> str:
    return code.replace("-", " ").capitalize()


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def problem(
    status: int,
    code: str,
    detail: str,
    *,
    title: str | None = None,
    extensions: Mapping[str, Any] | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    body: dict[str, Any] = {
        "type": type_uri(code),
        "title": title or _title(code),
        "status": status,
        "detail": detail,
        "code": code,
    }
    for key, value in (extensions or {}).items():
        body.setdefault(key, value)
    all_headers = dict(headers or {})
    if status in _RETRY_AFTER:
        all_headers.setdefault("Retry-After", _RETRY_AFTER[status])
    return JSONResponse(body, status_code=status, headers=all_headers, media_type=MEDIA_TYPE)


def _headers(error: errors.RunControlError) -> dict[str, str]:
    if isinstance(error, RateLimited | errors.Draining) and "retry_after" in error.details:
        return {"Retry-After": str(error.details["retry_after"])}
    return _www_authenticate(error)


def _www_authenticate(error: errors.RunControlError) -> dict[str, str]:
    if isinstance(error, Unauthorized):
        reason = error.details.get("oauth_error")
        value = 'Bearer realm="runcontrol"'
        if reason:
            value += f', error="{reason}"'
        return {"WWW-Authenticate": value}
    if isinstance(error, InsufficientScope):
        scope = error.details.get("scope", "")
        return {"WWW-Authenticate": f'Bearer error="insufficient_scope", scope="{scope}"'}
    return {}


def _safe_details(details: Mapping[str, Any]) -> dict[str, Any]:
    """Scalar details become extension members; anything else stays in the logs."""
    return {
        _camel(k): v
        for k, v in details.items()
        if k != "oauth_error" and isinstance(v, str | int | float | bool)
    }


def from_error(error: errors.RunControlError) -> JSONResponse:
    status = status_for(error)
    if status >= 500 and not isinstance(error, errors.Unavailable | errors.Draining):
        log.error("unmapped error %s: %s", error.code, error)
    return problem(
        status,
        error.code,
        str(error),
        extensions=_safe_details(error.details),
        headers=_headers(error),
    )


def _pointer(loc: Sequence[Any]) -> tuple[str, str]:
    where = str(loc[0]) if loc else "body"
    path = [str(p) for p in loc[1:]]
    return where, "#/" + "/".join(p.replace("~", "~0").replace("/", "~1") for p in path)


def field_errors(raw: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for err in raw:
        where, pointer = _pointer(err.get("loc", ()))
        out.append(
            {
                "in": where,
                "pointer": pointer,
                "field": ".".join(str(p) for p in err.get("loc", ())[1:]) or where,
                "detail": err.get("msg", "invalid"),
                "type": err.get("type", "value_error"),
            }
        )
    return out


# ---------------------------------------------------------------------- handlers


async def _on_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, errors.RunControlError)
    return from_error(exc)


async def _on_validation(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    found = field_errors(exc.errors())
    return problem(
        422,
        RequestInvalid.code,
        f"the request is invalid ({len(found)} error{'s' if len(found) != 1 else ''})",
        title="Request invalid",
        extensions={"errors": found},
    )


async def _on_http(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    try:
        phrase = HTTPStatus(exc.status_code).phrase
    except ValueError:
        phrase = "Error"
    code = phrase.lower().replace(" ", "-").replace("'", "")
    detail = exc.detail if isinstance(exc.detail, str) else phrase
    return problem(exc.status_code, code, detail, title=phrase, headers=exc.headers)


async def _on_unexpected(_: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error", exc_info=exc)
    return problem(500, "internal-error", "an unexpected error occurred", title="Internal error")


def install(app: FastAPI) -> None:
    app.add_exception_handler(errors.RunControlError, _on_error)
    app.add_exception_handler(RequestValidationError, _on_validation)
    app.add_exception_handler(StarletteHTTPException, _on_http)
    app.add_exception_handler(Exception, _on_unexpected)
    _document(app)


# ---------------------------------------------------------------------- OpenAPI


PROBLEM_SCHEMA: dict[str, Any] = {
    "title": "Problem",
    "type": "object",
    "description": "RFC 9457 problem details.",
    "required": ["type", "title", "status"],
    "properties": {
        "type": {"type": "string", "format": "uri"},
        "title": {"type": "string"},
        "status": {"type": "integer"},
        "detail": {"type": "string"},
        "code": {"type": "string"},
        "errors": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "in": {"type": "string"},
                    "pointer": {"type": "string"},
                    "field": {"type": "string"},
                    "detail": {"type": "string"},
                    "type": {"type": "string"},
                },
            },
        },
    },
}


def responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI entries for the problem statuses an operation may answer with."""
    return {
        status: {
            "description": HTTPStatus(status).phrase,
            "content": {MEDIA_TYPE: {"schema": {"$ref": "#/components/schemas/Problem"}}},
        }
        for status in statuses
    }


def _document(app: FastAPI) -> None:
    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title,
                version=app.version,
                description=app.description,
                routes=app.routes,
            )
            schema.setdefault("components", {}).setdefault("schemas", {})["Problem"] = (
                PROBLEM_SCHEMA
            )
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
