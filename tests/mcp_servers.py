"""The example's MCP server (examples/mcp/server.py) for the tests, a real process: over
stdio (the client starts it) or over streamable HTTP (started here, on a free port), each
tool body's run counted in a file (``runs``)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from mcp import StdioServerParameters

ROOT = Path(__file__).resolve().parents[1]
COMMAND = [sys.executable, "-m", "examples.mcp.server"]


def runs(counter: Path) -> Counter[str]:
    """How many times each tool body ran."""
    lines = counter.read_text().splitlines() if counter.exists() else []
    return Counter(json.loads(line)["tool"] for line in lines)


def environment(counter: Path) -> dict[str, str]:
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    return dict(os.environ, MCP_NOTES_COUNTER=str(counter), PYTHONPATH=path)


def stdio_server(counter: Path) -> StdioServerParameters:
    return StdioServerParameters(
        command=COMMAND[0], args=COMMAND[1:] + ["stdio"], env=environment(counter), cwd=str(ROOT)
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextmanager
def http_server(counter: Path) -> Iterator[str]:
    """The server over streamable HTTP while inside: answers its URL."""
    port = free_port()
    process = subprocess.Popen(
        [*COMMAND, "http", str(port)],
        env=environment(counter),
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise RuntimeError("the MCP server did not start") from None
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.terminate()
        process.wait(10)
