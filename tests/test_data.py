"""Data preparation: split sizes and stratification, determinism, manifest, FFCV round trip.

The CIFAR and image-folder tests build their inputs in the real formats (the python-pickle
release and its .tar.gz archive, class folders of JPEG/PNG files), a few dozen images each.
"""

from __future__ import annotations

import hashlib
import math
import pickle
import shutil

import numpy as np
import pytest
import torch
from helpers import cifar10_archive, cifar10_batches, fake_imagefolder

from locvit.config import validate_section
from locvit.data import sources
from locvit.data.ffcv_io import make_loader, read_all, stored_sizes, write_beton
from locvit.data.prepare import load_manifest, prepare, split_indices
from locvit.data.sources import get_source
from locvit.errors import InputError

SPLITS = ("train", "val", "test")


def _data(**keys) -> dict:
    """A validated data section (defaults filled), as the prepare step receives it."""
    return validate_section("data", keys, "test")


def _paths(folder) -> dict:
    return {s: folder / f"{s}.beton" for s in SPLITS}


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
    with pytest.raises(ValueError, match="allowed values: digits, cifar10, cifar100, imagenet, imagefolder"):
        get_source("mnist")


# --- training-set fractions -------------------------------------------------------------------


def test_train_fraction_is_stratified_seeded_and_nested():
    source = get_source("digits")
    source.load(8)
    y = source.labels  # 174-183 images per class
    full = split_indices(y, 0.15, 0.2, seed=0)
    per_class = np.bincount(y[full["train"]], minlength=10)
    previous = None
    for fraction in (0.05, 0.25, 0.5, 0.9):
        part = split_indices(y, 0.15, 0.2, seed=0, train_fraction=fraction)
        assert all(np.array_equal(part[s], full[s]) for s in ("val", "test"))  # only train shrinks
        assert len(part["train"]) == int(fraction * len(full["train"]))
        assert np.isin(part["train"], full["train"]).all()
        # Stratified: every class keeps within one image of its share.
        assert np.abs(np.bincount(y[part["train"]], minlength=10) - fraction * per_class).max() <= 1
        if previous is not None:  # nested: a smaller fraction is a subset of a larger one
            assert np.isin(previous, part["train"]).all()
        previous = part["train"]
    again = split_indices(y, 0.15, 0.2, seed=0, train_fraction=0.25)["train"]
    other = split_indices(y, 0.15, 0.2, seed=1, train_fraction=0.25)["train"]
    assert np.array_equal(again, split_indices(y, 0.15, 0.2, seed=0, train_fraction=0.25)["train"])
    assert not np.array_equal(again, other)


# --- CIFAR: the python release, as a folder or as its archive --------------------------------


def _fake_cifar10(root, **kwargs):
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    for name, blob in cifar10_batches(**kwargs).items():
        (folder / name).write_bytes(blob)
    return folder


def test_cifar_release_keeps_its_official_test_split(tmp_path):
    folder = _fake_cifar10(tmp_path)
    data = _data(source="cifar10", root=str(tmp_path), val_fraction=0.1)
    paths = _paths(tmp_path)
    manifest = prepare(data, paths, tmp_path / "manifest.json")
    assert [manifest["splits"][s]["size"] for s in SPLITS] == [90, 10, 30]
    assert manifest["official_test_split"] and manifest["class_names"][:2] == ["c0", "c1"]
    assert not manifest["train_stored_whole"]
    with open(folder / "test_batch", "rb") as fh:
        raw = pickle.load(fh, encoding="bytes")
    images, labels = read_all(paths["test"], jit=False)  # the test split is the test batch, in order, as (H, W, 3)
    assert np.array_equal(images, raw[b"data"].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))
    assert np.array_equal(labels, np.array(raw[b"labels"]))
    # Fractions of the training split, each its own file: stratified and nested; val and test unchanged.
    files = {}
    for fraction in (0.5, 0.25):
        out = tmp_path / f"f{fraction}"
        part = prepare({**data, "train_fraction": fraction}, _paths(out), out / "manifest.json")
        assert part["splits"]["train"]["size"] == int(90 * fraction)
        assert part["splits"]["test"] == manifest["splits"]["test"]
        assert part["splits"]["val"]["content_sha256"] == manifest["splits"]["val"]["content_sha256"]
        counts = np.array(part["splits"]["train"]["class_counts"])
        assert np.abs(counts - fraction * 9).max() <= 1  # 9 training images per class
        images, _ = read_all(out / "train.beton", jit=False)
        files[fraction] = {image.tobytes() for image in images}
    assert len(files[0.25]) == 22 and files[0.25] < files[0.5]


