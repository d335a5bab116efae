"""The data-efficiency protocol (params' ``fraction_protocol``): how a fraction f of the training split trains.

``same_epochs`` keeps the recipe's epochs; ``same_images`` is ConViT's rule (d'Ascoli et al., ICML 2021):
epochs x 1/f with the warm-up scaled alike, so every fraction sees about a full run's images. seed_budget
counts a seed's cost in images seen. The last test estimates ``make efficiency``'s time from the committed
benchmark files (the demo's measured epochs and throughput) and checks the preset's budget keeps it under
an hour on the 2-core machine.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest
import yaml

from locvit.config import ConfigError, budget_seeds, fraction_recipe, load_params, seed_cost, validate_params
from locvit.config.jobs import job_configs
from locvit.config.run import run_config, validate_run_config, variant_fraction, variant_seeds
from locvit.layout import StudyLayout

REPO = Path(__file__).resolve().parents[1]
RECIPE = {"epochs": 25, "warmup_epochs": 3, "batch_size": 16}


def test_same_epochs_keeps_the_recipe():
    for f in (0.1, 0.25, 1.0):
        assert fraction_recipe(RECIPE, f, "same_epochs") == RECIPE


def test_same_images_scales_epochs_by_one_over_f_and_the_warm_up_alike():
    assert fraction_recipe(RECIPE, 0.1, "same_images") == {**RECIPE, "epochs": 250, "warmup_epochs": 30}
    assert fraction_recipe(RECIPE, 0.25, "same_images") == {**RECIPE, "epochs": 100, "warmup_epochs": 12}
    assert fraction_recipe(RECIPE, 0.5, "same_images") == {**RECIPE, "epochs": 50, "warmup_epochs": 6}
    assert fraction_recipe(RECIPE, 1.0, "same_images") == RECIPE
    # 25 / 0.3 = 83.3 epochs: rounded to 83; the warm-up keeps its share of the schedule (3 / 25 of it)
    thirty = fraction_recipe(RECIPE, 0.3, "same_images")
    assert thirty["epochs"] == 83 and thirty["warmup_epochs"] == pytest.approx(3 * 83 / 25)
    assert thirty["warmup_epochs"] / thirty["epochs"] == pytest.approx(3 / 25)
    # images seen: epochs x (f of the 1,167 training images) is a full run's, to within the rounding
    for f in (0.1, 0.25, 0.3, 0.5):
        seen = fraction_recipe(RECIPE, f, "same_images")["epochs"] * math.floor(f * 1167)
        assert seen == pytest.approx(25 * 1167, rel=0.02), f
    assert fraction_recipe({**RECIPE, "epochs": 1, "warmup_epochs": 0}, 0.6, "same_images")["epochs"] == 2
    with pytest.raises(ConfigError, match="fraction_protocol: 'same_steps' is not allowed"):
        fraction_recipe(RECIPE, 0.5, "same_steps")


def test_a_seed_costs_its_images_seen():
    assert seed_cost(0.1, "same_epochs") == 0.1 and seed_cost(0.1, "same_images") == 1.0
    one = {"full_runs": 1, "max_seeds": 10}
    assert budget_seeds([0, 1, 2], 0.1, one, "same_epochs") == list(range(10))  # ten tenths: one full run
    assert budget_seeds([0, 1, 2], 0.1, one, "same_images") == [0, 1, 2]  # one seed is a full run: the study's 3
    assert budget_seeds([0, 1, 2], 0.1, {"full_runs": 5, "max_seeds": 10}, "same_images") == [0, 1, 2, 3, 4]
    assert budget_seeds([0, 1, 2], 0.25, {"full_runs": 5, "max_seeds": 4}, "same_images") == [0, 1, 2, 3]
    assert budget_seeds([0, 1, 2], 0.1, one) == list(range(10))  # same_epochs is the default


@pytest.fixture
def fractions(raw_tiny) -> dict:
    raw_tiny["train_fractions"] = [0.25, 1.0]
    raw_tiny["train"]["epochs"], raw_tiny["train"]["warmup_epochs"] = 4, 1
    raw_tiny.pop("mask_search", None)
    return raw_tiny


def test_run_configs_hold_the_resolved_epochs(fractions):
    params = validate_params(fractions, check_models=False)
    assert params["fraction_protocol"] == "same_epochs"  # the default
    name = next(iter(fractions["variants"]))
    assert run_config(params, f"{name}_25pct", 0)["train"]["epochs"] == 4
    images = validate_params({**fractions, "fraction_protocol": "same_images"}, check_models=False)
    quarter, full = run_config(images, f"{name}_25pct", 0), run_config(images, name, 0)
    assert (quarter["train"]["epochs"], quarter["train"]["warmup_epochs"]) == (16, 4)
    assert (full["train"]["epochs"], full["train"]["warmup_epochs"]) == (4, 1)
    assert "fraction_protocol" not in quarter["train"] and validate_run_config(quarter) is quarter


def test_the_protocol_reaches_exactly_the_jobs_it_changes(fractions):
    """Its job configs: the training runs of the fractions below 1 change; the full-data runs (the same runs
    under either protocol) and the prepared data do not; the report's config names the protocol."""
    before = job_configs(validate_params(fractions, check_models=False))
    after = job_configs(validate_params({**fractions, "fraction_protocol": "same_images"}, check_models=False))
    assert before.keys() == after.keys()
    changed = {p for p in before if before[p] != after[p]}
    layout = StudyLayout.of(validate_params(fractions, check_models=False))
    params = validate_params(fractions, check_models=False)
    runs = {
        layout.train_config(v, s)
        for v in params["variants"]
        for s in variant_seeds(params, v)
        if variant_fraction(params, v) < 1
    }
    assert changed == runs | {layout.job_config("report")}
    assert after[layout.job_config("report")]["fraction_protocol"] == "same_images"


