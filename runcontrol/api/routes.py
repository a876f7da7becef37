"""A route as its rule: ``Operation``, the route class of the API's routers.

An operation's OpenAPI text is its endpoint's docstring: the first paragraph is the summary,
the rest the description (each paragraph's lines joined by a space). Its ``operationId`` is the
endpoint's name in CamelCase (``get_run``: ``GetRun``). The problem statuses any such route may
answer are derived from its signature, so that a route names only those of its own rule:
401 and 403 where a caller is authenticated, 404 where its path names a resource, 413 where it
reads a body, 422 where it reads any input (a path, a query, a header, a body).

A hot route may be served plainly (``plain``): declared as every operation is, its request
handled by a Starlette handler of its own that makes the endpoint's arguments without
FastAPI's dependency solving (issue 42: the submission).
"""

from __future__ import annotations

import email.message
import inspect
import json
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from typing import Any

from fastapi import APIRouter, HTTPException, Request, Response
from fastapi.dependencies.models import Dependant
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic_core import PydanticUndefined

from .auth import authenticate
from .problems import responses


def camel(name: str) -> str:
    return "".join(part.title() for part in name.split("_"))


def _paragraphs(doc: str | None) -> list[str]:
    text = inspect.cleandoc(doc or "")
    return [" ".join(p.split("\n")) for p in text.split("\n\n") if p.strip()]


def _dependants(dependant: Dependant) -> Iterator[Dependant]:
    yield dependant
    for sub in dependant.dependencies:
        yield from _dependants(sub)


def derived_statuses(dependant: Dependant) -> set[int]:
    """The problem statuses a route answers by its signature alone."""
    every = list(_dependants(dependant))  # a dependency's inputs are the route's too
    found: set[int] = set()
    if any(d.call is authenticate for d in every):
        found |= {401, 403}
    if any(d.path_params for d in every):
        found.add(404)
    if any(d.body_params for d in every):
        found.add(413)
    if any(d.path_params or d.query_params or d.header_params or d.body_params for d in every):
        found.add(422)
    return found


class Operation(APIRoute):
    """An ``APIRoute`` documented by its endpoint (the module's docstring says how)."""

    def __init__(self, path: str, endpoint: Callable[..., Any], **kw: Any) -> None:
        paragraphs = _paragraphs(endpoint.__doc__)
        summary, rest = (paragraphs[0], paragraphs[1:]) if paragraphs else (None, [])
        if kw.get("summary") is None:
            kw["summary"] = summary
        if kw.get("operation_id") is None:
            kw["operation_id"] = camel(endpoint.__name__)
        given_description = kw.get("description")
        super().__init__(path, endpoint, **kw)
        if not given_description:
            # FastAPI takes a route's whole docstring for an empty description, up to a form
            # feed: a summary alone stays alone (the included route reads this one's).
            self.description = " ".join(rest) or "\f"
        given = self.responses or {}
        derived = responses(*derived_statuses(self.dependant) - set(given))
        self.responses = dict(sorted({**given, **derived}.items(), key=lambda kv: str(kv[0])))


def router(prefix: str, tag: str) -> APIRouter:
    """A router of ``Operation`` routes under ``prefix``, in the OpenAPI ``tag``."""
    return APIRouter(prefix=prefix, tags=[tag], route_class=Operation)


# ---------------------------------------------------------------------- plain routes

PlainHandler = Callable[[APIRoute, Request], Awaitable[Response]]


def plain(handler: PlainHandler) -> type[Operation]:
    """The route class of an operation declared as every ``Operation`` is (its endpoint's
    signature: the OpenAPI description, the derived problem statuses) and served by
    ``handler(route, request)``, a plain Starlette handler: no dependency solving and no walk
    of the signature per request. The handler makes the endpoint's arguments (the caller with
    ``auth.verified``, the body with ``json_body``, the rest with ``arguments``: the same
    checks, the same errors) and calls the endpoint; errors leave through the app's handlers,
    as every route's do."""

    class Plain(Operation):
        def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
            async def serve(request: Request) -> Response:
                return await handler(self, request)

            return serve

    return Plain


def _is_json(content_type: str) -> bool:
    if content_type == "application/json":
        return True
    message = email.message.Message()
    message["content-type"] = content_type
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (
        subtype == "json" or subtype.endswith("+json")
    )


async def json_body(request: Request) -> Any:
    """The body as FastAPI reads a route's JSON body, first of all: parsed when its content
    type is JSON (``application/json``, ``*/*+json``), its bytes under another or no content
    type (which the body's model then refuses), ``PydanticUndefined`` when there is none;
    malformed JSON is 422 (``json_invalid`` at its position), an unreadable body 400."""
    try:
        raw = await request.body()
        if not raw:
            return PydanticUndefined
        content_type = request.headers.get("content-type")
        return json.loads(raw) if content_type and _is_json(content_type) else raw
    except json.JSONDecodeError as exc:
        error = {
            "type": "json_invalid",
            "loc": ("body", exc.pos),
            "msg": "JSON decode error",
            "input": {},
            "ctx": {"error": exc.msg},
        }
        raise RequestValidationError([error], body=exc.doc) from exc
    except Exception as exc:
        raise HTTPException(status_code=400, detail="There was an error parsing the body") from exc


def _missing(loc: tuple[str, ...]) -> dict[str, Any]:
    return {"type": "missing", "loc": loc, "msg": "Field required", "input": None}


def arguments(route: APIRoute, request: Request, body: Any) -> dict[str, Any]:
    """The endpoint's header parameters and body, by name, checked by the fields the route
    declares (their errors as FastAPI reports them: the headers', then the body's, one 422)."""
    values: dict[str, Any] = {}
    errors: list[dict[str, Any]] = []
    for field in route.dependant.header_params:
        raw = request.headers.get(field.alias)
        if raw is None:
            if field.field_info.is_required():
                errors.append(_missing(("header", field.alias)))
            values[field.name] = field.default
            continue
        values[field.name], found = field.validate(raw, loc=("header", field.alias))
        errors += found
    if route.body_field is not None:
        field = route.body_field
        if body is PydanticUndefined:
            errors.append(_missing(("body",)))
        else:
            values[field.name], found = field.validate(body, loc=("body",))
            errors += found
    if errors:
        raise RequestValidationError(errors, body=None if body is PydanticUndefined else body)
    return values