def test_published_md5s_are_torchvisions():
    from torchvision.datasets import CIFAR10, CIFAR100

    assert sources.ARCHIVE_MD5 == {c.filename: c.tgz_md5 for c in (CIFAR10, CIFAR100)}
    assert {get_source(n).url for n in ("cifar10", "cifar100")} == {CIFAR10.url, CIFAR100.url}


def test_cifar_archive_is_checked_then_unpacked_atomically(tmp_path, monkeypatch):
    archive, md5 = cifar10_archive(tmp_path)
    monkeypatch.setitem(sources.ARCHIVE_MD5, archive.name, md5)  # the test archive's, not the published one's
    source = get_source("cifar10", root=tmp_path)
    source.load(32)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cifar-10-batches-py", archive.name]  # no temp folder left
    assert len(source.labels) == 130 and source.fixed_test.tolist() == list(range(100, 130))
    blobs = cifar10_batches()
    expected = pickle.loads(blobs["test_batch"])[b"data"].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
    assert np.array_equal(np.stack([source.image(i) for i in range(100, 130)]), expected)
    archive.unlink()  # from now on the folder is used
    get_source("cifar10", root=tmp_path).load(32)


def test_corrupt_truncated_or_missing_archive_names_the_file_and_how_to_get_it(tmp_path, monkeypatch):
    url = r"https://www\.cs\.toronto\.edu/~kriz/cifar-10-python\.tar\.gz"
    with pytest.raises(
        FileNotFoundError,
        match=rf"neither the folder .*cifar-10-batches-py nor the archive "
        rf".*cifar-10-python\.tar\.gz .*data\.download: true to fetch {url}",
    ):
        get_source("cifar10", root=tmp_path).load(32)
    archive, _ = cifar10_archive(tmp_path)
    archive.write_bytes(archive.read_bytes()[:-200])  # truncated: the published MD5 does not match
    truncated_md5 = hashlib.md5(archive.read_bytes()).hexdigest()
    published = sources.ARCHIVE_MD5["cifar-10-python.tar.gz"]  # torchvision's value
    with pytest.raises(
        ValueError,
        match=rf"cifar-10-python\.tar\.gz has MD5 {truncated_md5}, the published "
        rf"archive's is {published}.*data\.download: true.*{url}",
    ):
        get_source("cifar10", root=tmp_path).load(32)
    # An archive whose MD5 is accepted but that cannot be unpacked is named too.
    monkeypatch.setitem(sources.ARCHIVE_MD5, archive.name, truncated_md5)
    with pytest.raises(ValueError, match=r"cifar-10-python\.tar\.gz could not be unpacked .*data\.download: true"):
        get_source("cifar10", root=tmp_path).load(32)
    assert [p.name for p in tmp_path.iterdir()] == [archive.name]  # no folder, no temp folder


def test_download_fetches_a_missing_or_corrupt_archive(tmp_path, monkeypatch, cifar_server):
    served, _ = cifar_server
    published, md5 = cifar10_archive(served)
    monkeypatch.setitem(sources.ARCHIVE_MD5, published.name, md5)
    root = tmp_path / "data"
    root.mkdir()
    (root / published.name).write_bytes(b"an interrupted download")
    source = get_source("cifar10", root=root, download=True)
    source.load(32)
    assert (root / published.name).read_bytes() == published.read_bytes()  # fetched over HTTP
    assert (root / "cifar-10-batches-py" / "test_batch").is_file() and len(source.labels) == 130


@pytest.fixture
def cifar_server(tmp_path, monkeypatch):
    """A web server on 127.0.0.1 serving ``tmp_path/served/``, with CIFAR-10's URL pointed at it: torchvision
    downloads over HTTP as from the published address, and no test needs the network."""
    import functools
    import http.server
    import threading

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    served = tmp_path / "served"
    served.mkdir()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(served)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    release = sources.CifarSource.RELEASES["cifar10"]
    url = f"http://127.0.0.1:{server.server_port}/{release[6].rsplit('/', 1)[1]}"
    monkeypatch.setitem(sources.CifarSource.RELEASES, "cifar10", (*release[:6], url))
    yield served, server
    server.shutdown()
    server.server_close()


