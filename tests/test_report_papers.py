"""The papers' reported numbers beside ours: a fabricated CIFAR-10 study (eval, run, analysis and profile
files written here, as the producers write them) whose LSA Table 3 holds LSA's reported top-1, params
and throughput beside DeiT-T's and WRN-28-10's rows, with the difference to ours; a fabricated ImageNet study
whose IBiT Tables 3 and 4 hold the row of each variant's model and CutMix."""

from __future__ import annotations

import csv
import json
import uuid
from pathlib import Path

import pytest

from locvit.config import validate_params
from locvit.config.jobs import report_config
from locvit.io import JobConfig
from locvit.report.build import build_report
from locvit.report.reported import reported

SEEDS = [0, 1]
VARIANTS = {  # the paper's DeiT-T at 32 px (a setting: patch 4), WRN-28-10, LSA's Our-T, and a DeiT of no paper size
    "deit_t": {"model": "deit_tiny_patch16_224", "kwargs": {"patch_size": 4}},
    "wrn": {"model": "wrn_28_10", "kwargs": {}},
    "lsa_t": {"model": "lsa_tiny_cifar", "kwargs": {}},
    "deit_d6": {"model": "deit_tiny_patch16_224", "kwargs": {"patch_size": 4, "depth": 6}},
}
TOP1 = {"deit_t": [0.801, 0.815], "wrn": [0.953, 0.949], "lsa_t": [0.962, 0.958], "deit_d6": [0.78, 0.79]}
PARAMS = {"deit_t": 5_364_874, "wrn": 36_479_194, "lsa_t": 10_240_000, "deit_d6": 2_700_000}
ARCH = {"deit_t": ("deit", "DeiT"), "wrn": ("wrn", "WRN"), "lsa_t": ("lsa", "LSA"), "deit_d6": ("deit", "DeiT")}
THROUGHPUT = {"deit_t": 2000.0, "wrn": 1000.0, "lsa_t": 900.0, "deit_d6": 3000.0}


def _write(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj))


def _fabricate(root: Path, params: dict, top1=TOP1, n_params=PARAMS, arch=ARCH, throughput=THROUGHPUT) -> None:
    for v, spec in params["variants"].items():
        for s in SEEDS:
            rid = uuid.uuid4().hex
            _write(
                root / "eval" / v / f"seed{s}.json",
                {
                    "study": params["study"],
                    "variant": v,
                    "seed": s,
                    "model": spec["model"],
                    "split": "test",
                    "test_top1": top1[v][s],
                    "test_loss": 0.5,
                    "n": 10000,
                    "n_params": n_params[v],
                    "checkpoint_epoch": 2,
                    "val_top1": top1[v][s] - 0.01,
                    "mlflow_run_id": rid,
                    "data_hash": "0" * 16,
                },
            )
            _write(
                root / "runs" / v / f"seed{s}" / "metrics.json",
                {
                    "study": params["study"],
                    "variant": v,
                    "seed": s,
                    "model": spec["model"],
                    "n_params": n_params[v],
                    "best_val_top1": 0.6,
                    "best_epoch": 2,
                    "final_val_top1": 0.6,
                    "train_time_s": 10.0,
                    "mlflow_run_id": rid,
                    "history": [
                        {
                            "epoch": e,
                            "train_loss": 1.0,
                            "train_top1": 0.5,
                            "train_images_per_s": 500.0,
                            "val_loss": 1.0,
                            "val_top1": 0.5,
                        }
                        for e in range(3)
                    ],
                },
            )
            if v != "wrn":  # a CNN has no attention layers: its analysis holds none
                _write(
                    root / "analysis" / v / f"seed{s}.json",
                    {
                        "variant": v,
                        "seed": s,
                        "model": spec["model"],
                        "mlflow_run_id": rid,
                        "images": 4,
                        "als_kernel": [3, 3],
                        "layers": [],
                        "als": [],
                        "als_layers": [],
                        "als_mean": 0.5 + 0.01 * s,
                        "mad": [],
                        "mad_mean": 4.0,
                        "cross_layer_similarity": None,
                    },
                )
        family, display = arch[v]
        _write(
            root / "analysis" / v / "profile.json",
            {
                "variant": v,
                "model": spec["model"],
                "params": n_params[v],
                "gmacs": 1.0,
                "input_size": [3, 32, 32],
                "arch": {
                    "family": family,
                    "display": display,
                    "prior": "-",
                    "embed_dim": 192,
                    "depth": 12,
                    "num_heads": 3,
                    "patch_size": 4,
                    "layer_scale": False,
                    "mask": None,
                    "lsa": None,
                },
            },
        )
    if throughput is None:
        return
    lines = ["variant,img_s_median,img_s_low,img_s_high,ratio_vs_baseline,rounds,device"]
    lines += [f"{v},{t},{t - 10},{t + 10},{t / throughput['deit_t']},5,cpu (Test CPU)" for v, t in throughput.items()]
    (root / "report").mkdir(parents=True, exist_ok=True)
    (root / "report" / "throughput.csv").write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    root = tmp_path_factory.mktemp("cifar10")
    params = validate_params(
        {
            "study": "papers",
            "data": {"source": "cifar10", "image_size": 32},
            "train": {"epochs": 3, "batch_size": 32},
            "seeds": SEEDS,
            "baseline": "deit_t",
            "variants": VARIANTS,
        },
        check_models=False,
    )
    _fabricate(root, params)
    build_report(JobConfig(report_config(params), "report config"), root, root / "report", log_to_mlflow=False)
    rows = {r["Method"]: r for r in csv.DictReader((root / "report" / "tables" / "lsa_table3.csv").open())}
    return rows, (root / "report" / "tables" / "lsa_table3.md").read_text()


