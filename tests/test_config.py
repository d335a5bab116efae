"""Config validation: each kind of bad value is rejected with a message naming the key."""

from __future__ import annotations

import json

import pytest
import yaml

from locvit.config import ConfigError, load_params, validate_params
from locvit.config.run import run_config


def _error(params) -> str:
    with pytest.raises(ConfigError) as info:
        validate_params(params)
    return str(info.value)


def test_the_shipped_configs_are_valid(repo):
    for path in [repo / "params.yaml", *sorted((repo / "presets").glob("*.yaml"))]:
        params = load_params(path)
        assert params["variants"], path


def test_defaults_are_filled(tiny_params):
    assert tiny_params["train"]["weight_decay"] == 0.05  # schema default, not in the preset
    assert tiny_params["data"]["write_mode"] == "raw"
    assert tiny_params["variants"]["deit_a"]["train"] == {}


def test_unknown_top_level_key(raw_tiny):
    raw_tiny["seed"] = 3
    assert "unknown key 'seed' (did you mean 'seeds'?) at the top level" in _error(raw_tiny)


def test_unknown_nested_key_names_the_section_and_allowed_keys(raw_tiny):
    raw_tiny["train"]["learning_rate"] = 0.1
    msg = _error(raw_tiny)
    assert "unknown key 'learning_rate'" in msg and "under 'train'" in msg and "allowed keys:" in msg and "lr" in msg


def test_wrong_type(raw_tiny):
    raw_tiny["train"]["epochs"] = "ten"
    assert "train.epochs: 'ten' is not of type 'integer'" in _error(raw_tiny)


def test_out_of_range(raw_tiny):
    raw_tiny["variants"]["deit_a"]["train"] = {"lr": -1}
    assert "variants.deit_a.train.lr: -1 is less than or equal to the minimum of 0" in _error(raw_tiny)


def test_enum_lists_allowed_values(raw_tiny):
    raw_tiny["data"]["source"] = "mnist"
    assert "data.source: 'mnist' is not allowed; allowed values: 'digits', 'cifar10', 'cifar100', 'imagenet'" in _error(
        raw_tiny
    )


@pytest.mark.parametrize("name", ["../x", "a/b", "with space", ".hidden", ""])
def test_unsafe_variant_names(raw_tiny, name):
    raw_tiny["variants"][name] = raw_tiny["variants"]["deit_a"]
    msg = _error(raw_tiny)
    assert "variants" in msg and repr(name) in msg and "not safe as a file name" in msg


def test_missing_required_and_empty_lists(raw_tiny):
    del raw_tiny["variants"]["deit_a"]["model"]
    raw_tiny["seeds"] = []
    msg = _error(raw_tiny)
    assert "variants.deit_a: 'model' is a required property" in msg
    assert "seeds: [] should be non-empty" in msg


def test_duplicate_seeds(raw_tiny):
    raw_tiny["seeds"] = [0, 0]
    assert "seeds: [0, 0] has non-unique elements" in _error(raw_tiny)


def test_unknown_model_suggests_close_names(raw_tiny):
    raw_tiny["variants"]["deit_a"]["model"] = "deit_tiny_patch16_22"
    msg = _error(raw_tiny)
    assert "variants.deit_a.model: 'deit_tiny_patch16_22' is not a registered timm model" in msg
    assert "deit_tiny_patch16_224" in msg


def test_kwargs_that_do_not_build(raw_tiny):
    raw_tiny["variants"]["deit_a"]["kwargs"]["embed_dim"] = 33  # not divisible by 2 heads
    assert "variants.deit_a.kwargs: deit_tiny_patch16_224 does not build" in _error(raw_tiny)


def test_pipeline_owned_kwargs_are_refused(raw_tiny):
    raw_tiny["variants"]["deit_a"]["kwargs"]["img_size"] = 224
    assert "variants.deit_a.kwargs.img_size: set by the pipeline" in _error(raw_tiny)