def test_fetch_downloads_the_archive_where_prepare_reads_it_and_nothing_else(
    tmp_path, monkeypatch, cifar_server, capsys
):
    """`locvit fetch` on the login node, then prepare on an offline compute node, for the CIFAR preset."""
    from helpers import REPO

    from locvit.cli import main

    served, server = cifar_server
    published, md5 = cifar10_archive(served, per_batch=100)  # a miniature release, as the published archive
    monkeypatch.setitem(sources.ARCHIVE_MD5, published.name, md5)
    study = tmp_path / "study"  # where snakemake runs: the preset's data.root, `data`, is relative to it
    study.mkdir()
    monkeypatch.chdir(study)
    preset = str(REPO / "presets" / "lsa_cifar.yaml")
    good = published.read_bytes()
    published.write_bytes(good[:-100])  # a download cut short
    assert main(["fetch", "--params", preset]) == 1
    assert "has MD5" in capsys.readouterr().err and not list(study.rglob("*.*"))  # nothing kept, no temporary

    published.write_bytes(good)
    assert main(["fetch", "--params", preset]) == 0
    assert f"downloaded {sources.CifarSource('cifar10').url}" in capsys.readouterr().out
    assert [p.relative_to(study).as_posix() for p in sorted(study.rglob("*"))] == ["data", f"data/{published.name}"]
    assert (study / "data" / published.name).read_bytes() == good  # nothing unpacked, no study folder

    server.shutdown()  # the compute node: no network
    server.server_close()
    assert main(["fetch", "--params", preset]) == 0
    assert "published MD5; nothing to download" in capsys.readouterr().out
    out = {s: tmp_path / f"{s}.beton" for s in SPLITS}
    args = [f"--{s}={path}" for s, path in out.items()] + [f"--manifest={tmp_path / 'manifest.json'}"]
    assert main(["prepare", "--params", preset, *args]) == 0  # data.download: true, yet nothing to fetch
    assert load_manifest(tmp_path / "manifest.json")["splits"]["test"]["size"] == 30
    (study / "data" / published.name).unlink()
    shutil.rmtree(study / "data" / "cifar-10-batches-py")
    assert main(["fetch", "--params", preset]) == 1
    assert "could not download" in capsys.readouterr().err


def test_missing_or_corrupt_cifar_batch_says_which_file_and_what_to_do(tmp_path):
    folder = _fake_cifar10(tmp_path)
    (folder / "data_batch_2").unlink()
    with pytest.raises(FileNotFoundError, match=r"data_batch_2 is missing\. Run `locvit fetch` .*data\.download: true"):
        get_source("cifar10", root=tmp_path).load(32)
    (folder / "data_batch_2").write_bytes(b"not a pickle")
    with pytest.raises(ValueError, match=r"data_batch_2 is not a readable CIFAR batch.*data\.download: true"):
        get_source("cifar10", root=tmp_path).load(32)


def test_writer_options_round_trip(tmp_path):
    _fake_cifar10(tmp_path)
    source = get_source("cifar10", root=tmp_path)
    source.load(32)
    idx = np.arange(100, 130)
    expected = np.stack([source.image(int(i)) for i in idx])
    # Several writer processes and small chunks: the same file content, in order.
    write_beton(tmp_path / "a.beton", source, idx, 32, num_workers=2, chunk_size=7)
    assert np.array_equal(read_all(tmp_path / "a.beton", jit=False)[0], expected)
    # 'proportion': compress_probability 0 keeps every image raw, 1 compresses every one (JPEG: close, not equal).
    write_beton(tmp_path / "b.beton", source, idx, 32, write_mode="proportion", compress_probability=0.0)
    assert np.array_equal(read_all(tmp_path / "b.beton", jit=False)[0], expected)
    write_beton(
        tmp_path / "c.beton", source, idx, 32, write_mode="proportion", compress_probability=1.0, jpeg_quality=95
    )
    jpeg = read_all(tmp_path / "c.beton", jit=False)[0]
    assert not np.array_equal(jpeg, expected) and jpeg.shape == expected.shape
    assert (tmp_path / "c.beton").stat().st_size < (tmp_path / "b.beton").stat().st_size * 1.5


