"""A route as its rule: ``Operation``, the route class of the API's routers.

An operation's OpenAPI text is its endpoint's docstring: the first paragraph is the summary,
the rest the description (each paragraph's lines joined by a space). Its ``operationId`` is the
endpoint's name in CamelCase (``get_run``: ``GetRun``). The problem statuses any such route may
answer are derived from its signature, so that a route names only those of its own rule:
401 and 403 where a caller is authenticated, 404 where its path names a resource, 413 where it
reads a body, 422 where it reads any input (a path, a query, a header, a body).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from typing import Any

from fastapi import APIRouter
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute

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
