"""DVC and Snakemake keeping one record: the files each DVC stage stands for, the commit after a run, ``locvit pull``.

Each ``dvc.yaml`` stage runs its Snakemake targets (``locvit targets <stage>``), so Snakemake records what ran
whether a user runs ``snakemake`` or ``dvc repro``: one executor, two records. A Snakemake run of params.yaml's
study in a DVC repository ends with ``dvc commit -f`` (``commit_after_snakemake``), so ``dvc status`` is
clean; inside ``dvc repro`` the stages pass ``dvc_commit=false`` (DVC records the stage and holds the lock).
"""

from __future__ import annotations

import ast
import contextlib
import functools
import hashlib
import json
import shutil
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import yaml

from locvit.config.run import run_config, variant_seeds
from locvit.errors import InputError, allowed
from locvit.io import cache_file, remember
from locvit.layout import REPORT_FILES, StudyLayout
from locvit.model_modules import module_digests, module_files, source_digest

STAGES = ("prepare", "train", "evaluate", "analyse", "report")
#: The one study dvc.yaml describes: its templating reads params.yaml.
DVC_PARAMS = "params.yaml"
PACKAGE = Path(__file__).resolve().parent
#: The ``locvit`` commands each stage's jobs run (the report's stage holds the throughput job), and the
#: workflow files holding their rules.
STAGE_COMMANDS = {
    "configs": ["job-configs"],
    "prepare": ["prepare"],
    "train": ["train"],
    "evaluate": ["evaluate"],
    "analyse": ["analyse"],
    "report": ["report", "throughput"],
}
STAGE_RULES = {
    "configs": [],
    "prepare": ["prepare.smk"],
    "train": ["train.smk"],
    "evaluate": ["train.smk"],
    "analyse": ["analyse.smk"],
    "report": ["report.smk", "throughput.smk"],
}


def stage_targets(params: dict, stage: str, variant: str | None = None) -> list[Path]:
    """The Snakemake targets (files) of a DVC stage; ``variant`` for the per-variant stages."""
    layout = StudyLayout.of(params)
    allowed("stage", stage, STAGES)
    if stage in ("train", "evaluate", "analyse") and variant not in params["variants"]:
        raise InputError(
            f"variant: {variant!r} is not a variant of this study; defined: {', '.join(params['variants'])}"
        )
    seeds = variant_seeds(params, variant) if variant else params["seeds"]
    if layout.per_seed:
        raise InputError(
            "data.split: per_seed: dvc.yaml's stages describe one split (data/); run a study with a split per "
            "seed with snakemake (README), or set data.split: fixed"
        )
    if stage == "prepare":
        return list(layout.data_files().values())
    if stage == "train":
        return [
            path for s in seeds for path in (layout.run_files(variant, s).best, layout.run_files(variant, s).metrics)
        ]
    if stage == "evaluate":
        return [layout.eval_file(variant, s) for s in seeds]
    if stage == "analyse":
        return (
            [layout.analysis_file(variant, s) for s in seeds]
            + [layout.maps_file(variant, s) for s in seeds]
            + [layout.profile_file(variant)]
        )
    return [layout.report_file("md"), layout.throughput_file]  # the report's stage holds the throughput job


# dvc.yaml, generated ----------------------------------------------------------------------------------


@functools.lru_cache(maxsize=4)  # read once per process: every rule of the Snakefile asks
def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """locvit's modules and the locvit modules each imports by name, at the top or inside a function (read
    with ast).

    An import of ``locvit.a.b`` also counts the packages above it whose ``__init__`` Python runs first
    (``locvit``, ``locvit.a``), except the importing module's own packages (they ran before it did) unless
    it names one. The families a package imports by iterating its folder (locvit.models) are not edges: a job
    counts its variant's family (``family_files``). Remembered by the modules' contents: parsing them all takes
    half a second of every ``snakemake -n``.
    """
    files = {_module(path, package): path for path in package.rglob("*.py")}
    names = sorted(files)
    stamp = cache_file("import-graphs", ["named", names], [Path(__file__), *(files[name] for name in names)])
    with contextlib.suppress(OSError, ValueError):  # none yet, or unreadable: parsed again below
        return {name: set(imported) for name, imported in json.loads(stamp.read_text()).items()}
    graph = {}
    for name, path in files.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
        found = {m for m in found if m in files}
        ran = _parents(name) | ({name} if path.name == "__init__.py" else set())  # its own packages
        graph[name] = (found | ({p for m in found for p in _parents(m)} - ran)) - {name}
    remember(stamp, json.dumps({name: sorted(imported) for name, imported in graph.items()}))
    return graph


