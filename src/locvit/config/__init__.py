"""The one validated config: ``params.yaml`` read and checked against its JSON schema.

``params.schema.yaml`` (package data, ``SCHEMA``) declares every key once (type, default, description).
``load_params`` rejects unknown keys, wrong types, out-of-range values and NaN/infinity naming the key and
what is allowed, fills defaults (the default ``baseline`` from the family protocol), expands
``train_fractions`` and ``seed_budget``, holds the study within its ``limits``, then checks what a schema
cannot: a coherent recipe and every variant's model (``locvit.config.models.check_model``). Nothing runs or is
written before this passes. A validated study's runs and their configs: ``locvit.config.run``.
"""

from __future__ import annotations

import copy
import difflib
import functools
import math
import os
from importlib import resources
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from locvit.config.models import check_model, claiming_family
from locvit.errors import LocvitError
from locvit.io import cache_file, remember

#: The schema of params.yaml: package data, inside the installed package as in a checkout.
SCHEMA = resources.files("locvit") / "config" / "params.schema.yaml"
# Keys the pipeline sets itself from the data section; a variant may not override them.
PIPELINE_KWARGS = ("img_size", "num_classes")


class ConfigError(LocvitError, ValueError):
    """A config that breaks the schema; ``problems`` lists one message per bad key."""

    def __init__(self, problems: list[str], source: str = "params.yaml"):
        self.problems = problems
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"{source} is invalid ({len(problems)} problem(s)); nothing was run:\n{lines}")


@functools.cache
def _schema() -> dict:
    return yaml.load(SCHEMA.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # libyaml if built


def load_schema() -> dict:
    """The schema, parsed once per process; a copy the caller may change."""
    return copy.deepcopy(_schema())


def _key(path) -> str:
    return ".".join(str(p) for p in path) or "<top level>"


def _describe(err: jsonschema.ValidationError) -> str:
    """One readable line for a schema error: the key, what is wrong, what is allowed."""
    key = _key(err.absolute_path)
    schema = err.schema if isinstance(err.schema, dict) else {}
    if err.validator == "additionalProperties":
        allowed = sorted(schema.get("properties", {}))
        extra = sorted(set(err.instance) - set(allowed)) if isinstance(err.instance, dict) else []
        where = f"under '{key}'" if err.absolute_path else "at the top level"
        hints = []
        for name in extra:
            close = difflib.get_close_matches(name, allowed, n=1)
            hints.append(f"'{name}'" + (f" (did you mean '{close[0]}'?)" if close else ""))
        return f"unknown key {', '.join(hints)} {where}; allowed keys: {', '.join(allowed)}"
    if err.validator == "enum":
        return f"{key}: {err.instance!r} is not allowed; allowed values: {', '.join(map(repr, err.validator_value))}"
    if err.validator == "pattern":
        if "x-pattern-message" in schema:  # what the pattern means, said in words
            return f"{key}: {err.instance!r} {schema['x-pattern-message']}"
        if "file name" in schema.get("description", ""):
            return (
                f"{key}: name {err.instance!r} is not safe as a file name; use letters, digits, '_' and '-', "
                "starting with a letter or digit (at most 64)"
            )
        return f"{key}: {err.instance!r} does not match the pattern {err.validator_value!r}"
    return f"{key}: {err.message}"


def non_finite(value: Any, path: tuple = ()) -> list[str]:
    """One line per NaN or infinite number in ``value`` (parsed YAML or JSON), naming its key.

    Checked before the schema, which cannot: NaN compares false with every bound, so ``minimum`` and
    ``maximum`` pass it, and ``multipleOf`` raises on it. No key of params takes infinity."""
    if isinstance(value, float) and not math.isfinite(value):
        return [f"{_key(path)}: {value!r} is not a finite number"]
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in non_finite(v, (*path, k))]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in non_finite(v, (*path, i))]
    return []


