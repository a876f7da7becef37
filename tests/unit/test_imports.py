"""The import structure, read from the source with ``ast`` (DESIGN §3):

- no import cycle between the modules of ``runcontrol/`` (a relative or absolute import, at the
  top, in a function or under ``if TYPE_CHECKING:``: a circle of types is still a circle a
  reader walks);
- ``runcontrol`` never imports the hosts (``actors``) or the Serve entry (``serve_app``): they
  import it, and the CLI gets the Ray runtime handed in (``runcontrol/cli/cluster.py``);
- ``runcontrol/domain/`` imports the standard library and itself, nothing else;
- the agent frameworks (the extra ``agents``) are imported only by their adapter in
  ``runcontrol/integrations/``: the core never loads them.

``test_domain_purity.py`` checks the rest of the domain's purity (no I/O calls, importing it
loads no framework).
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pytest

import runcontrol

ROOT = Path(runcontrol.__file__).resolve().parents[1]
HOSTS = ("actors", "serve_app", "grpc_ingress")


@dataclass(frozen=True)
class Import:
    line: int
    module: str  # absolute; ``from . import x`` names the submodule x when there is one


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(root: Path, package: str) -> dict[str, Path]:
    return {module_name(p, root): p for p in sorted((root / package).rglob("*.py"))}


def _dynamic(node: ast.Call) -> str | None:
    """``__import__("x")`` and ``importlib.import_module("x")`` with a literal name."""
    func = node.func
    named = (isinstance(func, ast.Name) and func.id == "__import__") or (
        isinstance(func, ast.Attribute) and func.attr == "import_module"
    )
    if named and node.args and isinstance(node.args[0], ast.Constant):
        return str(node.args[0].value)
    return None


def imports(path: Path, root: Path, known: Iterable[str] = ()) -> list[Import]:
    """What ``path`` imports, relative imports resolved against its package; ``known``: the
    module names that ``from package import name`` may mean as a submodule."""
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    submodules = set(known)
    found: list[Import] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            found.extend(Import(node.lineno, a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{node.module}" if node.module else anchor
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.append(Import(node.lineno, sub if sub in submodules else base))
        elif isinstance(node, ast.Call) and (dynamic := _dynamic(node)) is not None:
            found.append(Import(node.lineno, dynamic))
    return sorted(dict.fromkeys(found), key=lambda i: i.line)


Graph = dict[str, dict[str, int]]  # module -> {module it imports: the line}


def import_graph(root: Path, package: str) -> Graph:
    """The imports between ``package``'s modules."""
    known = modules(root, package)
    graph: Graph = {name: {} for name in known}
    for name, path in known.items():
        for imp in imports(path, root, known):
            if imp.module in known and imp.module != name:
                graph[name].setdefault(imp.module, imp.line)
    return graph