def family_files(package: Path = PACKAGE) -> set[str]:
    """The modules a package imports by iterating its folder (``pkgutil.iter_modules(__path__)``): locvit's
    model families, each counted only by the jobs whose variant runs it."""
    found = set()
    for init in package.rglob("__init__.py"):
        if any(_iterates_its_folder(node) for node in ast.walk(ast.parse(init.read_text()))):
            name = _module(init, package)
            found |= {f"{name}.{path.stem}" for path in init.parent.glob("*.py") if path.name != "__init__.py"}
    return found


def _iterates_its_folder(node: ast.AST) -> bool:
    """``pkgutil.iter_modules(__path__)``: a package that imports every module in its folder."""
    return (
        isinstance(node, ast.Call)
        and getattr(node.func, "attr", getattr(node.func, "id", None)) == "iter_modules"
        and bool(node.args)
        and isinstance(node.args[0], ast.Name)
        and node.args[0].id == "__path__"
    )


def _parents(module: str) -> set[str]:
    """The packages above a dotted module name: ``a.b.c`` -> ``{a, a.b}``."""
    parts = module.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))}


def _module(path: Path, package: Path) -> str:
    parts = (package.name, *path.relative_to(package).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def command_modules(command: str, package: Path = PACKAGE, families: Iterable[str] = ()) -> set[str]:
    """Every locvit module ``locvit <command>`` can import by name: the CLI's own imports, the command
    function's, ``families`` (the family files its variants run), and all they import in turn."""
    graph = import_graph(package)
    tree = ast.parse((package / "cli.py").read_text())
    function = next(
        n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == f"cmd_{command.replace('-', '_')}"
    )
    start = set()  # cli.py itself counts, not every command's imports in it
    for node in [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))] + list(ast.walk(function)):
        if isinstance(node, ast.ImportFrom) and node.module:
            found = {m for m in (node.module, *(f"{node.module}.{a.name}" for a in node.names)) if m in graph}
            start |= found | {p for m in found for p in _parents(m)}  # and the packages Python runs first
    seen, todo = set(), list(start | set(families))
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo += graph[module]
    return seen | {f"{package.name}.cli"}


#: The package data each module reads (paths inside the package): a stage whose commands import the module
#: depends on them as on its code.
PACKAGE_DATA = {"locvit.config": ("config/params.schema.yaml",)}


#: The commands whose jobs build their variants' models, so run their families' code (``job_code``).
MODEL_COMMANDS = ("train", "evaluate", "analyse", "throughput", "search-spec", "search-table")


def code_digest(
    *commands: str, package: Path = PACKAGE, families: Iterable[str] = (), model_modules: Iterable[str] = ()
) -> str:
    """A digest of what the source ``locvit <command>`` runs computes (``command_modules`` with ``families``,
    each module by name and ``source_digest``: a comment, a docstring or a reformat changes nothing), the same
    wherever it is installed or checked out. A rule's ``code`` param (``job_code``), so Snakemake re-runs the
    jobs whose code changed.

    The ``families`` (locvit's family files the job runs) and ``model_modules`` (the user's: a family outside
    locvit, and the user's modules it imports, ``locvit.model_modules.module_digests``) follow the digest of the
    rest, each as ``name=digest``, so that Snakemake's reason (params changed, before and now) and
    ``locvit status`` name the family that changed."""
    modules, families = set().union(*(command_modules(c, package, families) for c in commands)), set(families)
    digest, named = hashlib.sha256(), []
    for path in sorted(package.rglob("*.py"), key=lambda f: _module(f, package)):
        name = _module(path, package)
        if name in families:
            named.append(f"{name}={source_digest(path)}")
        elif name in modules:
            digest.update(f"{name}\0{source_digest(path)}\0".encode())
    users = module_digests(model_modules)
    return " ".join([digest.hexdigest()[:16], *named, *(f"{name}={code}" for name, code in users.items())])


