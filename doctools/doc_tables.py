"""Keep the tables the docs quote equal to the committed files they quote.

A quoted table sits between two markers that name its file::

    <!-- table: results benchmarks/results/demo/results.csv -->
    | variant | n | ... |
    <!-- /table -->

``results`` renders a results.csv as ``locvit results --csv`` does; ``efficiency`` renders a
data-efficiency table (report/tables/data_efficiency.csv) one row per fraction and variant;
``throughput`` a report/throughput.csv; ``pipeline`` the demo's wall time and per-rule job
time from a bench_pipeline.py result (pipeline.json); ``machines`` a folder's result files (``*.json``), one
row each with the machine it records (CPU, its instruction set as torch used it, cores, torch, Python, GPU) and
the commit that made it, "not recorded" where an older file lacks a field; ``models`` the params and GMACs of
every entrypoint and baseline beside the papers' (doctools/model_table.py's model_table.csv); ``budgets`` a GPU
visit's groups, sections and budgets (gpu_node/visit.py); ``cost`` a study's cost before it runs (a preset;
``FILE#N``: an image folder's N training images);
``coverage`` benchmarks/coverage.py's
intervals per cell (``split_coverage`` its split cells); ``interaction`` the fraction x family interaction of
data-efficiency folders ``A,B``; ``plan`` ``locvit plan`` on a study's evaluations.json at its equivalence margin;
``side_by_side`` two files of one kind, named ``A,B`` (two machines' results.csv, or a data-efficiency table under
two protocols): each comparison's n, top-1, Δ and verdict on both sides, and whether the verdicts agree
(``designs``: with each side's MDE).
A figure inside a sentence is a value span that names its file and where in it the figure is::

    the demo took <!-- value benchmarks/results/pipeline.json demo_wall_s/minutes:.1f -->17.0<!-- /value --> min

The key is a path of ``/``-separated steps: a JSON or YAML key or list index; in a CSV, ``column=value``
keeps the rows whose column has that value and a plain step takes a column (a list of numbers); the last
steps may be ``len``, ``min``, ``max``, ``sum``, ``mean``, ``pct`` (× 100) or ``minutes`` (÷ 60); after
``:`` a format spec (``.1f``, ``,.0f``); a single CSV cell is a number where it parses as one.
Run from the repository root: ``python -m doctools.doc_tables`` rewrites every block and value of
README.md, docs/*.md and the READMEs of benchmarks/ and tests/ from its file; ``--check`` only lists the blocks
that differ
(tests/test_docs.py runs it, so a doc cannot drift from its file).
"""

from __future__ import annotations

import argparse
import ast
import csv
import re
import sys
from pathlib import Path

from locvit.io import write_text
from locvit.report.tables import as_markdown, num, read_results_csv, summary_lines

ROOT = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"(<!-- table: (\w+) (\S+) -->\n)(.*?)(<!-- /table -->)", re.S)
VALUE = re.compile(r"(<!-- value (\S+) (\S+) -->)(.*?)(<!-- /value -->)", re.S)
OPS = {
    "len": len,
    "min": min,
    "max": max,
    "sum": sum,
    "mean": lambda xs: sum(xs) / len(xs),
    "pct": lambda x: 100 * x,
    "minutes": lambda x: x / 60,
}


def _by_fraction(rows: list[dict]):
    """A data-efficiency CSV's (fraction column, row) pairs that hold runs, fraction by fraction."""
    for f in (k for k in rows[0] if k.endswith("% of train")):
        yield from ((f, r) for r in rows if r[f"{f} n"])


