"""Data preparation: split sizes and stratification, determinism, manifest, FFCV round trip."""

from __future__ import annotations

import math

import numpy as np
import pytest

from locvit.data.ffcv_io import read_all
from locvit.data.prepare import load_manifest, prepare, split_indices
from locvit.data.sources import get_source


def test_split_is_stratified_disjoint_and_complete():
    labels = get_source("digits")
    labels.load(8)
    y = labels.labels
    splits = split_indices(y, 0.15, 0.2, seed=0)
    all_idx = np.concatenate(list(splits.values()))
    assert len(all_idx) == len(y) == 1797
    assert len(np.unique(all_idx)) == len(y)  # disjoint and complete
    assert len(splits["test"]) == math.ceil(0.2 * 1797)  # scikit-learn rounds the test share up
    assert abs(len(splits["val"]) - 0.15 * 1797) <= 1
    # Stratified: every class's share in each split is within 2 points of its overall share.
    overall = np.bincount(y, minlength=10) / len(y)
    for idx in splits.values():
        share = np.bincount(y[idx], minlength=10) / len(idx)
        assert np.abs(share - overall).max() < 0.02


def test_split_depends_on_seed_only():
    y = np.repeat(np.arange(10), 50)
    a, b, c = split_indices(y, 0.1, 0.2, 0), split_indices(y, 0.1, 0.2, 0), split_indices(y, 0.1, 0.2, 1)
    assert all(np.array_equal(a[s], b[s]) for s in a)
    assert not np.array_equal(a["train"], c["train"])


def test_manifest_records_sizes_counts_and_hashes(prepared):
    m = prepared["manifest_data"]
    assert m["image_size"] == 16 and m["num_classes"] == 10
    assert sum(m["splits"][s]["size"] for s in m["splits"]) == 1797
    for split in ("train", "val", "test"):
        info = m["splits"][split]
        assert sum(info["class_counts"]) == info["size"]
        assert info["file_bytes"] == prepared[split].stat().st_size
        assert len(info["content_sha256"]) == 64
    assert load_manifest(prepared["manifest"]) == m


def test_prepare_is_deterministic(tmp_path, tiny_params, prepared):
    paths = {s: tmp_path / f"{s}.beton" for s in ("train", "val", "test")}
    again = prepare(tiny_params["data"], paths, tmp_path / "manifest.json")
    assert again["data_hash"] == prepared["manifest_data"]["data_hash"]
    for split in paths:
        assert again["splits"][split]["content_sha256"] == prepared["manifest_data"]["splits"][split]["content_sha256"]


def test_ffcv_round_trip_gives_back_the_source_images(prepared, tiny_params):
    source = get_source("digits")
    source.load(tiny_params["data"]["image_size"])
    idx = split_indices(source.labels, 0.15, 0.2, 0)["val"]
    images, labels = read_all(prepared["val"])  # sequential order: the written order
    assert images.shape == (len(idx), 16, 16, 3) and images.dtype == np.uint8
    assert np.array_equal(labels, source.labels[idx])
    assert np.array_equal(images, np.stack([source.image(int(i)) for i in idx]))


def test_truncated_beton_is_reported_with_its_name(prepared, tmp_path):
    bad = tmp_path / "val.beton"
    bad.write_bytes(prepared["val"].read_bytes()[:1000])
    with pytest.raises(ValueError, match=r"val\.beton.*truncated.*prepare"):
        load_manifest(prepared["manifest"], {"val": bad})
    with pytest.raises(FileNotFoundError, match="missing"):
        load_manifest(prepared["manifest"], {"val": tmp_path / "nope.beton"})


def test_missing_or_corrupt_manifest_names_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="manifest.*does not exist"):
        load_manifest(tmp_path / "manifest.json")
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"manifest\.json is not valid JSON.*prepare"):
        load_manifest(tmp_path / "manifest.json")


def test_unknown_source_lists_the_allowed_ones():
    with pytest.raises(ValueError, match="allowed values: digits, cifar10, cifar100, imagenet"):
        get_source("mnist")


def _fake_cifar10(root, per_batch: int = 20, test: int = 30, seed: int = 0):
    """A CIFAR-10 python release in miniature: the real file layout and pickle format."""
    import pickle

    rng = np.random.default_rng(seed)
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    batches = {f"data_batch_{i}": per_batch for i in range(1, 6)} | {"test_batch": test}
    for name, n in batches.items():
        data = rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)  # rows: R plane, G plane, B plane
        with open(folder / name, "wb") as fh:
            pickle.dump({b"data": data, b"labels": [i % 10 for i in range(n)]}, fh)
    with open(folder / "batches.meta", "wb") as fh:
        pickle.dump({b"label_names": [f"c{i}".encode() for i in range(10)]}, fh)
    return folder