def job_code(params: dict, command: str, variants: Iterable[str] | None = None, package: Path = PACKAGE) -> str:
    """The ``code_digest`` of a job of ``locvit <command>`` in study ``params``: for the ``MODEL_COMMANDS``,
    with the code of its ``variants``' models only (default: every variant of the study), so that an edit to a
    family the job does not run re-runs nothing (``locvit.config.models.code_modules``)."""
    if command not in MODEL_COMMANDS:
        return code_digest(command, package=package)
    families, users = set(), set()
    for name in params["variants"] if variants is None else variants:
        found = variant_code(params, name)
        families |= {m for m in found if m.split(".")[0] == package.name}
        users |= {m for m in found if m.split(".")[0] != package.name}
    return code_digest(command, package=package, families=sorted(families), model_modules=sorted(users))


def job_key(command: str, variant: str | None = None) -> str:
    """A job's name in the accepted-code ledger: ``train mait_b``, ``throughput``."""
    return f"{command} {variant}" if variant else command


def accepted(layout: StudyLayout) -> dict[str, dict]:
    """The study's accepted code changes (``locvit accept``): job key -> ``{"now", "ran_with", ...}``; none
    where the ledger is missing or unreadable."""
    with contextlib.suppress(OSError, ValueError):
        ledger = json.loads(layout.accepted_code.read_text())
        if isinstance(ledger, dict):
            return ledger
    return {}


def recorded_code(code: str, key: str, ledger: dict[str, dict]) -> str:
    """A job's ``code`` param: ``code``, or the code the job ran with where the user accepted ``code`` for it
    (the ledger's ``now``), so Snakemake finds the job's params as it recorded them."""
    entry = ledger.get(key) or {}
    return entry["ran_with"] if entry.get("now") == code and "ran_with" in entry else code


def variant_code(params: dict, variant: str) -> list[str]:
    """The modules whose code variant ``variant``'s model runs: its family's file and a user's module, or,
    where its model does not build (the job will fail and say why), every family and ``model_modules``."""
    from locvit.config.models import code_modules

    cfg = run_config(params, variant, variant_seeds(params, variant)[0])
    kwargs = {k: v for k, v in cfg["model_kwargs"].items() if k not in ("img_size", "num_classes")}
    found = code_modules(
        {"model": cfg["model"], "kwargs": kwargs},
        params["data"]["image_size"],
        cfg["model_kwargs"]["num_classes"],
        params["model_modules"],
    )
    return sorted(family_files()) + list(params["model_modules"]) if found is None else found


def stage_code(stage: str, package: Path = PACKAGE) -> list[str]:
    """The source a DVC stage's jobs run, relative to the repository: each module its commands can import
    (a package folder where they can import every module in it), the package data those modules read
    (``PACKAGE_DATA``) and the workflow files of its rules. A stage of model jobs lists every family: one
    stage serves every variant (``foreach``), so DVC re-runs it after any family's file changed."""
    models = set(STAGE_COMMANDS[stage]) & set(MODEL_COMMANDS)
    families = family_files(package) if models else set()
    modules = set().union(*(command_modules(c, package, families) for c in STAGE_COMMANDS[stage]))
    files = {path for path in package.rglob("*.py") if _module(path, package) in modules}
    files |= {package / data for module in modules for data in PACKAGE_DATA.get(module, ())}
    folders = sorted(
        {
            path.parent
            for path in files
            if path.parent != package and path.suffix == ".py" and all(f in files for f in path.parent.rglob("*.py"))
        },
        key=lambda f: (len(f.parts), f),
    )
    kept = [f for i, f in enumerate(folders) if not any(f.is_relative_to(g) for g in folders[:i])]
    paths = kept + sorted(f for f in files if not any(f.is_relative_to(g) for g in kept))
    root = package.parents[1]
    return [str(p.relative_to(root)) for p in paths] + [f"workflow/rules/{r}" for r in STAGE_RULES[stage]]