def test_incoherent_recipe(raw_tiny):
    raw_tiny["train"]["min_lr"] = 0.5
    raw_tiny["train"]["warmup_epochs"] = 5
    msg = _error(raw_tiny)
    assert "train.min_lr: 0.5 is larger than lr" in msg and "train.warmup_epochs: 5 must be smaller" in msg
    raw_tiny["train"] = {"batch_size": 63, "mixup": 0.8}
    assert "train.batch_size: MixUp/CutMix pair images within a batch, so it must be even (got 63)" in _error(raw_tiny)


def test_not_a_mapping_and_bad_yaml(tmp_path):
    assert "must hold a mapping" in _error([1, 2])
    bad = tmp_path / "p.yaml"
    bad.write_text("study: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_params(bad)
    with pytest.raises(ConfigError, match="does not exist"):
        load_params(tmp_path / "missing.yaml")


def test_run_config_merges_variant_overrides(raw_tiny):
    raw_tiny["variants"]["mait_b"]["train"] = {"lr": 0.01}
    params = validate_params(raw_tiny)
    cfg = run_config(params, "mait_b", 1)
    assert cfg["train"]["lr"] == 0.01 and cfg["train"]["epochs"] == 2 and cfg["seed"] == 1
    assert cfg["model_kwargs"]["img_size"] == 16 and cfg["model_kwargs"]["num_classes"] == 10
    with pytest.raises(ConfigError, match="no such variant"):
        run_config(params, "nope", 0)


def test_cli_rejects_a_bad_config_and_writes_nothing(tmp_path, raw_tiny, capsys):
    from locvit.cli import main

    raw_tiny["train"]["batch_size"] = 0
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(raw_tiny))
    out = tmp_path / "out"
    code = main(
        [
            "prepare",
            "--params",
            str(bad),
            "--train",
            str(out / "t.beton"),
            "--val",
            str(out / "v.beton"),
            "--test",
            str(out / "s.beton"),
            "--manifest",
            str(out / "m.json"),
        ]
    )
    assert code == 2
    assert "train.batch_size: 0 is less than the minimum of 1" in capsys.readouterr().err
    assert not out.exists()


def test_a_model_that_built_once_is_not_built_again(raw_tiny, tmp_path, monkeypatch):
    """check_model remembers a passing build (timm's import is most of `snakemake -n`); failures stay fresh."""
    import locvit.config.models as model_checks

    monkeypatch.setenv("LOCVIT_CACHE_DIR", str(tmp_path))
    builds = []
    real = model_checks._build_model
    monkeypatch.setattr(model_checks, "_build_model", lambda *a: builds.append(a[0]) or real(*a))
    validate_params(raw_tiny)
    assert sorted(builds) == ["deit_a", "mait_b"] and len(list((tmp_path / "model-checks").iterdir())) == 2
    validate_params(raw_tiny)
    assert len(builds) == 2  # both remembered
    raw_tiny["variants"]["deit_a"]["kwargs"]["depth"] = 3  # another model: built
    validate_params(raw_tiny)
    assert builds[2:] == ["deit_a"]
    raw_tiny["variants"]["deit_a"]["kwargs"]["patch_size"] = 5  # does not divide 16: refused, every time
    for _ in range(2):
        with pytest.raises(ConfigError, match="patch_size: 5 does not divide"):
            validate_params(raw_tiny)
    assert builds[3:] == ["deit_a", "deit_a"]