# --- image folders (ImageNet is one with 1000 classes) -------------------------------------------


def test_imagefolder_val_is_the_test_split(tmp_path):
    root = fake_imagefolder(tmp_path / "pets")
    data = _data(source="imagefolder", root=str(root), image_size=8, val_fraction=0.25)
    assert get_source("imagefolder", root=root).num_classes == 3  # counted from train/ before loading
    manifest = prepare(data, _paths(tmp_path), tmp_path / "m.json")
    assert manifest["class_names"] == ["cat", "dog", "eel"] and manifest["official_test_split"]
    assert [manifest["splits"][s]["size"] for s in SPLITS] == [9, 3, 6]
    assert manifest["splits"]["test"]["class_counts"] == [2, 2, 2]
    images, labels = read_all(tmp_path / "test.beton", jit=False)
    assert images.shape == (6, 8, 8, 3) and labels.tolist() == [0, 0, 1, 1, 2, 2]
    again = prepare(data, _paths(tmp_path / "again"), tmp_path / "again.json")
    assert again["data_hash"] == manifest["data_hash"]  # names, sizes and labels: deterministic


def test_imagefolder_without_val_draws_the_test_split(tmp_path):
    root = fake_imagefolder(tmp_path / "pets", per_class=(6,), val=False)
    manifest = prepare(
        _data(source="imagefolder", root=str(root), image_size=8, val_fraction=0.2, test_fraction=0.2),
        _paths(tmp_path),
        tmp_path / "m.json",
    )
    assert not manifest["official_test_split"]
    assert sum(manifest["splits"][s]["size"] for s in SPLITS) == 18 and manifest["splits"]["test"]["size"] == 4


def test_a_folder_too_small_to_split_by_class_names_the_key(tmp_path):
    """A user's mistake (InputError: one line, no traceback) where scikit-learn's stratified split refuses a
    class of one image, or a held-out share smaller than one image per class."""
    root = fake_imagefolder(tmp_path / "pets", per_class=(1,), val=False)  # one image a class
    with pytest.raises(InputError, match=r"^data\.test_fraction: 0\.2 cannot hold out a share of every class from 3 "):
        prepare(_data(source="imagefolder", root=str(root), image_size=8), _paths(tmp_path), tmp_path / "m.json")
    root = fake_imagefolder(tmp_path / "more", per_class=(6, 2))  # val/ is the test split; 18 training images
    with pytest.raises(InputError, match=r"^data\.val_fraction: 0\.1 cannot hold out .* 3 classes"):
        prepare(
            _data(source="imagefolder", root=str(root), image_size=8, val_fraction=0.1),
            _paths(tmp_path),
            tmp_path / "m.json",
        )
    assert not list(tmp_path.glob("*.beton"))


def test_imagenet_is_an_image_folder_of_1000_classes(tmp_path, monkeypatch):
    fake_imagefolder(tmp_path / "imagenet", classes=("n01", "n02", "n03"))
    source = get_source("imagenet", root=tmp_path)
    assert isinstance(source, sources.ImageFolderSource) and source.num_classes == 1000
    with pytest.raises(ValueError, match=r"imagenet/train has 3 class folders; imagenet has 1000"):
        source.load(8)
    source.num_classes = 3  # the same code path with a 3-class ImageNet
    source.load(8)
    assert source.class_names == ("n01", "n02", "n03")
    assert source.labels.tolist() == [0] * 4 + [1] * 4 + [2] * 4 + [0, 0, 1, 1, 2, 2]
    assert source.fixed_test.tolist() == list(range(12, 18))
    assert all(source.image(i).shape == (8, 8, 3) for i in range(18))
    (tmp_path / "imagenet" / "val").rename(tmp_path / "imagenet" / "valid")
    with pytest.raises(FileNotFoundError, match=r"imagenet/val is missing\. ImageNet is not downloaded for you"):
        source.load(8)  # unlike a plain image folder, ImageNet needs its val/


