"""The report: paper-shaped tables, figures and MLflow artifacts from a synthetic finished study.

The study is written file by file as the producers' contract describes (eval/, runs/,
analysis/), with numbers chosen here, so every expected cell is computed from them.
"""

from __future__ import annotations

import copy
import csv
import json
import logging
import re
import shutil
import statistics
import uuid
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as sps

from locvit.config import validate_params
from locvit.config.jobs import report_config
from locvit.io import JobConfig, pack_bits
from locvit.report import stats
from locvit.report.build import build_report

SEEDS = [0, 1]
VIT = {"patch_size": 4, "embed_dim": 48, "depth": 4, "num_heads": 3}
LSA = {"kernel_size": 4, "stride": 4, "padding": 0, "embed_dims": 48, "depths": [2, 1, 1], "num_heads": 3}
VARIANTS = {
    "deit": {"model": "deit_tiny_patch16_224", "kwargs": VIT},
    "deit_d8": {"model": "deit_tiny_patch16_224", "kwargs": {**VIT, "depth": 8}},
    "mait_3x3": {"model": "mait_tiny_patch16_224", "kwargs": {**VIT, "masked_heads": "sch1", "mask_type": "hard"}},
    "mait_5x5": {
        "model": "mait_tiny_patch16_224",
        "kwargs": {**VIT, "masked_heads": "sch1", "mask_type": "hard", "mask_kernel": [5, 5]},
    },
    "mait_soft": {"model": "mait_tiny_patch16_224", "kwargs": {**VIT, "masked_heads": "all", "mask_type": "soft"}},
    "lsa": {"model": "lsa_tiny_cifar", "kwargs": {**LSA, "shifts": "axes9"}},
    "lsa_noshift": {"model": "lsa_tiny_cifar", "kwargs": {**LSA, "shifts": "none"}},
    "ibit": {"model": "ibit_tiny_patch16_224", "kwargs": VIT, "train": {"cutmix": 0.0, "mixup": 0.0}},
    "ibit_cutmix": {"model": "ibit_tiny_patch16_224", "kwargs": VIT, "train": {"cutmix": 1.0, "mixup": 0.8}},
    "convit": {"model": "convit_tiny", "kwargs": {"embed_dim": 16, "depth": 4, "num_heads": 3}},
}
# Test top-1 (0-1) per variant and seed; None = the run's evaluation file is missing.
TOP1 = {
    "deit": [0.70, 0.72],
    "deit_d8": [0.73, 0.75],
    "mait_3x3": [0.74, 0.73],
    "mait_5x5": [0.71, 0.735],
    "mait_soft": [0.78, None],
    "lsa": [0.80, 0.82],
    "lsa_noshift": [0.76, 0.77],
    "ibit": [0.79, 0.81],
    "ibit_cutmix": [0.75, 0.74],
    "convit": [0.72, 0.71],
}
NO_PROFILE = {"convit"}  # its analyse step did not run
ANALYSED = {"deit": SEEDS, "mait_3x3": [0], "mait_soft": SEEDS, "ibit": SEEDS, "lsa": SEEDS}
MASK = {
    "masked_heads": "sch1",
    "heads_per_layer": [1, 1, 1, 1],
    "kernel": [3, 3],
    "mode": "multiply",
    "type": "hard",
    "alpha_init": 0.5,
}
ARCH = {  # variant -> (family, depth, mask, lsa)
    "deit": ("deit", 4, None, None),
    "deit_d8": ("deit", 8, None, None),
    "mait_3x3": ("mait", 4, MASK, None),
    "mait_5x5": ("mait", 4, {**MASK, "kernel": [5, 5]}, None),
    "mait_soft": ("mait", 4, {**MASK, "masked_heads": "all", "heads_per_layer": [3] * 4, "type": "soft"}, None),
    "lsa": ("lsa", 4, None, {"num_shifts": 9, "shifts": "axes9", "shift_mode": "conv", "pos_embed": "per_variant"}),
    "lsa_noshift": (
        "lsa",
        4,
        None,
        {"num_shifts": 1, "shifts": "none", "shift_mode": "conv", "pos_embed": "per_variant"},
    ),
    "ibit": ("ibit", 4, None, None),
    "ibit_cutmix": ("ibit", 4, None, None),
}


def make_params(variants=VARIANTS, study="synth", **data) -> dict:
    raw = {
        "study": study,
        "data": {"source": "digits", "image_size": 32, **data},
        "train": {"epochs": 3, "batch_size": 32},
        "seeds": SEEDS,
        "variants": copy.deepcopy(variants),
    }
    return validate_params(raw, check_models=False)


def config(params: dict) -> JobConfig:
    """The report's job config of a study, as the command line reads it: a key the report reads that the
    config lacks fails the test."""
    return JobConfig(report_config(params), "report config")


def write(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj))