DVC_YAML_HEAD = """\
# Generated by `locvit dvc-yaml` from locvit.layout (every path) and the imports of each
# stage's commands (its code); tests/test_layout.py checks it is current. Do not edit by hand.
#
# The DVC view of the Snakemake study of params.yaml: one stage per step, foreach variant.
# Each stage runs its Snakemake targets (`locvit targets <stage> [<variant>]` lists them), so
# Snakemake keeps its record of what ran whether you run `snakemake` or `dvc repro`, and a
# `snakemake ... all` of params.yaml ends with `dvc commit -f` (the Snakefile's onsuccess):
# `dvc status` is clean after either. `dvc repro train@<variant>` trains every seed of one variant.
# The configs stage writes each job's part of params.yaml to a file (locvit.config.jobs); every other
# stage depends on its own, so a params change re-runs exactly the stages its part reaches.
"""


def model_files(modules: Iterable[str]) -> list[str]:
    """The files of a study's ``model_modules`` and the user's modules they import (``module_files``), relative
    to the working directory where inside it: the code dvc.yaml's model stages depend on beside locvit's."""
    cwd = Path.cwd().resolve()
    paths = [p.resolve() for p in module_files(modules).values() if p is not None]
    return sorted(str(p.relative_to(cwd)) if p.is_relative_to(cwd) else str(p) for p in paths)


def stale_dvc_yaml(path: Path, modules: Iterable[str]) -> list[str]:
    """The ``model_files`` of ``modules`` that no stage of the dvc.yaml at ``path`` depends on."""
    stages = (yaml.safe_load(path.read_text()) or {}).get("stages", {})
    deps = {str(d) for stage in stages.values() for d in stage.get("do", stage).get("deps", [])}
    return [f for f in model_files(modules) if f not in deps]


def dvc_yaml(user_files: Iterable[str] = ()) -> str:
    """The text of dvc.yaml: the study's paths from the layout (``${results_dir}/${study}`` and the
    foreach ``${key}`` as templating), each stage's code from ``stage_code``, and ``user_files`` (``model_files``
    of params.yaml's ``model_modules``) in the stages whose commands build models."""
    layout, v = StudyLayout(Path("${results_dir}/${study}")), "${key}"
    user_files = list(user_files)

    def stage(name: str, deps: list, outs: list, logs: list, per_variant: bool = False, **more) -> dict:
        # The jobs' logs are outputs that persist: a stage with one is never restored from DVC's run
        # cache (which would put outputs in place behind Snakemake's back, its records then describing
        # others), while DVC still removes the other outputs, so the stage's jobs run again.
        body = {
            "cmd": f"${{snakemake}} $(locvit targets {name}{' ' + v if per_variant else ''})",
            "deps": [str(d) for d in deps]
            + stage_code(name)
            + (user_files if set(STAGE_COMMANDS[name]) & set(MODEL_COMMANDS) else []),
            **more,
            "outs": outs + [{str(log): {"persist": True}} for log in logs],
        }
        return {"foreach": "${variants}", "do": body} if per_variant else body

    data = str(layout.data_dir())
    # In the order of the DAG: `dvc commit` rewrites a new output in this order (a copy out of its
    # cache), and the throughput job's file is an input of the report's.
    report_outs = (
        [str(layout.throughput_file)]
        + [str(layout.report_file(r)) for r in REPORT_FILES]
        + [str(layout.report_file(f)) for f in ("tables", "pdf")]
    )
    stages = {
        "configs": {
            "cmd": "locvit job-configs",
            "deps": stage_code("configs"),
            "params": [{DVC_PARAMS: None}],
            "outs": [{str(layout.configs): {"persist": True}}],
        },
        "prepare": stage(
            "prepare",
            [layout.job_config("prepare", layout.data_name())],
            [data],
            [layout.log_file("prepare", layout.data_name())],
        ),
        "train": stage(
            "train",
            [data, layout.train_configs(v)],
            [{str(layout.runs_dir(v)): {"persist": True}}],
            [],
            per_variant=True,
        ),
        "evaluate": stage(
            "evaluate",
            [layout.runs_dir(v), data],
            [str(layout.eval_dir(v))],
            [layout.log_file("evaluate", v)],
            per_variant=True,
        ),
        "analyse": stage(
            "analyse",
            [layout.runs_dir(v), layout.eval_dir(v), data, layout.job_config("analyse")],
            [str(layout.analysis_dir(v)), str(layout.maps_dir(v))],
            [layout.log_file("analyse", v)],
            per_variant=True,
        ),
        "report": stage(
            "report",
            [layout.eval, layout.analysis, layout.maps, layout.job_config("report"), layout.job_config("throughput")],
            report_outs,
            [layout.log_file("throughput"), layout.log_file("report")],
            metrics=[str(layout.report_file("metrics"))],
            plots=[str(layout.report_file("figures"))],
        ),
    }
    body = yaml.safe_dump(
        {"vars": [{"snakemake": "snakemake --cores all --config dvc_commit=false --"}], "stages": stages},
        sort_keys=False,
        width=120,
    )
    return DVC_YAML_HEAD + body.replace(": null", ":")


