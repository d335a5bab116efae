"""A validated study's runs: each variant's seeds and training fraction, and each run's resolved config.

A run config (``run_config``) is all one training run needs of params.yaml, resolved: model and keywords (with
the data's image size and class count), the data section at the variant's fraction, the variant's recipe over
the study's, with the epochs and warm-up of params' ``fraction_protocol`` (resolved away, like seed_budget). A
training job takes it as JSON (``validate_run_config``); MLflow records it as params (``flatten``).
"""

from __future__ import annotations

import copy
from typing import Any

from locvit.config import ConfigError, fraction_recipe, load_schema, non_finite, schema_errors

RUN_CONFIG_KEYS = ("study", "variant", "seed", "model", "model_kwargs", "data", "train")
OPTIONAL_RUN_CONFIG_KEYS = ("model_modules",)  # present only when params set them


def variant_seeds(params: dict, variant: str) -> list[int]:
    """The seeds a variant trains: its own (``seeds``, or what seed_budget gave it), else the study's."""
    return list(params["variants"][variant].get("seeds") or params["seeds"])


def seed_sets(params: dict) -> dict[tuple[int, ...], list[str]]:
    """The study's variants grouped by their seeds, the study's own seeds first (one Snakemake rule
    per group: a rule's outputs cannot depend on the variant)."""
    groups: dict[tuple[int, ...], list[str]] = {tuple(params["seeds"]): []}
    for name in params["variants"]:
        groups.setdefault(tuple(variant_seeds(params, name)), []).append(name)
    return {seeds: names for seeds, names in groups.items() if names}


def variant_fraction(params: dict, variant: str) -> float:
    """The fraction of the training split a variant trains on (its own, else data.train_fraction)."""
    return params["variants"][variant].get("train_fraction", params["data"]["train_fraction"])


def folder_data(params: dict, fraction: float, seed: int | None = None) -> dict:
    """The data section one data folder is prepared from: the study's at ``fraction``, with seed's split seed
    (``split_seed + seed`` with a split per seed), and no ``split`` key (a folder's split is its split seed)."""
    data = {k: v for k, v in copy.deepcopy(params["data"]).items() if k != "split"}
    shift = seed if seed is not None and params["data"].get("split") == "per_seed" else 0
    return data | {"train_fraction": fraction, "split_seed": data["split_seed"] + shift}


def run_data(params: dict, variant: str, seed: int) -> dict:
    """The data section one run trains on: its folder's (``folder_data``), marked ``split: per_seed`` where each
    seed has its own split; a fixed split's carries no ``split`` key."""
    data = folder_data(params, variant_fraction(params, variant), seed)
    return data | {"split": "per_seed"} if params["data"].get("split") == "per_seed" else data


def data_folders(params: dict) -> dict[str, tuple[float, int]]:
    """Each data folder of the study (``StudyLayout.data_name``) -> its training fraction and split seed: one
    per fraction, or one per fraction and seed (``data.split: per_seed``, seed k's split seed split_seed + k)."""
    from locvit.layout import StudyLayout

    layout = StudyLayout.of(params)
    pairs = {(variant_fraction(params, v), s) for v in params["variants"] for s in variant_seeds(params, v)}
    if params.get("mask_search"):
        pairs.add((params["data"]["train_fraction"], params["mask_search"]["seed"]))
    return {layout.data_name(f, s): (f, folder_data(params, f, s)["split_seed"]) for f, s in sorted(pairs)}


def run_config(params: dict, variant: str, seed: int) -> dict:
    """The fully resolved config of one training run (what MLflow records as params)."""
    from locvit.data.sources import get_source

    if variant not in params["variants"]:
        raise ConfigError([f"variants.{variant}: no such variant; defined: {', '.join(params['variants'])}"])
    spec = params["variants"][variant]
    source = get_source(params["data"]["source"], params["data"]["root"])  # imagefolder counts its class folders
    kwargs = dict(spec["kwargs"], img_size=params["data"]["image_size"], num_classes=source.num_classes)
    modules = {"model_modules": list(params["model_modules"])} if params.get("model_modules") else {}
    return {
        **modules,
        "study": params["study"],
        "variant": variant,
        "seed": int(seed),
        "model": spec["model"],
        "model_kwargs": kwargs,
        "data": run_data(params, variant, int(seed)),
        # the variant's recipe over the study's, its epochs for its training fraction (fraction_protocol)
        "train": fraction_recipe(
            {**params["train"], **spec["train"]},
            variant_fraction(params, variant),
            params.get("fraction_protocol", "same_epochs"),
        ),
    }


def validate_run_config(cfg: dict) -> dict:
    """Check a resolved run config (from ``run_config``) handed to a job as JSON."""
    missing = [k for k in RUN_CONFIG_KEYS if k not in cfg]
    extra = [k for k in cfg if k not in RUN_CONFIG_KEYS + OPTIONAL_RUN_CONFIG_KEYS]
    if missing or extra:
        raise ConfigError(
            [
                f"run config: missing keys {missing}, unknown keys {extra}; "
                f"expected exactly {', '.join(RUN_CONFIG_KEYS)}"
            ],
            "--run-config",
        )
    schema = load_schema()
    recipe = {**schema["$defs"]["recipe"], "required": list(schema["$defs"]["recipe"]["properties"])}
    sub = {
        **schema,
        "required": ["train", "data"],
        "properties": {"train": recipe, "data": schema["properties"]["data"]},
    }
    problems = non_finite(cfg) or schema_errors({"train": cfg["train"], "data": cfg["data"]}, sub)
    if problems:
        raise ConfigError(problems, "--run-config")
    return cfg


def train_resources(params: dict, variant: str) -> dict:
    """What the variant's training job asks the cluster for: the study's ``resources``, the variant's over them."""
    return {**params["resources"], **params["variants"][variant].get("resources", {})}


def peak_lr(recipe: dict) -> float:
    """The lr as given, or scaled by the global batch when lr_scale_batch is set (DeiT: lr x batch / 512)."""
    base = recipe["lr_scale_batch"]
    return recipe["lr"] * recipe["batch_size"] / base if base else recipe["lr"]


def flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    """``{'a': {'b': 1}} -> {'a.b': 1}`` (for MLflow params)."""
    out = {}
    for key, value in d.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out