@pytest.mark.parametrize(
    "variant, paper_row, paper_top1, paper_params, paper_throughput",
    [("deit_t", "Deit-T", 88.39, 5.3, 1905.3), ("wrn", "WRN28-10", 95.83, 36.5, 1510.8)],
)
def test_lsa_table3_shows_the_papers_numbers_and_the_difference(
    table, variant, paper_row, paper_top1, paper_params, paper_throughput
):
    rows, md = table
    row = rows[variant]
    ours = 100 * sum(TOP1[variant]) / len(TOP1[variant])
    assert row["Paper row"] == f"LSA Table 3: {paper_row}"
    assert float(row["Paper top-1 (%)"]) == pytest.approx(paper_top1)
    assert float(row["Δ top-1 (%) vs paper"]) == pytest.approx(ours - paper_top1)
    assert float(row["Paper params (M)"]) == pytest.approx(paper_params)
    assert float(row["Δ params (M) vs paper"]) == pytest.approx(PARAMS[variant] / 1e6 - paper_params)
    assert float(row["Paper throughput (img/s)"]) == pytest.approx(paper_throughput)
    assert float(row["Δ throughput (img/s) vs paper"]) == pytest.approx(THROUGHPUT[variant] - paper_throughput)
    assert f"LSA Table 3: {paper_row}" in md and f"{paper_top1:.2f}" in md and f"{ours - paper_top1:+.2f}" in md


def test_the_paper_columns_come_after_ours_and_only_matching_rows_fill_them(table):
    rows, md = table
    header = list(next(iter(rows.values())))
    assert header.index("Paper row") > max(i for i, h in enumerate(header) if h.startswith("CIFAR10 (%)"))
    assert rows["deit_d6"]["Paper row"] == "" and rows["deit_d6"]["Paper top-1 (%)"] == ""  # 6 layers: no paper row
    assert rows["lsa_t"]["Paper row"] == "LSA Table 3: Our-T" and float(rows["lsa_t"]["Paper top-1 (%)"]) == 97.0
    assert "Paper GFLOPs" not in header  # LSA's Table 3 gives none
    assert "Paper columns: what the LSA paper reports" in md


