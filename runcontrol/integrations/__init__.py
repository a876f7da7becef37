"""Durable agents on Run Control: adapters that run an agent framework's agent inside a step.

Each adapter is a module of its own, imported only when its framework is installed (the extra
``runcontrol[agents]``); the core never imports them:

- ``runcontrol.integrations.pydantic_ai``: ``run_agent(step, agent, prompt)`` runs a
  ``pydantic_ai.Agent``;
- ``runcontrol.integrations.openai_agents``: ``run_agent(step, agent, input)`` runs an OpenAI
  Agents SDK ``Agent``.
- ``runcontrol.integrations.mcp`` (the extra ``runcontrol[mcp]``): ``mcp_session(step, name,
  server, policy)``, a step's journaled calls to an MCP server, each tool ``read``,
  ``side-effect`` or ``approval`` by policy; ``run_agent(..., mcp=policy)`` applies the policy
  to an agent's MCP servers (docs/mcp.md).

Both journal each model request and each tool call with ``step.run`` (a re-entered or retried
step replays them instead of repeating them), turn a tool that needs approval into
``step.approval`` of exactly that call, run a tool declared side-effecting through
``step.tool_call`` (at most once per run), stream text with ``step.stream`` and report token
usage with ``step.consume`` (docs/integrations.md).
"""
