"""Corrupt inputs: a truncated or bit-flipped FFCV file, checkpoint or manifest is caught before use.

Each kind of file records what it held when it was written (FFCV files: size and SHA-256
in the manifest; the manifest: a digest of itself; a checkpoint: a digest of its
contents), and every reader checks it first. The error names the file and the command
that rebuilds it, and the step that hit it writes nothing, so no later step runs on it.
(Archives: tests/test_data.py, against the published MD5s.)
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest
import timm
import torch

import locvit.models  # noqa: F401  registers locvit's families
from locvit import cli, io
from locvit.checkpoint import load_checkpoint, save_checkpoint
from locvit.config.run import run_config
from locvit.data.prepare import load_manifest

FLIPS = 60  # random single-bit flips per file


def flip_bit(path: Path, rng: random.Random) -> int:
    data = bytearray(path.read_bytes())
    at = rng.randrange(len(data))
    data[at] ^= 1 << rng.randrange(8)
    path.write_bytes(bytes(data))
    return at


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    """A fresh cache of verified hashes for each test."""
    monkeypatch.setenv(io.CACHE_ENV, str(tmp_path / "cache"))


@pytest.fixture
def checkpoint(tiny_params, tmp_path) -> tuple[Path, dict]:
    """An (untrained) deit_a checkpoint of the tiny study, as training writes best.pt."""
    cfg = run_config(tiny_params, "deit_a", 0)
    model = timm.create_model(cfg["model"], pretrained=False, **cfg["model_kwargs"])
    state = {
        "model": model.state_dict(),
        "config": cfg,
        "epoch": 0,
        "val_top1": 0.1,
        "mlflow_run_id": None,
        "weights": "model",
    }
    path = tmp_path / "runs" / "deit_a" / "seed0" / "best.pt"
    save_checkpoint(path, state)
    return path, state


def evaluate_cli(ckpt: Path, prepared: dict, out: Path, data: Path | None = None, manifest: Path | None = None):
    return cli.main(
        [
            "evaluate",
            "--checkpoint",
            str(ckpt),
            "--out",
            str(out),
            "--data",
            str(data or prepared["test"]),
            "--manifest",
            str(manifest or prepared["manifest"]),
            "--tracking-db",
            str(out.parent / "mlflow.db"),
            "--threads",
            "1",
        ]
    )


# Checkpoints ------------------------------------------------------------------------------------------


def test_every_bit_flip_in_a_checkpoint_is_caught_or_harmless(checkpoint, tmp_path):
    path, state = checkpoint
    good = path.read_bytes()
    rng = random.Random(0)
    caught = harmless = 0
    for _ in range(FLIPS):
        path.write_bytes(good)
        at = flip_bit(path, rng)
        try:
            loaded = load_checkpoint(path)
        except ValueError as err:
            assert str(path) in str(err) and f"snakemake --cores all --forcerun {path}" in str(err), err
            caught += 1
            continue
        # Loaded: then it must be exactly what was written (the flip hit bytes that carry nothing).
        assert loaded.keys() == state.keys(), at
        assert all(torch.equal(loaded["model"][k], state["model"][k]) for k in state["model"]), at
        assert {k: v for k, v in loaded.items() if k != "model"} == {k: v for k, v in state.items() if k != "model"}
        harmless += 1
    print(f"\n{FLIPS} single-bit flips in a {len(good)}-byte checkpoint: {caught} caught, {harmless} harmless")
    assert caught >= FLIPS * 0.9  # nearly every byte of a checkpoint is content


def test_a_missing_truncated_or_unchecked_checkpoint_is_refused_by_name(checkpoint, tmp_path):
    with pytest.raises(FileNotFoundError, match=r"checkpoint .*missing\.pt does not exist.*Rebuild it: snakemake"):
        load_checkpoint(tmp_path / "missing.pt")
    path, state = checkpoint
    good = path.read_bytes()
    for keep in (0, 100, len(good) // 2, len(good) - 1):
        path.write_bytes(good[:keep])
        with pytest.raises(ValueError, match="truncated or corrupt.*Rebuild it: snakemake"):
            load_checkpoint(path)
    torch.save(state, path)  # a plain torch.save: nothing to check it against
    with pytest.raises(ValueError, match="records no content digest"):
        load_checkpoint(path)


def test_a_changed_value_in_a_checkpoint_is_caught(checkpoint):
    """Rewritten by a program that keeps the recorded digest: one weight or one number differs."""
    path, _ = checkpoint
    raw = torch.load(path, weights_only=True)
    raw["model"]["head.bias"][0] += 1e-3
    torch.save(raw, path)
    with pytest.raises(ValueError, match="does not match the digest"):
        load_checkpoint(path)
    raw["model"]["head.bias"][0] -= 1e-3
    raw["epoch"] = 1
    torch.save(raw, path)
    with pytest.raises(ValueError, match="does not match the digest"):
        load_checkpoint(path)


def test_evaluating_a_corrupt_checkpoint_writes_nothing(checkpoint, prepared, tmp_path, capsys):
    path, _ = checkpoint
    out = tmp_path / "eval" / "deit_a" / "seed0.json"
    assert evaluate_cli(path, prepared, out) == 0 and out.is_file()  # the intact file is scored
    out.unlink()
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0x10  # in the weights
    path.write_bytes(bytes(raw))
    capsys.readouterr()
    assert evaluate_cli(path, prepared, out) == 1
    err = capsys.readouterr().err
    assert f"checkpoint {path}" in err and "Rebuild it" in err
    assert not out.exists() and not io.temporaries(out)


def test_a_corrupt_last_pt_stops_the_run_and_says_how_to_start_over(tiny_params, prepared, checkpoint, tmp_path):
    from locvit.train.state import plan_run

    cfg = run_config(tiny_params, "deit_a", 0)
    last = tmp_path / "run" / "last.pt"
    last.parent.mkdir()
    last.write_bytes(checkpoint[0].read_bytes()[:-10])
    with pytest.raises(ValueError, match=rf"checkpoint {last} .*delete it to train the run from scratch"):
        plan_run(cfg, prepared["manifest_data"]["data_hash"], last.parent)


# FFCV files and the manifest ------------------------------------------------------------------------------


@pytest.fixture
def data_copy(prepared, tmp_path) -> dict:
    out = tmp_path / "data"
    shutil.copytree(prepared["dir"], out)
    return {"dir": out, "manifest": out / "manifest.json", **{s: out / f"{s}.beton" for s in ("train", "val", "test")}}


def test_every_bit_flip_in_an_ffcv_file_is_caught(data_copy):
    path, manifest = data_copy["val"], data_copy["manifest"]
    good = path.read_bytes()
    load_manifest(manifest, {"val": path})  # intact: fine
    rng = random.Random(1)
    for _ in range(FLIPS // 3):
        path.write_bytes(good)
        flip_bit(path, rng)
        with pytest.raises(ValueError, match=rf"FFCV file {path} is corrupt.*--forcerun prepare"):
            load_manifest(manifest, {"val": path})
    path.write_bytes(good[:-1])
    with pytest.raises(ValueError, match=rf"FFCV file {path} has .* bytes.*truncated"):
        load_manifest(manifest, {"val": path})


def test_a_file_is_hashed_once_per_version(data_copy, monkeypatch):
    reads = []
    real = io.sha256_file
    monkeypatch.setattr(io, "sha256_file", lambda p, *a: reads.append(Path(p).name) or real(p, *a))
    files = {s: data_copy[s] for s in ("train", "val")}
    load_manifest(data_copy["manifest"], files)
    load_manifest(data_copy["manifest"], files)
    assert sorted(reads) == ["train.beton", "val.beton"]  # the second check read nothing
    flip_bit(data_copy["val"], random.Random(2))  # a new version (new mtime/ctime)
    with pytest.raises(ValueError, match="is corrupt"):
        load_manifest(data_copy["manifest"], files)
    assert sorted(reads) == ["train.beton", "val.beton", "val.beton"]


def test_a_changed_manifest_is_caught(data_copy):
    manifest = data_copy["manifest"]
    record = json.loads(manifest.read_text())
    record["splits"]["val"]["class_counts"][0] += 1  # still valid JSON
    manifest.write_text(json.dumps(record))
    with pytest.raises(ValueError, match=rf"dataset manifest {manifest} is corrupt.*--forcerun prepare"):
        load_manifest(manifest)
    manifest.write_text(json.dumps(record)[:-20])  # truncated: not JSON
    with pytest.raises(ValueError, match="not valid JSON.*--forcerun prepare"):
        load_manifest(manifest)


def test_evaluating_on_a_corrupt_ffcv_file_writes_nothing(checkpoint, prepared, data_copy, tmp_path, capsys):
    flip_bit(data_copy["test"], random.Random(3))
    out = tmp_path / "eval" / "deit_a" / "seed0.json"
    capsys.readouterr()
    assert evaluate_cli(checkpoint[0], prepared, out, data_copy["test"], data_copy["manifest"]) == 1
    err = capsys.readouterr().err
    assert f"FFCV file {data_copy['test']} is corrupt" in err and "snakemake --cores all --forcerun prepare" in err
    assert not out.exists()