IBIT_VARIANTS = {  # IBiT without and with CutMix (Table 4 A, B), DeiT-Ti with DeiT's recipe (Table 3, Table 4 C),
    # DeiT-Ti without CutMix (no row of either table), ConViT-Ti (Table 3, any recipe)
    "ibit": {"model": "ibit_tiny_patch16_224", "train": {"cutmix": 0.0, "mixup": 0.0}},
    "ibit_cutmix": {"model": "ibit_tiny_patch16_224", "train": {"cutmix": 1.0, "mixup": 0.8}},
    "deit": {"model": "deit_tiny_patch16_224", "train": {"cutmix": 1.0, "mixup": 0.8}},
    "deit_plain": {"model": "deit_tiny_patch16_224", "train": {"cutmix": 0.0, "mixup": 0.0}},
    "convit": {"model": "convit_tiny", "train": {"cutmix": 0.0, "mixup": 0.0}},
}
IBIT_TOP1 = {
    "ibit": [0.751, 0.745],
    "ibit_cutmix": [0.73, 0.72],
    "deit": [0.70, 0.71],
    "deit_plain": [0.69, 0.68],
    "convit": [0.74, 0.73],
}
IBIT_PARAMS = {
    "ibit": 5_760_000,
    "ibit_cutmix": 5_760_000,
    "deit": 5_717_416,
    "deit_plain": 5_717_416,
    "convit": 5_524_312,
}
IBIT_ARCH = {
    "ibit": ("ibit", "IBiT"),
    "ibit_cutmix": ("ibit", "IBiT"),
    "deit": ("deit", "DeiT"),
    "deit_plain": ("deit", "DeiT"),
    "convit": ("convit", "ConViT"),
}


def _ibit_tables(root: Path, source: str, size: int) -> dict:
    params = validate_params(
        {
            "study": "ibit",
            "data": {"source": source, "image_size": size},
            "train": {"epochs": 3, "batch_size": 32},
            "seeds": SEEDS,
            "baseline": "deit",
            "variants": IBIT_VARIANTS,
        },
        check_models=False,
    )
    _fabricate(root, params, IBIT_TOP1, IBIT_PARAMS, IBIT_ARCH, throughput=None)
    build_report(JobConfig(report_config(params), "report config"), root, root / "report", log_to_mlflow=False)
    tables = root / "report" / "tables"
    return {
        name: (
            {r["Variant"]: r for r in csv.DictReader((tables / f"{name}.csv").open())},
            (tables / f"{name}.md").read_text(),
        )
        for name in ("ibit_table3", "ibit_table4")
    }


@pytest.fixture(scope="module")
def ibit_tables(tmp_path_factory):
    return _ibit_tables(tmp_path_factory.mktemp("imagenet"), "imagenet", 224)


def _ours(variant: str) -> float:
    return 100 * sum(IBIT_TOP1[variant]) / len(IBIT_TOP1[variant])


@pytest.mark.parametrize(
    "variant, paper_row, paper_top1",
    [("ibit", "IBiT (Ours)", 74.2), ("deit", "DeiT", 72.2), ("convit", "ConViT", 73.1)],
)
def test_ibit_table3_shows_the_papers_top1_and_params(ibit_tables, variant, paper_row, paper_top1):
    rows, md = ibit_tables["ibit_table3"]
    row = rows[variant]
    assert row["Paper row"] == f"IBiT Table 3: {paper_row}"
    assert float(row["Paper top-1 (%)"]) == pytest.approx(paper_top1)
    assert float(row["Δ top-1 (%) vs paper"]) == pytest.approx(_ours(variant) - paper_top1)
    assert float(row["Paper params (M)"]) == pytest.approx(6)
    assert float(row["Δ params (M) vs paper"]) == pytest.approx(IBIT_PARAMS[variant] / 1e6 - 6)
    assert f"IBiT Table 3: {paper_row}" in md and f"{_ours(variant) - paper_top1:+.2f}" in md