def test_a_split_that_passed_once_is_not_checked_again(raw_tiny, tmp_path, monkeypatch):
    """The split's size check remembers a pass (scikit-learn's import is a second of every `snakemake -n`);
    a failure is checked, and said, every time."""
    import locvit.config as config

    monkeypatch.setenv("LOCVIT_CACHE_DIR", str(tmp_path))
    checks = []
    real = config._size_problems
    monkeypatch.setattr(config, "_size_problems", lambda *a: checks.append(1) or real(*a))
    validate_params(raw_tiny)
    validate_params(raw_tiny)
    assert len(checks) == 1 and len(list((tmp_path / "size-checks").iterdir())) == 1
    raw_tiny["train"]["batch_size"] = 4096  # more than the training split: refused, every time
    for _ in range(2):
        with pytest.raises(ConfigError, match="train.batch_size: 4096 is more than the"):
            validate_params(raw_tiny)
    assert len(checks) == 3


def test_the_working_directory_is_on_sys_path_only_while_a_model_module_is_found(tmp_path, monkeypatch, repo):
    """params' model_modules are found in the working directory (a study's own family beside its params),
    through one helper that both the config check and the import use, and nothing else sees it there."""
    import os
    import sys

    from locvit.model_modules import working_dir_on_path

    monkeypatch.chdir(tmp_path)
    before = list(sys.path)
    with working_dir_on_path() as cwd:
        assert cwd == os.getcwd() and sys.path[0] == cwd
    assert sys.path == before
    with pytest.raises(KeyError), working_dir_on_path():
        raise KeyError("a failed import")
    assert sys.path == before
    inserting = [
        f.relative_to(repo).as_posix()
        for f in sorted((repo / "src").rglob("*.py"))
        if "sys.path.insert" in f.read_text()
    ]
    assert inserting == ["src/locvit/model_modules.py"]


def test_seed_budget_gives_smaller_fractions_more_seeds(raw_tiny):
    """round(full_runs / f) seeds, at least the study's, at most max_seeds; the extra ones count up from the
    largest; a variant's own seeds stay; variants with the same seeds form one group (one Snakemake rule)."""
    from locvit.config import budget_seeds
    from locvit.config.run import seed_sets, variant_seeds

    assert budget_seeds([0, 1, 2], 0.1, {"full_runs": 1, "max_seeds": 10}) == list(range(10))
    assert budget_seeds([0, 1, 2], 0.25, {"full_runs": 1, "max_seeds": 10}) == [0, 1, 2, 3]
    assert budget_seeds([0, 1, 2], 0.5, {"full_runs": 1, "max_seeds": 10}) == [0, 1, 2]  # round(2) < 3 seeds
    assert budget_seeds([5, 7], 0.1, {"full_runs": 1, "max_seeds": 4}) == [5, 7, 8, 9]  # capped
    assert budget_seeds([0, 1, 2], 0.1, {"full_runs": 1, "max_seeds": 2}) == [0, 1, 2]  # the study's seeds win
    assert budget_seeds([0, 1], 0.1, None) == [0, 1]
    raw_tiny["train_fractions"] = [0.1, 1.0]
    raw_tiny["seed_budget"] = {"full_runs": 0.5}  # max_seeds defaults to 10
    first = next(iter(raw_tiny["variants"]))
    raw_tiny["variants"][first]["seeds"] = [3, 4]
    params = validate_params(raw_tiny, check_models=False)
    assert params["seed_budget"]["max_seeds"] == 10
    for name, spec in params["variants"].items():
        want = params["seeds"] if spec["train_fraction"] == 1.0 else list(range(5))
        assert variant_seeds(params, name) == ([3, 4] if spec["base"] == first else want)
    groups = seed_sets(params)
    assert list(groups)[0] == tuple(params["seeds"]) and sum(map(len, groups.values())) == len(params["variants"])


def test_seed_budget_and_margin_are_checked(raw_tiny):
    raw_tiny["seed_budget"] = {"full_runs": 0}
    with pytest.raises(ConfigError, match="seed_budget.full_runs"):
        validate_params(raw_tiny, check_models=False)
    raw_tiny["seed_budget"] = {"max_seeds": 4}
    with pytest.raises(ConfigError, match="full_runs"):
        validate_params(raw_tiny, check_models=False)
    del raw_tiny["seed_budget"]
    raw_tiny["equivalence_margin"] = -1
    with pytest.raises(ConfigError, match="equivalence_margin"):
        validate_params(raw_tiny, check_models=False)