def efficiency_lines(rows: list[dict]) -> list[list[str]]:
    """A data-efficiency CSV (one row per variant, a column group per fraction) as one line per
    fraction and variant: n, mean ± std, interval, Δ to the baseline at that fraction, MDE, verdict."""
    lines = [
        ["train fraction", "variant", "n", "test top-1 (%)", "95% CI", "Δ vs reference", "Δ 95% CI", "MDE", "verdict"]
    ]
    for f, r in _by_fraction(rows):
        mean = num(r[f]) + (f" ± {num(r[f'{f} std'])}" if r[f"{f} std"] else "")
        ci = f"[{num(r[f'{f} ci95_low'])}, {num(r[f'{f} ci95_high'])}]" if r[f"{f} ci95_low"] else "–"
        delta = f"{num(r[f'{f} delta'], '+.2f')} vs {r[f'{f} reference']}" if r[f"{f} reference"] else "–"
        dci = (
            f"[{num(r[f'{f} delta_ci95_low'], '+.2f')}, {num(r[f'{f} delta_ci95_high'], '+.2f')}]"
            if r[f"{f} delta_ci95_low"]
            else "–"
        )
        lines.append(
            [
                f.replace(" of train", ""),
                r["Variant"],
                r[f"{f} n"],
                mean,
                ci,
                delta,
                dci,
                num(r[f"{f} mde80"]),
                r[f"{f} verdict"] or "–",
            ]
        )
    return lines


def throughput_lines(rows: list[dict]) -> list[list[str]]:
    """A throughput.csv: images/s (median over rounds, the rounds' range) and the ratio to the baseline."""
    lines = [["variant", "images/s", "rounds' range", "× baseline"]]
    for r in rows:
        lines.append(
            [
                r["variant"],
                f"{float(r['img_s_median']):,.0f}",
                f"{float(r['img_s_low']):,.0f}-{float(r['img_s_high']):,.0f}",
                num(r["ratio_vs_baseline"]),
            ]
        )
    return lines


def pipeline_lines(path: Path) -> list[list[str]]:
    """A pipeline.json's demo from scratch: its wall time, then per rule the jobs and their summed job time
    (for training, the epochs' share and the rest), and MLflow's share of the job time where recorded."""
    import json

    data = json.loads(path.read_text())
    lines = [["rule", "jobs", "job time (s)", "of it in epochs (s)", "around the epochs (s)"]]
    for rule, r in data["demo_breakdown"].items():
        if rule != "all":
            lines.append(
                [
                    rule,
                    str(r["jobs"]),
                    f"{r['job_s']:,.1f}",
                    f"{r['epochs_s']:,.1f}" if "epochs_s" in r else "",
                    f"{r['other_s']:,.1f}" if "other_s" in r else "",
                ]
            )
    total = sum(r["job_s"] for r in data["demo_breakdown"].values())
    lines.append(
        [
            "all jobs",
            str(sum(r["jobs"] for rule, r in data["demo_breakdown"].items() if rule != "all")),
            f"{total:,.1f}",
            "",
            "",
        ]
    )
    lines.append(["wall time", "", f"{data['demo_wall_s']:,.1f} ({data['demo_wall_s'] / 60:.1f} min)", "", ""])
    if "demo_mlflow" in data:  # MLflow's calls in every job, and the system-metrics sampler
        m = data["demo_mlflow"]
        lines.append(
            [
                "of all jobs: MLflow",
                "",
                f"{m['total_s']:,.1f} ({100 * m['share_of_job_time']:.1f} %)",
                "",
                f"training {m['train_s']:,.1f}, evaluation {m['evaluate_s']:,.1f}, report {m['report_s']:,.1f}, "
                f"system metrics {m['system_metrics_s']:,.2f}",
            ]
        )
    return lines


MACHINE_FIELDS = (
    ("CPU", "cpu"),
    ("ISA", "cpu_capability"),
    ("cores", "cores"),
    ("torch", "torch"),
    ("Python", "python"),
    ("GPU", "gpu"),
)


def machines_lines(folder: Path) -> list[list[str]]:
    """Every result file of a folder with the machine and the commit it records."""
    import json

    lines = [["file", *(label for label, _ in MACHINE_FIELDS), "commit"]]
    for path in sorted(folder.glob("*.json")):
        data = json.loads(path.read_text())
        machine = data.get("machine") or {}
        cells = [machine.get(key, "not recorded") for _, key in MACHINE_FIELDS]
        commit = data.get("commit") or machine.get("commit") or "not recorded"
        lines.append([f"`{path.name}`", *("–" if c is None else str(c) for c in cells), str(commit)])
    return lines


