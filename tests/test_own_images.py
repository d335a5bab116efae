"""A user's own images, end to end (docs/own_images.md): a folder of PNGs, with and without ``val/``, through
prepare -> train -> evaluate -> analyse -> throughput -> report with Snakemake, as the page walks it.

One tiny variant, one seed, one epoch; the two layouts share one copy of the workflow and one set of images
(the folder without ``val/`` links to the other's ``train/``).
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
    """The tiny preset on an image folder: one tiny DeiT, one seed, one epoch, no mask search."""
    tiny = yaml.safe_load((Path(__file__).resolve().parents[1] / "presets" / "tiny.yaml").read_text())
    tiny.pop("mask_search")
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
    manifest = json.loads((root / "data" / "manifest.json").read_text())
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
    (row,) = csv.DictReader((root / "report" / "results.csv").open())
    assert row["variant"] == "deit" and 0 <= float(row["test_top1_mean"]) <= 100 and row["n_seeds"] == "1"
    assert "deit" in (root / "report" / "results.md").read_text()
    assert (root / "report" / "index.md").is_file() and (root / "report" / "throughput.csv").is_file()
