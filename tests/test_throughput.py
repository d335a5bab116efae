"""Throughput side by side (locvit.analysis.throughput): every variant timed in one process, in
alternating rounds, so that two identical models measure alike and a model that does strictly
more work is not measured faster; the CSV it writes and reads back; the config key it needs.

The machine may be busy with other processes while this runs: the rounds alternate and the
results are medians over them, which is what keeps these comparisons steady.
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch
import yaml
from helpers import REPO

from locvit.analysis.throughput import measure_throughput
from locvit.config import ConfigError, validate_params
from locvit.config.jobs import throughput_config
from locvit.io import THROUGHPUT_COLUMNS, JobConfig, read_throughput

# The demo's sizes: patch 4 at 32x32 (8x8 grid + class token = 65 tokens), 48-d, 4 layers, 3 heads.
DEMO = {"patch_size": 4, "embed_dim": 48, "depth": 4, "num_heads": 3}


def _raw() -> dict:
    """The tiny preset at the demo's image size, without its mask search (its variant is replaced)."""
    raw = yaml.safe_load((REPO / "presets" / "tiny.yaml").read_text())
    raw["data"]["image_size"] = 32
    del raw["mask_search"]
    return raw


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> tuple[dict, Path]:
    """DeiT, its identical twin under another name, and the hard-masked MaiT of the same sizes, measured once."""
    raw = _raw()
    raw["variants"] = {
        "deit": {"model": "deit_tiny_patch16_224", "kwargs": DEMO},
        "deit_twin": {"model": "deit_tiny_patch16_224", "kwargs": DEMO},
        "mait_hard": {"model": "mait_tiny_patch16_224", "kwargs": {**DEMO, "masked_heads": "all", "mask_type": "hard"}},
    }
    raw["baseline"] = "deit"
    # about 0.2 s per variant and round: 5 rounds of 2 untimed + 16 timed batches of 32 images. One thread:
    # torch's threads wait for each other at every op, and on cores that other processes hold that wait
    # can cost more than the op (2 threads beside two training processes: 40 times slower).
    raw["analysis"] = {"profile_batch": 32, "profile_repeats": 16, "throughput_rounds": 5}
    out = tmp_path_factory.mktemp("throughput") / "report" / "throughput.csv"
    rows = measure_throughput(JobConfig(throughput_config(validate_params(raw, check_models=False))), out, threads=1)
    return rows, out


def test_identical_variants_measure_alike(measured):
    rows, _ = measured
    ratio = rows["deit_twin"]["ratio_vs_baseline"]
    assert 0.9 <= ratio <= 1.1, rows


def test_a_hard_masked_mait_is_not_faster_than_its_deit(measured):
    """MaiT's hard masks add work to DeiT's (a mask multiplied into every head's logits)."""
    rows, _ = measured
    assert rows["mait_hard"]["img_s_median"] <= rows["deit"]["img_s_high"], rows


def test_the_csv_has_its_columns_in_order_and_reads_back(measured):
    rows, out = measured
    with open(out, newline="") as f:
        lines = list(csv.reader(f))
    assert tuple(lines[0]) == THROUGHPUT_COLUMNS
    assert [line[0] for line in lines[1:]] == ["deit", "deit_twin", "mait_hard"]  # the study's order
    assert rows == read_throughput(out)
    assert rows["deit"]["ratio_vs_baseline"] == 1
    for row in rows.values():
        assert row["rounds"] == 5 >= 3
        assert 0 < row["img_s_low"] <= row["img_s_median"] <= row["img_s_high"]
        assert row["device"].startswith("cpu (") and row["device"].endswith(", 1 threads)")
    assert not list(out.parent.glob(".*.tmp"))  # written atomically: no temporary file left


def _tiny(**variant_models) -> dict:
    """The tiny preset (two 32-d, 2-layer models at 16x16) with a quick measurement: a fraction of a second."""
    raw = yaml.safe_load((REPO / "presets" / "tiny.yaml").read_text())
    raw["analysis"] = {"profile_batch": 4, "profile_repeats": 1, "throughput_rounds": 3}
    for name, model in variant_models.items():
        raw["variants"][name]["model"] = model
    return raw


