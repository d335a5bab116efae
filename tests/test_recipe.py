"""Real-format datasets through prepare and a short training with the papers' full recipe.

A CIFAR-10 archive in the published layout and a small folder of JPEG/PNG files (stored
whole, random-resized crops at load) each go through the prepare step and one epoch of
`train_run` with RandAugment, random erasing, repeated augmentation, MixUp/CutMix, EMA and
the batch-scaled lr switched on.
"""

from __future__ import annotations

import json

import pytest
import torch
from helpers import cifar10_archive, fake_imagefolder

from locvit import models
from locvit.checkpoint import load_checkpoint
from locvit.config import validate_params
from locvit.config.run import run_config
from locvit.data import sources
from locvit.data.prepare import prepare
from locvit.train.loop import train_run

# Each trains a run that logs its model to MLflow, whose git context runs git (git check-ignore).
pytestmark = pytest.mark.e2e

RECIPE = {
    "epochs": 1,
    "batch_size": 8,
    "eval_batch_size": 16,
    "lr": 0.001,
    "lr_scale_batch": 512,
    "warmup_epochs": 0,
    "loader_jit": False,
    "translate": 4,
    "hflip": True,
    "randaugment": "rand-m9-mstd0.5-inc1",
    "random_erasing": 0.25,
    "repeated_aug": 2,
    "mixup": 0.8,
    "cutmix": 1.0,
    "ema": True,
    "ema_decay": 0.9,
}


def _train(tmp_path, data: dict, kwargs: dict) -> tuple[dict, dict]:
    params = validate_params(
        {
            "study": "recipe",
            "data": data,
            "train": RECIPE,
            "seeds": [0],
            "variants": {"deit": {"model": "deit_tiny_patch16_224", "kwargs": kwargs}},
        }
    )
    paths = {s: tmp_path / f"{s}.beton" for s in ("train", "val", "test")}
    manifest = prepare(params["data"], paths, tmp_path / "manifest.json")
    cfg = run_config(params, "deit", 0)
    metrics = train_run(
        cfg,
        paths["train"],
        paths["val"],
        tmp_path / "manifest.json",
        tmp_path / "run",
        tmp_path / "mlflow.db",
        show_progress=False,
        threads=1,
    )
    return manifest, metrics


def test_cifar_archive_trains_with_the_full_recipe(tmp_path, monkeypatch):
    archive, md5 = cifar10_archive(tmp_path / "data")
    monkeypatch.setitem(sources.ARCHIVE_MD5, archive.name, md5)  # the test archive's, not the published one
    manifest, metrics = _train(
        tmp_path,
        {"source": "cifar10", "root": str(tmp_path / "data"), "val_fraction": 0.2},
        {"patch_size": 8, "embed_dim": 32, "depth": 1, "num_heads": 2},
    )
    assert manifest["num_classes"] == 10 and manifest["splits"]["test"]["size"] == 30
    (row,) = metrics["history"]
    assert all(torch.isfinite(torch.tensor(row[k])) for k in ("train_loss", "val_loss"))
    assert row["lr"] <= 0.001 * 8 / 512  # the peak lr scaled by the global batch
    state = load_checkpoint(tmp_path / "run" / "best.pt")
    assert state["weights"] == "ema"  # best.pt holds the EMA weights when EMA is on
    model = models.load(state, "cpu")
    assert model(torch.zeros(2, 3, 32, 32)).shape == (2, 10)


def test_image_folder_stored_whole_trains_on_random_resized_crops(tmp_path):
    root = fake_imagefolder(tmp_path / "pets", per_class=(4, 2))
    manifest, metrics = _train(
        tmp_path,
        {"source": "imagefolder", "root": str(root), "image_size": 16, "max_resolution": 24, "val_fraction": 0.25},
        {"patch_size": 8, "embed_dim": 32, "depth": 1, "num_heads": 2},
    )
    assert manifest["train_stored_whole"] and manifest["num_classes"] == 3
    assert len(metrics["history"]) == 1 and json.loads((tmp_path / "run" / "metrics.json").read_text())
