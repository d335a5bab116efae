"""MaiT's ALS-guided mask search (Sec. 4.2): the rules, and a round derived from a known ALS file."""

from __future__ import annotations

import json

import pytest
from helpers import config_file

from locvit.analysis.search import assign, calibrate, next_spec, search_run_config, search_table
from locvit.cli import main

# ALS[layer][head] of a 4-layer, 3-head model whose head 0 is masked in every layer.
ALS = [[0.95, 0.40, 0.30], [0.50, 0.20, 0.10], [0.10, 0.05, 0.02], [0.80, 0.01, 0.90]]


def test_round_zero_masks_head_zero_everywhere():
    spec = next_spec(0)
    assert spec["masked_heads"] == "sch1"  # MaiT's Sch.1 is the first head of every layer


def test_assignment_follows_the_thresholds():
    spec, why = assign(ALS, [[0]] * 4, num_heads=3, all_above=0.8, remove_below=0.3)
    # 0.95 >= 0.8: all heads; 0.5 in between: keep; 0.1 < 0.3: remove; 0.8 is "at or above": all.
    assert spec == [[0, 1, 2], [0], [], [0, 1, 2]]
    assert "mask all 3 heads" in why[0] and "keep" in why[1] and "remove" in why[2]


def test_assignment_leaves_layers_without_head_zero_alone():
    spec, _ = assign(ALS, [[1], [0], [], [0]], num_heads=3, all_above=0.8, remove_below=0.3)
    assert spec[0] == [1] and spec[2] == []


def test_calibration_drops_only_heads_below_the_threshold():
    spec, why = calibrate(ALS, [[0, 1, 2], [0], [], [0, 1, 2]], remove_below=0.3)
    assert spec == [[0, 1, 2], [0], [], [0, 2]]  # head 1 of layer 3 (ALS 0.01) loses its mask
    assert "head 1 ALS 0.010 < 0.3: remove" in why[3] and why[0].endswith("unchanged")


def test_later_rounds_need_the_previous_round():
    with pytest.raises(ValueError, match="previous round"):
        next_spec(1)
    with pytest.raises(ValueError, match="not this search's model"):
        next_spec(2, {"round": 1, "masked_heads": [[0]] * 3}, ALS)


def test_cli_derives_a_round_from_a_known_als_file(tmp_path):
    (tmp_path / "spec0.json").write_text(json.dumps(next_spec(0)))
    (tmp_path / "analysis0.json").write_text(json.dumps({"als": ALS}))
    config = config_file({"variant": "mait_b", "all_above": 0.9, "remove_below": 0.45}, tmp_path / "search.json")
    for r, previous in ((1, "spec0.json"), (2, "spec1.json")):
        assert (
            main(
                [
                    "search-spec",
                    "--round",
                    str(r),
                    "--search-config",
                    config,
                    "--previous-spec",
                    str(tmp_path / previous),
                    "--previous-analysis",
                    str(tmp_path / "analysis0.json"),
                    "--out",
                    str(tmp_path / f"spec{r}.json"),
                ]
            )
            == 0
        )
    # Round 1 with these thresholds: 0.95 -> all, 0.5 -> keep, 0.1 -> remove, 0.8 -> keep.
    assert json.loads((tmp_path / "spec1.json").read_text())["masked_heads"] == [[0, 1, 2], [0], [], [0]]
    # Round 2 calibrates with the same ALS: heads 1 and 2 of layer 0 (0.40, 0.30) drop.
    assert json.loads((tmp_path / "spec2.json").read_text())["masked_heads"] == [[0], [0], [], [0]]


def test_a_bad_search_config_names_the_key(tmp_path, capsys):
    code = main(
        [
            "search-spec",
            "--round",
            "0",
            "--search-config",
            config_file({"variant": "m", "all_above": 2}, tmp_path / "search.json"),
            "--out",
            str(tmp_path / "spec.json"),
        ]
    )
    assert code == 2 and "mask_search.all_above" in capsys.readouterr().err
    assert not (tmp_path / "spec.json").exists()


def test_a_round_trains_the_base_variant_with_its_masks(tiny_params):
    from locvit.config.run import run_config

    base = run_config(tiny_params, "mait_b", 0)
    cfg = search_run_config(base, {"round": 1, "masked_heads": [[0, 1], []]})
    assert cfg["variant"] == "search_round1" and cfg["model"] == "mait_tiny_patch16_224"
    assert cfg["model_kwargs"]["masked_heads"] == [[0, 1], []]
    assert cfg["model_kwargs"]["embed_dim"] == 32 and cfg["seed"] == 0
    assert base["model_kwargs"]["masked_heads"] == "sch1"  # the base config is left alone


def test_the_table_reports_each_round(tiny_params):
    specs = [next_spec(0), {"round": 1, "masked_heads": [[0, 1], []], "rule": ["layer 0: x", "layer 1: y"]}]
    analyses = [{"als": [[0.9, 0.2], [0.1, 0.3]]}, {"als": [[0.8, 0.6], [0.2, 0.1]]}]
    evals = [
        {"val_top1": 0.5, "test_top1": 0.4, "mlflow_run_id": "a"},
        {"val_top1": 0.6, "test_top1": 0.55, "mlflow_run_id": "b"},
    ]
    rows = search_table(specs, analyses, evals)
    assert [r["masked_heads"] for r in rows] == [2, 2]
    assert rows[0]["mean_als_masked"] == pytest.approx((0.9 + 0.1) / 2)
    assert rows[1]["mean_als_masked"] == pytest.approx((0.8 + 0.6) / 2)
    assert rows[1]["test_top1"] == pytest.approx(55.0)
