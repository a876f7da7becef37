"""RFC 9457 problem details: how an error leaves the HTTP edge.

Every failure leaves the API as ``application/problem+json`` with a stable ``type`` URI built
from the error's ``code`` and the status of ``runcontrol.edge.errors.STATUS`` (the table both
edges share). Domain errors arrive typed (they cross the Ray boundary as themselves); the edges
add a few errors of their own (authentication, headers, cursors), re-exported here for routes.
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
from ..edge.errors import (
    ApiError,
    IdempotencyKeyRequired,
    InsufficientScope,
    InvalidCursor,
    Overloaded,
    PayloadTooLarge,
    RateLimited,
    RequestInvalid,
    TooManySubscribers,
    Unauthorized,
    http_status,
)
from ..edge.unexpected import unexpected

log = logging.getLogger(__name__)

PROBLEM_BASE = "https://runcontrol.dev/problems/"
MEDIA_TYPE = "application/problem+json"
CORRELATION_HEADER = "X-Correlation-Id"


__all__ = [
    "ApiError",
    "IdempotencyKeyRequired",
    "InsufficientScope",
    "InvalidCursor",
    "Overloaded",
    "PayloadTooLarge",
    "RateLimited",
    "RequestInvalid",
    "TooManySubscribers",
    "Unauthorized",
    "from_error",
    "install",
    "problem",
    "responses",
    "status_for",
]

# Statuses after which the same request may succeed later: tell the client when to retry.
_RETRY_AFTER = {429: "1", 503: "1"}


def status_for(error: errors.RunControlError) -> int:
    return http_status(error)


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
    retrying = RateLimited | errors.Draining | errors.ShardMoving
    if isinstance(error, retrying) and "retry_after" in error.details:
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


async def _on_unexpected(request: Request, exc: Exception) -> JSONResponse:
    door = f"HTTP {request.method} {request.url.path}"
    error = unexpected(exc, door, request.headers.get(CORRELATION_HEADER))
    cid = error.details["correlation_id"]
    return problem(
        500,
        error.code,
        error.message,
        title="Internal error",
        extensions={"correlationId": cid},
        headers={CORRELATION_HEADER: cid},
    )


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