def schema_errors(params: Any, schema: dict) -> list[str]:
    """One line per way ``params`` breaks ``schema`` (a part of ``load_schema``'s), sorted by key."""
    validator = jsonschema.Draft202012Validator(schema)
    problems = []
    for err in sorted(validator.iter_errors(params), key=lambda e: list(map(str, e.absolute_path))):
        problems.append(_describe(err))
    return problems


def _fill_defaults(params: dict, schema: dict) -> dict:
    """Fill the declared defaults of the top-level sections (not of variant overrides)."""
    out = _fill_defaults_section(params, schema)
    for section in ("data", "train", "analysis", "mask_search", "tracking", "limits"):
        if section not in out:  # an optional section left out (mask_search)
            continue
        sub = schema["properties"][section]
        sub = schema["$defs"][sub["$ref"].split("/")[-1]] if "$ref" in sub else sub
        out[section] = _fill_defaults_section(out[section], sub)
    out["resources"] = {**schema["properties"]["resources"]["default"], **out["resources"]}  # key by key
    if out.get("seed_budget"):  # an optional section: its keys' defaults once it is given
        out["seed_budget"] = _fill_defaults_section(out["seed_budget"], schema["properties"]["seed_budget"])
    for variant in out["variants"].values():
        variant.setdefault("kwargs", {})
        variant.setdefault("train", {})
    if out.get("baseline") is None:
        out["baseline"] = default_baseline(out["variants"], out["model_modules"])
    return out


def fraction_name(variant: str, fraction: float) -> str:
    """``deit_25pct``: the name train_fractions gives a variant's copy at another fraction."""
    return f"{variant}_{round(100 * fraction)}pct"


def _expand_fractions(params: dict) -> list[str]:
    """train_fractions: each variant at each fraction (in place); the problems found, if any."""
    fractions = params.get("train_fractions")
    if not fractions:
        return []
    default = params["data"]["train_fraction"]
    problems = [
        f"train_fractions: {f} is not a whole percent (e.g. 0.1, 0.25)"
        for f in fractions
        if abs(100 * f - round(100 * f)) > 1e-9
    ]
    if default not in fractions:
        problems.append(
            f"train_fractions: {fractions} must include data.train_fraction ({default}), the fraction "
            "whose runs keep the variants' own names"
        )
    if problems:
        return problems
    expanded = {}
    for name, spec in params["variants"].items():
        for f in sorted(fractions, reverse=True):
            new = name if f == default else fraction_name(name, f)
            if len(new) > 64:
                problems.append(
                    f"train_fractions: variant {name!r} at {f} would be named {new!r}, longer than 64 "
                    "characters; shorten the variant's name"
                )
            if new in expanded or (new != name and new in params["variants"]):
                problems.append(f"train_fractions: variant {name!r} at {f} would be named {new!r}, which is taken")
            expanded[new] = {**spec, "train_fraction": f, "base": name}
    params["variants"] = expanded
    return problems


#: How a training fraction is trained (params' ``fraction_protocol``): the recipe's epochs, or ConViT's
#: equal images seen (d'Ascoli et al., ICML 2021, arXiv 2103.10697: epochs x 1/f).
FRACTION_PROTOCOLS = ("same_epochs", "same_images")


def fraction_recipe(recipe: dict, fraction: float, protocol: str) -> dict:
    """The recipe a run on ``fraction`` of the training split trains with under ``protocol``.

    ``same_epochs``: the recipe as it is (f of a full run's images and optimiser steps). ``same_images``:
    ``epochs / f`` rounded to a whole epoch (at least 1), and ``warmup_epochs`` scaled by the same factor
    (the warm-up keeps its share of the schedule), so a run sees about as many images as a full one.
    """
    if protocol not in FRACTION_PROTOCOLS:
        raise ConfigError(
            [
                f"fraction_protocol: {protocol!r} is not allowed; allowed values: "
                f"{', '.join(map(repr, FRACTION_PROTOCOLS))}"
            ]
        )
    if protocol == "same_epochs" or fraction >= 1:
        return dict(recipe)
    epochs = max(1, round(recipe["epochs"] / fraction))
    factor = epochs / recipe["epochs"]
    return {**recipe, "epochs": epochs, "warmup_epochs": round(recipe["warmup_epochs"] * factor, 6)}