def test_too_many_epochs_are_refused_by_name(fractions):
    fractions["train"]["epochs"], fractions["train_fractions"] = 3000, [0.1, 1.0]
    name = next(iter(fractions["variants"]))
    with pytest.raises(
        ConfigError,
        match=f"variants.{name}_10pct: fraction_protocol same_images trains 3000 epochs "
        "/ 0.1 = 30000 epochs, more than 10000",
    ):
        validate_params({**fractions, "fraction_protocol": "same_images"}, check_models=False)
    validate_params(fractions, check_models=False)  # the same epochs: fine


def estimate_minutes(params: dict) -> float:
    """``make efficiency``'s wall time on the machine of the committed demo, from its benchmark files.

    ``benchmarks/results/pipeline.json`` holds the demo's measured job seconds per rule, its training
    epochs' seconds and its wall time; ``demo/throughput.csv`` each model's inference images/s. An epoch of
    a run costs a fixed part (the validation pass over the 270 validation images at the model's images/s,
    and MLflow's per-epoch share) plus a part per training image proportional to 1 / images/s, its constant
    fitted so that the demo's runs add up to its measured training seconds. A study's training time is
    that over its runs at their resolved epochs and fraction; each other rule's jobs cost the demo's
    average job; the job seconds become wall seconds at the demo's ratio (two jobs at a time on 2 cores).
    """
    bench = json.loads((REPO / "benchmarks/results/pipeline.json").read_text())
    speed = {
        r["variant"]: float(r["img_s_median"])
        for r in csv.DictReader((REPO / "benchmarks/results/demo/throughput.csv").open())
    }
    demo = load_params(REPO / "params.yaml", check_models=False)
    train_images, val_images = 1167, 270  # the digits split (data.val_fraction 0.15, test_fraction 0.2)
    rules, mlflow = bench["demo_breakdown"], bench["demo_mlflow"]
    runs = [(v, s) for v in demo["variants"] for s in variant_seeds(demo, v)]
    epochs = demo["train"]["epochs"]
    fixed = {v: val_images / speed[v] + mlflow["train_s"] / (len(runs) * epochs) for v in speed}
    full = train_images // demo["train"]["batch_size"] * demo["train"]["batch_size"]  # the last batch dropped
    per_image = (rules["train"]["epochs_s"] - sum(epochs * fixed[v] for v, _ in runs)) / sum(
        epochs * full / speed[v] for v, _ in runs
    )

    def demo_twin(name: str) -> str:  # the demo's variant with the same model: its measured images/s
        spec = params["variants"][name]
        return next(
            v for v, d in demo["variants"].items() if (d["model"], d["kwargs"]) == (spec["model"], spec["kwargs"])
        )

    train_s = 0.0
    for name in params["variants"]:
        recipe = run_config(params, name, 0)["train"]
        twin = demo_twin(name)
        images = math.floor(variant_fraction(params, name) * train_images + 1e-9)
        images = images // recipe["batch_size"] * recipe["batch_size"]
        epoch_s = fixed[twin] + per_image * images / speed[twin]
        train_s += len(variant_seeds(params, name)) * recipe["epochs"] * epoch_s

    def job(rule: str) -> float:
        return rules[rule]["job_s"] / rules[rule]["jobs"]

    variants, data = len(params["variants"]), len({variant_fraction(params, v) for v in params["variants"]})
    other_s = (
        variants * (rules["train"]["other_s"] / rules["train"]["jobs"] + job("evaluate") + job("analyse"))
        + data * job("prepare")
        + job("report")
        + rules["throughput"]["job_s"] * variants / len(demo["variants"])
    )
    return (train_s + other_s) * bench["demo_wall_s"] / mlflow["job_s"] / 60


