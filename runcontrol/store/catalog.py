"""The workflow catalog's read model: workflows with their releases and aliases, and a run's
steps as a graph. Queries run in the caller's tenant (row-level security)."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from sqlalchemy import Connection, func, select

from ..domain import WorkflowDefinition
from ..domain.workflow import graph
from . import queries as q
from .tables import release_aliases, releases


def _aliases(conn: Connection, workflow_id: str | None = None) -> dict[str, dict[str, str]]:
    stmt = select(release_aliases).order_by(release_aliases.c.alias)
    if workflow_id is not None:
        stmt = stmt.where(release_aliases.c.workflow_id == workflow_id)
    found: dict[str, dict[str, str]] = {}
    for r in conn.execute(stmt):
        found.setdefault(r.workflow_id, {})[r.alias] = r.release_id
    return found


def release_view(m: Any, aliases: dict[str, str]) -> dict[str, Any]:
    definition = WorkflowDefinition.from_dict(m["definition"])
    return {
        "releaseId": m["release_id"],
        "workflowId": m["workflow_id"],
        "contentHash": m["content_hash"],
        "publishedBy": m.get("published_by"),
        "publishedAt": m.get("published_at"),
        "aliases": sorted(a for a, rid in aliases.items() if rid == m["release_id"]),
        "definition": definition.to_dict(),
        "graph": graph(definition),
    }


def list_workflows(conn: Connection) -> list[dict[str, Any]]:
    aliases = _aliases(conn)
    rows = conn.execute(
        select(
            releases.c.workflow_id,
            func.count().label("release_count"),
            func.max(releases.c.published_at).label("last_published_at"),
        )
        .group_by(releases.c.workflow_id)
        .order_by(releases.c.workflow_id)
    )
    return [
        {
            "workflowId": r.workflow_id,
            "aliases": aliases.get(r.workflow_id, {}),
            "releaseCount": r.release_count,
            "lastPublishedAt": r.last_published_at,
        }
        for r in rows
    ]


def get_workflow(conn: Connection, workflow_id: str) -> dict[str, Any] | None:
    """The workflow's releases (newest first) with their graphs, and its aliases; None when
    nothing of it is published in this tenant."""
    rows = conn.execute(
        select(releases)
        .where(releases.c.workflow_id == workflow_id)
        .order_by(releases.c.published_at.desc(), releases.c.release_id)
    ).all()
    if not rows:
        return None
    aliases = _aliases(conn, workflow_id).get(workflow_id, {})
    return {
        "workflowId": workflow_id,
        "aliases": aliases,
        "releases": [release_view(r._mapping, aliases) for r in rows],
    }


def run_graph(
    conn: Connection, run_id: UUID, *, project_id: str | None = None
) -> dict[str, Any] | None:
    """The run's steps as nodes (state, attempts, resolved dependencies) and the edges
    between them; None when the run is not visible."""
    view = q.get_run(conn, run_id, project_id=project_id)
    if view is None:
        return None
    nodes = []
    previous: str | None = None
    for step in view["steps"]:
        depends = step["dependsOn"]
        if depends is None:  # a run accepted before graphs: the step before it
            depends = [previous] if previous is not None else []
        nodes.append(
            {
                "stepId": step["stepId"],
                "name": step["name"],
                "agentId": step["agentId"],
                "state": step["state"],
                "kind": step["kind"],
                "dueAt": step["dueAt"],
                "dependsOn": depends,
                "attempts": step["attempts"],
            }
        )
        previous = step["name"]
    return {
        "runId": view["runId"],
        "state": view["state"],
        "releaseId": view["releaseId"],
        "nodes": nodes,
        "edges": [{"from": d, "to": n["name"]} for n in nodes for d in n["dependsOn"]],
    }


def newest_release(conn: Connection, workflow_id: str) -> tuple[str, WorkflowDefinition] | None:
    """The workflow's newest release (its id and definition); None when nothing of it is
    published in this tenant. An A2A agent is its workflow's newest release (issue 31)."""
    row = conn.execute(
        select(releases.c.release_id, releases.c.definition)
        .where(releases.c.workflow_id == workflow_id)
        .order_by(releases.c.published_at.desc(), releases.c.release_id)
        .limit(1)
    ).first()
    if row is None:
        return None
    return row.release_id, WorkflowDefinition.from_dict(row.definition)


def agent_workflows(conn: Connection) -> list[str]:
    """The workflows of this tenant whose newest release is an A2A agent (issue 31)."""
    return [workflow_id for workflow_id, _, _ in agent_releases(conn)]


def agent_releases(conn: Connection) -> list[tuple[str, str, WorkflowDefinition]]:
    """Each workflow of this tenant whose newest release opts in as an agent (its ``agent``
    block): the workflow id, the release id and its definition, by workflow id."""
    newest = (
        select(releases.c.workflow_id, releases.c.release_id, releases.c.definition)
        .distinct(releases.c.workflow_id)
        .order_by(releases.c.workflow_id, releases.c.published_at.desc(), releases.c.release_id)
    )
    return [
        (row.workflow_id, row.release_id, WorkflowDefinition.from_dict(row.definition))
        for row in conn.execute(newest)
        if "agent" in row.definition
    ]
