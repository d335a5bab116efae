"""The prepare step: dataset source -> seeded stratified split -> one FFCV file per split.

Beside the ``.beton`` files, a JSON manifest: split sizes and counts per class, the image size, a
deterministic content hash per split (pixels of in-memory datasets; an image folder's file names and byte
sizes, since hashing ImageNet's pixels would decode it twice), and each file's size and SHA-256, so a later
step detects a truncated or corrupt file. Splits are squares of ``image_size``, except an image folder's
training split with ``max_resolution``: stored whole (longer side capped) for DeiT's random-resized crops.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from locvit.data.ffcv_io import write_beton
from locvit.data.sources import get_source
from locvit.data.splits import empty_classes, fraction_subset, split_indices  # noqa: F401  (the split's home)
from locvit.errors import InputError, MissingFileError
from locvit.io import read_json, remove_temporaries, sha256_file, verified_sha256, write_json

SPLITS = ("train", "val", "test")


def content_hash(source, indices: np.ndarray) -> str:
    digest = hashlib.sha256()
    for i in indices:
        digest.update(source.fingerprint(int(i)))
    digest.update(np.ascontiguousarray(source.labels[indices]).tobytes())
    return digest.hexdigest()


def prepare(data_cfg: dict, outputs: dict[str, Path], manifest_path: Path) -> dict:
    """Prepare the dataset described by ``data_cfg`` (the validated ``data`` section)."""
    remove_temporaries(*outputs.values(), manifest_path)  # what a killed prepare left
    size, max_resolution = data_cfg["image_size"], data_cfg["max_resolution"]
    if max_resolution is not None and max_resolution < size:
        raise InputError(
            f"data.max_resolution {max_resolution} is smaller than data.image_size {size}: training "
            f"crops of {size} px would be cut from smaller pictures. Use at least {size} (FFCV's "
            f"ImageNet example stores 400-500 px for 160-224 px training), or null"
        )
    source = get_source(data_cfg["source"], data_cfg["root"], data_cfg["download"])
    source.load(size, max_resolution)
    whole_train = max_resolution is not None and source.variable_size
    splits = split_indices(
        source.labels,
        data_cfg["val_fraction"],
        data_cfg["test_fraction"],
        data_cfg["split_seed"],
        source.fixed_test,
        data_cfg["train_fraction"],
    )
    empty = empty_classes(source.labels, splits["train"], source.num_classes)
    if empty:  # before any file is written: a model that never saw a class is no result
        names = [source.class_names[c] if c < len(source.class_names) else str(c) for c in empty]
        raise InputError(
            f"data.train_fraction: {data_cfg['train_fraction']} leaves {len(empty)} of the "
            f"{source.num_classes} classes of {source.name} with no training image ({', '.join(names)}; "
            f"{len(splits['train'])} training image(s) in all); use a larger data.train_fraction"
        )
    manifest = {
        "source": source.name,
        "image_size": size,
        "max_resolution": max_resolution,
        "train_stored_whole": whole_train,
        "num_classes": source.num_classes,
        "class_names": list(source.class_names),
        "split_seed": data_cfg["split_seed"],
        "train_fraction": data_cfg["train_fraction"],
        "official_test_split": source.fixed_test is not None,
        "splits": {},
    }
    for split in SPLITS:
        indices = splits[split]
        whole = whole_train and split == "train"
        write_beton(
            outputs[split],
            source,
            indices,
            max_resolution if whole else size,
            crop=not whole,
            write_mode=data_cfg["write_mode"],
            jpeg_quality=data_cfg["jpeg_quality"],
            compress_probability=data_cfg["compress_probability"],
            num_workers=data_cfg["write_workers"],
            chunk_size=data_cfg["chunk_size"],
            seed=data_cfg["split_seed"],
        )
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
    manifest[MANIFEST_DIGEST] = manifest_digest(manifest)
    write_json(manifest_path, manifest)
    return manifest


def check_split(cfg: dict, manifest: dict, path: Path) -> None:
    """A run of a split per seed (its config's ``data.split``) reads only its own seed's split."""
    want = cfg["data"].get("split_seed")
    if cfg["data"].get("split") == "per_seed" and manifest.get("split_seed") != want:
        raise InputError(
            f"{path} holds the split of split seed {manifest.get('split_seed')}, but {cfg['variant']} seed "
            f"{cfg['seed']} has its own split (data.split: per_seed, split seed {want}): give it "
            f"{Path(path).parent.parent.name}/seed{cfg['seed']}/'s files"
        )


def per_checkpoint(checkpoints: list, data, manifests) -> tuple[list[Path], list[Path]]:
    """The data file and manifest of each checkpoint: one pair for all, or one per checkpoint (a split per seed)."""
    data, manifests = (
        [data] if isinstance(data, (str, Path)) else list(data),
        ([manifests] if isinstance(manifests, (str, Path)) else list(manifests)),
    )
    if len(data) != len(manifests) or len(data) not in (1, len(checkpoints)):
        raise InputError(
            f"{len(checkpoints)} checkpoint(s), {len(data)} data file(s) and {len(manifests)} manifest(s): give "
            "one data file and manifest for all, or one of each per checkpoint"
        )
    n = len(checkpoints) if len(data) == 1 else 1
    return [Path(d) for d in data] * n, [Path(m) for m in manifests] * n


#: The key under which a manifest records the digest of everything else it holds.
MANIFEST_DIGEST = "manifest_sha256"


def manifest_digest(manifest: dict) -> str:
    """SHA-256 of a manifest's canonical JSON, without its own digest."""
    rest = {k: v for k, v in manifest.items() if k != MANIFEST_DIGEST}
    return hashlib.sha256(json.dumps(rest, sort_keys=True).encode()).hexdigest()


def load_manifest(path: str | Path, check_files: dict[str, Path] | None = None) -> dict:
    """Read a manifest and check it; with ``check_files`` check each split file too.

    The manifest's own digest (written by ``prepare``; a manifest from before
    digests were recorded is read unchecked) and each file's recorded size and SHA-256
    (``locvit.io.verified_sha256``: a large file is hashed once per version and
    machine). A missing, truncated, bit-flipped or replaced file raises an error that
    names it and how to rebuild it, before anything is read from it.
    """
    fix = (
        "Rebuild the prepared data: snakemake --cores all --forcerun prepare (or dvc repro --force prepare); "
        "the steps after it re-run too."
    )
    manifest = read_json(path, "dataset manifest", fix)
    recorded = manifest.get(MANIFEST_DIGEST) if isinstance(manifest, dict) else None
    if (
        not isinstance(manifest, dict)
        or "splits" not in manifest
        or (recorded is not None and recorded != manifest_digest(manifest))
    ):
        raise InputError(
            f"dataset manifest {path} is corrupt: it was changed after the prepare step wrote it "
            f"(its recorded digest does not match). {fix}"
        )
    for split, file in (check_files or {}).items():
        file = Path(file)
        expected = manifest["splits"][split]["file_bytes"]
        if not file.is_file():
            raise MissingFileError(f"FFCV file {file} is missing. {fix}")
        if file.stat().st_size != expected:
            raise InputError(
                f"FFCV file {file} has {file.stat().st_size} bytes, the manifest recorded {expected}: "
                f"it is truncated or was replaced. {fix}"
            )
        if verified_sha256(file) != manifest["splits"][split]["file_sha256"]:
            raise InputError(
                f"FFCV file {file} is corrupt: its SHA-256 differs from the one the manifest {path} "
                f"recorded when it was written. {fix}"
            )
    return manifest
