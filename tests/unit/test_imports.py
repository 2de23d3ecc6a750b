"""The package's modules import one another without a cycle and in the order of their layers, and import nothing
inside a function unless the function says why: not at the top of a module, not inside a function, not under
TYPE_CHECKING. The graph is read from the source (every ``import`` and ``from ... import`` statement, at any depth),
so an import hidden where Python does not run it at once still counts."""

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


# The package's layers, bottom to top, each module in one. A module imports only modules of its own layer or of a
# layer below; names are module names without the leading "specsweep." ("" is the package itself).
LAYERS = {
    # what every stage shares: versions, errors, canonical JSON and digests, the results' paths, the configuration's
    # types, logs, a job's progress and run records, text and chat templates
    "foundation": ("", "errors", "canon", "layout", "coerce", "sections", "logs", "progress", "runs", "text"),
    # what to send and how to send it, time it and read the server's counters; what the records mean
    "measuring": ("http1", "client", "counters", "metrics", "sequential", "workloads", "traces"),
    # SGLang's interface: its launch flags per release, a flag's spellings, the variables that change decoding.
    # Below the model, apart from the rest of SGLang's layer: the model (a DDTree build's decoding variables), the
    # simulated server (which accepts SGLang's flags) and the launcher all speak it
    "sglang interface": ("sglang_options",),
    # what speculative decoding would do: the algorithm registry and DDTree's builds, how a server decodes, a
    # configured method as a server runs it, the acceptance model, the cost model, its profiles, published figures
    "modelling": (
        "algorithms",
        "ddtree",
        "ddtree_profile",
        "modelling",
        "modelling.decoding",
        "modelling.method",
        "modelling.acceptance",
        "modelling.cost",
        "modelling.profiles",
        "modelling.published",
    ),
    # a process using the model: its command line, engine, HTTP API, clock and stream; replay steps its engine
    "simulated server": (
        "sim",
        "sim.__main__",
        "sim.args",
        "sim.engine",
        "sim.api",
        "sim.server",
        "sim.clock",
        "sim.stream",
        "sim.replay",
    ),
    # SGLang (or the simulated server) run as a process: what a server job starts a server with (server_job, built
    # by the jobs above from a configuration), the launcher, the installed build's environment, the GPU pool
    "sglang": ("server_job", "launcher", "environment", "external", "gpus"),
    # the workflow's jobs: the configuration and its methods and engines, the server jobs, the cost model each TP
    # uses (calibration.choose), cells and their cache, the bench job, the SLOs (judged at aggregation), aggregation,
    # a calibration (its probe and fit need only the layers below, but are a calibration's parts), the plan, what a
    # job's rerun depends on (rerun: its settings' digest and what changed)
    "jobs": (
        "rerun",
        "config",
        "methods",
        "engines",
        "jobs",
        "calibration",
        "calibration.choose",
        "cache",
        "cells",
        "implied",
        "bench",
        "slo",
        "verdict",
        "aggregate",
        "calibration.probe",
        "calibration.fit",
        "calibration.run",
        "plan",
    ),
    "reporting": ("report", "archive"),
}


def layer_of() -> dict[str, tuple[int, str]]:
    """Each module's (floor, layer): the layer's place in LAYERS, bottom first."""
    return {
        ("specsweep." + name).rstrip("."): (floor, layer)
        for floor, (layer, names) in enumerate(LAYERS.items())
        for name in names
    }


def imports_reaching_up(graph: dict[str, set[str]], layers: dict[str, tuple[int, str]]) -> list[str]:
    """Every import of a module of a higher layer than the importer's, as "importer (layer) -> imported (layer)" (a
    module in no layer is test_every_module_has_one_layer's to name)."""
    return [
        f"{module} ({layers[module][1]}) -> {target} ({layers[target][1]})"
        for module in sorted(set(graph) & set(layers))
        for target in sorted(graph[module] & set(layers))
        if layers[target][0] > layers[module][0]
    ]


def test_the_layer_check_names_an_import_that_reaches_up(tmp_path):
    package = tmp_path / "specsweep"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "canon.py").write_text("")
    (package / "report.py").write_text("from . import canon\n")
    (package / "client.py").write_text("def f():\n    from .report import x\n")
    graph = import_graph(package)
    assert imports_reaching_up(graph, layer_of()) == ["specsweep.client (measuring) -> specsweep.report (reporting)"]
    (package / "client.py").write_text("from .canon import digest\n")
    assert imports_reaching_up(import_graph(package), layer_of()) == []


def test_every_module_has_one_layer():
    named = [name for names in LAYERS.values() for name in names]
    assert len(named) == len(set(named)), "a module named in two layers"
    modules = set(import_graph())
    unplaced = sorted(modules - set(layer_of()))
    assert not unplaced, f"modules in no layer (add each to LAYERS): {', '.join(unplaced)}"
    gone = sorted(set(layer_of()) - modules)
    assert not gone, f"LAYERS names modules that are not in the package: {', '.join(gone)}"


def test_no_import_reaches_up_a_layer():
    """The layers by meaning, as the code has them: SGLang's interface (sglang_options) lies below the model, apart
    from the rest of SGLang, because the model and the simulated server speak it too; the server job's description
    (server_job) lies with SGLang, which starts it, below the jobs that build it; the algorithm registry and DDTree's
    builds are the model's, though modules of their own; in the jobs' layer the cost model's choice
    (calibration.choose) lies low, read by the engines' views and the server jobs, and a calibration's run high, above
    the jobs it starts, so the calibration package spans that layer; reporting reads the run records of the cells'
    cache."""
    reaching = imports_reaching_up(import_graph(), layer_of())
    assert not reaching, "imports of a higher layer:\n" + "\n".join(reaching)


IMPORTED_HERE = "Imported here:"  # a function that imports says so in its docstring, naming each module and why


def local_imports(package=PACKAGE) -> list[str]:
    """Every import made inside a function whose docstring does not name the module after IMPORTED_HERE, as
    "path:line function: module"."""
    out = []
    for path in sorted(package.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for function in ast.walk(tree):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            reason = " ".join((ast.get_docstring(function) or "").split()).partition(IMPORTED_HERE)[2]
            for node in ast.walk(function):
                if isinstance(node, ast.Import):
                    modules = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom):
                    modules = ["." * node.level + (node.module or "")]
                else:
                    continue
                for module in modules:
                    if module.lstrip(".").split(".")[0] not in reason.split() and module not in reason:
                        where = path.relative_to(package.parent)
                        out.append(f"{where}:{node.lineno} {function.name}: {module}")
    return out


def test_the_local_import_check_asks_for_the_reason(tmp_path):
    package = tmp_path / "specsweep"
    package.mkdir()
    (package / "a.py").write_text(
        "def plot():\n"
        '    """Charts. Imported here: matplotlib (heavy, for this job alone)."""\n'
        "    import matplotlib.pyplot\n"
        "def count():\n"
        '    """Counts."""\n'
        "    from .text import split\n"
    )
    assert local_imports(package) == ["specsweep/a.py:6 count: .text"]


def test_no_import_inside_a_function_without_its_reason():
    found = local_imports()
    assert not found, (
        f"imports inside functions whose docstring gives no reason (say '{IMPORTED_HERE} <module> (why)', or import "
        "it at the top of the module):\n" + "\n".join(found)
    )
