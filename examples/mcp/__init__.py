"""``examples/mcp``: a step calling a real MCP server's tools through
``runcontrol.integrations.mcp`` (docs/mcp.md): a ``read`` tool answered from the journal on
re-entry, a ``side-effect`` tool run at most once, an ``approval`` tool asked of a reviewer with
exactly its server, name and arguments.

``server.py`` is the MCP server (``python -m examples.mcp.server stdio`` or ``http PORT``): a
small notes service whose tool bodies count their runs in a file; ``agents.py`` the worker app
and its workflow."""