def test_ibit_table3_leaves_a_variant_of_another_recipe_without_a_paper_row(ibit_tables):
    rows, md = ibit_tables["ibit_table3"]
    header = list(next(iter(rows.values())))
    assert header.index("Paper row") > header.index("#Params (M)")
    for variant in ("ibit_cutmix", "deit_plain"):  # the paper's IBiT trained without CutMix, its DeiT with it
        assert rows[variant]["Paper row"] == "" and rows[variant]["Paper top-1 (%)"] == ""
    assert "Paper GFLOPs" not in header and "Paper throughput (img/s)" not in header
    assert "Paper columns: what the IBiT paper reports" in md and "trains IBiT without CutMix" in md


@pytest.mark.parametrize(
    "variant, paper_row, paper_top1",
    [("ibit", "A (IBiT)", 74.2), ("ibit_cutmix", "B", 72.2), ("deit", "C (DeiT)", 71.5), ("deit_plain", None, None)],
)
def test_ibit_table4_finds_the_row_of_the_variants_masks_and_cutmix(ibit_tables, variant, paper_row, paper_top1):
    rows, md = ibit_tables["ibit_table4"]
    row = rows[variant]
    if paper_row is None:  # DeiT without CutMix is no configuration of the paper's
        assert row["Paper row"] == "" and row["Paper top-1 (%)"] == "" and row["Δ top-1 (%) vs paper"] == ""
        return
    assert row["Paper row"] == f"IBiT Table 4: {paper_row}"
    assert float(row["Paper top-1 (%)"]) == pytest.approx(paper_top1)
    assert float(row["Δ top-1 (%) vs paper"]) == pytest.approx(_ours(variant) - paper_top1)
    assert "Paper params (M)" not in row  # Table 4 gives top-1 only
    assert "says nothing of MixUp" in md


def test_the_ibit_tables_have_no_paper_columns_off_the_papers_dataset(tmp_path):
    tables = _ibit_tables(tmp_path, "cifar10", 32)
    for name, (rows, md) in tables.items():
        assert set(rows) == set(IBIT_VARIANTS) - ({"convit"} if name == "ibit_table4" else set()), name
        assert "Paper row" not in next(iter(rows.values())) and "Paper columns" not in md, name


def test_a_row_with_a_recipe_condition_needs_the_variants_recipe():
    from locvit.report.reported import paper_row

    kwargs = {"img_size": 224, "num_classes": 1000}
    assert (
        paper_row("IBiT", "ibit_tiny_patch16_224", kwargs, "imagenet", recipe={"cutmix": 0.0, "mixup": 0.0}, table=4)[
            "row"
        ]
        == "A (IBiT)"
    )
    assert (
        paper_row("IBiT", "ibit_tiny_patch16_224", kwargs, "imagenet", recipe={"cutmix": 0.5, "mixup": 0.0}, table=4)[
            "row"
        ]
        == "B"
    )
    assert (
        paper_row("IBiT", "ibit_tiny_patch16_224", kwargs, "imagenet", recipe={"cutmix": 0.5, "mixup": 0.0}, table=3)
        is None
    )
    assert paper_row("IBiT", "ibit_tiny_patch16_224", kwargs, "imagenet", table=4) is None  # no recipe given
    assert paper_row("IBiT", "convit_tiny", kwargs, "imagenet")["row"] == "ConViT"  # no condition: any recipe


def test_a_recipe_condition_that_is_not_true_or_false_is_refused(tmp_path, monkeypatch):
    import locvit.report.reported as rep
    from locvit.errors import InputError

    (tmp_path / "papers_reported.yaml").write_text(
        "papers: {IBiT: IBiT}\nrows:\n  - {paper: IBiT, table: 4, row: B, dataset: imagenet, model: m, cutmix: 1.0}\n"
    )
    monkeypatch.setattr(rep, "files", lambda package: tmp_path)
    rep.reported.cache_clear()
    try:
        with pytest.raises(InputError, match=r"IBiT Table 4: B\): cutmix must be true or false, not 1\.0"):
            rep.reported()
    finally:
        monkeypatch.undo()
        rep.reported.cache_clear()


