"""A study's cost before it runs (locvit.analysis.cost, ``locvit validate``): runs, epochs, images seen from the
split the prepare step will make, training FLOPs from the meta-device count, GPU-hours at a measured or an
assumed rate, and what is unknown until the data is prepared."""

from __future__ import annotations

import pytest
import timm
import torch

import locvit.models  # noqa: F401
from locvit.analysis import cost as plan
from locvit.analysis.profile import gmacs
from locvit.cli import main
from locvit.config import load_params

pytestmark = pytest.mark.usefixtures("cache_in_tmp")


@pytest.fixture(scope="module")
def cifar(repo):
    return load_params(repo / "presets" / "lsa_cifar.yaml", check_models=False)


def test_a_cifar_studys_cost_counts_its_split_epochs_and_flops(cifar):
    rows = {r["variant"]: r for r in plan.study_cost(cifar, measured={})}
    assert list(rows) == list(cifar["variants"])
    deit = rows["deit_t"]
    train = 50_000 - round(50_000 * cifar["data"]["val_fraction"])  # CIFAR-10's training images less val
    assert deit["train_images"] == train and deit["images_seen"] == cifar["train"]["epochs"] * train
    with torch.device("meta"):
        forward = gmacs(timm.create_model("deit_tiny_patch16_224", img_size=32, patch_size=4, num_classes=10), 32)
    assert deit["forward_gmacs"] == pytest.approx(forward)
    assert deit["pflop"] == pytest.approx(6 * forward * 1e9 * deit["images_seen"] / 1e15)
    rate = plan.ASSUMED_MFU * plan.PEAK_TFLOPS * 1e12
    assert deit["gpu_hours"] == pytest.approx(deit["pflop"] * 1e15 / rate / 3600) and not deit["mfu_measured"]
    # a measured MFU replaces the assumed one for that model only
    faster = {r["variant"]: r for r in plan.study_cost(cifar, measured={"deit_tiny_patch16_224": 0.6})}
    assert faster["deit_t"]["gpu_hours"] == pytest.approx(deit["gpu_hours"] / 2) and faster["deit_t"]["mfu_measured"]
    assert faster["lsa_t"]["gpu_hours"] == pytest.approx(rows["lsa_t"]["gpu_hours"])


def test_a_models_count_is_remembered(tiny_params, monkeypatch):
    counted = plan.study_cost(tiny_params, measured={})
    monkeypatch.setattr(plan.profile, "gmacs", lambda *_: pytest.fail("a model counted before is counted again"))
    assert plan.study_cost(tiny_params, measured={}) == counted


def test_an_image_folders_count_is_unknown_until_given(repo):
    params = load_params(repo / "presets" / "mait_imagenet.yaml", check_models=False)
    unknown = plan.study_cost(params, measured={})
    assert all(r["images_seen"] is None and r["gpu_hours"] is None for r in unknown)
    assert "give --train-images N" in plan.cost_lines(unknown)[-1]
    given = plan.study_cost(params, measured={}, train_images=1000)
    assert [r["images_seen"] for r in given] == [r["epochs"] * 1000 for r in given]


def test_validate_prints_the_cost_table_unless_asked_not_to(repo, capsys):
    main(["validate", "--params", str(repo / "presets" / "lsa_cifar.yaml")])
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith("= 15 training run(s)") and out[1].split()[:3] == ["variant", "runs", "epochs"]
    assert out[-2].startswith("total") and "assumed 30% of 989 TFLOP/s" in out[-1]
    main(["validate", "--params", str(repo / "presets" / "lsa_cifar.yaml"), "--no-cost"])
    assert len(capsys.readouterr().out.splitlines()) == 1
    with pytest.raises(SystemExit):
        main(["validate", "--train-images", "-5"])
    assert "'-5' is not a whole number of images, 1 or more" in capsys.readouterr().err