def test_the_cli_measures_every_variant_of_a_study(tmp_path, capsys):
    from locvit.cli import main

    (tmp_path / "study.yaml").write_text(yaml.safe_dump(_tiny()))
    out = tmp_path / "throughput.csv"
    assert main(["throughput", "--params", str(tmp_path / "study.yaml"), "--out", str(out), "--threads", "1"]) == 0
    rows = read_throughput(out)
    assert list(rows) == ["deit_a", "mait_b"] and rows["deit_a"]["ratio_vs_baseline"] == 1  # the default baseline
    assert all(r["rounds"] == 3 and r["img_s_median"] > 0 for r in rows.values())
    assert "throughput of 2 variant(s), cpu (" in capsys.readouterr().out


def test_without_a_baseline_the_ratio_is_empty(tmp_path):
    params = validate_params(_tiny(deit_a="mait_tiny_patch16_224"), check_models=False)
    assert params["baseline"] is None  # no DeiT left to default to
    out, threads = tmp_path / "throughput.csv", torch.get_num_threads()
    rows = measure_throughput(JobConfig(throughput_config(params)), out, threads=threads + 1)
    assert torch.get_num_threads() == threads  # the caller's thread count, back
    assert [r["ratio_vs_baseline"] for r in rows.values()] == [None, None]
    assert all(line.split(",")[4] == "" for line in out.read_text().splitlines()[1:])


def test_a_corrupt_file_is_named(tmp_path):
    bad = tmp_path / "throughput.csv"
    with pytest.raises(FileNotFoundError, match="throughput file .*throughput.csv does not exist"):
        read_throughput(bad)
    bad.write_text("variant,img_s\ndeit,3\n")
    with pytest.raises(ValueError, match=f"throughput file {bad} is corrupt .*header"):
        read_throughput(bad)
    bad.write_text(",".join(THROUGHPUT_COLUMNS) + "\ndeit,12.5,10,x,1,5,cpu\n")
    with pytest.raises(ValueError, match=f"throughput file {bad} is corrupt .*line 2"):
        read_throughput(bad)
    bad.write_text(",".join(THROUGHPUT_COLUMNS) + "\ndeit,12.5,10\n")
    with pytest.raises(ValueError, match="line 2 has 3 fields"):
        read_throughput(bad)


def test_fewer_than_three_rounds_is_refused():
    raw = _raw()
    raw["analysis"] = {"throughput_rounds": 2}
    with pytest.raises(ConfigError, match="analysis.throughput_rounds: 2 is less than the minimum of 3"):
        validate_params(raw, check_models=False)


def test_each_variant_is_timed_under_its_runs_precision_and_memory_format(tmp_path, monkeypatch):
    """A variant whose run trains with ``amp: bf16`` and ``channels_last`` is timed under bf16 autocast on an
    NHWC batch; one with ``amp: off``, in float32 (on the CPU ``auto`` is off, as in training)."""
    from locvit.analysis import throughput

    raw = _raw()
    raw["variants"] = {
        "deit_bf16": {
            "model": "deit_tiny_patch16_224",
            "kwargs": DEMO,
            "train": {"amp": "bf16", "channels_last": True},
        },
        "deit_fp32": {"model": "deit_tiny_patch16_224", "kwargs": DEMO, "train": {"amp": "off"}},
    }
    raw["analysis"] = {"profile_batch": 4, "profile_repeats": 1, "throughput_rounds": 3}
    seen = {}
    config = throughput_config(validate_params(raw, check_models=False))
    built = throughput._build(config)
    for variant, b in built.items():
        b.model.register_forward_hook(
            lambda m, args, out, v=variant: seen.setdefault(
                v,
                (torch.is_autocast_enabled("cpu"), args[0].is_contiguous(memory_format=torch.channels_last), out.dtype),
            )
        )
    monkeypatch.setattr(throughput, "_build", lambda params: built)
    measure_throughput(config, tmp_path / "t.csv", threads=1)
    assert seen == {"deit_bf16": (True, True, torch.bfloat16), "deit_fp32": (False, False, torch.float32)}