def model_lines(rows: list[dict]) -> list[list[str]]:
    """model_table.csv: one line per model, its keywords in code, params and GMACs beside the paper's."""
    lines = [
        ["entrypoint", "keywords", "paper model", "input", "params (M)", "paper params (M)", "GMACs", "paper GFLOPs"]
    ]
    for r in rows:
        lines.append(
            [
                f"`{r['entrypoint']}`",
                f"`{r['keywords']}`" if r["keywords"] else "",
                r["paper model"],
                r["input"],
                r["params (M)"],
                r["paper params (M)"],
                r["GMACs"],
                r["paper GFLOPs"],
            ]
        )
    return lines


def python_literals(path: Path, names: tuple[str, ...]) -> dict:
    """The values of the module-level assignments ``names`` in the Python file ``path``, read from its source
    (``ast.literal_eval``: no import, so no torch for gpu_check.py)."""
    found = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and getattr(node.targets[0], "id", None) in names:
            found[node.targets[0].id] = ast.literal_eval(node.value)
    return found


def cost_lines(path: Path) -> list[list[str]]:
    """A study's cost before it runs (``locvit validate``'s table, locvit.analysis.cost) at the assumed rate."""
    from locvit.analysis.cost import ASSUMED_MFU, PEAK_TFLOPS, study_cost
    from locvit.config import load_params

    params, _, train_images = str(path).partition("#")  # an image folder's training images: FILE#N
    rows = study_cost(load_params(params, check_models=False), {}, int(train_images) if train_images else None)
    lines = [
        [
            "variant",
            "runs",
            "epochs",
            "images seen",
            "forward GMACs",
            "training PFLOP",
            f"GPU-hours at {ASSUMED_MFU:.0%} of {PEAK_TFLOPS:g} TFLOP/s",
        ]
    ]
    lines += [
        [
            r["variant"],
            str(r["runs"]),
            str(r["epochs"]),
            f"{r['images_seen']:,}",
            f"{r['forward_gmacs']:.2f}",
            f"{r['pflop']:,.0f}",
            f"{r['gpu_hours']:.1f}",
        ]
        for r in rows
    ]
    lines.append(
        [
            "**total**",
            str(sum(r["runs"] for r in rows)),
            "",
            f"{sum(r['images_seen'] for r in rows):,}",
            "",
            f"{sum(r['pflop'] for r in rows):,.0f}",
            f"**{sum(r['gpu_hours'] for r in rows):.1f}**",
        ]
    )
    return lines


def budget_lines(path: Path) -> list[list[str]]:
    """A GPU visit's processes (gpu_node/visit.py, which imports no torch): each group's sections, budget (s) and
    how each was estimated; each plan's total, facts and install included, against its deadline."""
    from gpu_node import visit

    lines = [["group", "section", "budget (s)", "how estimated"]]
    for plan, groups in visit.GROUPS.items():
        lines.append(
            [
                f"*{plan}*",
                "node facts, wheelhouse install",
                str(visit.FACTS_S + visit.INSTALL_S),
                "standard-library probes and nvidia-smi; pip --target of the wheelhouse, cut at its budget",
            ]
        )
        for group, sections in groups:
            lines += [
                [
                    group if i == 0 else "",
                    f"`{s}`",
                    str(visit.BUDGETS[s][1] + (visit.START_S if i == 0 else 0)),
                    visit.BUDGETS[s][2] + (f" (+{visit.START_S} s: the process's start)" if i == 0 else ""),
                ]
                for i, s in enumerate(sections)
            ]
        lines.append(
            [
                f"**{plan}, in all**",
                "",
                f"**{visit.plan_seconds(plan)}**",
                f"of the {visit.DEADLINE_S} s default deadline (a 10-minute command less a minute)",
            ]
        )
    return lines


RENDER = {
    "results": summary_lines,
    "efficiency": efficiency_lines,
    "throughput": throughput_lines,
    "models": model_lines,
}


def _cell(text) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _allowed(spec: dict) -> str:
    """A schema entry's type and range, as a reader wants it."""
    if "enum" in spec:
        return ", ".join(f"`{v}`" for v in spec["enum"])
    kinds = spec.get("type", "object" if "properties" in spec else "")
    kinds = "/".join(kinds) if isinstance(kinds, list) else kinds
    bounds = [
        f"≥ {spec['minimum']}" if "minimum" in spec else "",
        f"> {spec['exclusiveMinimum']}" if "exclusiveMinimum" in spec else "",
        f"≤ {spec['maximum']}" if "maximum" in spec else "",
        f"< {spec['exclusiveMaximum']}" if "exclusiveMaximum" in spec else "",
    ]
    return " ".join([kinds, ", ".join(b for b in bounds if b)]).strip()


