"""Pairing checked: two variants' per-image results are paired only over the same test split.

Each evaluation file records ``test_hash``, the content hash of the test split it scored in the
order it scored it (the manifest's ``content_sha256`` of the split); the report pairs two variants
only when every file of both records the same one, and otherwise says which files differ and
compares them unpaired.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from locvit.config import validate_params
from locvit.config.jobs import report_config
from locvit.io import JobConfig, pack_bits
from locvit.report import stats
from locvit.report.study import load_study, split_difference
from locvit.report.tables import results_table

SEEDS = [0, 1, 2]
VIT = {"patch_size": 4, "embed_dim": 48, "depth": 4, "num_heads": 3}
RIGHT = {"deit": [300, 305, 310], "lsa": [330, 331, 335]}  # test images right of 360, per seed
SPLIT = "a1" * 32


def params() -> dict:
    return validate_params(
        {
            "study": "pair",
            "data": {"source": "digits", "image_size": 32},
            "train": {"epochs": 3, "batch_size": 32},
            "seeds": SEEDS,
            "baseline": "deit",
            "variants": {v: {"model": "deit_tiny_patch16_224", "kwargs": VIT} for v in RIGHT},
        },
        check_models=False,
    )


def write_evals(root: Path, splits: dict[tuple[str, int], str | None], n_train: int | None = None) -> None:
    """Evaluation files as evaluate writes them; ``splits``: (variant, seed) -> test_hash (None: none recorded);
    with ``n_train``, of a study with a split per seed."""
    for variant, right in RIGHT.items():
        for seed, k in zip(SEEDS, right):
            hits = np.arange(360) < k
            record = {
                "study": "pair",
                "variant": variant,
                "seed": seed,
                "model": "deit_tiny_patch16_224",
                "split": "test",
                "test_top1": k / 360,
                "test_loss": 1.0,
                "n": 360,
                "test_hits": pack_bits(hits),
                "n_params": 1000,
                "checkpoint_epoch": 2,
                "val_top1": 0.9,
                "mlflow_run_id": f"{variant}{seed}",
                "data_hash": "0" * 16,
            }
            if n_train:
                record |= {"n_train": n_train, "data_split": "per_seed"}
            if splits.get((variant, seed), SPLIT) is not None:
                record["test_hash"] = splits.get((variant, seed), SPLIT)
            path = root / "eval" / variant / f"seed{seed}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(record))


def expected(paired: bool) -> stats.Comparison:
    values = {v: [100.0 * (k / 360) for k in right] for v, right in RIGHT.items()}
    hits = {v: np.stack([np.arange(360) < k for k in right], axis=1) for v, right in RIGHT.items()}
    return stats.compare(values["lsa"], values["deit"], 1.0, 360, (hits["lsa"], hits["deit"]) if paired else None)


def comparison(root: Path):
    study = load_study(JobConfig(report_config(params()), "report config"), root)
    table = results_table(study)
    lsa = next(row[1] for row in table.rows if row[1].variant == "lsa")
    return lsa, table.notes


def test_the_same_test_split_is_paired(tmp_path):
    write_evals(tmp_path, {})
    lsa, notes = comparison(tmp_path)
    assert lsa.test.paired and lsa.unpaired is None
    assert lsa.test == expected(paired=True) != expected(paired=False)
    assert not any("not paired" in n for n in notes)


def test_another_test_split_is_unpaired_and_the_report_names_the_files(tmp_path):
    write_evals(tmp_path, {("deit", 1): "b2" * 32})
    lsa, notes = comparison(tmp_path)
    assert not lsa.test.paired and lsa.test == expected(paired=False)
    [note] = [n for n in notes if "not paired" in n]
    assert note.startswith("lsa vs deit: not paired over the test images: ")
    assert "eval/deit/seed1.json scored test split b2b2b2b2b2b2" in note
    assert (
        "eval/lsa/seed0.json, eval/lsa/seed1.json, eval/lsa/seed2.json, eval/deit/seed0.json, "
        "eval/deit/seed2.json scored test split a1a1a1a1a1a1" in note
    )


def test_a_file_without_the_record_is_unpaired(tmp_path):
    write_evals(tmp_path, {("lsa", 2): None})
    lsa, notes = comparison(tmp_path)
    assert not lsa.test.paired and lsa.test == expected(paired=False)
    assert any("eval/lsa/seed2.json record no test split" in n for n in notes)


def test_a_split_per_seed_is_paired_by_seed(tmp_path):
    """data.split: per_seed: seed k of both variants scored seed k's own test split: paired by seed, Nadeau and
    Bengio's corrected resampled t with J - 1 df, for the difference and each variant; a seed whose split
    differs between the variants is left out of the pairs, and with fewer than two pairs left each side's
    corrected error is added; the report says which."""
    per_seed = {(v, s): f"{s:02d}" * 32 for v in RIGHT for s in SEEDS}
    write_evals(tmp_path, per_seed, n_train=1077)
    lsa, notes = comparison(tmp_path)
    values = {v: [100.0 * (k / 360) for k in right] for v, right in RIGHT.items()}
    want = stats.compare(values["lsa"], values["deit"], 1.0, 360, resample=360 / 1077)
    assert lsa.test == want and lsa.test.paired and lsa.test.df == 2 and lsa.unpaired is None
    assert lsa.test.se**2 == pytest.approx((1 / 3 + 360 / 1077) * np.var(np.subtract(*values.values()), ddof=1))
    assert lsa.summary.df == 2 and lsa.seed_splits == {s: f"{s:02d}" * 32 for s in SEEDS}
    assert any("data.split: per_seed" in n and "corrected resampled t" in n for n in notes)
    write_evals(tmp_path, {**per_seed, ("deit", 1): "ff" * 32}, n_train=1077)
    lsa, notes = comparison(tmp_path)
    pairs = [[values[v][0], values[v][2]] for v in ("lsa", "deit")]
    assert lsa.test == stats.compare(*pairs, 1.0, resample=360 / 1077) and lsa.test.df == 1
    assert lsa.unpaired == "lsa vs deit: seed(s) 1 left out: not run on the same split by both"
    write_evals(tmp_path, {**per_seed, ("deit", 1): "ff" * 32, ("deit", 2): "ee" * 32}, n_train=1077)
    lsa, notes = comparison(tmp_path)
    parts = [stats.Part(stats.resampled(v, None, 360 / 1077)[1], 2) for v in (values["lsa"], values["deit"])]
    assert not lsa.test.paired and lsa.test.se**2 == pytest.approx(parts[0].var + parts[1].var)
    assert lsa.test.df == pytest.approx(stats.satterthwaite(parts))
    assert "not paired by seed: fewer than 2 seeds on the same split" in lsa.unpaired


@pytest.mark.parametrize(
    "files, differs",
    [({"a": "x", "b": "x"}, False), ({"a": "x", "b": "y"}, True), ({"a": "x", "b": None}, True), ({"a": None}, True)],
)
def test_split_difference(files, differs):
    assert (split_difference(files) is not None) == differs


def test_the_test_hash_follows_the_order_scored():
    """The hash evaluate records is the split's content in its order: the same images in another order
    (whose per-image results would not line up) give another hash."""
    from locvit.data.prepare import content_hash
    from locvit.data.sources import get_source

    source = get_source("digits", "data")
    source.load(8, None)
    indices = np.arange(20)
    assert content_hash(source, indices) == content_hash(source, indices.copy())
    assert content_hash(source, indices) != content_hash(source, indices[::-1])