def make_study(
    root: Path,
    params: dict,
    top1=TOP1,
    run_ids: dict | None = None,
    analysed=ANALYSED,
    seeds=SEEDS,
    hits: dict | None = None,
) -> dict:
    """Write the contract's files for every variant and seed; return the MLflow run ids used.

    ``analysed``: variant -> seeds with attention analyses (figures are what takes time here);
    ``hits``: (variant, seed) -> per-image right/wrong of its 360 test images (else none recorded).
    """
    rng = np.random.default_rng(0)
    run_ids = run_ids or {(v, s): uuid.uuid4().hex for v in params["variants"] for s in seeds}
    for v, spec in params["variants"].items():
        n_params = 100_000 + 1_000 * len(v)
        for s in seeds:
            rid = run_ids[(v, s)]
            if top1[v][s] is not None:
                write(
                    root / "eval" / v / f"seed{s}.json",
                    {
                        "study": params["study"],
                        "variant": v,
                        "seed": s,
                        "model": spec["model"],
                        "split": "test",
                        "test_top1": top1[v][s],
                        "test_loss": 1.0,
                        "n": 360,
                        "n_params": n_params,
                        "checkpoint_epoch": 2,
                        "val_top1": top1[v][s] - 0.01,
                        "mlflow_run_id": rid,
                        "data_hash": "0" * 16,
                        "test_hash": "1" * 64,
                        **({"test_hits": pack_bits(hits[(v, s)])} if hits else {}),
                    },
                )
            history = [
                {
                    "epoch": e,
                    "train_loss": 2.0 - 0.4 * e + 0.05 * s,
                    "train_top1": 0.3 + 0.1 * e,
                    "train_images_per_s": 500.0,
                    "val_loss": 1.5 - 0.2 * e,
                    "val_top1": 0.4 + 0.1 * e,
                }
                for e in range(3)
            ]
            write(
                root / "runs" / v / f"seed{s}" / "metrics.json",
                {
                    "study": params["study"],
                    "variant": v,
                    "seed": s,
                    "model": spec["model"],
                    "n_params": n_params,
                    "best_val_top1": 0.6,
                    "best_epoch": 2,
                    "final_val_top1": 0.6,
                    "train_time_s": 10.0,
                    "mlflow_run_id": rid,
                    "history": history,
                },
            )
        if v in NO_PROFILE or v not in ARCH:
            continue
        family, depth, mask, lsa = ARCH[v]
        arch = {
            "family": family,
            "embed_dim": 48,
            "depth": depth,
            "num_heads": 3,
            "img_size": 32,
            "patch_size": None if lsa else 4,
            "layer_scale": False,
            "mask": mask,
            "lsa": lsa,
            "ibit": {"rank": 9, "normalize": "frobenius", "mask_kernel": "radial"} if family == "ibit" else None,
        }
        write(
            root / "analysis" / v / "profile.json",
            {
                "variant": v,
                "model": spec["model"],
                "params": n_params,
                "gmacs": 0.01 * depth,
                "input_size": [3, 32, 32],
                "arch": arch,
            },
        )
        if v != "convit":  # the throughput job's file (convit's row missing)
            _throughput_row(root, v, 1000.0 + len(v))
        for s in analysed.get(v, []):
            layers = [
                {
                    "name": f"blocks.{i}.attn",
                    "layer": i,
                    "kind": "shift" if lsa and i == 0 else "softmax",
                    "heads": 3,
                    "tokens": 65,
                    "grid": None if lsa and i == 0 else [8, 8],
                    "num_prefix": 1,
                }
                for i in range(depth)
            ]
            als = rng.uniform(size=(depth, 3)).tolist()
            if lsa:
                als[0] = None
            write(
                root / "analysis" / v / f"seed{s}.json",
                {
                    "variant": v,
                    "seed": s,
                    "model": spec["model"],
                    "mlflow_run_id": run_ids[(v, s)],
                    "images": 4,
                    "als_kernel": [3, 3],
                    "layers": layers,
                    "als": als,
                    "als_layers": [i for i, a in enumerate(als) if a is not None],
                    "cross_layer_similarity": None if lsa else rng.uniform(size=(3, depth, depth)).tolist(),
                    "alphas": rng.uniform(size=(depth, 3)).tolist() if mask and mask["type"] == "soft" else None,
                },
            )
            arrays = {"images": rng.integers(0, 255, size=(4, 32, 32, 3), dtype=np.uint8)}
            if not lsa:
                arrays["rollout"] = rng.uniform(size=(4, 8, 8)).astype(np.float32)
            if family == "ibit":
                arrays["learned_masks"] = rng.uniform(size=(depth, 3, 8, 8)).astype(np.float32)
            (root / "maps" / v).mkdir(parents=True, exist_ok=True)
            np.savez(root / "maps" / v / f"seed{s}.npz", **arrays)
    return run_ids


def _throughput_row(root: Path, variant: str, img_s: float) -> None:
    path = root / "report" / "throughput.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    head = "variant,img_s_median,img_s_low,img_s_high,ratio_vs_baseline,rounds,device\n"
    lines = [
        x for x in (path.read_text() if path.is_file() else head).splitlines(True) if not x.startswith(f"{variant},")
    ]
    path.write_text("".join(lines) + f"{variant},{img_s},{img_s - 10},{img_s + 10},{img_s / 1004.0},5,cpu (Test CPU)\n")


def expected(variant: str) -> tuple[float, float | None, int]:
    values = [100 * t for t in TOP1[variant] if t is not None]
    return statistics.mean(values), statistics.stdev(values) if len(values) > 1 else None, len(values)


def read_csv(path: Path) -> list[dict]:
    return list(csv.DictReader(path.open()))


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("study")
    params = make_params()
    run_ids = make_study(root, params)
    report = build_report(config(params), root, root / "report", log_to_mlflow=False)
    return root, root / "report", report, run_ids


