"""The package's import graph: no module imports one that imports it back, and MLflow only in locvit.tracking.

Every import counts, at the top of a module or inside a function (a lazy import is still
a dependency): the graph is read from the source with ``ast``.
"""

from __future__ import annotations

import ast
from pathlib import Path

from locvit import versioning

SRC = Path(__file__).resolve().parents[1] / "src"


def import_graph() -> dict[str, set[str]]:
    """This checkout's graph, read as dvc.yaml's stage code is (:func:`locvit.versioning.import_graph`)."""
    return versioning.import_graph(SRC / "locvit")


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_imports_one_that_imports_it_back():
    graph = import_graph()
    assert "locvit.tracking" in graph["locvit.train.loop"]  # the graph is read (the loop tracks through it)
    assert cycles(graph) == []


def test_only_the_tracking_package_imports_mlflow():
    users = []
    for path in (SRC / "locvit").rglob("*.py"):
        if path.relative_to(SRC / "locvit").parts[0] == "tracking":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            if any(n == "mlflow" or n.startswith("mlflow.") for n in names):
                users.append(str(path.relative_to(SRC)))
    assert users == []


#: The packages that see models only through the family protocol and the model factory.
PROTOCOL_ONLY = ("locvit.analysis", "locvit.report", "locvit.tracking")
#: What they may import of locvit.models: the factory (the package) and the protocol.
MODELS_ALLOWED = {"locvit.models", "locvit.models.family"}


def leaks(graph: dict[str, set[str]]) -> dict[str, list[str]]:
    """Per module of PROTOCOL_ONLY: the family modules (any of locvit.models but the factory and the
    protocol) and the locvit.train modules it imports."""
    found = {}
    for module, deps in graph.items():
        if not module.startswith(tuple(p + "." for p in PROTOCOL_ONLY) + PROTOCOL_ONLY):
            continue
        bad = sorted(d for d in deps if (d.startswith("locvit.models.") and d not in MODELS_ALLOWED)
                     or d == "locvit.train" or d.startswith("locvit.train."))
        if bad:
            found[module] = bad
    return found


def test_the_leak_finder_finds_a_family_or_a_training_import():
    graph = {"locvit.analysis.metrics": {"locvit.models.mait", "locvit.models.family"},
             "locvit.report": {"locvit.train.checkpoint", "locvit.models"},
             "locvit.tracking.run": {"locvit.train"}, "locvit.train.loop": {"locvit.models.mait"}}
    assert leaks(graph) == {"locvit.analysis.metrics": ["locvit.models.mait"],
                            "locvit.report": ["locvit.train.checkpoint"], "locvit.tracking.run": ["locvit.train"]}


def test_analysis_report_and_tracking_know_families_only_through_the_protocol():
    """They import no family module (locvit.models.mait, ibit, lsa, baselines, ...) and nothing of
    locvit.train: a family's facts come from its declaration (locvit.models.family), models from the factory."""
    graph = import_graph()
    assert "locvit.models.family" in graph["locvit.analysis.attention"]  # the graph is read
    assert leaks(graph) == {}
