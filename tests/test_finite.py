"""Only finite numbers: NaN and infinity are refused in every number of a study's params, naming the key.

JSON Schema's bounds compare false with NaN, so the schema alone lets ``train.lr: .nan`` through (and
``multipleOf`` raises on it); :func:`locvit.config.non_finite` walks the parsed params first. The keys tried
here are read from the schema itself: every number and integer it declares, in every section, in a variant's
overrides and in lists, so a key added later is tried too.
"""

from __future__ import annotations

import json
import math

import pytest

from locvit.config import ConfigError, load_schema, non_finite, validate_params, validate_section
from locvit.config.jobs import encode
from locvit.config.run import run_config, validate_run_config

#: A path step that stands for any name (a variant's): the first one the tiny preset has there.
ANY = "*"


def numeric_keys(spec: dict, path: tuple = ()) -> list[tuple]:
    """The path of every number or integer the schema ``spec`` declares (``ANY`` for a variant's name, 0 for a
    list's items)."""
    defs = load_schema()["$defs"]
    if "$ref" in spec:
        spec = {**defs[spec["$ref"].rsplit("/", 1)[1]], **{k: v for k, v in spec.items() if k != "$ref"}}
    kinds = spec.get("type", [])
    found = [path] if {"number", "integer"} & set([kinds] if isinstance(kinds, str) else kinds) else []
    for name, sub in spec.get("properties", {}).items():
        found += numeric_keys(sub, (*path, name))
    if isinstance(spec.get("additionalProperties"), dict):
        found += numeric_keys(spec["additionalProperties"], (*path, ANY))
    if isinstance(spec.get("items"), dict):
        found += numeric_keys(spec["items"], (*path, 0))
    return found


NUMERIC_KEYS = numeric_keys(load_schema())


def put(params: dict, path: tuple, value) -> str:
    """Set the key at ``path`` of ``params`` to ``value`` (a list: ``[value]``; a missing section: created);
    the key as messages name it (``variants.deit_a.train.lr``, ``train.betas.0``)."""
    where, named = params, []
    for step, after in zip(path, path[1:]):
        step = next(iter(where)) if step == ANY else step
        named.append(step)
        if isinstance(after, int):  # the list's items: one value
            where[step] = [value]
            return ".".join(map(str, (*named, after)))
        if not isinstance(where.get(step), dict):
            where[step] = {}
        where = where[step]
    where[path[-1]] = value
    return ".".join(map(str, (*named, path[-1])))


def test_the_schema_walk_finds_the_numbers_of_every_section():
    keys = {".".join(map(str, p)) for p in NUMERIC_KEYS}
    assert {
        "train.lr",
        "train.betas.0",
        "data.val_fraction",
        "tracking.system_metrics_s",
        "equivalence_margin",
        "mask_search.all_above",
        "seed_budget.full_runs",
        "train_fractions.0",
        "seeds.0",
        "limits.max_runs",
        "resources.gpus",
        "variants.*.train.lr",
        "variants.*.kwargs.drop_path_rate",
        "variants.*.seeds.0",
        "variants.*.resources.mem_mb",
        "variants.*.train_fraction",
    } <= keys, sorted(keys)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("path", NUMERIC_KEYS, ids=lambda p: ".".join(map(str, p)))
def test_every_number_of_the_schema_refuses_nan_and_infinity(raw_tiny, path, value):
    key = put(raw_tiny, path, value)
    with pytest.raises(ConfigError) as refused:  # and no other exception
        validate_params(raw_tiny)
    assert refused.value.problems == [f"{key}: {value!r} is not a finite number"]


def test_a_number_the_schema_does_not_declare_is_refused_too(raw_tiny):
    """A model's keyword arguments are free-form: they are walked all the same."""
    raw_tiny["variants"]["mait_b"]["kwargs"]["mlp_ratio"] = math.nan
    raw_tiny["train"]["betas"] = [0.9, math.inf]
    with pytest.raises(ConfigError) as refused:
        validate_params(raw_tiny)
    assert refused.value.problems == [
        "train.betas.1: inf is not a finite number",
        "variants.mait_b.kwargs.mlp_ratio: nan is not a finite number",
    ]


def test_finite_numbers_and_words_pass(tiny_params):
    assert non_finite(tiny_params) == [] and non_finite({"study": "nan", "ok": True, "n": 10**400}) == []


def test_a_job_config_with_nan_is_refused_and_never_written(tiny_params):
    """Configs handed to jobs as JSON (Python's json reads NaN) are walked too, and written as strict JSON."""
    cfg = run_config(tiny_params, "deit_a", 0)
    cfg["train"]["mixup"] = math.nan
    with pytest.raises(ConfigError, match=r"train\.mixup: nan is not a finite number"):
        validate_run_config(json.loads(json.dumps(cfg)))
    with pytest.raises(ConfigError, match=r"data\.val_fraction: inf is not a finite number"):
        validate_section("data", {**tiny_params["data"], "val_fraction": math.inf}, "--data-config")
    with pytest.raises(ValueError, match="not JSON compliant"):
        encode(cfg)