def test_missing_or_empty_folders_name_the_path(tmp_path):
    root = tmp_path / "pets"
    with pytest.raises(FileNotFoundError, match=r"pets/train is missing\. Put the images there as train/<class>"):
        get_source("imagefolder", root=root).num_classes
    (root / "train").mkdir(parents=True)
    with pytest.raises(ValueError, match=r"pets/train has no class folders"):
        get_source("imagefolder", root=root).load(8)
    fake_imagefolder(tmp_path / "more")
    (tmp_path / "more" / "train" / "fox").mkdir()
    with pytest.raises(ValueError, match=r"more/train/fox holds no images"):
        get_source("imagefolder", root=tmp_path / "more").load(8)
    (tmp_path / "more" / "train" / "fox").rmdir()
    (tmp_path / "more" / "val" / "owl").mkdir()
    with pytest.raises(ValueError, match=r"more/val/owl is a class folder that .*more/train does not have"):
        get_source("imagefolder", root=tmp_path / "more").load(8)


@pytest.mark.timeout(120)  # FFCV's writer alone would wait forever for a writer process that died
def test_unreadable_image_names_the_file_when_read_and_when_prepared(tmp_path):
    root = fake_imagefolder(tmp_path / "pets")
    bad = root / "train" / "dog" / "dog_1.JPEG"
    bad.write_bytes(bad.read_bytes()[:40])  # a truncated JPEG
    source = get_source("imagefolder", root=root)
    source.load(8)
    with pytest.raises(ValueError, match=r"pets/train/dog/dog_1\.JPEG is not a readable image"):
        source.image(5)
    out = tmp_path / "out"
    data = _data(source="imagefolder", root=str(root), image_size=8, val_fraction=0.25, write_workers=2, chunk_size=1)
    with pytest.raises(ValueError, match=r"dog_1\.JPEG is not a readable image.*while writing train\.beton"):
        prepare(data, _paths(out), out / "m.json")
    assert list(out.iterdir()) == []  # no file, not even a temporary one


def test_max_resolution_stores_the_training_images_whole(tmp_path):
    root = fake_imagefolder(tmp_path / "pets", per_class=(4, 2))  # 12x20 up to 36x20 px
    data = _data(source="imagefolder", root=str(root), image_size=8, val_fraction=0.25, max_resolution=16)
    paths = _paths(tmp_path)
    manifest = prepare(data, paths, tmp_path / "m.json")
    assert manifest["train_stored_whole"] and manifest["max_resolution"] == 16
    (h0, h1), (w0, w1) = stored_sizes(paths["train"])
    assert max(h1, w1) == 16 and (h0, w0) != (h1, w1)  # longer side capped, aspect kept
    assert stored_sizes(paths["val"]) == stored_sizes(paths["test"]) == ((8, 8), (8, 8))  # centre squares
    with pytest.raises(ValueError, match=r"train\.beton holds images of .* the loader needs image_size"):
        make_loader(paths["train"], 4, True, torch.device("cpu"), jit=False)
    loader = make_loader(paths["train"], 4, True, torch.device("cpu"), jit=False, image_size=8)  # random-resized crops
    images = torch.cat([x for x, _ in loader])
    assert images.shape == (8, 3, 8, 8) and images.dtype == torch.uint8
    with pytest.raises(ValueError, match=r"data\.max_resolution 4 is smaller than data\.image_size 8"):
        prepare({**data, "max_resolution": 4}, paths, tmp_path / "m.json")
    # No effect on in-memory squares (CIFAR): every split stays image_size squares.
    _fake_cifar10(tmp_path / "c")
    cifar = prepare(
        _data(source="cifar10", root=str(tmp_path / "c"), max_resolution=64),
        _paths(tmp_path / "c"),
        tmp_path / "c" / "m.json",
    )
    assert not cifar["train_stored_whole"] and stored_sizes(tmp_path / "c" / "train.beton") == ((32, 32), (32, 32))


def test_an_epoch_leaves_torchs_thread_count_alone(prepared):
    """FFCV's Loader.__iter__ sets torch's thread count to num_workers; ours keeps the caller's."""
    from locvit.data.ffcv_io import make_loader

    before = torch.get_num_threads()
    try:
        loader = make_loader(prepared["val"], 64, True, torch.device("cpu"), num_workers=2, jit=False)
        torch.set_num_threads(1)  # a run's --threads, set after the loader is built
        for epoch in range(2):
            for _ in loader:
                assert torch.get_num_threads() == 1, f"epoch {epoch}"
    finally:
        torch.set_num_threads(before)