def cycles(graph: Graph) -> list[list[str]]:
    """One cycle (a -> ... -> a) through each strongly connected set of modules (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    sets: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            members = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                members.append(w)
                if w == v:
                    break
            if len(members) > 1:
                sets.append(sorted(members))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return [_a_cycle(graph, members) for members in sets]


def _a_cycle(graph: Graph, members: list[str]) -> list[str]:
    """The shortest cycle from the first of ``members`` back to it, within them."""
    start, inside = members[0], set(members)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v]):
                if w == start:
                    return [*paths[v], start]
                if w in inside and w not in paths:
                    paths[w] = [*paths[v], w]
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"no cycle through {members}")


def describe(graph: Graph, cycle: list[str]) -> str:
    steps = [f"{a} (line {graph[a][b]})" for a, b in zip(cycle, cycle[1:], strict=False)]
    return " -> ".join([*steps, cycle[-1]])


# ---------------------------------------------------------------------- the reader itself


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / "pkg" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_the_reader_resolves_relative_and_dynamic_imports_wherever_they_are(
    tmp_path: Path,
) -> None:
    root = _package(
        tmp_path,
        {
            "__init__.py": "",
            "hashing.py": "",
            "sub/__init__.py": "",
            "sample.py": "import os, ray.util\n"
            "from . import hashing, errors\n"
            "from .hashing import x\n"
            "from .sub import y\n"
            "from sqlalchemy.orm import Session\n"
            "__import__('grpc')\n"
            "def f():\n"
            "    importlib.import_module('fastapi')\n"
            "if TYPE_CHECKING:\n"
            "    from .other import z\n",
        },
    )
    known = modules(root, "pkg")
    found = [(i.line, i.module) for i in imports(root / "pkg/sample.py", root, known)]
    assert found == [
        (1, "os"),
        (1, "ray.util"),
        (2, "pkg.hashing"),  # a submodule
        (2, "pkg"),  # a name of the package
        (3, "pkg.hashing"),
        (4, "pkg.sub"),
        (5, "sqlalchemy.orm"),
        (6, "grpc"),
        (8, "fastapi"),  # in a function: it runs when called
        (10, "pkg.other"),  # for the type checker: still an import a reader follows
    ]


def test_a_cycle_is_found_lazy_or_for_the_type_checker(tmp_path: Path) -> None:
    root = _package(
        tmp_path,
        {
            "__init__.py": "",
            "a.py": "from . import b\n",
            "b.py": "def later():\n    from .c import thing\n",
            "c.py": "from .a import x\n",  # a -> b -> c -> a, one of them lazy
            "d.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .e import T\n",
            "e.py": "from .d import y\n",  # d -> e for the type checker: a circle too
            "f.py": "from . import a\n",  # into a circle, not on it
        },
    )
    graph = import_graph(root, "pkg")
    assert cycles(graph) == [["pkg.a", "pkg.b", "pkg.c", "pkg.a"], ["pkg.d", "pkg.e", "pkg.d"]]
    assert describe(graph, cycles(graph)[0]) == (
        "pkg.a (line 1) -> pkg.b (line 2) -> pkg.c (line 1) -> pkg.a"
    )


# ---------------------------------------------------------------------- the rules


RUNCONTROL = modules(ROOT, "runcontrol")
DOMAIN = {name: path for name, path in RUNCONTROL.items() if name.startswith("runcontrol.domain")}


def test_runcontrol_has_no_import_cycle() -> None:
    graph = import_graph(ROOT, "runcontrol")
    assert len(graph) > 100 and graph["runcontrol.cli"]  # it read the tree
    found = cycles(graph)
    assert not found, "import cycles in runcontrol/:\n" + "\n".join(
        describe(graph, c) for c in found
    )


@pytest.mark.parametrize("name", sorted(RUNCONTROL))
def test_runcontrol_never_imports_the_hosts(name: str) -> None:
    """Not even for the type checker: the hosts depend on runcontrol, never the reverse."""
    offending = [
        f"{name}:{i.line} imports {i.module}"
        for i in imports(RUNCONTROL[name], ROOT, RUNCONTROL)
        if i.module.split(".")[0] in HOSTS
    ]
    assert not offending, "\n".join(offending)


@pytest.mark.parametrize("name", sorted(DOMAIN))
def test_the_domain_imports_only_the_standard_library_and_itself(name: str) -> None:
    offending = [
        f"{name}:{i.line} imports {i.module}"
        for i in imports(DOMAIN[name], ROOT, RUNCONTROL)
        if i.module != "runcontrol.domain"
        and not i.module.startswith("runcontrol.domain.")
        and i.module.split(".")[0] not in sys.stdlib_module_names
    ]
    assert not offending, "\n".join(offending)


AGENT_FRAMEWORKS = {"pydantic_ai": "pydantic_ai", "agents": "openai_agents"}


def adapter_module(name: str, adapter: str) -> bool:
    """``name`` is the adapter's module or a private one of it (``_pydantic_ai_mcp``)."""
    module = name.removeprefix("runcontrol.integrations.")
    return module != name and (module == adapter or module.startswith(f"_{adapter}_"))


@pytest.mark.parametrize("name", sorted(RUNCONTROL))
def test_an_agent_framework_is_imported_by_its_adapter_alone(name: str) -> None:
    offending = [
        f"{name}:{i.line} imports {i.module}"
        for i in imports(RUNCONTROL[name], ROOT, RUNCONTROL)
        if (adapter := AGENT_FRAMEWORKS.get(i.module.split(".")[0])) is not None
        and not adapter_module(name, adapter)
    ]
    assert not offending, "\n".join(offending)


def test_the_rules_read_the_tree() -> None:
    assert {"runcontrol.domain", "runcontrol.domain.backoff", "runcontrol.domain.events"} <= set(
        DOMAIN
    )
    assert {"runcontrol.cli", "runcontrol.cli.service", "runcontrol.cli.cluster"} <= set(RUNCONTROL)