def test_mait_table2_cells_are_mean_std_and_delta_vs_deit(built):
    root, out, report, run_ids = built
    rows = read_csv(out / "tables" / "mait_table2.csv")
    assert [r["Model size"] for r in rows] == ["48-d, 4 layers, 3 heads"]  # deit_d8 has no MaiT of its size
    row = rows[0]
    base = expected("deit")[0]
    for column, variant in (
        ("DeiT", "deit"),
        ("MaiT(3x3)", "mait_3x3"),
        ("MaiT(5x5)", "mait_5x5"),
        ("MaiT+(3x3)", "mait_soft"),
    ):
        mean, std, n = expected(variant)
        assert float(row[column]) == pytest.approx(mean)
        assert int(row[f"{column} n"]) == n
        assert (float(row[f"{column} std"]) == pytest.approx(std)) if std is not None else row[f"{column} std"] == ""
        if variant != "deit":
            assert float(row[f"{column} delta"]) == pytest.approx(mean - base)
        present = [s for s in SEEDS if TOP1[variant][s] is not None]
        assert row[f"{column} mlflow_run_ids"].split() == [run_ids[(variant, s)] for s in present]
    md = (out / "tables" / "mait_table2.md").read_text()
    mean, std, _ = expected("mait_3x3")
    low, high = float(row["MaiT(3x3) delta_ci95_low"]), float(row["MaiT(3x3) delta_ci95_high"])
    verdict = row["MaiT(3x3) verdict"]
    assert low < mean - base < high and verdict in ("better", "worse", "equivalent", "undecided")
    assert f"{mean:.2f} ± {std:.2f} (n=2) ({mean - base:+.2f} [{low:+.2f}, {high:+.2f}], {verdict})" in md
    assert row["DeiT verdict"] == "baseline"
    # The missing run is named, never filled: mait_soft's cell has one seed and says which is absent.
    assert row["MaiT+(3x3) missing"] == "missing: mait_soft seed 1"
    assert (
        f"{100 * TOP1['mait_soft'][0]:.2f} (n=1) ({100 * TOP1['mait_soft'][0] - base:+.2f}, undecided); "
        "missing: mait_soft seed 1" in md
    )
    assert f"`{run_ids[('mait_3x3', 0)][:8]}`" in md  # no tracking: run ids shown, no links


def test_mait_table3_by_scheme_and_table4_with_missing_profile(built):
    _, out, _, _ = built
    header = next(csv.reader((out / "tables" / "mait_table3.csv").open()))
    cols = [
        h
        for h in header
        if not h.endswith(
            (
                " std",
                " n",
                " ci95_low",
                " ci95_high",
                " reference",
                " delta",
                " p",
                " p_holm",
                " p_equivalence_holm",
                " mde80",
                " verdict",
                " delta_ci95_low",
                " delta_ci95_high",
                " mlflow_run_ids",
                " missing",
                " delta_ci90_low",
                " delta_ci90_high",
                " min_margin",
                " p_improvement",
                " within_margin",
                " holm_family",
            )
        )
    ]
    assert cols == ["Model size", "DeiT", "MaiT(Sch.1)", "MaiT(Sch.1, 5x5)", "MaiT(all heads, soft)"]
    row = read_csv(out / "tables" / "mait_table3.csv")[0]
    assert float(row["MaiT(Sch.1, 5x5) delta"]) == pytest.approx(expected("mait_5x5")[0] - expected("deit")[0])
    rows = {r["Model"]: r for r in read_csv(out / "tables" / "mait_table4.csv")}
    assert set(rows) == set(VARIANTS)
    assert rows["deit_d8"]["Layers"] == "8" and float(rows["deit_d8"]["GMACs"]) == pytest.approx(0.08)
    assert float(rows["lsa"]["Top-1 (%)"]) == pytest.approx(expected("lsa")[0])
    # convit has no profile: the cells that need it say so; its params come from the eval file.
    for cell in ("Layers", "GMACs"):
        assert rows["convit"][cell] == "missing: convit profile"
    assert float(rows["convit"]["Params (M)"]) == pytest.approx((100_000 + 6_000) / 1e6)


def test_lsa_tables(built):
    _, out, _, _ = built
    rows = {r["Method"]: r for r in read_csv(out / "tables" / "lsa_table3.csv")}
    head = "Throughput (img/s, cpu (Test CPU), batch 32)"  # from report/throughput.csv, never from a profile
    assert head in rows["lsa"]
    assert float(rows["lsa"]["Digits (%)"]) == pytest.approx(expected("lsa")[0])
    assert float(rows["lsa"][head]) == pytest.approx(1003.0)
    assert float(rows["lsa"]["× baseline"]) == pytest.approx(1003.0 / 1004.0)
    assert rows["convit"][head] == "missing: convit in report/throughput.csv"
    t5 = read_csv(out / "tables" / "lsa_table5.csv")
    assert [(r["Variant"], r["#Shifting"], r["Shift mode"], r["Local block"]) for r in t5] == [
        ("lsa_noshift", "0", "", "no"),
        ("lsa", "9", "conv", "yes"),
    ]
    assert float(t5[1]["Digits (%)"]) == pytest.approx(expected("lsa")[0])


def test_ibit_tables(built):
    _, out, _, _ = built
    t3 = read_csv(out / "tables" / "ibit_table3.csv")
    assert [(r["Model type"], r["Variant"]) for r in t3] == [
        ("IBiT", "ibit"),
        ("IBiT", "ibit_cutmix"),
        ("DeiT", "deit"),
        ("DeiT", "deit_d8"),
        ("ConViT", "convit"),
    ]
    t4 = read_csv(out / "tables" / "ibit_table4.csv")
    got = [(r["Variant"], r["Learnable masks"], r["CutMix"]) for r in t4]
    assert got[:3] == [("ibit", "yes", "no"), ("ibit_cutmix", "yes", "yes"), ("deit", "no", "no")]
    mean, std, _ = expected("ibit_cutmix")
    assert float(t4[1]["Top-1 (%)"]) == pytest.approx(mean) and float(t4[1]["Top-1 (%) std"]) == pytest.approx(std)
    assert "✓" in (out / "tables" / "ibit_table4.md").read_text()


def test_latex_escapes_underscores(built):
    _, out, report, _ = built
    for name, files in report["tables"].items():
        tex = (out / files["tex"]).read_text()
        assert not re.search(r"(?<!\\)_", tex), name
        assert r"\toprule" in tex
    assert r"mait\_3x3" in (out / "tables" / "mait_table4.tex").read_text()
    assert r"$\pm$" in (out / "tables" / "mait_table2.tex").read_text()


