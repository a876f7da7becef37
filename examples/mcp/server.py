"""A small real MCP server for ``examples/mcp`` and the tests: notes kept in memory, each tool
body's run appended to the file ``MCP_NOTES_COUNTER`` (a line with the tool's name and the
process), so a test can count how many times a tool really ran, across processes.

``python -m examples.mcp.server stdio`` serves on stdin/stdout, ``python -m examples.mcp.server
http PORT`` over streamable HTTP at ``http://127.0.0.1:PORT/mcp``."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("notes")
NOTES: dict[str, str] = {"welcome": "hello from the notes server"}


def counted(tool: str) -> None:
    if counter := os.environ.get("MCP_NOTES_COUNTER"):
        with Path(counter).open("a") as out:
            out.write(json.dumps({"tool": tool, "pid": os.getpid()}) + "\n")


@server.tool()
def lookup(key: str) -> str:
    """The note stored under ``key`` (a read)."""
    counted("lookup")
    return NOTES.get(key, "")


@server.tool()
def record(key: str, text: str) -> str:
    """Store a note (a side effect)."""
    counted("record")
    NOTES[key] = text
    return f"recorded {key}"


@server.tool()
def write(path: str, content: str) -> str:
    """Write a file (a side effect a reviewer approves first)."""
    counted("write")
    Path(path).write_text(content)
    return f"wrote {len(content)} characters to {path}"


@server.tool()
def refuse(reason: str) -> str:
    """Fails on purpose: the tool's own error, answered as an error result."""
    counted("refuse")
    raise ToolError(f"refused: {reason}")


@server.resource("notes://{key}")
def note(key: str) -> str:
    """A note as a resource."""
    return NOTES.get(key, "")


@server.prompt()
def summarize(key: str) -> str:
    """A prompt asking to summarize a note."""
    return f"Summarize the note {key}: {NOTES.get(key, '')}"


def main(argv: list[str]) -> None:
    if argv[:1] == ["http"]:
        server.run("streamable-http", host="127.0.0.1", port=int(argv[1]))
    else:
        server.run("stdio")


if __name__ == "__main__":
    main(sys.argv[1:])
