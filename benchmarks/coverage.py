"""How often the report's intervals cover the truth, on a simulated crossed seeds x images model.

    .venv/bin/python -m benchmarks.coverage      # about 3 minutes on 2 cores; writes results/coverage.json

P(right) = expit(mu_v + a_i + e_vi + u_vs + w_vis): a per-image difficulty a shared by both variants, a
per-variant image effect e, a per-seed offset u and the image x seed interaction w, all normal. In the
failed-run cell a fifth of the runs lose 2 logits on every image. Per cell, REPLICATES draws of images and
seeds; locvit.report.stats applied to arrays of replicates. tests/test_stats.py asserts the bounds. The split
cells (``split_grid``, about 30 s) add a split effect on a finite dataset: a split per seed (``resampled``)
against one fixed split (``crossed``).
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats as sps
from scipy.special import expit

from locvit.report.stats import accuracy_interval, agreement_floor, crossed, resampled

SIGMA = {"image": 1.5, "variant_image": 0.7, "seed": 0.2, "interaction": 0.7}
#: (seeds, test images, accuracy, share of failed runs)
GRID = [(s, n, acc, 0.0) for s in (3, 5, 10) for n in (360, 10_000) for acc in (0.70, 0.95, 0.99)] + [
    (3, 360, 0.95, 0.2)
]
REPLICATES = 2000
FAILED_LOGITS = 2.0


def expected_accuracy(mu: float, fail: float = 0.0, extra: float = 0.0) -> float:
    """E over images and seeds of expit(mu + Z s), s^2 the sum of the model's variances plus ``extra`` (the split
    cells' SPLIT^2) (Gauss-Hermite)."""
    x, w = np.polynomial.hermite_e.hermegauss(80)
    s = math.sqrt(sum(v * v for v in SIGMA.values()) + extra)

    def at(m: float) -> float:
        return float((w * expit(m + s * x)).sum() / w.sum())

    return (1 - fail) * at(mu) + fail * at(mu - FAILED_LOGITS)


def location_for(accuracy: float, extra: float = 0.0) -> float:
    from scipy.optimize import brentq

    return brentq(lambda mu: expected_accuracy(mu, extra=extra) - accuracy, -30, 30)


def hit_counts(hits: np.ndarray) -> np.ndarray:
    """Each image's hits over the seeds (last axis), as a product with ones: a reduction over the short seed axis
    is several times slower."""
    return hits.astype(np.float32) @ np.ones(hits.shape[-1], np.float32)