def test_results_table_and_summary_are_kept(built):
    _, out, _, _ = built
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary) == set(VARIANTS)
    assert summary["deit"]["test_top1_mean"] == pytest.approx(expected("deit")[0]) and summary["deit"]["seeds"] == 2
    assert summary["mait_soft"]["seeds"] == 1
    assert "| mait_soft |" in (out / "results.md").read_text()


CONTRACT = ["variant", "n_seeds", "test_top1_mean", "test_top1_std", "test_top1_ci95_low", "test_top1_ci95_high"]


def test_results_csv_contract_with_statistics_against_the_baseline(built):
    _, out, _, _ = built
    header = next(csv.reader((out / "results.csv").open()))
    assert header[:6] == CONTRACT
    assert header[6:16] == [
        "reference",
        "delta_vs_baseline",
        "delta_ci95_low",
        "delta_ci95_high",
        "p_vs_baseline",
        "p_holm",
        "p_equivalence_holm",
        "mde80",
        "verdict",
        "mlflow_run_ids",
    ]
    rows = {r["variant"]: r for r in read_csv(out / "results.csv")}
    assert list(rows) == list(VARIANTS)
    # deit is the default baseline (the first DeiT variant): not compared with itself.
    assert rows["deit"]["delta_vs_baseline"] == rows["deit"]["p_vs_baseline"] == rows["deit"]["p_holm"] == ""
    assert rows["deit"]["verdict"] == "baseline"
    base = [100 * t for t in TOP1["deit"]]
    tested = {}
    for name, row in rows.items():
        values = [100 * t for t in TOP1[name] if t is not None]
        s = stats.describe(values, n_images=360)  # the eval files score 360 images, no per-image results
        assert int(row["n_seeds"]) == len(values) and float(row["test_top1_mean"]) == pytest.approx(s.mean)
        if len(values) > 1:
            assert float(row["test_top1_ci95_low"]) == pytest.approx(s.ci_low)
            assert float(row["test_top1_ci95_high"]) == pytest.approx(s.ci_high)
        else:  # one seed: no spread, no interval, no test
            assert row["test_top1_std"] == row["test_top1_ci95_low"] == row["p_vs_baseline"] == ""
        if name != "deit" and len(values) > 1:
            c = stats.compare(values, base, 1.0, n_images=360)
            assert row["reference"] == "deit"
            assert float(row["delta_vs_baseline"]) == pytest.approx(c.delta)
            assert float(row["delta_ci95_low"]) == pytest.approx(c.ci_low)
            assert float(row["delta_ci95_high"]) == pytest.approx(c.ci_high)
            tested[name] = c
            assert float(row["p_vs_baseline"]) == pytest.approx(c.p)
    # Holm over exactly the variants that could be tested (one family: all against deit); MDE at alpha / m
    m = len(tested)
    assert header[16:23] == [
        "missing_seeds",
        "delta_ci90_low",
        "delta_ci90_high",
        "equivalence_margin_min",
        "p_improvement",
        "within_margin",
        "holm_family",
    ]
    for (name, c), p in zip(tested.items(), stats.holm([c.p for c in tested.values()])):
        row = rows[name]
        assert float(row["p_holm"]) == pytest.approx(p)
        assert float(row["mde80"]) == pytest.approx(stats.mde(c.se, c.df, stats.ALPHA / m))
        assert float(row["equivalence_margin_min"]) == pytest.approx(
            abs(c.delta) + sps.t.ppf(1 - 0.05 / m, c.df) * c.se
        )
        assert (float(row["delta_ci90_low"]), float(row["delta_ci90_high"])) == (
            pytest.approx(c.ci90_low),
            pytest.approx(c.ci90_high),
        )
        assert c.ci_low < c.ci90_low < c.delta < c.ci90_high < c.ci_high
        values = [100 * t for t in TOP1[name] if t is not None]
        wins = sum((x > y) + (x == y) / 2 for x in values for y in base) / (len(values) * len(base))
        assert float(row["p_improvement"]) == pytest.approx(wins)
        assert "p_improvement_ci95_low" not in row  # no interval (stats.probability_of_improvement)
        assert row["holm_family"] == "against deit" and row["within_margin"] in ("yes", "no")
    for row in rows.values():  # no accuracy interval leaves [0, 100]
        if row["test_top1_ci95_low"]:
            assert (
                0
                <= float(row["test_top1_ci95_low"])
                <= float(row["test_top1_mean"])
                <= float(row["test_top1_ci95_high"])
                <= 100
            )
    seeds = read_csv(out / "results_seeds.csv")
    assert [(r["variant"], int(r["seed"])) for r in seeds] == [
        (v, s) for v in VARIANTS for s in SEEDS if TOP1[v][s] is not None
    ]
    assert float(seeds[0]["test_top1"]) == pytest.approx(100 * TOP1["deit"][0])
    md = (out / "results.md").read_text()
    assert (
        "| Variant | n | Test top-1 (%) | 95% CI | Δ vs deit | Δ 95% CI | Δ 90% CI (TOST) | p (Holm) | MDE | "
        "min. margin | P(>ref) | verdict | Holm family |"
    ) in md
    assert "deit is the baseline." in md and "lsa vs deit: +10.00 points [" in md
    assert "mait_soft vs deit:" in md and "not tested (needs at least 2 seeds on both sides)" in md
    assert f"over the whole study): deit ({m} comparisons)." in md
    assert r"$\Delta$ vs deit" in (out / "results.tex").read_text()


COMPARISON_FIELDS = (
    "delta",
    "delta_ci95_low",
    "delta_ci95_high",
    "p_holm",
    "p_equivalence_holm",
    "mde80",
    "verdict",
    "delta_ci90_low",
    "delta_ci90_high",
    "min_margin",
    "p_improvement",
    "holm_family",
)
RESULTS_NAMES = {"delta": "delta_vs_baseline", "min_margin": "equivalence_margin_min"}