def seed_cost(fraction: float, protocol: str) -> float:
    """What one seed on ``fraction`` of the training split costs, in full runs' images seen: f at the same
    epochs, a whole run at the same images seen (``fraction_recipe``)."""
    return fraction if protocol == "same_epochs" else 1.0


def budget_seeds(seeds: list[int], fraction: float, budget: dict | None, protocol: str = "same_epochs") -> list[int]:
    """The seeds of a variant trained on ``fraction`` of the training split under ``seed_budget``:
    ``round(full_runs / cost)`` of them, with a seed's cost in full runs' images seen (``seed_cost``:
    f under ``same_epochs``, 1 under ``same_images``), at least the study's ``seeds`` and at most
    ``max_seeds``; the extra ones count up from the largest of ``seeds``."""
    if not budget:
        return list(seeds)
    wanted = min(budget["max_seeds"], round(budget["full_runs"] / seed_cost(fraction, protocol)))
    extra = max(0, wanted - len(seeds))
    return list(seeds) + list(range(max(seeds) + 1, max(seeds) + 1 + extra))


def _budget_seeds(params: dict) -> None:
    """seed_budget: each variant's ``seeds`` from its training fraction (in place; a variant's own seeds stay)."""
    budget = params.get("seed_budget")
    if budget:
        for name, spec in params["variants"].items():
            fraction = spec.get("train_fraction", params["data"]["train_fraction"])  # a train_fractions copy's own
            spec.setdefault("seeds", budget_seeds(params["seeds"], fraction, budget, params["fraction_protocol"]))


def _check_limits(params: dict, own_seeds: set[str]) -> list[str]:
    """The study stays within ``limits``: seeds per variant (seed_budget's included) and runs in all, each
    counted as ``locvit.config.run.variant_seeds`` counts them. ``own_seeds``: the variants that set
    their own ``seeds`` (the others' come from ``seeds`` or seed_budget)."""
    limits, problems = params["limits"], []
    most = load_schema()["properties"]["limits"]["properties"]  # how far each limit may be raised
    counts = {name: len(spec.get("seeds") or params["seeds"]) for name, spec in params["variants"].items()}
    name, seeds = max(counts.items(), key=lambda item: item[1])
    if seeds > limits["max_seeds_per_variant"]:
        key = (
            f"variants.{params['variants'][name].get('base', name)}.seeds"
            if name in own_seeds
            else "seed_budget"
            if params.get("seed_budget")
            else "seeds"
        )
        problems.append(
            f"{key}: variant {name!r} would train {seeds} seeds, more than limits.max_seeds_per_variant "
            f"({limits['max_seeds_per_variant']}); use fewer seeds, or raise limits.max_seeds_per_variant "
            f"(at most {most['max_seeds_per_variant']['maximum']})"
        )
    runs = sum(counts.values())
    if runs > limits["max_runs"]:
        problems.append(
            f"variants: {len(counts)} variant(s) x their seeds would make {runs} training runs, more than "
            f"limits.max_runs ({limits['max_runs']}); use fewer variants, fractions or seeds, or raise "
            f"limits.max_runs (at most {most['max_runs']['maximum']})"
        )
    return problems


def default_baseline(variants: dict, modules: list[str] = ()) -> str | None:
    """The variant the results table compares every other one with when ``baseline`` is not given: the
    first whose model a baseline family claims (``locvit.models.family.Family.baseline``: DeiT/ViT,
    ``deit*``, ``vit_*``), else none. ``modules``: params' ``model_modules``, whose families count too."""
    return next(
        (
            name
            for name, v in variants.items()
            if (family := claiming_family(v["model"], modules)) and family["baseline"]
        ),
        None,
    )