def test_the_estimate_reproduces_the_demo_it_was_fitted_on():
    bench = json.loads((REPO / "benchmarks/results/pipeline.json").read_text())
    assert estimate_minutes(load_params(REPO / "params.yaml", check_models=False)) == pytest.approx(
        bench["demo_wall_s"] / 60, rel=0.01
    )


def test_the_presets_budget_keeps_make_efficiency_under_an_hour():
    """presets/data_efficiency.yaml: the anchors' protocol, 4 seeds at every fraction (each a full run's
    images): 80 runs, each fraction 4 full runs' compute, estimated under the hour; twice the budget would not be."""
    params = load_params(REPO / "presets" / "data_efficiency.yaml", check_models=False)
    assert params["fraction_protocol"] == "same_images"
    seeds = {v: variant_seeds(params, v) for v in params["variants"]}
    assert set(map(len, seeds.values())) == {4} and len(seeds) == 20
    cost = {
        f: sum(
            len(seeds[v]) * seed_cost(f, "same_images") for v in params["variants"] if variant_fraction(params, v) == f
        )
        for f in params["train_fractions"]
    }
    assert set(cost.values()) == {4 * 5}  # 5 families x 4 full runs at each fraction
    assert estimate_minutes(params) < 60
    raw = yaml.safe_load((REPO / "presets" / "data_efficiency.yaml").read_text())
    raw["seed_budget"]["full_runs"] = 8
    assert estimate_minutes(validate_params(raw, check_models=False)) > 60


def test_make_efficiency_protocol_writes_the_preset_under_that_protocol(tmp_path):
    """`make efficiency PROTOCOL=same_epochs`'s params file: the preset with the other protocol and the
    equal-epochs budget (more seeds at the smaller fractions, at most 10); its full-data runs are the
    preset's, so the two protocols share them."""
    import sys

    from doctools import efficiency_preset

    out = tmp_path / "same_epochs.yaml"
    sys.argv = ["efficiency_preset.py", "same_epochs", str(out)]
    efficiency_preset.main()
    epochs = load_params(out, check_models=False)
    images = load_params(REPO / "presets" / "data_efficiency.yaml", check_models=False)
    assert epochs["fraction_protocol"] == "same_epochs" and epochs["seed_budget"] == {"full_runs": 1, "max_seeds": 10}
    assert {v: len(variant_seeds(epochs, v)) for v in ("deit_10pct", "deit_25pct", "deit_50pct", "deit")} == {
        "deit_10pct": 10,
        "deit_25pct": 4,
        "deit_50pct": 3,
        "deit": 3,
    }
    assert run_config(epochs, "deit", 0) == run_config(images, "deit", 0)
    assert run_config(epochs, "deit_10pct", 0)["train"]["epochs"] == 25
    assert run_config(images, "deit_10pct", 0)["train"]["epochs"] == 250