def test_every_paper_value_names_its_paper_table_row_and_dataset():
    rows = reported()
    assert {(r["paper"], r["table"]) for r in rows} == {("LSA", 3), ("LSA", 4), ("MaiT", 4), ("IBiT", 3), ("IBiT", 4)}
    assert all(r["dataset"] in ("cifar10", "cifar100", "imagenet") and r["row"] for r in rows)
    keys = [(r["paper"], r["table"], r["row"], r["dataset"]) for r in rows]
    assert len(keys) == len(set(keys))
    # LSA Table 3 has 17 rows on two datasets, LSA Table 4 16, MaiT Table 4 20, IBiT Table 3 4, IBiT Table 4 3
    assert len(rows) == 17 * 2 + 16 + 20 + 4 + 3


def _decimals(value) -> int:
    return len(repr(value).partition(".")[2]) if isinstance(value, float) else 0


def test_the_ibit_rows_are_registered_models_of_the_papers_size():
    """IBiT Tables 3 and 4 (ImageNet-1k): each row's model is a registered entrypoint, and built as the pipeline
    builds it (224 px, 1000 classes, the row's keywords; on the meta device) it has the paper's parameters at the
    paper's precision (its "6M" is 5.5 to 6.5M)."""
    import timm
    import torch

    import locvit.models

    rows = [r for r in reported() if r["paper"] == "IBiT"]
    assert {(r["table"], r["row"]) for r in rows} == {
        (3, "IBiT (Ours)"),
        (3, "DeiT"),
        (3, "DeiT (Our Reproduction)"),
        (3, "ConViT"),
        (4, "A (IBiT)"),
        (4, "B"),
        (4, "C (DeiT)"),
    }
    assert all(r["dataset"] == "imagenet" and r["model"] for r in rows)
    for r in rows:
        assert timm.is_model(r["model"]), f"{r['row']}: {r['model']} is not a registered entrypoint"
    sized = [r for r in rows if r.get("params_m") is not None]
    assert {r["table"] for r in sized} == {3}  # Table 4 gives top-1 only
    for r in sized:
        with torch.device("meta"):
            model = locvit.models.create(
                {"model": r["model"], "model_kwargs": {"img_size": 224, "num_classes": 1000, **(r.get("kwargs") or {})}}
            )
        ours = sum(p.numel() for p in model.parameters()) / 1e6
        half_unit = 0.5 * 10 ** -_decimals(r["params_m"])
        assert abs(ours - r["params_m"]) <= half_unit, f"IBiT Table 3 {r['row']}: {r['model']} has {ours:.2f}M"


@pytest.mark.parametrize(
    "preset, paper, not_in_the_table",
    [
        ("lsa_cifar", "LSA", set()),
        ("lsa_imagenet", "LSA", set()),
        ("mait_sota", "MaiT", {"deit_t"}),
        ("ibit_imagenet", "IBiT", set()),
    ],
)
def test_every_row_of_the_table_presets_is_its_papers_row(repo, preset, paper, not_in_the_table):
    """The presets that reproduce a table are valid as `locvit validate` checks them (every model built at the
    data's size on the meta device) and each variant finds its paper row (the report shows it beside)."""
    from locvit.config import load_params
    from locvit.config.jobs import REPORT_RECIPE_KEYS
    from locvit.config.run import run_config
    from locvit.report.reported import paper_row

    params = load_params(repo / "presets" / f"{preset}.yaml")
    unmatched = set()
    for name, spec in params["variants"].items():
        cfg = run_config(params, name, params["seeds"][0])
        recipe = {k: cfg["train"][k] for k in REPORT_RECIPE_KEYS}
        if paper_row(paper, spec["model"], cfg["model_kwargs"], params["data"]["source"], recipe=recipe) is None:
            unmatched.add(name)
    assert unmatched == not_in_the_table
