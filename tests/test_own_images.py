"""A user's own images, end to end (docs/own_images.md): a folder of PNGs, with and without ``val/``, through
prepare -> train -> evaluate -> analyse -> throughput -> report with Snakemake, as the page walks it.

One tiny variant, one seed, one epoch; the two layouts share one copy of the workflow and one set of images
(the folder without ``val/`` links to the other's ``train/``). Without ``val/`` the study also draws a split per
seed (``data.split: per_seed``), with two variants and two seeds, as docs/statistics.md describes.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml
from helpers import copy_workflow, snakemake

from locvit.report import stats

pytestmark = pytest.mark.e2e

CLASSES = ("apple", "bee", "cup")
TRAIN_PER_CLASS, VAL_PER_CLASS = 16, 4


def write_pngs(folder: Path, count: int, rng) -> None:
    """``count`` PNGs of each class in ``folder/<class>/``, of two shapes, the class in their mean colour."""
    from PIL import Image

    for label, name in enumerate(CLASSES):
        (folder / name).mkdir(parents=True)
        for i in range(count):
            pixels = rng.integers(0, 128, size=(20 + 4 * (i % 2), 24, 3)) + 60 * label  # landscape sizes differ
            Image.fromarray(pixels.clip(0, 255).astype(np.uint8)).save(folder / name / f"{name}_{i}.png")


def study_params(name: str, root: str) -> dict:
    """The tiny preset on an image folder: one tiny DeiT, one seed, one epoch, no mask search; without val/ a
    split per seed, two seeds and the preset's MaiT beside it."""
    tiny = yaml.safe_load((Path(__file__).resolve().parents[1] / "presets" / "tiny.yaml").read_text())
    tiny.pop("mask_search")
    if name == "without_val":
        return {
            **study_params("with_val", root),
            "study": name,
            "data": {"source": "imagefolder", "root": root, "image_size": 16, "split": "per_seed"},
            "seeds": [0, 1],
            "train_jobs": "per_run",
            "variants": {"deit": tiny["variants"]["deit_a"], "mait": tiny["variants"]["mait_b"]},
        }
    return {
        **tiny,
        "study": name,
        "data": {"source": "imagefolder", "root": root, "image_size": 16},
        "train": {**tiny["train"], "epochs": 1, "batch_size": 8},
        "analysis": {**tiny["analysis"], "images": 4, "throughput_rounds": 3},
        "seeds": [0],
        "variants": {"deit": tiny["variants"]["deit_a"]},
    }


@pytest.fixture(scope="module")
def studies(tmp_path_factory) -> dict[str, Path]:
    """Both layouts run through Snakemake in one workflow copy: layout -> the study's folder."""
    work = copy_workflow(tmp_path_factory.mktemp("own"))
    rng = np.random.default_rng(0)
    write_pngs(work / "photos" / "train", TRAIN_PER_CLASS, rng)
    write_pngs(work / "photos" / "val", VAL_PER_CLASS, rng)
    (work / "photos_noval").mkdir()
    (work / "photos_noval" / "train").symlink_to(work / "photos" / "train", target_is_directory=True)
    found = {}
    for layout, root in (("with_val", "photos"), ("without_val", "photos_noval")):
        params = work / f"{layout}.yaml"
        params.write_text(yaml.safe_dump(study_params(layout, root), sort_keys=False))
        snakemake(work, "--cores", "2", "all", "--config", f"params={params.name}")
        found[layout] = work / "results" / layout
    return found


@pytest.mark.parametrize("layout", ["with_val", "without_val"])
def test_an_image_folder_goes_from_prepare_to_the_report(studies, layout):
    root = studies[layout]
    manifest = json.loads((root / "data" / ("seed0" if layout == "without_val" else "") / "manifest.json").read_text())
    splits = {name: split["size"] for name, split in manifest["splits"].items()}
    assert manifest["source"] == "imagefolder" and manifest["class_names"] == list(CLASSES)
    total = len(CLASSES) * TRAIN_PER_CLASS
    if layout == "with_val":  # val/ is the test split; validation is drawn from train/
        assert manifest["official_test_split"] and splits["test"] == len(CLASSES) * VAL_PER_CLASS
        assert splits["train"] + splits["val"] == total
        assert manifest["splits"]["test"]["class_counts"] == [VAL_PER_CLASS] * len(CLASSES)
    else:  # both drawn from train/, stratified (test_fraction 0.2, val_fraction 0.15 by default)
        assert not manifest["official_test_split"] and sum(splits.values()) == total
        assert splits["test"] == math.ceil(0.2 * total)  # scikit-learn's test_size rounds up
        assert all(count > 0 for count in manifest["splits"]["test"]["class_counts"])
    if layout == "without_val":
        return  # test_a_split_per_seed_reaches_the_report
    (row,) = csv.DictReader((root / "report" / "results.csv").open())
    assert row["variant"] == "deit" and 0 <= float(row["test_top1_mean"]) <= 100 and row["n_seeds"] == "1"
    assert "deit" in (root / "report" / "results.md").read_text()
    assert (root / "report" / "index.md").is_file() and (root / "report" / "throughput.csv").is_file()


def test_a_split_per_seed_reaches_the_report(studies):
    """data.split: per_seed: seed k's runs of both variants are scored on data/seed<k>/, drawn with split_seed k
    (another test split per seed), and the report pairs them by seed (the corrected resampled t, 1 df)."""
    root = studies["without_val"]
    manifests = [json.loads((root / "data" / f"seed{k}" / "manifest.json").read_text()) for k in (0, 1)]
    assert [m["split_seed"] for m in manifests] == [0, 1]
    hashes = [m["splits"]["test"]["content_sha256"] for m in manifests]
    assert hashes[0] != hashes[1]
    top1 = {}
    for variant in ("deit", "mait"):
        for k in (0, 1):
            record = json.loads((root / "eval" / variant / f"seed{k}.json").read_text())
            assert record["test_hash"] == hashes[k] and record["n_train"] == manifests[k]["splits"]["train"]["size"]
            assert record["data_split"] == "per_seed"
            top1.setdefault(variant, []).append(100 * record["test_top1"])
    rows = {r["variant"]: r for r in csv.DictReader((root / "report" / "results.csv").open())}
    assert rows["deit"]["n_seeds"] == rows["mait"]["n_seeds"] == "2"
    ratio = np.mean([m["splits"]["test"]["size"] / m["splits"]["train"]["size"] for m in manifests])
    want = stats.compare(top1["mait"], top1["deit"], 1.0, manifests[0]["splits"]["test"]["size"], resample=ratio)
    assert want.df in (1, None)
    got = rows["mait"]["delta_ci95_low"]
    assert (got == "") if want.ci_low is None else float(got) == pytest.approx(want.ci_low, abs=0.01), (rows, want)