def test_one_number_per_comparison_in_every_table(built):
    """A comparison (variant, reference) is computed once per study: every table that shows it repeats the
    results table's numbers and names the same Holm family (lsa vs deit: results, MaiT Table 4, LSA Tables 3 and
    5, locality; mait_3x3 vs deit: results, MaiT Tables 2, 3 and 4)."""
    _, out, _, _ = built
    results = {r["variant"]: r for r in read_csv(out / "results.csv")}
    # table -> (the column naming the variant, or the variant itself; the accuracy column)
    cells = [
        ("mait_table2", "mait_3x3", "MaiT(3x3)"),
        ("mait_table3", "mait_3x3", "MaiT(Sch.1)"),
        ("mait_table4", "Model", "Top-1 (%)"),
        ("lsa_table3", "Method", "Digits (%)"),
        ("lsa_table5", "Variant", "Digits (%)"),
        ("locality", "Variant", "Top-1 (%)"),
    ]
    seen = {"lsa": [], "mait_3x3": []}
    for table, key, column in cells:
        for row in read_csv(out / "tables" / f"{table}.csv"):
            name = row.get(key, key)
            if name not in seen:
                continue
            want = results[name]
            assert row[f"{column} reference"] == want["reference"] == "deit"
            for f in COMPARISON_FIELDS:
                assert row[f"{column} {f}"] == want[RESULTS_NAMES.get(f, f)], (table, name, f)
            seen[name].append(table)
    assert seen == {
        "lsa": ["mait_table4", "lsa_table3", "lsa_table5", "locality"],
        "mait_3x3": ["mait_table2", "mait_table3", "mait_table4", "lsa_table3", "locality"],
    }
    for table in ("mait_table2", "lsa_table5", "results"):  # each table names the family
        path = out / ("results.md" if table == "results" else f"tables/{table}.md")
        assert (
            "Holm families (the comparisons against one reference, over the whole study): deit (8 comparisons)"
            in path.read_text()
        )


def test_a_difference_shown_inside_the_margin_says_so(tmp_path):
    """6 images more right on every seed, seeds identical: +1.67 points, shown (p 0.01) and, with a margin of 3
    points, also shown inside it by two one-sided tests: ``better (within ±3)``, its 90 % interval beside."""
    ks = {"ref": [300] * 3, "gain": [306] * 3}
    top1 = {v: [k / 360 for k in ks[v]] for v in ks}
    hits = {(v, s): prefix_hits(ks[v][s]) for v in ks for s in range(3)}
    params = {**make_params({v: VARIANTS["deit"] for v in ks}), "seeds": [0, 1, 2], "equivalence_margin": 3.0}
    make_study(tmp_path, params, top1=top1, analysed={}, seeds=[0, 1, 2], hits=hits)
    build_report(config(params), tmp_path, tmp_path / "report", log_to_mlflow=False)
    row = {r["variant"]: r for r in read_csv(tmp_path / "report" / "results.csv")}["gain"]
    assert row["verdict"] == "better" and row["within_margin"] == "yes"
    low, high = float(row["delta_ci90_low"]), float(row["delta_ci90_high"])
    assert 0 < low and high < 3 and float(row["equivalence_margin_min"]) == pytest.approx(high, rel=0.05)
    md = (tmp_path / "report" / "results.md").read_text()
    assert "| better (within ±3) |" in md and f"[{low:+.2f}, {high:+.2f}]" in md
    assert "better (Holm-adjusted p = " in md and ") and within ± 3 points (two one-sided tests, 90 % interval" in md


def prefix_hits(k: int, n: int = 360) -> np.ndarray:
    """The first k of n test images right."""
    return np.arange(n) < k


def test_every_verdict_with_its_interval(tmp_path):
    """better, worse, equivalent and undecided, each agreeing with its interval; pairing over the same
    360 images makes a tie provable that the unpaired test set could not show."""
    ks = {
        "deit": [253, 254, 255],
        "far": [353, 354, 355],
        "low": [200, 201, 202],
        "same": [253, 254, 255],
        "noisy": [230, 250, 270],
    }
    top1 = {v: [k / 360 for k in ks[v]] for v in ks}
    hits = {(v, s): prefix_hits(ks[v][s]) for v in ks for s in range(3)}
    variants = {v: VARIANTS["deit"] for v in ks}
    params = {**make_params(variants), "seeds": [0, 1, 2]}
    make_study(tmp_path, params, top1=top1, analysed={}, seeds=[0, 1, 2], hits=hits)
    build_report(config(params), tmp_path, tmp_path / "report", log_to_mlflow=False)
    rows = {r["variant"]: r for r in read_csv(tmp_path / "report" / "results.csv")}
    assert {v: rows[v]["verdict"] for v in ks} == {
        "deit": "baseline",
        "far": "better",
        "low": "worse",
        "same": "equivalent",
        "noisy": "undecided",
    }
    for v in ("far", "low", "same", "noisy"):
        low, high, delta = (float(rows[v][k]) for k in ("delta_ci95_low", "delta_ci95_high", "delta_vs_baseline"))
        assert low < delta < high
        verdict = rows[v]["verdict"]
        assert (verdict != "better" or low > 0) and (verdict != "worse" or high < 0)
        assert verdict != "equivalent" or (abs(delta) < 1.0 and float(rows[v]["p_equivalence_holm"]) < 0.05)
        low90, high90 = float(rows[v]["delta_ci90_low"]), float(rows[v]["delta_ci90_high"])
        assert low < low90 < delta < high90 < high
        assert verdict != "equivalent" or -1.0 < low90 < high90 < 1.0  # TOST reads the 90 % interval
    # the undecided row says what the study could have seen
    mde = float(rows["noisy"]["mde80"])
    assert mde > abs(float(rows["noisy"]["delta_vs_baseline"]))
    md = (tmp_path / "report" / "results.md").read_text()
    assert f"could detect a difference of {mde:.2f} points or more (80 % power)" in md
    assert "far vs deit: +27.78 points [" in md and "], better (Holm-adjusted p = " in md
    assert (
        "same vs deit: +0.00 points [" in md
        and "equivalent: within ± 1 point (two one-sided tests, 90 % interval [" in md
    )
    # without the per-image results (older evaluation files) the same tie cannot be shown
    for v in ks:
        for s in range(3):
            path = tmp_path / "eval" / v / f"seed{s}.json"
            path.write_text(json.dumps({k: x for k, x in json.loads(path.read_text()).items() if k != "test_hits"}))
    build_report(config(params), tmp_path, tmp_path / "report2", log_to_mlflow=False)
    rows = {r["variant"]: r for r in read_csv(tmp_path / "report2" / "results.csv")}
    assert rows["same"]["verdict"] == "undecided" and rows["far"]["verdict"] == "better"