def test_the_default_baseline_is_the_first_variant_a_baseline_family_claims(raw_tiny, tmp_path, monkeypatch):
    """Families declare the model names they claim and whether they are baselines (locvit.models.family);
    a family of the study's own model_modules counts as locvit's do, and the answer is remembered."""
    import textwrap

    from locvit import models  # noqa: F401  registers locvit's families
    from locvit.config.models import claiming_family
    from locvit.models.family import family_claiming

    monkeypatch.setenv("LOCVIT_CACHE_DIR", str(tmp_path / "cache"))
    assert family_claiming("mait_cait_xxs24_224").name == "mait_cait"  # the longest prefix wins over mait_
    assert family_claiming("deit_tiny_patch16_224").baseline and not family_claiming("convit_tiny").baseline
    assert family_claiming("resnet50") is None
    assert validate_params(raw_tiny, check_models=False)["baseline"] == "deit_a"
    (tmp_path / "plain_family.py").write_text(
        textwrap.dedent("""
        from timm.models.vision_transformer import VisionTransformer
        from locvit.models.family import Family, register_family, vit_blocks, vit_sites

        class Plain(VisionTransformer):
            pass

        register_family(Family("plain", "Plain", Plain, "none", vit_blocks, lambda m: vit_sites(m, {}),
                               models=("plain_",), baseline=True))
    """)
    )
    monkeypatch.chdir(tmp_path)
    raw_tiny["model_modules"] = ["plain_family"]
    raw_tiny["variants"] = {
        "mait_b": raw_tiny["variants"]["mait_b"],
        "ours": {"model": "plain_vit"},
        "deit_a": raw_tiny["variants"]["deit_a"],
    }
    assert validate_params(raw_tiny, check_models=False)["baseline"] == "ours"
    assert len(list((tmp_path / "cache" / "model-families").iterdir())) == 3  # one answer per model name
    assert claiming_family("plain_vit", ["plain_family"]) == {"family": "plain", "baseline": True}
    for answer in (tmp_path / "cache" / "model-families").iterdir():  # half-written or foreign: asked again
        answer.write_text('{"family": "pl')
    assert claiming_family("plain_vit", ["plain_family"]) == {"family": "plain", "baseline": True}
    assert claiming_family("deit_tiny_patch16_224") == {"family": "deit", "baseline": True}