def _check_baseline(params: dict) -> list[str]:
    if params["baseline"] is None or params["baseline"] in params["variants"]:
        return []
    return [
        f"baseline: {params['baseline']!r} is not a variant of this study; allowed: "
        f"{', '.join(params['variants'])} (or null: the first variant of a baseline family, e.g. DeiT)"
    ]


def _fill_defaults_section(section: dict, schema: dict) -> dict:
    out = copy.deepcopy(section)
    for key, spec in schema.get("properties", {}).items():
        if "default" in spec and key not in out:
            out[key] = copy.deepcopy(spec["default"])
    return out


def _check_fraction_epochs(params: dict) -> list[str]:
    """Each run's epochs under fraction_protocol stay within what a run config may hold (the schema's maximum)."""
    problems = []
    most = load_schema()["$defs"]["recipe"]["properties"]["epochs"]["maximum"]  # what a run config may hold
    for name, variant in params["variants"].items():  # the epochs a fraction's run gets (fraction_protocol)
        recipe = {**params["train"], **variant["train"]}
        fraction = variant.get("train_fraction", params["data"]["train_fraction"])
        epochs = fraction_recipe(recipe, fraction, params["fraction_protocol"])["epochs"]
        if epochs > most:
            problems.append(
                f"variants.{name}: fraction_protocol same_images trains {recipe['epochs']} epochs / "
                f"{fraction} = {epochs} epochs, more than {most}; use fewer epochs, a larger "
                "fraction or fraction_protocol: same_epochs"
            )
    return problems


def _check_semantics(params: dict) -> list[str]:
    """What the schema cannot say: recipe coherence and models that build."""
    from locvit.data.sources import get_source  # data sources know their class count

    problems = []
    recipes = {"train": params["train"]}
    # A variant's recipe is checked only where it overrides something (else train's message says it all).
    recipes.update(
        {f"variants.{n}.train": {**params["train"], **v["train"]} for n, v in params["variants"].items() if v["train"]}
    )
    for where, recipe in recipes.items():
        if recipe["min_lr"] > recipe["lr"]:
            problems.append(f"{where}.min_lr: {recipe['min_lr']} is larger than lr {recipe['lr']}")
        if recipe["warmup_epochs"] >= recipe["epochs"] and recipe["warmup_epochs"] > 0:
            problems.append(
                f"{where}.warmup_epochs: {recipe['warmup_epochs']} must be smaller than epochs ({recipe['epochs']})"
            )
        if (recipe["mixup"] > 0 or recipe["cutmix"] > 0) and recipe["batch_size"] % 2:
            problems.append(
                f"{where}.batch_size: MixUp/CutMix pair images within a batch, so it must be even "
                f"(got {recipe['batch_size']}); or set mixup and cutmix to 0"
            )
    if any(k % 2 == 0 for k in params["analysis"]["als_kernel"]):
        problems.append(
            f"analysis.als_kernel: {params['analysis']['als_kernel']} must be odd in both directions "
            "(a neighbourhood centred on the patch)"
        )
    source = get_source(params["data"]["source"], params["data"]["root"])  # imagefolder counts its class folders
    problems.extend(_check_sizes(params, source))
    problems.extend(_check_search(params, source.num_classes))
    for name, variant in params["variants"].items():
        owned = [key for key in PIPELINE_KWARGS if key in variant["kwargs"]]
        problems.extend(
            f"variants.{name}.kwargs.{key}: set by the pipeline from the data section "
            f"(data.image_size / the dataset's classes); remove it from the variant"
            for key in owned
        )
        if not owned:
            size, modules = params["data"]["image_size"], params["model_modules"]
            found = check_model(name, variant, size, source.num_classes, modules)
            problems.extend(p for p in found if p not in problems)  # a model_modules entry that fails: said once
    return problems