def simulate(seeds: int, images: int, accuracy: float, fail: float, rng) -> dict[str, float]:
    """One cell: coverage of the 95 % interval of a difference (b makes 70 % of a's errors) overall and where
    the image component was truncated, type-I error at 5 % (b equal to a), and coverage of a variant's
    95 % interval (a's)."""
    mu_a, mu_alt = location_for(accuracy), location_for(1 - 0.7 * (1 - accuracy))
    truth_a = 100 * expected_accuracy(mu_a, fail)
    truth = truth_a - 100 * expected_accuracy(mu_alt, fail)
    n = {"covered": 0, "rejected": 0, "truncated": 0, "covered_truncated": 0, "variant_covered": 0}
    chunk = max(1, 2_000_000 // (images * seeds))
    for start in range(0, REPLICATES, chunk):
        r = min(chunk, REPLICATES - start)
        difficulty = rng.standard_normal((r, images, 1), dtype=np.float32) * SIGMA["image"]

        def logits():
            out = (
                difficulty
                + rng.standard_normal((r, images, 1), dtype=np.float32) * SIGMA["variant_image"]
                + rng.standard_normal((r, 1, seeds), dtype=np.float32) * SIGMA["seed"]
                + rng.standard_normal((r, images, seeds), dtype=np.float32) * SIGMA["interaction"]
            )
            return out - FAILED_LOGITS * (rng.random((r, 1, seeds)) < fail) if fail else out

        a = rng.random((r, images, seeds), dtype=np.float32) < expit(mu_a + logits())
        mean, var, df, _ = crossed(a)
        low, high = accuracy_interval(mean, var, df, images)
        n["variant_covered"] += int(((low <= truth_a) & (truth_a <= high)).sum())
        b_logit, u = logits(), rng.random((r, images, seeds), dtype=np.float32)
        for mu_b, truth_b in ((mu_a, 0.0), (mu_alt, truth)):  # the same draws: b equal to a, then better
            b = u < expit(mu_b + b_logit)
            delta, var, df, truncated = crossed(a, b)
            flat = var <= 0  # no spread at all: the report's agreement floor (stats.compare), normal
            disagree = (hit_counts(a) != hit_counts(b)).sum(-1)
            var, df = np.where(flat, agreement_floor(disagree, images), var), np.where(flat, np.inf, df)
            p = 2 * sps.t.sf(np.abs(delta - truth_b) / np.sqrt(var), df)
            if truth_b:
                n["covered"] += int((p >= 0.05).sum())
                n["truncated"] += int(truncated.sum())
                n["covered_truncated"] += int(((p >= 0.05) & truncated).sum())
            else:
                n["rejected"] += int((p < 0.05).sum())
    return {
        "coverage": n["covered"] / REPLICATES,
        "type_i": n["rejected"] / REPLICATES,
        "truncated": n["truncated"],
        "coverage_truncated": n["covered_truncated"] / n["truncated"] if n["truncated"] else None,
        "variant_coverage": n["variant_covered"] / REPLICATES,
    }


def run_grid() -> list[dict]:
    rng = np.random.default_rng(20)
    return [
        {"seeds": s, "images": n, "accuracy": acc, "failed_runs": fail, **simulate(s, n, acc, fail, rng)}
        for s, n, acc, fail in GRID
    ]


#: the split effects (logits): a model trained on the images T gets SPLIT * sum_{i in T} h_vi / sqrt(|T|); two
#: training sets of one dataset share most images, so most of it is the dataset's, which no resampling sees
SPLIT_EFFECTS = (0.15, 0.3)
#: (seeds, accuracy) of the split cells, on a dataset of DATASET images (digits') of which TEST test the models
SPLIT_GRID = [(s, acc) for s in (3, 5, 10) for acc in (0.70, 0.95)]
DATASET, TEST = 1797, 360
SPLIT_REPLICATES = 10_000


def split_cell(seeds: int, accuracy: float, split: float, rng) -> dict[str, dict[str, float]]:
    """One split cell: per design, ``simulate``'s coverage, type-I error and variant coverage, the truth over
    datasets, splits, seeds and images. per_seed: seed k tests on its own random TEST images (both variants),
    ``resampled``; fixed: one split for every seed, ``crossed``. The same dataset and draws for both."""
    extra, train = split**2, DATASET - TEST
    mu_a, mu_alt = location_for(accuracy, extra), location_for(1 - 0.7 * (1 - accuracy), extra)
    truth_a = 100 * expected_accuracy(mu_a, extra=extra)
    truth = truth_a - 100 * expected_accuracy(mu_alt, extra=extra)
    n = {d: {"covered": 0, "rejected": 0, "variant_covered": 0} for d in ("per_seed", "fixed")}
    chunk = max(1, 4_000_000 // (seeds * DATASET))
    for start in range(0, SPLIT_REPLICATES, chunk):
        r = min(chunk, SPLIT_REPLICATES - start)
        difficulty = rng.standard_normal((r, 1, DATASET), dtype=np.float32) * SIGMA["image"]
        own = rng.standard_normal((2, r, 1, DATASET), dtype=np.float32) * SIGMA["variant_image"]  # a's, b's
        h = rng.standard_normal((2, r, 1, DATASET), dtype=np.float32)
        per_seed = np.argpartition(rng.random((r, seeds, DATASET), dtype=np.float32), TEST, -1)[..., :TEST]
        fixed = np.argpartition(rng.random((r, 1, DATASET), dtype=np.float32), TEST, -1)[..., :TEST]
        offset = rng.standard_normal((2, r, seeds, 1), dtype=np.float32) * SIGMA["seed"]
        inter = rng.standard_normal((2, r, seeds, TEST), dtype=np.float32) * SIGMA["interaction"]
        u = rng.random((2, r, seeds, TEST), dtype=np.float32)
        for design, test in (("per_seed", per_seed), ("fixed", np.broadcast_to(fixed, per_seed.shape))):
            at = np.take_along_axis  # (r, seeds, TEST): each seed's test images
            on_train = h.sum(-1, keepdims=True) - at(h, test[None], -1).sum(-1, keepdims=True)
            logit = at(difficulty + own, test[None], -1) + split * on_train / math.sqrt(train) + offset + inter
            a = u[0] < expit(mu_a + logit[0])
            if design == "per_seed":
                acc_a = 100 * a.mean(-1)
                low, high = accuracy_interval(*resampled(acc_a, None, TEST / train), TEST)
            else:
                a = a.swapaxes(-1, -2)  # (r, images, seeds)
                mean, var, df, _ = crossed(a)
                low, high = accuracy_interval(mean, var, df, TEST)
            n[design]["variant_covered"] += int(((low <= truth_a) & (truth_a <= high)).sum())
            for mu_b, truth_b in ((mu_a, 0.0), (mu_alt, truth)):  # the same draws: b equal to a, then better
                b = u[1] < expit(mu_b + logit[1])
                if design == "per_seed":
                    delta, var, df = resampled(acc_a, 100 * b.mean(-1), TEST / train)
                else:
                    b = b.swapaxes(-1, -2)
                    delta, var, df, _ = crossed(a, b)
                    flat = var <= 0  # as in simulate: the agreement floor
                    disagree = (hit_counts(a) != hit_counts(b)).sum(-1)
                    var, df = np.where(flat, agreement_floor(disagree, TEST), var), np.where(flat, np.inf, df)
                with np.errstate(divide="ignore", invalid="ignore"):  # no spread: no p (compare), neither count
                    p = np.where(var > 0, 2 * sps.t.sf(np.abs(delta - truth_b) / np.sqrt(var), df), np.nan)
                if truth_b:
                    n[design]["covered"] += int((p >= 0.05).sum())
                else:
                    n[design]["rejected"] += int((p < 0.05).sum())
    return {
        design: {
            "coverage": c["covered"] / SPLIT_REPLICATES,
            "type_i": c["rejected"] / SPLIT_REPLICATES,
            "variant_coverage": c["variant_covered"] / SPLIT_REPLICATES,
        }
        for design, c in n.items()
    }


def split_grid(effects: tuple[float, ...] = SPLIT_EFFECTS) -> list[dict]:
    """The split cells at each split effect, on their own random stream (the other cells' draws stay as they were)."""
    rng = np.random.default_rng(22)
    return [
        {"split_effect": e, "seeds": s, "accuracy": acc, **split_cell(s, acc, e, rng)}
        for e in effects
        for s, acc in SPLIT_GRID
    ]


#: (seeds a side, accuracy, b better) of the probability-of-improvement cells; their replicates (each a bootstrap)
IMPROVEMENT_GRID = [(s, acc, better) for s in (10, 20) for acc in (0.70, 0.95) for better in (False, True)]
IMPROVEMENT_REPLICATES = 400


def improvement_coverage(seeds: int, accuracy: float, better: bool, rng, images: int = 360) -> dict:
    """Coverage of rliable's percentile bootstrap 95 % interval (scipy's, 4000 resamples) of P(a seed of a beats
    a seed of b), the truth given the replicate's test images from 400 more seeds a side, and how often the
    interval is one point (one side wins every pair). Why the report shows no such interval."""
    from scipy.stats import bootstrap, mannwhitneyu

    mu_a = location_for(accuracy)
    mu_b = location_for(1 - 0.7 * (1 - accuracy)) if better else mu_a
    covered = points = 0
    for _ in range(IMPROVEMENT_REPLICATES):
        difficulty = rng.standard_normal((images, 1)) * SIGMA["image"]
        own = {side: rng.standard_normal((images, 1)) * SIGMA["variant_image"] for side in ("a", "b")}

        def runs(side: str, mu: float, n: int) -> np.ndarray:
            seed = rng.standard_normal((1, n)) * SIGMA["seed"] + rng.standard_normal((images, n)) * SIGMA["interaction"]
            return 100 * (rng.random((images, n)) < expit(mu + difficulty + own[side] + seed)).mean(0)

        truth = mannwhitneyu(runs("a", mu_a, 400), runs("b", mu_b, 400)).statistic / 400**2
        a, b = runs("a", mu_a, seeds), runs("b", mu_b, seeds)

        def share(x, y, axis=-1):
            x, y = np.moveaxis(x, axis, -1)[..., :, None], np.moveaxis(y, axis, -1)[..., None, :]
            return (x > y).mean((-2, -1)) + (x == y).mean((-2, -1)) / 2

        ci = bootstrap((a, b), share, n_resamples=4000, method="percentile", vectorized=True, random_state=rng)
        low, high = ci.confidence_interval
        covered += bool(low <= truth <= high)
        points += bool(low == high)
    return {"coverage": covered / IMPROVEMENT_REPLICATES, "one_point": points / IMPROVEMENT_REPLICATES}


def main() -> None:
    from benchmarks.common import write_result

    cells = run_grid()
    rng = np.random.default_rng(21)
    improvement = [
        {"seeds": s, "accuracy": acc, "b_better": better, **improvement_coverage(s, acc, better, rng)}
        for s, acc, better in IMPROVEMENT_GRID
    ]
    result = {"replicates": REPLICATES, "sigma": SIGMA, "cells": cells, "improvement": improvement}
    result |= {"split_replicates": SPLIT_REPLICATES, "split": split_grid()}
    print(f"wrote {write_result('coverage', result)}")


if __name__ == "__main__":
    main()