def test_a_model_module_that_fails_to_import_is_reported_once(raw_tiny, tmp_path, monkeypatch):
    """Every variant's model check imports params' model_modules first; a module that does not import is one
    problem of the study, not one per variant."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LOCVIT_CACHE_DIR", str(tmp_path / "cache"))
    raw_tiny["model_modules"] = ["no_such_family"]
    with pytest.raises(ConfigError) as refused:
        validate_params(raw_tiny)
    found = [p for p in refused.value.problems if p.startswith("model_modules:")]
    assert len(raw_tiny["variants"]) == 2 and len(found) == 1
    assert "cannot import 'no_such_family'" in found[0]


def test_a_study_is_held_within_its_limits(raw_tiny):
    """Seeds per variant (seed_budget's included) and runs in all, each refused with the number it would make
    and the key that raises it; a raised limit lets the study through, and the limits reach no job."""
    from locvit.config.jobs import job_configs

    raw_tiny["seeds"] = list(range(50_000))
    with pytest.raises(ConfigError) as refused:
        validate_params(raw_tiny, check_models=False)
    assert refused.value.problems == [
        "seeds: variant 'deit_a' would train 50000 seeds, more than limits.max_seeds_per_variant (100); use fewer "
        "seeds, or raise limits.max_seeds_per_variant (at most 1000)",
        "variants: 2 variant(s) x their seeds would make 100000 training runs, more than limits.max_runs (2000); "
        "use fewer variants, fractions or seeds, or raise limits.max_runs (at most 10000)",
    ]
    raw_tiny["seeds"] = [0, 1]
    raw_tiny["variants"]["mait_b"]["seeds"] = list(range(101))
    assert "variants.mait_b.seeds: variant 'mait_b' would train 101 seeds" in _error(raw_tiny)
    del raw_tiny["variants"]["mait_b"]["seeds"]
    raw_tiny["train_fractions"], raw_tiny["seed_budget"] = [0.1, 1.0], {"full_runs": 20, "max_seeds": 200}
    assert "seed_budget: variant 'deit_a_10pct' would train 200 seeds" in _error(raw_tiny)  # round(20 / 0.1)
    raw_tiny["limits"] = {"max_seeds_per_variant": 200, "max_runs": 3}
    assert "variants: 4 variant(s) x their seeds would make 440 training runs, more than limits.max_runs (3)" in _error(
        raw_tiny
    )  # each variant at 0.1: 200 seeds, at 1.0: round(20 / 1) = 20
    raw_tiny["limits"]["max_runs"] = 1000
    params = validate_params(raw_tiny, check_models=False)
    assert params["limits"] == {"max_seeds_per_variant": 200, "max_runs": 1000}
    assert all("limits" not in json.dumps(cfg) for cfg in job_configs(params).values())  # a bound re-runs nothing
    raw_tiny["limits"] = {"max_seeds_per_variant": 1001}
    assert "limits.max_seeds_per_variant: 1001 is greater than the maximum of 1000" in _error(raw_tiny)


def test_the_limits_hold_every_shipped_study(repo):
    from locvit.config import load_schema
    from locvit.config.run import variant_seeds

    limits = load_schema()["properties"]["limits"]["properties"]
    for path in [repo / "params.yaml", *sorted((repo / "presets").glob("*.yaml"))]:
        params = load_params(path, check_models=False)
        seeds = [len(variant_seeds(params, v)) for v in params["variants"]]
        assert max(seeds) * 10 <= limits["max_seeds_per_variant"]["default"], path  # far within: room to grow
        assert sum(seeds) * 10 <= limits["max_runs"]["default"], path


@pytest.mark.parametrize("folder", ["/tmp/results", "~/results", "../results", "results/../../x"])
def test_results_dir_stays_inside_the_working_directory(raw_tiny, folder):
    raw_tiny["results_dir"] = folder
    assert f"results_dir: {folder!r} is not a folder inside the working directory" in _error(raw_tiny)


def test_negative_stochastic_depth_and_a_misspelt_kwarg(raw_tiny):
    raw_tiny["variants"]["deit_a"]["kwargs"]["drop_path_rate"] = -0.1  # timm builds it as none, silently
    assert "variants.deit_a.kwargs.drop_path_rate: -0.1 is less than the minimum of 0" in _error(raw_tiny)
    raw_tiny["variants"]["deit_a"]["kwargs"]["drop_path_rate"] = 0.1
    raw_tiny["variants"]["deit_a"]["kwargs"]["num_head"] = raw_tiny["variants"]["deit_a"]["kwargs"].pop("num_heads")
    assert (
        "variants.deit_a.kwargs.num_head: deit_tiny_patch16_224 takes no keyword argument 'num_head'; "
        "did you mean 'num_heads'?"
    ) in _error(raw_tiny)
    raw_tiny["variants"]["deit_a"]["kwargs"]["num_heads"] = raw_tiny["variants"]["deit_a"]["kwargs"].pop("num_head")
    raw_tiny["variants"]["deit_a"]["kwargs"]["zzz"] = 1  # nothing close: the build's own words
    assert "variants.deit_a.kwargs: deit_tiny_patch16_224 does not build with" in _error(raw_tiny)