def _check_sizes(params: dict, source) -> list[str]:
    """Where the source knows its labels without its images (digits, CIFAR): each variant's training split
    holds at least one batch and an image of every class, and the test split ``analysis.images``. The split
    is the prepare step's own (``locvit.data.splits.split_indices``); other sources are checked when
    prepared and when trained (the loop refuses an epoch without an optimiser step). A pass is remembered:
    scikit-learn (the labels, the split) takes a second to import in every ``snakemake -n``."""
    from locvit.data import sources, splits

    runs = sorted(
        {
            (v.get("train_fraction", params["data"]["train_fraction"]), {**params["train"], **v["train"]}["batch_size"])
            for v in params["variants"].values()
        }
    )
    try:
        versions = [version(package) for package in ("scikit-learn", "numpy")]
    except PackageNotFoundError:  # no scikit-learn (the GPU node): no labels known, nothing remembered
        return _size_problems(params, source)
    key = [source.name, params["data"], runs, params["analysis"]["images"], versions]
    stamp = cache_file("size-checks", key, [Path(__file__), Path(sources.__file__), Path(splits.__file__)])
    if stamp.exists():
        return []
    problems = _size_problems(params, source)
    if not problems:
        remember(stamp)
    return problems


def _size_problems(params: dict, source) -> list[str]:
    known = source.known_labels()
    if known is None:
        return []
    from locvit.data.splits import empty_classes, split_indices

    labels, fixed_test = known
    data, problems = params["data"], []
    splits = {}
    for name, variant in params["variants"].items():
        fraction = variant.get("train_fraction", data["train_fraction"])
        if fraction not in splits:
            splits[fraction] = split_indices(
                labels, data["val_fraction"], data["test_fraction"], data["split_seed"], fixed_test, fraction
            )
        train = splits[fraction]["train"]
        where = (
            "train_fractions"
            if params.get("train_fractions")
            else f"variants.{name}.train_fraction"
            if "train_fraction" in variant
            else "data.train_fraction"
        )
        batch_key = f"variants.{name}.train.batch_size" if "batch_size" in variant["train"] else "train.batch_size"
        batch = {**params["train"], **variant["train"]}["batch_size"]
        if len(train) < batch:
            lead = (
                f"{where}: {fraction} leaves {len(train)} training image(s) of {source.name}, fewer than one "
                f"batch ({batch_key} {batch})"
                if fraction < 1
                else f"{batch_key}: {batch} is more than the {len(train)} images of the training split of "
                f"{source.name} "
                f"(data.val_fraction {data['val_fraction']}, data.test_fraction {data['test_fraction']})"
            )
            problems.append(
                f"{lead}: not one optimiser step per epoch (a partial batch is dropped); use a batch of at "
                f"most {len(train)}" + (" or a larger fraction" if fraction < 1 else "")
            )
        empty = empty_classes(labels, train, source.num_classes)
        if empty:
            problems.append(
                f"{where}: {fraction} leaves {len(empty)} of the {source.num_classes} classes of "
                f"{source.name} with no training image ({len(train)} training image(s) in all); use a larger fraction"
            )
    test = len(next(iter(splits.values()))["test"])  # the same at every fraction
    if params["analysis"]["images"] > test:
        problems.append(
            f"analysis.images: {params['analysis']['images']} is more than the {test} images of "
            f"the test split of {source.name} (data.test_fraction {data['test_fraction']}), whose first "
            f"analysis.images are analysed; use at most {test}"
        )
    return list(dict.fromkeys(problems))  # one message per key and numbers, not one per variant


def _check_split(params: dict) -> list[str]:
    """A split per seed gives each seed its own training files: one job per run."""
    if params["data"]["split"] == "per_seed" and params["train_jobs"] == "per_variant":
        return [
            "data.split: per_seed gives each seed its own training files, so one job cannot train a variant's "
            "seeds; use train_jobs: per_run, or data.split: fixed"
        ]
    return []


