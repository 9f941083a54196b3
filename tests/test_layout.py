"""The layout tells the truth: allowed import directions between packages, and no import cycles.

The rules below are the ones ``docs/architecture.md`` draws. Every ``import`` in the project's packages
counts, including those under ``if TYPE_CHECKING:`` and inside functions: a cycle hidden from the
interpreter is still a cycle for the reader.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Top-level package -> the project packages it may import (besides itself).
ALLOWED: dict[str, frozenset[str]] = {
    "wire": frozenset(),
    "taskdefs": frozenset({"wire"}),
    "certs": frozenset({"wire"}),
    "contracts": frozenset({"wire", "taskdefs"}),
    "swarmlearning": frozenset({"wire"}),
    "daemons": frozenset({"wire", "certs", "contracts", "taskdefs"}),
    "swci": frozenset({"wire", "certs", "taskdefs", "daemons"}),
    "runscripts": frozenset({"certs", "daemons", "swci"}),
}
PACKAGES = tuple(ALLOWED)

# The actors inside daemons/: each may use what daemons/ shares, never another actor.
ACTORS = frozenset({"daemons.sn", "daemons.swop", "daemons.sl", "daemons.dashboard"})
# The only parts of daemons/ the shell may use: the bus, identities and the SN's client.
SWCI_MAY_USE = frozenset({"daemons.bus", "daemons.identity", "daemons.ledger_client"})
# The one module that may import every actor: the `swarm` command dispatching to them.
ENTRY_POINTS = frozenset({"daemons.cli"})
# Heavy ML dependencies stay on the ML side.
ML_ONLY = frozenset({"torch"})
# What an SL has no use for unless its node asks for GPUs: the ledger itself (the SN's), SQLite, and the
# task models with pydantic (the SWOP's). Each SL of a host imports what it loads, at once.
NOT_IN_AN_SL = frozenset(
    {"contracts.ledger", "contracts.blockstore", "contracts.machine", "sqlite3", "taskdefs", "pydantic"}
)


@dataclass(frozen=True)
class Import:
    """One import statement's target inside the project."""

    source: str
    target: str
    line: int


def module_files() -> dict[str, Path]:
    """Every module of the project's packages, by dotted name."""
    modules: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            modules[name] = path
    return modules


def _targets(node: ast.AST, modules: dict[str, Path]) -> Iterator[str]:
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        for alias in node.names:
            submodule = f"{node.module}.{alias.name}"
            yield submodule if submodule in modules else node.module


def project_imports(modules: dict[str, Path]) -> list[Import]:
    """Every import of a project module by a project module."""
    found = []
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            for target in _targets(node, modules):
                if target in modules and target != name:
                    found.append(Import(name, target, node.lineno))
    return found


def external_imports(modules: dict[str, Path]) -> list[Import]:
    """Every import of a third-party top-level module."""
    found = []
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            for target in _targets(node, modules):
                top = target.split(".")[0]
                if top not in ALLOWED:
                    found.append(Import(name, top, node.lineno))
    return found


def _group(module: str) -> str:
    """A module's unit for the daemons rules: ``daemons.sn.node`` -> ``daemons.sn``."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "daemons" and len(parts) > 1 else parts[0]


def violation(imp: Import) -> str | None:
    """Why this import breaks the layout, or None."""
    src, dst = imp.source.split(".")[0], imp.target.split(".")[0]
    where = f"{imp.source} (line {imp.line}) imports {imp.target}"
    if src != dst and dst not in ALLOWED[src]:
        return f"{where}: {src}/ may import only {sorted(ALLOWED[src]) or 'nothing of the project'}"
    src_group, dst_group = _group(imp.source), _group(imp.target)
    if src == "swci" and dst == "daemons" and dst_group not in SWCI_MAY_USE:
        return f"{where}: swci/ may use only {sorted(SWCI_MAY_USE)} of daemons/"
    crosses_actors = src == dst == "daemons" and src_group != dst_group and dst_group in ACTORS
    if crosses_actors and imp.source not in ENTRY_POINTS:
        return f"{where}: only {sorted(ENTRY_POINTS)} may import an actor from outside it"
    return None


def cycles(imports: list[Import]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    graph: dict[str, set[str]] = {}
    for imp in imports:
        graph.setdefault(imp.source, set()).add(imp.target)
        graph.setdefault(imp.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


@pytest.fixture(scope="module")
def modules() -> dict[str, Path]:
    return module_files()


def test_the_rules_cover_every_package_the_project_ships() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    shipped = {name.rstrip("*") for name in config["tool"]["setuptools"]["packages"]["find"]["include"]}
    assert shipped == set(PACKAGES), "pyproject.toml ships a package the layout rules do not know"
    assert set(config["tool"]["mypy"]["packages"]) == set(PACKAGES), "mypy must check every package"


def test_imports_follow_the_allowed_directions(modules: dict[str, Path]) -> None:
    broken = [v for imp in project_imports(modules) if (v := violation(imp))]
    assert not broken, "\n".join(broken)


def test_no_import_cycles(modules: dict[str, Path]) -> None:
    found = cycles(project_imports(modules))
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def test_torch_stays_on_the_ml_side(modules: dict[str, Path]) -> None:
    broken = [
        f"{imp.source} (line {imp.line}) imports {imp.target}"
        for imp in external_imports(modules)
        if imp.target in ML_ONLY and not imp.source.startswith("swarmlearning")
    ]
    assert not broken, "\n".join(broken)


def test_an_sl_starts_without_the_ledger_or_the_task_models() -> None:
    script = "import sys, daemons.sl.cli; print(' '.join(sys.modules))"
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True)
    loaded = set(out.stdout.split())
    assert "daemons.sl.node" in loaded
    assert not loaded & NOT_IN_AN_SL, f"daemons.sl.cli loads {sorted(loaded & NOT_IN_AN_SL)}"


def test_every_package_says_what_it_is_and_may_import(modules: dict[str, Path]) -> None:
    for package in PACKAGES:
        doc = ast.get_docstring(ast.parse(modules[package].read_text())) or ""
        assert "import" in doc.lower(), f"{package}/__init__.py must say what it may import"


def test_the_checker_sees_a_cycle_and_a_wrong_direction() -> None:
    loop = [Import("a.x", "a.y", 1), Import("a.y", "a.z", 1), Import("a.z", "a.x", 1), Import("a.z", "b", 1)]
    assert cycles(loop) == [["a.x", "a.y", "a.z"]]
    assert violation(Import("wire.limits", "daemons.bus", 3)) is not None
    assert violation(Import("contracts.tx", "wire.envelope", 3)) is None
    assert violation(Import("daemons.sl.node", "daemons.swop.node", 3)) is not None
    assert violation(Import("daemons.sl.node", "daemons.bus.session", 3)) is None
    assert violation(Import("swci.main", "daemons.sn.node", 3)) is not None