def test_figures_are_valid_files_with_captions(built):
    _, out, report, _ = built
    figs = report["figures"]
    want = {
        "curves",
        "accuracy_vs_depth",
        "als_deit",
        "als_mait_3x3",
        "als_mait_soft",
        "als_ibit",
        "als_lsa",
        "similarity_deit",
        "rollout_deit",
        "rollout_ibit",
        "learned_masks_ibit",
        "alphas_mait_soft",
    }
    assert want <= set(figs)
    # No figure where the study has nothing to draw: no rollout without a class token, no masks outside IBiT.
    assert not {"rollout_lsa", "similarity_lsa", "learned_masks_deit", "alphas_deit", "als_convit"} & set(figs)
    for name, fig in figs.items():
        assert (out / fig["png"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
        if fig["pdf"]:
            assert (out / fig["pdf"]).read_bytes()[:4] == b"%PDF", name
        assert fig["caption"] and fig["caption"] in (out / "index.md").read_text()
    assert figs["als_deit"]["pdf"] and figs["als_deit"]["variant"] == "deit"
    assert "missing: mait_3x3 seed 1" in figs["als_mait_3x3"]["caption"]
    assert "accuracy_vs_fraction" in report["skipped"]  # one study has one train_fraction
    assert json.loads((out / "report.json").read_text()) == report
    assert "![als_deit](figures/als_deit.png)" in (out / "index.md").read_text()


def test_a_profile_that_lists_its_familys_extras_needs_no_model_to_draw_them():
    """The analysis writes the family's extras into the profile's arch (``Extra.figure``): the report draws
    from that record; a profile without it (an older analysis) falls back to the family's declaration."""
    from locvit.models.family import family_named
    from locvit.report.study import ExtraFigure, Variant

    declared = family_named("ibit").extras
    record = json.loads(json.dumps([extra.figure() for extra in declared]))  # as profile.json holds it
    arch = {"family": "ibit", "extras": record}
    recorded = Variant("v", "unbuildable", "", {}, [0], profile={"arch": arch}).extras
    assert recorded == tuple(ExtraFigure(**extra.figure()) for extra in declared) and recorded
    older = Variant("v", "unbuildable", "", {}, [0], profile={"arch": {"family": "ibit"}}).extras
    assert older == declared


def test_absent_families_are_not_written_and_stale_tables_go(built, tmp_path):
    _, full_report, _, _ = built
    out = tmp_path / "report"
    shutil.copytree(full_report, out)  # the report of the whole study, then the study loses variants
    assert (out / "tables" / "lsa_table3.md").is_file() and (out / "figures" / "als_lsa.png").is_file()
    only_mait = make_params({v: VARIANTS[v] for v in ("deit", "mait_3x3", "mait_soft")})
    make_study(tmp_path, only_mait, analysed={})
    report = build_report(config(only_mait), tmp_path, out, log_to_mlflow=False)
    assert set(report["tables"]) == {"results", "mait_table2", "mait_table3", "mait_table4"}
    assert {"lsa_table3", "lsa_table5", "ibit_table3", "ibit_table4", "accuracy_vs_depth"} <= set(report["skipped"])
    assert not (out / "tables" / "lsa_table3.md").exists() and not (out / "figures" / "als_lsa.png").exists()
    assert sorted(p.name for p in (out / "tables").iterdir()) == sorted(
        f"{t}.{e}" for t in ("mait_table2", "mait_table3", "mait_table4") for e in ("md", "csv", "tex")
    )


def test_fraction_figure_from_several_studies(built, tmp_path):
    root, _, _, _ = built
    variants = {v: VARIANTS[v] for v in ("deit", "ibit")}
    studies = []
    for frac in (0.25, 0.5):
        params = make_params(variants, study=f"frac{int(100 * frac)}", train_fraction=frac)
        make_study(tmp_path / params["study"], params, analysed={})
        studies.append((config(params), tmp_path / params["study"]))
    report = build_report(*studies[0], tmp_path / "report", log_to_mlflow=False, extra_studies=studies[1:])
    fig = report["figures"]["accuracy_vs_fraction"]
    assert (tmp_path / "report" / fig["pdf"]).read_bytes()[:4] == b"%PDF" and "frac25, frac50" in fig["caption"]


def test_data_efficiency_table_and_figure_from_one_study(tmp_path):
    """train_fractions: each variant at each fraction in one study; cells are tested against the baseline
    at the same fraction, and the figure draws one line per base variant."""
    raw = {
        "study": "eff",
        "data": {"source": "digits", "image_size": 32},
        "train": {"epochs": 3, "batch_size": 32},
        "seeds": SEEDS,
        "train_fractions": [0.25, 1.0],
        "variants": {v: copy.deepcopy(VARIANTS[v]) for v in ("deit", "lsa")},
    }
    params = validate_params(raw, check_models=False)
    assert list(params["variants"]) == ["deit", "deit_25pct", "lsa", "lsa_25pct"]
    top1 = {"deit": [0.90, 0.92], "deit_25pct": [0.50, 0.54], "lsa": [0.99, 0.98], "lsa_25pct": [0.90, 0.91]}
    make_study(tmp_path, params, top1=top1, analysed={})
    report = build_report(config(params), tmp_path, tmp_path / "report", log_to_mlflow=False)
    rows = {r["Variant"]: r for r in read_csv(tmp_path / "report" / "tables" / "data_efficiency.csv")}
    assert list(rows) == ["deit", "lsa"]
    assert float(rows["lsa"]["25% of train"]) == pytest.approx(90.5)
    assert rows["lsa"]["25% of train reference"] == "deit_25pct"  # the baseline at the same fraction
    assert float(rows["lsa"]["25% of train delta"]) == pytest.approx(90.5 - 52.0)
    assert rows["lsa"]["100% of train reference"] == "deit"
    results = {r["variant"]: r for r in read_csv(tmp_path / "report" / "results.csv")}
    assert results["lsa_25pct"]["reference"] == "deit_25pct" and results["deit_25pct"]["p_vs_baseline"] == ""
    assert results["deit_25pct"]["verdict"] == "baseline"
    # one Holm family per fraction: each holds one comparison here, so Holm leaves its p as it is
    for name, table in (("lsa_25pct", results), ("lsa", results)):
        assert float(table[name]["p_holm"]) == pytest.approx(float(table[name]["p_vs_baseline"]))
    assert float(rows["lsa"]["25% of train p_holm"]) == pytest.approx(float(rows["lsa"]["25% of train p"]))
    assert (
        "over the whole study): deit_25pct (1 comparison); deit (1 comparison)."
        in (tmp_path / "report" / "tables" / "data_efficiency.md").read_text()
    )
    fig = report["figures"]["accuracy_vs_fraction"]
    assert (tmp_path / "report" / fig["png"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "95 % interval as error bars" in fig["caption"]


def _tracked_deit_and_mait(tmp_path, monkeypatch):
    """A DeiT and a MaiT study with a real SQLite MLflow backend and a run per variant and seed:
    (params, client, experiment id, run ids by (variant, seed))."""
    import mlflow

    from locvit import tracking

    # setup() sets MLFLOW_TRACKING_URI; recording a value first makes monkeypatch remove it afterwards.
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "unset")
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    variants = {v: VARIANTS[v] for v in ("deit", "mait_3x3")}
    params = make_params(variants)
    exp = tracking.setup(params["study"], tmp_path / "mlflow.db")
    client = mlflow.MlflowClient()
    return params, client, exp, {(v, s): client.create_run(exp).info.run_id for v in variants for s in SEEDS}


def test_mlflow_links_and_artifacts(tmp_path, monkeypatch, caplog):
    params, client, exp, run_ids = _tracked_deit_and_mait(tmp_path, monkeypatch)
    run_ids[("mait_3x3", 1)] = uuid.uuid4().hex  # a run the backend does not know (e.g. after dvc pull)
    make_study(tmp_path, params, run_ids=run_ids, analysed={"deit": [0], "mait_3x3": [0]})
    with caplog.at_level(logging.WARNING, logger="locvit"):
        report = build_report(
            config(params), tmp_path, tmp_path / "report", log_to_mlflow=True, ui_base="http://ui:5000"
        )
    assert "1 MLflow run(s) not in the tracking backend" in caplog.text
    md = (tmp_path / "report" / "tables" / "mait_table2.md").read_text()
    link = f"http://ui:5000/#/experiments/{exp}/runs/{run_ids[('deit', 0)]}?workflowType=machine_learning"
    assert f"[s0]({link})" in md  # the UI's model-training view
    assert client.get_experiment(exp).tags["mlflow.experimentKind"] == "custom_model_development"
    assert f"`{run_ids[('mait_3x3', 1)][:8]}`" in md  # unknown run: id without a link
    logged = {a.path for a in client.list_artifacts(run_ids[("deit", 1)], "report")}
    assert {"report/als_deit.png", "report/als_deit.pdf", "report/rollout_deit.png"} <= logged
    assert report["mlflow"]["failed"] and all("mait_3x3 seed 1" in f for f in report["mlflow"]["failed"])
    assert (tmp_path / "report" / "figures" / "als_mait_3x3.png").is_file()  # kept on disk regardless


def test_variant_runs_carry_the_comparison(tmp_path, monkeypatch):
    """publish_tree logs a variant's results.csv row to its MLflow run: every numeric column arrives as a
    metric (the probability of improvement, the 90 % interval, the smallest margin; P(improvement) has no
    interval, so none is logged), the Holm family and within-margin flag as tags."""
    params, client, exp, run_ids = _tracked_deit_and_mait(tmp_path, monkeypatch)
    make_study(tmp_path, params, run_ids=run_ids, analysed={})
    report = build_report(config(params), tmp_path, tmp_path / "report", log_to_mlflow=True, ui_base="http://ui:5000")
    row = {r["variant"]: r for r in read_csv(tmp_path / "report" / "results.csv")}["mait_3x3"]
    assert "variant_runs" in report["mlflow"]["tree"], report["mlflow"]["tree"]
    run = client.get_run(report["mlflow"]["tree"]["variant_runs"]["mait_3x3"])
    assert "p_improvement_ci95_low" not in run.data.metrics and "p_improvement_ci95_low" not in row
    for key in (
        "p_improvement",
        "delta_ci90_low",
        "delta_ci90_high",
        "equivalence_margin_min",
        "mde80",
        "p_holm",
    ):
        assert run.data.metrics[key] == pytest.approx(float(row[key])), key
    assert run.data.tags["holm_family"] == "against deit" and run.data.tags["within_margin"] == row["within_margin"]


def test_no_mlflow_needed_without_logging(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:9")  # nothing listens there
    params = make_params({v: VARIANTS[v] for v in ("deit", "mait_3x3")})
    make_study(tmp_path, params, analysed={})
    report = build_report(config(params), tmp_path, tmp_path / "report", log_to_mlflow=False)
    assert report["mlflow"] == {} and not (tmp_path / "mlflow.db").exists()
    assert "mait_table2" in report["tables"]


def test_every_locality_cell_names_the_layers_it_measured(tmp_path):
    """A ViT, a PVT and a Swin with window 2, analysed from real forwards. PVT's ALS and distance are both its
    last stage's (the only one with an ALS), named, and its ALS is by construction (a 2x2 grid inside the 3x3
    kernel); Swin's every window lies inside the kernel; the per-stage table has each pyramid's stages; the
    analyses that could not run (similarity over layers of mixed shapes, rollout) are named below the table."""
    import timm
    import torch

    import locvit.models  # noqa: F401
    from locvit.analysis.analyse import measures
    from locvit.analysis.attention import collect_attention

    swin = {"embed_dim": 16, "depths": [2, 2], "num_heads": [1, 2], "window_size": 2}
    variants = {
        "deit": VARIANTS["deit"],
        "pvt": {"model": "pvt_v1_tiny", "kwargs": {"depths": [1, 1, 1, 1]}},
        "swin2": {"model": "swin_tiny_patch4_window7_224", "kwargs": swin},
    }
    params = make_params(variants)
    make_study(tmp_path, params, top1={v: [0.7, 0.71] for v in variants}, analysed={})
    for v, spec in params["variants"].items():
        torch.manual_seed(0)
        size = 64 if v == "pvt" else 32  # PVT's last stage a 2x2 grid
        model = timm.create_model(spec["model"], img_size=size, num_classes=10, **spec["kwargs"]).eval()
        _, maps = collect_attention(model, torch.randn(2, 3, size, size))
        record = {
            "als_kernel": [3, 3],
            "layers": [{"name": m.name, "layer": m.layer, "kind": m.kind, "grid": list(m.grid)} for m in maps],
            **measures(maps, (3, 3), size, 2),
        }
        for s in SEEDS:
            write(tmp_path / "analysis" / v / f"seed{s}.json", {"variant": v, "seed": s, **record})
    build_report(config(params), tmp_path, tmp_path / "report", log_to_mlflow=False)
    tables = tmp_path / "report" / "tables"
    rows = {r["Variant"]: r for r in read_csv(tables / "locality.csv")}
    assert rows["deit"]["Measured on"] == "all 4 layers" and "by construction" not in rows["deit"]["ALS (3x3)"]
    assert rows["pvt"]["Measured on"] == "stage 4 of 4 (2x2 tokens)"
    assert rows["pvt"]["ALS (3x3)"].endswith("(by construction)")
    stages = {(r["Variant"], r["Stage"]): r for r in read_csv(tables / "locality_stages.csv")}
    assert rows["pvt"]["Mean attention distance (px)"] == stages[("pvt", "4 of 4")]["Mean attention distance (px)"]
    assert [r["ALS"] for k, r in stages.items() if k[0] == "pvt"][:3] == ["—"] * 3
    assert rows["swin2"]["Measured on"] == "stages 1, 2 of 2, mean over their layers"
    assert rows["swin2"]["ALS (3x3)"] == "1.000 ± 0.000 (by construction)"
    assert ("deit", "1 of 1") not in stages
    md = (tables / "locality.md").read_text()
    assert "'By construction': the kernel covers every key of those layers' attention" in md
    assert "swin2: no cross-layer similarity: its layers' maps differ in shape" in md
    assert "pvt: no cross-layer similarity: 1 layer(s) with maps over the patch grid; no attention rollout: its " in md


def test_a_backend_that_did_not_answer_is_said_below_the_results(tmp_path, monkeypatch):
    """A run trained while the tracking backend did not answer has no MLflow run (its metrics.json says why), and
    a report built while it still does not answer links none: the results table says both below it, with the
    command that uploads the runs; the same sentence is what Snakemake prints when the workflow ends."""
    from locvit.tracking.run import untracked

    dead = "http://127.0.0.1:9"  # the discard port: nothing listens
    params = make_params({"deit": VARIANTS["deit"], "lsa": VARIANTS["lsa"]})
    make_study(tmp_path, params, analysed={})
    assert untracked(tmp_path, tmp_path / "mlflow.db") is None
    metrics = tmp_path / "runs" / "lsa" / "seed1" / "metrics.json"
    record = json.loads(metrics.read_text())
    error = "ConnectionError: connection refused"
    write(metrics, {**record, "mlflow_run_id": None, "tracking": {"status": "failed", "uri": dead, "error": error}})
    monkeypatch.setenv("MLFLOW_TRACKING_URI", dead)
    build_report(config(params), tmp_path, tmp_path / "report", log_to_mlflow=True)
    md = (tmp_path / "report" / "results.md").read_text()
    assert f"MLflow links: none; the tracking backend {dead} did not answer (" in md
    notice = untracked(tmp_path, tmp_path / "mlflow.db")
    assert notice.startswith(f"MLflow: 1 training run(s) are not in MLflow (lsa seed1): the tracking backend {dead} ")
    assert f"did not answer ({error}); their records are kept in their metrics.json" in notice
    assert f"locvit sync-tracking --runs-dir {tmp_path / 'runs'} --tracking-db {tmp_path / 'mlflow.db'}" in notice
    assert notice in md