def _check_tracking(params: dict) -> list[str]:
    """``tracking.ui_url`` is an address the report's links can start with: no whitespace, a host."""
    url = params["tracking"]["ui_url"]
    if url is None:
        return []
    from urllib.parse import urlsplit

    if any(c.isspace() for c in url):
        return [
            f"tracking.ui_url: {url!r} holds whitespace; every link of the report would be broken. Give the "
            "address users open the MLflow UI at, e.g. http://mlflow.example.org:5000"
        ]
    try:
        parts = urlsplit(url)
        host, _ = parts.hostname, parts.port  # port: a ValueError when it is not a number in range
    except ValueError as err:
        return [f"tracking.ui_url: {url!r} is not a valid address ({err}); e.g. http://mlflow.example.org:5000"]
    if not host:
        return [f"tracking.ui_url: {url!r} names no host; e.g. http://mlflow.example.org:5000"]
    return []


def _check_search(params: dict, num_classes: int) -> list[str]:
    search = params.get("mask_search")
    if search is None:
        return []
    problems = []
    name = search["variant"]
    if name not in params["variants"]:
        problems.append(
            f"mask_search.variant: {name!r} is not a variant of this study; defined: {', '.join(params['variants'])}"
        )
    elif not any(key in params["variants"][name]["kwargs"] for key in PIPELINE_KWARGS):  # else: its own message
        # The search sets masked_heads, from round 0's "sch1" (locvit.analysis.search.INITIAL).
        variant = params["variants"][name]
        searched = {**variant, "kwargs": {**variant["kwargs"], "masked_heads": "sch1"}}
        if check_model(name, searched, params["data"]["image_size"], num_classes, params["model_modules"]):
            problems.append(
                f"mask_search.variant: {name!r} is a {variant['model']}, which does not build with "
                "masked_heads (the search sets it); the search needs a MaiT model (mait_*)"
            )
    if search["remove_below"] > search["all_above"]:
        problems.append(
            f"mask_search.remove_below: {search['remove_below']} is larger than all_above {search['all_above']}"
        )
    return problems


def validate_params(params: Any, source: str = "params.yaml", check_models: bool = True) -> dict:
    """Validate a parsed config; return it with defaults filled, or raise ``ConfigError``."""
    schema = load_schema()
    if not isinstance(params, dict):
        raise ConfigError([f"the file must hold a mapping of keys, not {type(params).__name__}"], source)
    problems = non_finite(params) or schema_errors(params, schema)
    if problems:
        raise ConfigError(problems, source)
    params = _fill_defaults(params, schema)
    problems = _expand_fractions(params)
    if problems:
        raise ConfigError(problems, source)
    own_seeds = {name for name, spec in params["variants"].items() if "seeds" in spec}
    _budget_seeds(params)
    problems = _check_limits(params, own_seeds)  # before anything that costs per run
    if problems:
        raise ConfigError(problems, source)
    problems = (
        _check_baseline(params)
        + _check_fraction_epochs(params)
        + _check_tracking(params)
        + _check_split(params)
        + (_check_semantics(params) if check_models else [])
    )
    if problems:
        raise ConfigError(problems, source)
    return params


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, except that a key given twice in one mapping is an error
    (plain YAML keeps the last one silently: two variants with one name would be one)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def load_params(path: str | os.PathLike = "params.yaml", check_models: bool = True) -> dict:
    """Read and validate ``params.yaml``."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError([f"{path} does not exist; copy params.yaml from the repository root"], str(path))
    try:
        raw = yaml.load(path.read_text(), Loader=_UniqueKeyLoader)
    except yaml.YAMLError as err:
        raise ConfigError([f"not valid YAML: {err}"], str(path)) from err
    return validate_params(raw, str(path), check_models=check_models)


def validate_section(name: str, section: dict, source: str) -> dict:
    """Validate one top-level section given on its own (as Snakemake hands it to a job)."""
    schema = load_schema()
    sub = {**schema, "required": [name], "properties": {name: schema["properties"][name]}}
    problems = non_finite(section, (name,)) or schema_errors({name: section}, sub)
    if problems:
        raise ConfigError(problems, source)
    return _fill_defaults_section(section, schema["properties"][name])
