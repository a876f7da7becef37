"""The role table: what each role may do, which scopes it mints, how far it sees."""

from __future__ import annotations

import pytest

from runcontrol.domain import Principal, Role
from runcontrol.domain.access import (
    ALL_SCOPES,
    APPROVALS_DECIDE,
    APPROVALS_READ,
    POLICIES_MANAGE,
    ROLE_OPERATIONS,
    RUNS_OPERATE,
    RUNS_READ,
    RUNS_WRITE,
    RUNTIME,
    WEBHOOKS_MANAGE,
    WORKFLOWS_MANAGE,
    Operation,
    allows,
    effective_scopes,
    project_scope,
    scopes_of,
)

Op = Operation


def test_every_role_has_a_row() -> None:
    assert set(ROLE_OPERATIONS) == set(Role)


@pytest.mark.parametrize(
    ("role", "may", "scopes"),
    [
        (Role.OBSERVER, {Op.READ_RUNS, Op.READ_APPROVALS}, {RUNS_READ, APPROVALS_READ}),
        (
            Role.REQUESTER,
            {Op.READ_RUNS, Op.READ_APPROVALS, Op.SUBMIT_RUN, Op.CANCEL_RUN},
            {RUNS_READ, RUNS_WRITE, APPROVALS_READ},
        ),
        (
            Role.REVIEWER,
            {Op.READ_RUNS, Op.READ_APPROVALS, Op.DECIDE_APPROVAL},
            {RUNS_READ, APPROVALS_READ, APPROVALS_DECIDE},
        ),
        (
            Role.OPERATOR,
            {Op.READ_RUNS, Op.READ_APPROVALS, Op.CANCEL_RUN, Op.MANAGE_WEBHOOKS, Op.OPERATE_RUNS},
            {RUNS_READ, RUNS_WRITE, APPROVALS_READ, WEBHOOKS_MANAGE, RUNS_OPERATE},
        ),
        (Role.WORKER, {Op.RUNTIME}, {RUNTIME}),
        (
            Role.WORKSPACE_ADMIN,
            {
                Op.READ_RUNS,
                Op.READ_APPROVALS,
                Op.SUBMIT_RUN,
                Op.CANCEL_RUN,
                Op.DECIDE_APPROVAL,
                Op.MANAGE_WEBHOOKS,
                Op.MANAGE_POLICY,
                Op.OPERATE_RUNS,
                Op.PUBLISH_RELEASE,
            },
            {
                RUNS_READ,
                RUNS_WRITE,
                APPROVALS_READ,
                APPROVALS_DECIDE,
                WEBHOOKS_MANAGE,
                POLICIES_MANAGE,
                RUNS_OPERATE,
                WORKFLOWS_MANAGE,
            },
        ),
    ],
)
def test_the_table(role: Role, may: set[Operation], scopes: set[str]) -> None:
    assert {op for op in Operation if allows({role}, ALL_SCOPES, op)} == may
    assert scopes_of({role}) == scopes


def test_a_token_does_no_more_than_its_roles_nor_its_scopes() -> None:
    assert effective_scopes({Role.OBSERVER}, ALL_SCOPES) == {RUNS_READ, APPROVALS_READ}
    assert effective_scopes({Role.REQUESTER}, {RUNS_READ}) == {RUNS_READ}
    assert not allows({Role.REQUESTER}, {RUNS_READ}, Op.SUBMIT_RUN)
    assert not allows(set(), ALL_SCOPES, Op.READ_RUNS)


def test_only_operators_and_admins_span_the_tenant() -> None:
    def scope(*roles: Role) -> str | None:
        return project_scope(Principal("s", "t", "p", frozenset(roles)))

    for role in (Role.REQUESTER, Role.REVIEWER, Role.OBSERVER, Role.WORKER):
        assert scope(role) == "p"
    for role in (Role.OPERATOR, Role.WORKSPACE_ADMIN, Role.PLATFORM_ADMIN):
        assert scope(role) is None
        assert scope(Role.REQUESTER, role) is None
