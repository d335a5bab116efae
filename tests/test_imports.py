"""The package's import graph: the layers of locvit.LAYERS, no cycle, MLflow only in locvit.tracking, and
dvc.yaml's stage code from the same graph.

Every import counts, at the top of a module or inside a function (a lazy import is still
a dependency): the graph is read from the source with ``ast``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import yaml

import locvit
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
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
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
        bad = sorted(
            d
            for d in deps
            if (d.startswith("locvit.models.") and d not in MODELS_ALLOWED)
            or d == "locvit.train"
            or d.startswith("locvit.train.")
        )
        if bad:
            found[module] = bad
    return found


def test_the_leak_finder_finds_a_family_or_a_training_import():
    graph = {
        "locvit.analysis.metrics": {"locvit.models.mait", "locvit.models.family"},
        "locvit.report": {"locvit.train.checkpoint", "locvit.models"},
        "locvit.tracking.run": {"locvit.train"},
        "locvit.train.loop": {"locvit.models.mait"},
    }
    assert leaks(graph) == {
        "locvit.analysis.metrics": ["locvit.models.mait"],
        "locvit.report": ["locvit.train.checkpoint"],
        "locvit.tracking.run": ["locvit.train"],
    }


def test_analysis_report_and_tracking_know_families_only_through_the_protocol():
    """They import no family module (locvit.models.mait, ibit, lsa, baselines, ...) and nothing of
    locvit.train: a family's facts come from its declaration (locvit.models.family), models from the factory."""
    graph = import_graph()
    assert "locvit.models.family" in graph["locvit.analysis.attention"]  # the graph is read
    assert leaks(graph) == {}


# The layers (locvit.LAYERS, written down in the package's docstring) ---------------------------------


def top(module: str) -> str:
    """The top-level module or package of locvit a module belongs to (``locvit`` itself: its ``__init__``)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def layer_of() -> dict[str, int]:
    layers = {name: i for i, names in enumerate(locvit.LAYERS) for name in names}
    return {"__init__": 0, **layers}


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Each import from a module to a module of a higher layer, as ``module -> imported``."""
    layer = layer_of()
    return sorted(f"{m} -> {d}" for m, deps in graph.items() for d in deps if layer[top(d)] > layer[top(m)])


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The graph between locvit's top-level modules and packages."""
    out: dict[str, set[str]] = {top(m): set() for m in graph}
    for m, deps in graph.items():
        out[top(m)] |= {top(d) for d in deps} - {top(m)}
    return out


def test_the_layer_checks_find_an_upward_import_and_a_package_cycle():
    graph = {
        "locvit.train.loop": {"locvit.report.render", "locvit.errors"},
        "locvit.report.render": {"locvit.io"},
        "locvit.errors": set(),
        "locvit.io": set(),
    }
    assert upward_imports(graph) == ["locvit.train.loop -> locvit.report.render"]
    assert cycles(
        package_graph(
            {
                "locvit.analysis.search": {"locvit.report.render"},
                "locvit.report.study": {"locvit.analysis.throughput"},
                "locvit.report.render": set(),
                "locvit.analysis.throughput": set(),
            }
        )
    ) == [["analysis", "report"]]


def test_every_module_has_a_layer_and_the_docstring_names_them():
    graph = import_graph()
    layer = layer_of()
    assert {top(m) for m in graph} <= set(layer), "a new top-level module or package: give it a layer in LAYERS"
    for name in layer:
        assert name == "__init__" or f"``{name}``" in locvit.__doc__, f"{name} is not in locvit's docstring"


def test_imports_go_down_the_layers_and_packages_form_no_cycle():
    graph = import_graph()
    assert "locvit.io" in graph["locvit.report.study"]  # the graph is read
    assert upward_imports(graph) == []
    assert cycles(package_graph(graph)) == []