def params_lines(path: Path) -> list[list[str]]:
    """The params reference: every key of the schema with its type and range, default and description."""
    import json

    import yaml

    schema = yaml.safe_load(path.read_text())
    defs = schema.get("$defs", {})

    def resolved(spec: dict) -> dict:
        if "$ref" in spec:
            return {**defs[spec["$ref"].rsplit("/", 1)[1]], **{k: v for k, v in spec.items() if k != "$ref"}}
        return spec

    lines = [["key", "type and range", "default", "description"]]

    def walk(properties: dict, prefix: str) -> None:
        for name, spec in properties.items():
            spec = resolved(spec)
            default = (
                f"`{json.dumps(spec['default'])}`"
                if "default" in spec
                else "required"
                if name in required.get(prefix, ())
                else ""
            )
            lines.append([f"`{prefix}{name}`", _cell(_allowed(spec)), default, _cell(spec.get("description", ""))])
            if "properties" in spec:
                required[f"{prefix}{name}."] = spec.get("required", ())
                walk(spec["properties"], f"{prefix}{name}.")

    required = {"": schema.get("required", ())}
    walk(schema["properties"], "")
    return lines


def step_lines(path: Path) -> list[list[str]]:
    """A bench_mait.py / bench_ibit.py result: per model size and variant, the training step time over the
    baseline's with its fused and with its eager attention."""
    import json

    data = json.loads(path.read_text())
    lines = [["model size (batch)", "variant", "step time / baseline (fused)", "/ baseline (eager)"]]
    for size, r in data["results"].items():
        for variant, ratio in r["ratios"].items():
            lines.append(
                [f"{size} ({r['batch']})", variant, f"{ratio:.3f}", f"{r['ratios_vs_eager_twin'][variant]:.3f}"]
            )
    return lines


def _json_at(path: Path):
    """A result file's JSON, or the part of it a ``file.json#key/key`` source names."""
    import json

    file, _, key = str(path).partition("#")
    data = json.loads(Path(file).read_text())
    for step in filter(None, key.split("/")):
        data = data[step]
    return data


def _figure(x) -> str:
    if isinstance(x, float):
        return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"
    return str(x)


def flat_lines(path: Path) -> list[list[str]]:
    """Any part of a result file (``file.json#key``) as one row per leaf: its key path and its value."""
    lines = [["key", "value"]]

    def walk(x, prefix):
        if isinstance(x, dict):
            for k, v in x.items():
                walk(v, f"{prefix}/{k}" if prefix else str(k))
        else:
            lines.append([f"`{prefix}`", _figure(x)])

    walk(_json_at(path), "")
    return lines


def augment_side_lines(path: Path) -> list[list[str]]:
    """bench_augment.py's side_by_side: images/s of the tensor backend and timm's PIL path, and their ratios."""
    lines = [["size (batch)", "threads", "tensor backend", "timm's PIL path", "ratio", "RandAugment alone: ratio"]]
    for size, r in _json_at(Path(f"{path}#side_by_side")).items():
        for threads, t in ((k, v) for k, v in r.items() if k.endswith(("_thread", "_threads"))):
            ips = t["images_per_s"]
            lines.append(
                [
                    f"{size} ({r['batch']})",
                    threads.split("_")[0],
                    f"{ips['tensor']:,.0f}",
                    f"{ips['timm_pil']:,.0f}",
                    f"{t['ratio_tensor_over_pil']:.2f}",
                    f"{t['ratio_tensor_over_pil_randaugment_only']:.2f}",
                ]
            )
    return lines


def augment_ops_lines(path: Path) -> list[list[str]]:
    """bench_augment.py's tensor_vs_pil_levels: per op, |tensor - PIL| in uint8 levels as mean / share of pixels
    more than 2 levels apart / max, at each size on smooth images and on noise."""
    levels = _json_at(Path(f"{path}#tensor_vs_pil_levels"))
    cases = [(size, kind) for size in levels for kind in ("smooth", "noise")]
    lines = [["op", *(f"{size} {kind}" for size, kind in cases)]]
    for op in next(iter(levels.values())):
        cells = []
        for size, kind in cases:
            d = levels[size][op][kind]
            cells.append("0" if d["max"] == 0 else f"{d['mean']:.2f} / {100 * d['share_over_2']:.1f} % / {d['max']}")
        lines.append([op, *cells])
    return lines


