"""The package's modules import one another without a cycle: not at the top of a module, not inside a function,
not under TYPE_CHECKING. The graph is read from the source (every ``import`` and ``from ... import`` statement, at
any depth), so an import hidden where Python does not run it at once still counts."""

from __future__ import annotations

import ast

from conftest import REPO

PACKAGE = REPO / "specsweep"


def module_name(path, root) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(package=PACKAGE) -> dict[str, set[str]]:
    """Every module of the package and the package modules it imports (``from P import m`` counts as importing
    P.m where m is a module of P, else P)."""
    files = {module_name(p, package.parent): p for p in sorted(package.rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        is_package = path.name == "__init__.py"
        here = name if is_package else name.rpartition(".")[0]
        edges = graph.setdefault(name, set())
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = here.split(".")[: len(here.split(".")) - (node.level - 1)]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                targets = [
                    f"{source}.{alias.name}" if f"{source}.{alias.name}" in files else source for alias in node.names
                ]
            else:
                continue
            edges.update(t for t in targets if t in files and t != name)
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The cycles a depth-first walk of the graph meets (one per edge back to a module still open), each as its
    modules in order with the first repeated at the end; none when the graph has no cycle."""
    state: dict[str, str] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        state[node] = "open"
        stack.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == "open":
                cycles.append(stack[stack.index(target) :] + [target])
            elif target not in state:
                visit(target)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return cycles


def test_the_graph_sees_imports_inside_functions_and_under_type_checking(tmp_path):
    package = tmp_path / "specsweep"
    (package / "sim").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sim" / "__init__.py").write_text("")
    (package / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import B\n")
    (package / "b.py").write_text("def f():\n    from . import c\n")
    (package / "c.py").write_text("import specsweep.sim.d\n")
    (package / "sim" / "d.py").write_text("from .. import a\n")
    graph = import_graph(package)
    assert graph["specsweep.a"] == {"specsweep.b"}
    assert graph["specsweep.b"] == {"specsweep.c"}
    assert graph["specsweep.c"] == {"specsweep.sim.d"}
    assert graph["specsweep.sim.d"] == {"specsweep.a"}
    assert find_cycles(graph) == [["specsweep.a", "specsweep.b", "specsweep.c", "specsweep.sim.d", "specsweep.a"]]
    (package / "sim" / "d.py").write_text("")
    assert find_cycles(import_graph(package)) == []


def test_the_package_has_no_import_cycle():
    graph = import_graph()
    assert "specsweep.config" in graph and "specsweep.sim.server" in graph
    cycles = find_cycles(graph)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(cycle) for cycle in cycles)
