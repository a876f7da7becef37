"""The MCP server's tool table (``runcontrol.mcp_server``): names an MCP client accepts,
object input schemas, the operation the door checks before a call, and the tenant's policy
flag that offers the decision tool."""

from __future__ import annotations

import json

import pytest

from runcontrol.domain import PolicyDocument
from runcontrol.domain.access import Operation
from runcontrol.domain.errors import ValidationFailed
from runcontrol.mcp_server.door import TOOL_NAME, called_tool, operation_of
from runcontrol.mcp_server.tools import DECIDE, TOOLS
from runcontrol.ports.policy import document_from_dict, document_to_dict


def test_every_tool_has_a_valid_name_and_an_object_schema() -> None:
    for tool in [*TOOLS.values(), DECIDE]:
        assert TOOL_NAME.match(tool.name), tool.name
        assert tool.input_schema["type"] == "object", tool.name
        assert tool.description


def test_the_door_checks_the_operation_of_the_tool_called() -> None:
    def body(name: object) -> bytes:
        return json.dumps(
            {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": name}}
        ).encode()

    assert operation_of(called_tool(body("start_run"))) == Operation.SUBMIT_RUN
    assert operation_of(called_tool(body("cancel_run"))) == Operation.CANCEL_RUN
    assert operation_of(called_tool(body("decide_approval"))) == Operation.DECIDE_APPROVAL
    assert operation_of(called_tool(body("workflow.review"))) == Operation.SUBMIT_RUN
    assert operation_of(called_tool(body("get_run"))) == Operation.READ_RUNS
    # Anything else is the SDK's to answer (a parse error, an unknown tool, another method).
    assert called_tool(b"{") is None and called_tool(body(3)) is None
    assert called_tool(b'{"method": "tools/list"}') is None
    assert operation_of(called_tool(body("nope"))) is None


def test_deciding_over_mcp_is_off_unless_the_tenants_policy_says_so() -> None:
    assert not PolicyDocument("default", "0").mcp_decisions
    assert "mcpDecisions" not in document_to_dict(PolicyDocument("default", "0"))
    on = document_from_dict("default", "1", {"mcpDecisions": True})
    assert on.mcp_decisions and document_to_dict(on)["mcpDecisions"] is True
    with pytest.raises(ValidationFailed, match="mcpDecisions"):
        document_from_dict("default", "1", {"mcpDecisions": "yes"})