def dataloader_lines(path: Path) -> list[list[str]]:
    """bench_dataloader.py: per data set and worker case, images/s of FFCV and torch, JIT on and off, and the
    ratios; the first and a later epoch's seconds of FFCV with its JIT."""
    data = _json_at(path)
    lines = [
        [
            "data set (batch, images an epoch)",
            "workers",
            "FFCV, JIT",
            "torch",
            "ratio",
            "FFCV, no JIT",
            "torch",
            "ratio",
            "FFCV JIT: first / later epoch (s)",
        ]
    ]
    for name, d in data["datasets"].items():
        jit, plain = data["loaders"]["jit"][name], data["loaders"]["no_jit"][name]
        for case, c in jit["cases"].items():
            n = plain["cases"][case]
            workers = case.replace("plain_w", "").replace("w", "") + (
                ", no augmentation" if case.startswith("plain") else ""
            )
            lines.append(
                [
                    f"{name} ({d['batch']}, {jit['images_per_epoch']:,})",
                    workers,
                    f"{c['ffcv_images_per_s']:,.0f}",
                    f"{c['torch_images_per_s']:,.0f}",
                    f"{c['ratio_ffcv_over_torch']:.2f}",
                    f"{n['ffcv_images_per_s']:,.0f}",
                    f"{n['torch_images_per_s']:,.0f}",
                    f"{n['ratio_ffcv_over_torch']:.2f}",
                    f"{c['ffcv_first_epoch_s']:.2f} / {c['ffcv_later_epoch_s']:.2f}",
                ]
            )
    return lines


def feed_lines(path: Path) -> list[list[str]]:
    """bench_feed.py: per size, feed capacity (images/s of every setting, the best-against-best ratio and its
    range over rounds, FFCV's part alone) and training fed by each side (images/s, ratio and range)."""
    results = _json_at(path)["results"]
    lines = [["size", "what", "images/s", "ratio (rounds' range)"]]
    for size, r in results.items():
        cap, e2e = r["feed_capacity"], r["end_to_end"]
        for setting, ips in cap["images_per_s"].items():
            lines.append([size, f"feed: `{setting}`", f"{ips:,.0f}", ""])
        rounds = cap["ratio_per_round"]
        lines.append(
            [
                size,
                f"feed: best locvit (`{cap['best_locvit']}`) over best torch (`{cap['best_timm']}`)",
                "",
                f"**{cap['ratio_best_over_best']:.2f}** ({min(rounds):.2f}-{max(rounds):.2f})",
            ]
        )
        lines.append(
            [size, "feed: FFCV's part alone over best torch", "", f"{cap['ratio_ffcv_loader_only_over_best_timm']:.2f}"]
        )
        for setting, ips in e2e["images_per_s"].items():
            lines.append([size, f"training: `{setting}`", f"{ips:,.1f}", ""])
        rounds = e2e["ratio_per_round"]
        lines.append(
            [
                size,
                f"training: locvit-fed over timm-fed (batch {e2e['batch']})",
                "",
                f"**{e2e['ratio_ffcv_fed_over_timm_fed']:.2f}** ({min(rounds):.2f}-{max(rounds):.2f})",
            ]
        )
    return lines


def coverage_lines(path: Path) -> list[list[str]]:
    """benchmarks/coverage.py's result: per cell, the coverage of a difference's and a variant's 95 % interval,
    the type-I error at 5 %, and how often the image component was truncated with the coverage then."""
    head = ["seeds", "test images", "accuracy", "failed runs", "Δ coverage", "type-I", "truncated", "Δ coverage if so"]
    lines = [[*head, "variant coverage"]]
    for c in _json_at(path)["cells"]:
        conditional = "–" if c["coverage_truncated"] is None else f"{c['coverage_truncated']:.3f}"
        lines.append(
            [
                str(c["seeds"]),
                f"{c['images']:,}",
                f"{c['accuracy']:.2f}",
                f"{c['failed_runs']:.0%}",
                f"{c['coverage']:.3f}",
                f"{c['type_i']:.3f}",
                str(c["truncated"]),
                conditional,
                f"{c['variant_coverage']:.3f}",
            ]
        )
    return lines


