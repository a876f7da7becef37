"""runcontrol as an MCP server (issue 45): ``/mcp`` on the HTTP front door (docs/mcp.md)."""