def commit_after_snakemake(params_file: str, enabled: bool = True, root: Path = Path(".")) -> str:
    """``dvc commit -f`` after a Snakemake run of ``params.yaml``'s study in a DVC repository; what was done.

    Nothing for another study file (dvc.yaml does not describe it), outside a DVC repository,
    without a ``dvc`` command, or when ``enabled`` is false (inside ``dvc repro``). A failed
    commit is reported, not fatal: the study's files stand.
    """
    if not enabled:
        return "skipped: dvc_commit=false (a stage of dvc repro: DVC records it)"
    if Path(params_file) != Path(DVC_PARAMS):
        return f"skipped: {params_file} is not {DVC_PARAMS}, the study dvc.yaml describes"
    if not (root / ".dvc").is_dir():
        return "skipped: not a DVC repository"
    dvc = shutil.which("dvc") or str(Path(sys.executable).with_name("dvc"))
    if not Path(dvc).exists() and shutil.which(dvc) is None:
        return "skipped: no dvc command"
    proc = subprocess.run(
        [dvc, "--wait-for-lock", "commit", "--force", "--quiet"], cwd=root, capture_output=True, text=True
    )
    if proc.returncode:
        return (
            f"dvc.lock NOT updated (dvc commit failed: {(proc.stderr or proc.stdout).strip()[-800:]}); "
            "run `dvc commit -f` once every stage's outputs exist"
        )
    return "dvc.lock records this run (dvc commit -f); `dvc status`: up to date"


def pull(params_file: str = DVC_PARAMS, root: Path = Path(".")) -> None:
    """``dvc pull``, then ``snakemake --touch all``: the pulled files get Snakemake's order of times.

    DVC restores files with new times in no particular order, and a fresh clone has no
    Snakemake records, so Snakemake (>= 9.18 re-runs a job whose input is newer than its
    output whatever the rerun triggers say) would plan everything again; the contents are
    DVC's, checked by ``dvc status``.
    """
    bin_dir = Path(sys.executable).parent
    for cmd in (
        [str(bin_dir / "dvc"), "pull"],
        [
            str(bin_dir / "snakemake"),
            "--touch",
            "--cores",
            "1",
            "all",
            "--config",
            f"params={params_file}",
            "dvc_commit=false",
        ],
    ):
        proc = subprocess.run(cmd, cwd=root)
        if proc.returncode:
            raise SystemExit(f"locvit pull: `{' '.join(cmd)}` failed (exit {proc.returncode})")