def split_coverage_lines(path: Path) -> list[list[str]]:
    """benchmarks/coverage.py's split cells: per split effect, seeds and accuracy, each design's coverage of a
    difference's and a variant's 95 % interval and its type-I error."""
    lines = [["split effect", "seeds", "accuracy"]]
    for design in ("per_seed", "fixed"):
        lines[0] += [f"{design}: Δ coverage", "type-I", "variant coverage"]
    for c in _json_at(path)["split"]:
        row = [f"{c['split_effect']:.2f}", str(c["seeds"]), f"{c['accuracy']:.2f}"]
        for design in ("per_seed", "fixed"):
            d = c[design]
            row += [f"{d['coverage']:.3f}", f"{d['type_i']:.3f}", f"{d['variant_coverage']:.3f}"]
        lines.append(row)
    return lines


def plan_lines(path: Path) -> str:
    """``locvit plan`` on a committed evaluations.json at the study's equivalence margin as the difference."""
    from locvit.report.study import study_from_evaluations
    from locvit.report.tables import plan_markdown

    study = study_from_evaluations(path)
    return plan_markdown(study, study.margin)


FILE_RENDER = {
    "coverage": coverage_lines,
    "split_coverage": split_coverage_lines,
    "cost": cost_lines,
    "budgets": budget_lines,
    "dataloader": dataloader_lines,
    "feed": feed_lines,
    "pipeline": pipeline_lines,
    "params": params_lines,
    "step": step_lines,
    "flat": flat_lines,
    "augment_side": augment_side_lines,
    "augment_ops": augment_ops_lines,
}  # kinds that read the file themselves


def _side_label(path: Path) -> str:
    """A side of a side-by-side table: its folder's name, with the instruction set its ``source.json`` records."""
    import json

    record = path.parent / "source.json"
    isa = (json.loads(record.read_text()).get("machine") or {}).get("cpu_capability") if record.is_file() else None
    return f"{path.parent.name} ({isa})" if isa else path.parent.name


def _comparisons(path: Path) -> dict[tuple[str, str], dict]:
    """A results.csv or a data-efficiency table as ``{(fraction, variant): row}``, each row with the cells a
    side-by-side table shows: n, top-1 mean ± std, Δ with its 95 % interval, verdict."""
    rows = list(csv.DictReader(path.open(newline="")))
    if rows and "Variant" in rows[0]:  # report/tables/data_efficiency.csv: a column group per fraction
        return {
            (f.replace(" of train", ""), r["Variant"]): {
                "n": r[f"{f} n"],
                "mean": r[f],
                "std": r[f"{f} std"],
                "delta": r[f"{f} delta"],
                "low": r[f"{f} delta_ci95_low"],
                "high": r[f"{f} delta_ci95_high"],
                "verdict": r[f"{f} verdict"],
            }
            for f, r in _by_fraction(rows)
        }
    return {
        ("", r["variant"]): {
            "n": r["n_seeds"],
            "mean": r["test_top1_mean"],
            "std": r["test_top1_std"],
            "delta": r["delta_vs_baseline"],
            "low": r["delta_ci95_low"],
            "high": r["delta_ci95_high"],
            "verdict": r["verdict"],
            "mde": r["mde80"],
        }
        for r in read_results_csv(path)
    }