def test_cifar_release_keeps_its_official_test_split(tmp_path):
    folder = _fake_cifar10(tmp_path)
    data = {"source": "cifar10", "root": str(tmp_path), "download": False, "image_size": 32, "val_fraction": 0.1,
            "test_fraction": 0.2, "split_seed": 0, "write_mode": "raw", "jpeg_quality": 90, "train_fraction": 1.0}
    paths = {s: tmp_path / f"{s}.beton" for s in ("train", "val", "test")}
    manifest = prepare(data, paths, tmp_path / "manifest.json")
    assert [manifest["splits"][s]["size"] for s in ("train", "val", "test")] == [90, 10, 30]
    assert manifest["official_test_split"] and manifest["class_names"][:2] == ["c0", "c1"]
    import pickle

    with open(folder / "test_batch", "rb") as fh:
        raw = pickle.load(fh, encoding="bytes")
    images, labels = read_all(paths["test"])  # the test split is the test batch, in order, as (H, W, 3)
    assert np.array_equal(images, raw[b"data"].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))
    assert np.array_equal(labels, np.array(raw[b"labels"]))
    # A fraction of the training split, stratified; val and test unchanged.
    half = prepare({**data, "train_fraction": 0.5}, paths, tmp_path / "manifest.json")
    assert half["splits"]["train"]["size"] == 45 and half["splits"]["test"] == manifest["splits"]["test"]
    assert half["splits"]["val"]["content_sha256"] == manifest["splits"]["val"]["content_sha256"]
    assert max(half["splits"]["train"]["class_counts"]) - min(half["splits"]["train"]["class_counts"]) <= 1


def test_missing_or_corrupt_cifar_says_which_file_and_what_to_do(tmp_path):
    source = get_source("cifar10", root=tmp_path)
    with pytest.raises(FileNotFoundError, match=r"data_batch_1 is missing\. Set data\.download: true"):
        source.load(32)
    folder = _fake_cifar10(tmp_path)
    (folder / "data_batch_3").write_bytes(b"not a pickle")
    with pytest.raises(ValueError, match=r"data_batch_3 is not a readable CIFAR batch.*data\.download: true"):
        get_source("cifar10", root=tmp_path).load(32)


def _fake_imagefolder(root, classes=("n01", "n02", "n03"), per_class=(4, 2)):
    """ImageNet's ImageFolder layout in miniature: real JPEG/PNG files of different shapes."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, count in zip(("train", "val"), per_class):
        for c, name in enumerate(classes):
            folder = root / "imagenet" / split / name
            folder.mkdir(parents=True)
            for i in range(count):
                pixels = rng.integers(0, 256, size=(12 + 4 * i, 20, 3), dtype=np.uint8)  # landscape and portrait
                Image.fromarray(pixels).save(folder / f"{name}_{i}.{'JPEG' if i % 2 else 'png'}")
    (root / "imagenet" / "train" / classes[0] / "notes.txt").write_text("not an image")  # ignored


def test_imagenet_folder_layout_val_is_the_test_split(tmp_path, monkeypatch):
    from locvit.data import sources

    _fake_imagefolder(tmp_path)
    source = sources.get_source("imagenet", root=tmp_path)
    with pytest.raises(ValueError, match="has 3 class folders, ImageNet-1k has 1000"):
        source.load(8)
    source.num_classes = 3  # the same code path with a 3-class ImageNet
    source.load(8)
    assert source.class_names == ("n01", "n02", "n03") and source.labels.tolist() == [0] * 4 + [1] * 4 + [2] * 4 + [0, 0, 1, 1, 2, 2]
    assert source.fixed_test.tolist() == list(range(12, 18))
    assert all(source.image(i).shape == (8, 8, 3) for i in range(18))
    monkeypatch.setitem(sources.SOURCES, "imagenet", lambda root, download: source)
    data = {"source": "imagenet", "root": str(tmp_path), "download": False, "image_size": 8, "val_fraction": 0.25,
            "test_fraction": 0.2, "split_seed": 0, "write_mode": "raw", "jpeg_quality": 90, "train_fraction": 1.0}
    manifest = prepare(data, {s: tmp_path / f"{s}.beton" for s in ("train", "val", "test")}, tmp_path / "m.json")
    assert [manifest["splits"][s]["size"] for s in ("train", "val", "test")] == [9, 3, 6]


def test_missing_or_unreadable_imagenet_says_what_to_do(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"imagenet/train is missing\. ImageNet is not downloaded for you"):
        get_source("imagenet", root=tmp_path).load(8)
    _fake_imagefolder(tmp_path)
    source = get_source("imagenet", root=tmp_path)
    source.num_classes = 3
    source.load(8)
    bad = tmp_path / "imagenet" / "train" / "n02" / "n02_0.png"
    bad.write_bytes(b"truncated")
    with pytest.raises(ValueError, match=r"n02_0\.png is not a readable image"):
        source.image(4)
