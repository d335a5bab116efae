"""The prepare step: dataset source -> seeded stratified split -> one FFCV file per split.

Besides the ``.beton`` files it writes a small JSON manifest: the split sizes and
counts per class, the image size, a content hash of the images and labels of each
split (deterministic: the same config always gives the same hash), and the size and
SHA-256 of each written file, so a later step can detect a truncated or corrupted file.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from locvit.data.ffcv_io import write_beton
from locvit.data.sources import get_source
from locvit.io import read_json, sha256_file, write_json

SPLITS = ("train", "val", "test")


def split_indices(labels: np.ndarray, val_fraction: float, test_fraction: float, seed: int,
                  fixed_test: np.ndarray | None = None, train_fraction: float = 1.0) -> dict[str, np.ndarray]:
    """Stratified train/val/test indices (sorted), reproducible for a given seed.

    Without ``fixed_test`` the test split is ``test_fraction`` of everything and val is
    ``val_fraction`` of everything. With an official test split, it is the test split
    and val is ``val_fraction`` of the rest. ``train_fraction`` < 1 then keeps a
    stratified subset of the training split (the data-fraction studies).
    """
    from sklearn.model_selection import train_test_split  # 4 s to import: only the prepare step needs it

    idx = np.arange(len(labels))
    if fixed_test is None:
        rest, test = train_test_split(idx, test_size=test_fraction, stratify=labels, random_state=seed)
        val_of_rest = val_fraction / (1.0 - test_fraction)
    else:
        test = np.asarray(fixed_test)
        rest = np.setdiff1d(idx, test)
        val_of_rest = val_fraction
    train, val = train_test_split(rest, test_size=val_of_rest, stratify=labels[rest], random_state=seed + 1)
    if train_fraction < 1.0:
        train, _ = train_test_split(train, train_size=train_fraction, stratify=labels[train], random_state=seed + 2)
    return {"train": np.sort(train), "val": np.sort(val), "test": np.sort(test)}


def content_hash(source, indices: np.ndarray) -> str:
    digest = hashlib.sha256()
    for i in indices:
        digest.update(np.ascontiguousarray(source.image(int(i))).tobytes())
    digest.update(np.ascontiguousarray(source.labels[indices]).tobytes())
    return digest.hexdigest()


def prepare(data_cfg: dict, outputs: dict[str, Path], manifest_path: Path) -> dict:
    """Prepare the dataset described by ``data_cfg`` (the validated ``data`` section)."""
    source = get_source(data_cfg["source"], data_cfg["root"], data_cfg["download"])
    size = data_cfg["image_size"]
    source.load(size)
    splits = split_indices(source.labels, data_cfg["val_fraction"], data_cfg["test_fraction"], data_cfg["split_seed"],
                           source.fixed_test, data_cfg["train_fraction"])
    manifest = {
        "source": source.name,
        "image_size": size,
        "num_classes": source.num_classes,
        "class_names": list(source.class_names),
        "split_seed": data_cfg["split_seed"],
        "train_fraction": data_cfg["train_fraction"],
        "official_test_split": source.fixed_test is not None,
        "splits": {},
    }
    for split in SPLITS:
        indices = splits[split]
        write_beton(outputs[split], source, indices, size, data_cfg["write_mode"], data_cfg["jpeg_quality"])
        counts = np.bincount(source.labels[indices], minlength=source.num_classes)
        manifest["splits"][split] = {
            "file": Path(outputs[split]).name,
            "size": int(len(indices)),
            "class_counts": counts.tolist(),
            "content_sha256": content_hash(source, indices),
            "file_bytes": Path(outputs[split]).stat().st_size,
            "file_sha256": sha256_file(outputs[split]),
        }
    # One hash for the whole prepared dataset: recorded as an MLflow tag of every run.
    manifest["data_hash"] = hashlib.sha256(
        "".join(manifest["splits"][s]["content_sha256"] for s in SPLITS).encode()
    ).hexdigest()[:16]
    write_json(manifest_path, manifest)
    return manifest


def load_manifest(path: str | Path, check_files: dict[str, Path] | None = None) -> dict:
    """Read a manifest; with ``check_files`` verify each split file's recorded size.

    A missing, truncated or replaced file raises an error naming it and how to rebuild.
    """
    fix = "Re-run the prepare step: snakemake --cores all prepare (or dvc repro prepare)."
    manifest = read_json(path, "dataset manifest", fix)
    for split, file in (check_files or {}).items():
        file = Path(file)
        expected = manifest["splits"][split]["file_bytes"]
        if not file.is_file():
            raise FileNotFoundError(f"FFCV file {file} is missing. {fix}")
        if file.stat().st_size != expected:
            raise ValueError(f"FFCV file {file} has {file.stat().st_size} bytes, the manifest recorded {expected}: "
                             f"it is truncated or was replaced. {fix}")
    return manifest