def side_by_side_lines(sources: list[Path], mde: bool = False) -> list[list[str]]:
    """Two results of one study side by side (``A.csv,B.csv``: two machines' demos, or a data-efficiency study
    under two protocols): per comparison each side's n, top-1, Δ with its 95 % interval and verdict, and
    whether the verdicts agree. Both files must be of one kind (results.csv, or data_efficiency.csv). ``mde``
    (results.csv): each side's MDE too (``designs``: one study under two designs)."""
    if len(sources) != 2:
        raise ValueError(f"a side_by_side table compares two files, given as A,B; got {len(sources)}")
    sides = [_comparisons(p) for p in sources]
    keys = [k for k in sides[0] if k in sides[1]] + [k for k in sides[1] if k not in sides[0]]
    by_fraction = any(fraction for fraction, _ in keys)
    lines = [[*(["train fraction"] if by_fraction else []), "variant"]]
    for path in sources:
        label = _side_label(path)
        lines[0] += [f"{label}: n", "test top-1 (%)", "Δ [95% CI]", *(["MDE"] if mde else []), "verdict"]
    lines[0].append("same verdict")

    def cells(row: dict | None) -> list[str]:
        if row is None:
            return ["–"] * (5 if mde else 4)
        mean = num(row["mean"]) + (f" ± {num(row['std'])}" if row["std"] else "")
        delta = (
            f"{num(row['delta'], '+.2f')} [{num(row['low'], '+.2f')}, {num(row['high'], '+.2f')}]"
            if row["low"]
            else "–"
        )
        return [
            row["n"],
            mean,
            delta,
            *([num(row["mde"]) if row["mde"] else "–"] if mde else []),
            row["verdict"] or "–",
        ]

    for key in keys:
        a, b = (side.get(key) for side in sides)
        same = "–" if a is None or b is None else "yes" if a["verdict"] == b["verdict"] else "**no**"
        lines.append([*([key[0]] if by_fraction else []), key[1], *cells(a), *cells(b), same])
    return lines


def interaction_lines(folders: list[Path]) -> list[list[str]]:
    """The fraction x family interaction of data-efficiency studies (``A,B``: a folder per protocol, each with its
    evaluations.json): per family, Δ against DeiT at the smallest fraction and with all the data, each the study's
    own comparison (paired over the test images, as in its results.csv), and their difference
    (``stats.interaction``), Holm over each folder's families."""
    from locvit.report import stats
    from locvit.report.study import study_from_evaluations

    lines = []
    head = ["protocol", "family", "Δ at {small}", "Δ at 100%", "Δ({small}) − Δ(100%) [95% CI]", "p (Holm)"]
    for folder in folders:
        study = study_from_evaluations(folder / "evaluations.json")
        accs = {name: study.acc(v) for name, v in study.variants.items()}
        small = min((int(m.group(1)) for v in accs if (m := re.search(r"_(\d+)pct$", v))), default=None)
        found = []
        for family, acc in accs.items():
            if acc.test is None or f"{family}_{small}pct" not in accs:
                continue
            at = [accs[f"{family}_{small}pct"].test, acc.test]
            found.append((family, at, stats.interaction(*at)))
        for (family, at, test), p in zip(found, stats.holm([t.p for _, _, t in found])):
            ci = "–" if test.ci_low is None else f"{test.delta:+.2f} [{test.ci_low:+.2f}, {test.ci_high:+.2f}]"
            lines.append([folder.name, family, *(f"{c.delta:+.2f}" for c in at), ci, "–" if p is None else f"{p:.2g}"])
        if folder == folders[0]:
            lines.insert(0, [h.format(small=f"{small}%") for h in head])
    return lines


def source_lines(path: Path) -> list[list[str]]:
    """Where a quoted result comes from: the machine and the commit its record names (a folder's
    ``source.json``, written by publish.py, or a result file's own fields); an older record that lacks
    them says so."""
    import json

    record = path / "source.json" if path.is_dir() else path
    data = json.loads(record.read_text()) if record.is_file() else {}
    machine = data.get("machine") or {}
    unknown = "not recorded (an earlier locvit)"
    cells = [str(machine.get(key) or unknown) for _, key in MACHINE_FIELDS[:2]]
    commit = data.get("commit") or unknown
    return [["made on", "instruction set", "by commit"], [*cells, commit]]


FOLDER_RENDER = {"machines": machines_lines, "source": source_lines}  # kinds that read a folder


