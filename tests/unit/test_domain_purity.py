"""runcontrol.domain is pure: no I/O calls, importable without Ray or a database. What it may
import (the standard library and itself) is checked with the rest of the import structure in
``test_imports.py``."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

import runcontrol.domain

DOMAIN_DIR = Path(runcontrol.domain.__file__).parent
DOMAIN_FILES = sorted(DOMAIN_DIR.rglob("*.py"))
FORBIDDEN = {
    "ray",
    "fastapi",
    "starlette",
    "sqlalchemy",
    "psycopg",
    "psycopg2",
    "grpc",
    "apscheduler",
    "alembic",
    "pydantic",
    "pydantic_settings",
    "uvicorn",
    "httpx",
    "requests",
}


def test_domain_files_are_found():
    names = {p.name for p in DOMAIN_FILES}
    assert {"states.py", "machines.py", "hashing.py", "backoff.py", "events.py"} <= names
    assert {"core.py", "leases.py", "outcomes.py", "submission.py"} <= names  # domain/run/


@pytest.mark.parametrize("path", DOMAIN_FILES, ids=lambda p: p.name)
def test_no_direct_io_calls(path):
    """No file, socket or sleep calls: time and ids come in through CommandContext."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    banned_calls = {"open", "sleep", "urlopen", "connect", "socket", "getenv"}
    banned_attrs = {("datetime", "now"), ("datetime", "utcnow"), ("time", "time")}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = getattr(func, "id", None) or getattr(func, "attr", None)
            assert name not in banned_calls, f"{path.name}:{node.lineno} calls {name}"
            if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
                pair = (func.value.id, func.attr)
                assert pair not in banned_attrs, f"{path.name}:{node.lineno} calls {pair}"


def test_importing_the_domain_pulls_in_no_framework():
    code = (
        "import json, sys\n"
        "import runcontrol.domain\n"
        "import runcontrol.domain.run, runcontrol.domain.workflow, runcontrol.domain.backoff\n"
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    loaded = set(json.loads(result.stdout))
    assert "runcontrol" in loaded
    assert not (loaded & FORBIDDEN), sorted(loaded & FORBIDDEN)
    assert "sqlalchemy" not in loaded
