"""The workflow catalog (seed 004's "Workflow catalog and start"): publish a release, read the
workflows with their releases, aliases and graphs, move an alias, and read a run's graph.

Publishing and moving an alias are the workspace admins' (``factory.workflows.manage``);
reading is reading runs (``factory.runs.read``). A definition is checked exactly as the CLI
checks it (``WorkflowDefinition.from_dict``): an unknown dependency or a cycle is a 422 problem
naming it and nothing is published. A moved alias changes what later submissions pin; runs
already accepted keep their release (invariant 2).
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Annotated, Any
from uuid import UUID

from fastapi import Path, Response
from sqlalchemy import Connection

from schemas.api import (
    MoveAliasRequest,
    PublishReleaseRequest,
    ReleaseView,
    RunGraph,
    WorkflowPage,
    WorkflowView,
    id_check,
)

from ..domain import WorkflowDefinition, errors
from ..ports import releases
from ..store import catalog
from . import routes
from .auth import ReleasePublisher, RunsReader
from .context import Svc, found, location
from .problems import responses

releases_router = routes.router("/factory/releases", "catalog")
workflows_router = routes.router("/factory/workflows", "catalog")
graph_router = routes.router("/factory/runs", "catalog")

WorkflowIdPath = Annotated[
    str, Path(alias="workflowId", min_length=1, max_length=200), id_check(segment=True)
]
AliasPath = Annotated[str, Path(min_length=1, max_length=200), id_check(segment=True)]
RunIdPath = Annotated[UUID, Path(alias="runId")]


def _released(conn: Connection, workflow_id: str, release_id: str) -> dict[str, Any]:
    view = catalog.get_workflow(conn, workflow_id)
    assert view is not None  # just published in this tenant
    return next(r for r in view["releases"] if r["releaseId"] == release_id)


@releases_router.post("", status_code=201, response_model=ReleaseView, responses=responses(409))
async def publish_release(
    caller: ReleasePublisher, svc: Svc, body: PublishReleaseRequest, response: Response
) -> dict[str, Any]:
    """Publish a workflow definition as an immutable release and move aliases to it.

    Scope `factory.workflows.manage`; roles WorkspaceAdmin, PlatformAdmin. The same content
    publishes the same release. An invalid definition (an unknown `dependsOn` name, a cycle) is 422
    with the reason, and nothing is published.
    """
    definition = WorkflowDefinition.from_dict(body.definition)  # 422 before any write
    release = await asyncio.to_thread(
        releases.publish_release,
        svc.db,
        caller.tenant_id,
        definition,
        caller.principal.subject,
        datetime.now(UTC),
        body.aliases,
    )
    response.headers["Location"] = location(workflows_router.prefix, release.workflow_id)
    return await svc.read_in_tenant(
        caller, lambda conn: _released(conn, release.workflow_id, release.release_id)
    )


@workflows_router.get("", response_model=WorkflowPage)
async def list_workflows(caller: RunsReader, svc: Svc) -> dict[str, Any]:
    """The tenant's workflows: their aliases and how many releases each has.

    Scope `factory.runs.read`.
    """
    items = await svc.read_in_tenant(caller, catalog.list_workflows)
    return {"items": items}


@workflows_router.get("/{workflowId}", response_model=WorkflowView)
async def get_workflow(caller: RunsReader, svc: Svc, workflow_id: WorkflowIdPath) -> dict[str, Any]:
    """A workflow's releases (newest first, each with its graph) and aliases.

    Scope `factory.runs.read`.
    """
    view = await svc.read_in_tenant(caller, lambda conn: catalog.get_workflow(conn, workflow_id))
    missing = errors.WorkflowNotFound(
        f"workflow {workflow_id!r} has no release", workflow_id=workflow_id
    )
    return found(view, missing)


@workflows_router.put("/{workflowId}/aliases/{alias}", response_model=ReleaseView)
async def move_alias(
    caller: ReleasePublisher,
    svc: Svc,
    workflow_id: WorkflowIdPath,
    alias: AliasPath,
    body: MoveAliasRequest,
) -> dict[str, Any]:
    """Point an alias at one of the workflow's releases.

    Scope `factory.workflows.manage`; roles WorkspaceAdmin, PlatformAdmin. Later submissions naming
    the alias pin that release; runs already accepted keep theirs.
    """
    await asyncio.to_thread(
        releases.move_alias,
        svc.db,
        caller.tenant_id,
        workflow_id,
        alias,
        body.release_id,
        datetime.now(UTC),
    )
    return await svc.read_in_tenant(
        caller, lambda conn: _released(conn, workflow_id, body.release_id)
    )


@graph_router.get("/{runId}/graph", response_model=RunGraph)
async def get_run_graph(caller: RunsReader, svc: Svc, run_id: RunIdPath) -> dict[str, Any]:
    """The run's steps as a graph: each node's state, attempts and dependencies.

    Scope `factory.runs.read`; the caller's project only, unless a role spans the tenant.
    """
    project = caller.project_scope
    view = await svc.read_in_scope(
        caller, lambda conn: catalog.run_graph(conn, run_id, project_id=project)
    )
    return found(view, errors.RunNotFound(f"run {run_id} not found"))