def render(kind: str, source: str) -> str:
    path = ROOT / source
    special = ("side_by_side", "designs", "plan", "interaction")
    if kind not in RENDER and kind not in FILE_RENDER and kind not in FOLDER_RENDER and kind not in special:
        raise ValueError(
            f"table kind {kind!r} (in a '<!-- table: ... -->' marker); allowed: "
            f"{', '.join([*RENDER, *FILE_RENDER, *FOLDER_RENDER, *special])}"
        )
    if kind in ("side_by_side", "designs"):
        paths = [ROOT / part for part in source.split(",")]
        for p in paths:
            if not p.is_file():
                raise FileNotFoundError(
                    f"{p.relative_to(ROOT)} (quoted by a '<!-- table: side_by_side ... -->' marker) does not exist"
                )
        return as_markdown(side_by_side_lines(paths, mde=kind == "designs"))
    if kind == "interaction":
        return as_markdown(interaction_lines([ROOT / part for part in source.split(",")]))
    if kind == "source" and path.is_file():
        return as_markdown(source_lines(path))
    if kind in FOLDER_RENDER:
        if not path.is_dir():
            raise FileNotFoundError(f"{source} (quoted by a '<!-- table: {kind} ... -->' marker) is not a folder")
        return as_markdown(FOLDER_RENDER[kind](path))
    if not Path(str(path).partition("#")[0]).is_file():
        raise FileNotFoundError(f"{source} (quoted by a '<!-- table: ... -->' marker) does not exist")
    if kind == "plan":
        return plan_lines(path)
    if kind in FILE_RENDER:
        return as_markdown(FILE_RENDER[kind](path))
    rows = read_results_csv(path) if kind == "results" else list(csv.DictReader(path.open(newline="")))
    return as_markdown(RENDER[kind](rows))


def _number(cell):
    try:
        return int(cell)
    except ValueError:
        try:
            return float(cell)
        except ValueError:
            return cell


def value(source: str, key: str) -> str:
    """The text of a ``<!-- value source key -->`` span: the value at ``key`` in ``source``, formatted."""
    import json

    import yaml

    path = ROOT / source
    if not path.is_file():
        raise FileNotFoundError(f"{source} (quoted by a '<!-- value ... -->' span) does not exist")
    key, _, fmt = key.partition(":")
    if path.suffix == ".csv":
        data = list(csv.DictReader(path.open(newline="")))
    elif path.suffix == ".json":
        data = json.loads(path.read_text())
    else:
        data = yaml.safe_load(path.read_text())
    for step in key.split("/"):
        if step in OPS and not (isinstance(data, dict) and step in data):
            data = OPS[step](data)
        elif isinstance(data, list) and "=" in step:  # CSV rows: keep those whose column has the value
            column, wanted = step.split("=", 1)
            data = [row for row in data if row.get(column) == wanted]
        elif isinstance(data, list) and data and isinstance(data[0], dict) and step in data[0]:
            data = [_number(row[step]) for row in data]  # a CSV column
        elif isinstance(data, list) and step.lstrip("-").isdigit():
            data = data[int(step)]
        elif isinstance(data, dict) and step in data:
            data = data[step]
        else:
            raise KeyError(f"{source}: no {step!r} in '{key}' (a '<!-- value ... -->' span)")
    if isinstance(data, list) and len(data) == 1:
        data = data[0]
    return format(data, fmt) if fmt else str(data)


def docs() -> list[Path]:
    return [
        ROOT / "README.md",
        *sorted((ROOT / "docs").glob("*.md")),
        ROOT / "benchmarks" / "README.md",
        ROOT / "tests" / "README.md",
    ]


def sync(check: bool) -> list[str]:
    """Rewrite (or, with ``check``, only compare) every quoted table; the blocks that differed."""
    stale = []
    for doc in docs():
        text = doc.read_text()
        new = BLOCK.sub(lambda m: m.group(1) + render(m.group(2), m.group(3)) + m.group(5), text)
        new = VALUE.sub(lambda m: m.group(1) + value(m.group(2), m.group(3)) + m.group(5), new)
        if new != text:
            stale += [
                f"{doc.relative_to(ROOT)}: {m.group(3)}"
                for m in BLOCK.finditer(text)
                if m.group(4) != render(m.group(2), m.group(3))
            ]
            stale += [
                f"{doc.relative_to(ROOT)}: {m.group(2)} {m.group(3)}"
                for m in VALUE.finditer(text)
                if m.group(4) != value(m.group(2), m.group(3))
            ]
            if not check:
                write_text(doc, new)
    return stale


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--check", action="store_true", help="list the tables that differ from their files; change nothing"
    )
    args = parser.parse_args()
    stale = sync(args.check)
    for line in stale:
        print(("differs from its file: " if args.check else "rewritten: ") + line)
    sys.exit(1 if stale and args.check else 0)


if __name__ == "__main__":
    main()
