"""Bad sizes caught before compute, on the prepared tiny data (digits): a training split smaller than one
batch, a class left without a training image, more images to analyse than the test split holds; and an epoch
that took no optimiser step, which stops a run whatever caused it. (locvit validate refuses the same where the
dataset's size is known from its source: tests/bad_configs/56-61.)"""

from __future__ import annotations

import pytest
import torch

from locvit.config.run import run_config
from locvit.errors import InputError, LocvitError
from locvit.train.engine import NoOptimiserStep, train_one_epoch


def test_an_epoch_without_a_batch_takes_no_optimiser_step_and_says_why():
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(
        NoOptimiserStep,
        match="an epoch took no optimiser step: the training split holds fewer "
        r"images than one batch \(train.batch_size",
    ) as err:
        train_one_epoch(model, [], optimizer, lambda step: 0.1)
    assert isinstance(err.value, LocvitError)  # a user's error: one line from the command line
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    x, y = torch.randn(2, 4), torch.tensor([0, 1])
    assert train_one_epoch(model, [(x, y)], optimizer, lambda step: 0.1)["steps"] == 1  # one batch: one step


def test_a_run_with_a_batch_above_the_training_split_stops_before_compute(tiny_params, prepared, tmp_path):
    from locvit.train.loop import train_run

    cfg = run_config(tiny_params, "deit_a", 0)
    cfg["train"] = {**cfg["train"], "batch_size": 2000}
    images = prepared["manifest_data"]["splits"]["train"]["size"]
    with pytest.raises(
        InputError, match=f"train.batch_size: 2000 is more than the {images} images of the training split"
    ):
        train_run(
            cfg, prepared["train"], prepared["val"], prepared["manifest"], tmp_path / "run", tmp_path / "mlflow.db"
        )
    assert not (tmp_path / "run").exists() and not (tmp_path / "mlflow.db").exists()  # nothing began


def test_prepare_refuses_a_class_without_a_training_image(tiny_params, tmp_path):
    from locvit.data.prepare import prepare

    data = {**tiny_params["data"], "train_fraction": 0.004}
    outputs = {s: tmp_path / f"{s}.beton" for s in ("train", "val", "test")}
    with pytest.raises(
        InputError,
        match=r"data.train_fraction: 0.004 leaves 6 of the 10 classes of digits with no "
        r"training image \([0-9, ]+; 4 training image\(s\) in all\)",
    ):
        prepare(data, outputs, tmp_path / "manifest.json")
    assert not list(tmp_path.iterdir())  # before any file


def test_analyse_refuses_more_images_than_the_test_split(prepared, tmp_path):
    from locvit.analysis.analyse import analyse_checkpoints

    test = prepared["manifest_data"]["splits"]["test"]["size"]
    with pytest.raises(InputError, match=f"analysis.images: 1000 is more than the {test} images of the test split"):
        analyse_checkpoints(
            [tmp_path / "best.pt"],
            [tmp_path / "a.json"],
            [tmp_path / "a.npz"],
            prepared["test"],
            prepared["manifest"],
            images=1000,
        )
    assert not list(tmp_path.iterdir())


def test_validate_knows_the_sizes_of_digits_and_cifar_not_of_an_image_folder(tmp_path):
    from locvit.data.sources import get_source

    labels, fixed = get_source("digits").known_labels()
    assert len(labels) == 1797 and fixed is None
    labels, fixed = get_source("cifar100", tmp_path).known_labels()  # no files needed
    assert len(labels) == 60_000 and list(fixed[[0, -1]]) == [50_000, 59_999] and labels[:50_000].max() == 99
    assert get_source("imagefolder", tmp_path).known_labels() is None
