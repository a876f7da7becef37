"""runcontrol.domain is pure: no I/O frameworks, no hosts, importable without Ray or a database."""

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
# The parts of runcontrol that are hosts or I/O: the domain may not reach into them either.
FORBIDDEN_INTERNAL = {
    "runcontrol.store",
    "runcontrol.api",
    "runcontrol.grain",
    "runcontrol.ports",
    "runcontrol.config",
    "runcontrol.embedded",
    "runcontrol.bootstrap",
    "runcontrol.cli",
    "runcontrol.client",
    "actors",
}


def _imports(path: Path) -> list[tuple[int, str]]:
    """Absolute module names imported by a file (relative imports resolved)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = "runcontrol.domain"
    if path.is_relative_to(DOMAIN_DIR):  # a subpackage's file: its own package
        package = ".".join(["runcontrol", "domain", *path.relative_to(DOMAIN_DIR).parent.parts])
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            found.append((node.lineno, module))
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "__import__":
            if node.args and isinstance(node.args[0], ast.Constant):
                found.append((node.lineno, str(node.args[0].value)))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            found.append((node.lineno, str(node.args[0].value)))
    return found


def test_domain_files_are_found():
    names = {p.name for p in DOMAIN_FILES}
    assert {"states.py", "machines.py", "hashing.py", "retry.py", "events.py"} <= names
    assert {"core.py", "leases.py", "outcomes.py", "submission.py"} <= names  # domain/run/


def test_import_parser_sees_relative_and_dynamic_imports(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import os, ray.util\n"
        "from . import errors\n"
        "from .hashing import x\n"
        "from sqlalchemy.orm import Session\n"
        "__import__('grpc')\n"
        "importlib.import_module('fastapi')\n"
    )
    modules = [m for _, m in _imports(sample)]
    assert modules == [
        "os",
        "ray.util",
        "runcontrol.domain",
        "runcontrol.domain.hashing",
        "sqlalchemy.orm",
        "grpc",
        "fastapi",
    ]


@pytest.mark.parametrize("path", DOMAIN_FILES, ids=lambda p: p.name)
def test_no_framework_or_host_imports(path):
    offending = []
    for lineno, module in _imports(path):
        top = module.split(".")[0]
        if top in FORBIDDEN:
            offending.append(f"{path.name}:{lineno} imports {module}")
        if any(module == m or module.startswith(m + ".") for m in FORBIDDEN_INTERNAL):
            offending.append(f"{path.name}:{lineno} imports {module}")
        if module.startswith("runcontrol.") and not module.startswith("runcontrol.domain"):
            offending.append(f"{path.name}:{lineno} reaches outside the domain: {module}")
    assert not offending, "\n".join(offending)


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
        "import runcontrol.domain.run, runcontrol.domain.workflow, runcontrol.domain.retry\n"
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