def closure(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo += graph[m]
    return seen


def imports_torch(module: str) -> bool:
    path = SRC.joinpath(*module.split("."))
    path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    for node in ast.walk(ast.parse(path.read_text())):
        names = (
            [a.name for a in node.names]
            if isinstance(node, ast.Import)
            else [node.module or ""]
            if isinstance(node, ast.ImportFrom)
            else []
        )
        if any(n == "torch" or n.startswith("torch.") for n in names):
            return True
    return False


def test_train_and_analysis_import_nothing_of_the_report():
    graph = import_graph()
    for package in ("train", "analysis"):
        users = {m: sorted(d for d in deps if top(d) == "report") for m, deps in graph.items() if top(m) == package}
        assert {m: d for m, d in users.items() if d} == {}, package
    assert "locvit.report.search" in graph["locvit.cli"]  # the mask search's table is rendered in the report


def test_the_report_reads_throughput_without_torch_or_the_models():
    """The report reads report/throughput.csv through locvit.io, which imports (at any depth,
    lazily or not) no torch and nothing of locvit.models; nothing of the report imports the throughput job."""
    graph = import_graph()
    assert imports_torch("locvit.analysis.throughput")  # the check sees torch where it is
    reader = closure(graph, "locvit.io")
    assert not [m for m in reader if top(m) == "models" or imports_torch(m)], reader
    assert "locvit.io" in graph["locvit.report.study"]
    assert not [(m, d) for m, deps in graph.items() if top(m) == "report" for d in deps if top(d) == "analysis"]


def test_an_import_counts_the_packages_python_runs_first():
    """``from locvit.tracking.run import x`` runs locvit/__init__.py and locvit/tracking/__init__.py first:
    both count; a module's own packages (already running when it runs) do not."""
    graph = import_graph()
    assert {"locvit", "locvit.tracking", "locvit.tracking.run"} <= graph["locvit.cli"] | closure(graph, "locvit.cli")
    assert {"locvit.analysis", "locvit.analysis.search"} <= graph["locvit.cli"]  # cmd_train's lazy import
    assert "locvit.tracking" not in graph["locvit.tracking.run"]  # its own package ran before it


def test_the_graph_is_read_once_per_version_of_the_modules(tmp_path, monkeypatch):
    """Remembered by the modules' contents (parsing them all is half a second of every ``snakemake -n``): read
    again, nothing is parsed; a module that gains an import is parsed, and the graph has it."""
    import shutil

    monkeypatch.setenv("LOCVIT_CACHE_DIR", str(tmp_path / "cache"))
    package = tmp_path / "locvit"
    shutil.copytree(SRC / "locvit", package, ignore=shutil.ignore_patterns("__pycache__"))
    first = versioning.import_graph.__wrapped__(package)  # past the per-process cache
    parsed, real = [], ast.parse
    monkeypatch.setattr(ast, "parse", lambda *a, **k: parsed.append(1) or real(*a, **k))
    assert versioning.import_graph.__wrapped__(package) == first and parsed == []
    (package / "errors.py").write_text((package / "errors.py").read_text() + "\nimport locvit.layout\n")
    changed = versioning.import_graph.__wrapped__(package)
    assert parsed and "locvit.layout" in changed["locvit.errors"] - first["locvit.errors"]
    for stamp in (tmp_path / "cache" / "import-graphs").iterdir():  # a cache file that is not JSON: parsed again
        stamp.write_text("{half")
    assert versioning.import_graph.__wrapped__(package) == changed


def test_dvc_stages_hold_only_the_code_their_jobs_run():
    """dvc.yaml's code dependencies (from the import graph): training holds nothing of the report, evaluation
    nothing of sync-tracking's code nor of the stop-on-signal handling only training uses; the parent
    packages' __init__ files that Python runs count."""
    stages = yaml.safe_load((SRC.parent / "dvc.yaml").read_text())["stages"]
    deps = {name: stage.get("do", stage)["deps"] for name, stage in stages.items()}
    assert "src/locvit/train/loop.py" in deps["train"] and "src/locvit/tracking/__init__.py" in deps["train"]
    assert not [d for d in deps["train"] if d.startswith("src/locvit/report")], deps["train"]
    assert "src/locvit/train/evaluate.py" in deps["evaluate"] and "src/locvit/train/__init__.py" in deps["evaluate"]
    assert "src/locvit/tracking/sync.py" not in deps["evaluate"]
    assert "src/locvit/train/state.py" in deps["train"]
    for stage, paths in deps.items():  # the package data locvit.config reads (or its folder): every stage validates
        assert {"src/locvit/config/params.schema.yaml", "src/locvit/config"} & set(paths), stage
    for stage in ("configs", "prepare", "evaluate", "analyse", "report"):
        assert not [
            d
            for d in deps[stage]
            if d
            in ("src/locvit/train/state.py", "src/locvit/tracking/sync.py", "src/locvit/train", "src/locvit/tracking")
        ], stage
