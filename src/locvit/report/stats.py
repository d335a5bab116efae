"""Statistics for comparing variants trained over a few seeds and scored on one finite test set.

A variant's test top-1 has two sources of error, and every interval here carries both:

- **seeds**: the spread of the seeds' accuracies (a t-part with n - 1 degrees of freedom);
- **the test set**: N images are a sample too. A variant's interval adds the binomial error of
  its pooled accuracy (Agresti-Coull's, never zero: seeds that agree still get an interval);
  a difference between two variants scored on the same images adds the error of the mean of
  the per-image differences instead (paired, as McNemar's test pairs them), which is smaller
  when both get the same images right.

The parts' squared standard errors add, and the degrees of freedom of their sum are
Welch-Satterthwaite's, as in Welch's test (with no test-set part every number below equals
Welch's test: tests/test_stats.py checks it against scipy's ``ttest_ind`` and statsmodels'
``ttost_ind``). Adding the seed part (which already holds the test set's noise of each seed)
to the test-set part counts that noise twice, a small and conservative excess.

For each comparison against a reference:

- :func:`compare`: the difference of means, its 95 % interval, Welch's two-sided p, and
  the p of two one-sided tests (TOST) that it lies within ``± margin`` points;
- :func:`mde`: the smallest difference the comparison detects with 80 % power at a given
  level (statsmodels' noncentral-t power, ``ttest_power``, inverted with scipy's brentq);
- :func:`holm`: Holm's step-down correction (equal to statsmodels' ``multipletests``, written out:
  see the function) over one
  family of comparisons: those against one reference (the table decides, see
  :class:`locvit.report.render.Table`);
- :func:`verdict`: ``better`` / ``worse`` (Holm-adjusted Welch p < 0.05), else
  ``equivalent`` (Holm-adjusted TOST p < 0.05), else ``undecided``.

What is ours: the variance parts and their Satterthwaite sum (no maintained library's t-test
takes a third, shared variance part), the verdict's rule and Holm's few lines (checked against
statsmodels'); the distributions and the power are scipy's and statsmodels'. Bootstrap intervals are absent: on 3 seeds
they are not meaningful.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

ALPHA = 0.05        # the tables' level, after Holm's correction
CONFIDENCE = 0.95   # intervals
POWER = 0.80        # the power of the minimum detectable effect
VERDICTS = ("baseline", "better", "worse", "equivalent", "undecided")


@dataclass(frozen=True)
class Part:
    """One part of an estimate's error: its squared standard error and degrees of freedom (inf: normal)."""

    var: float
    df: float


def satterthwaite(parts: Sequence[Part]) -> float:
    """Welch-Satterthwaite degrees of freedom of a sum of independent parts (inf when none has finite df)."""
    total = sum(p.var for p in parts)
    denominator = sum(p.var ** 2 / p.df for p in parts if p.var > 0 and math.isfinite(p.df))
    return total ** 2 / denominator if denominator > 0 else math.inf


def _t():
    from scipy.stats import t as student_t

    return student_t


def seed_part(values: Sequence[float]) -> Part:
    """The seeds' part of the error of their mean: ``std^2 / n`` with n - 1 degrees of freedom."""
    values = np.asarray(values, dtype=float)
    return Part(float(values.var(ddof=1)) / len(values), len(values) - 1)


def binomial_part(accuracy: float, n_images: int) -> Part:
    """The test set's part of a variant's accuracy (in points^2): Agresti-Coull's variance of a proportion,
    ``p~(1 - p~) / (N + z^2)`` with ``p~ = (x + z^2 / 2) / (N + z^2)``, so that 100 % still has an error."""
    from scipy.stats import norm

    z2 = float(norm.ppf(0.5 + CONFIDENCE / 2)) ** 2
    n_tilde = n_images + z2
    p_tilde = (accuracy / 100.0 * n_images + z2 / 2) / n_tilde
    return Part(1e4 * p_tilde * (1 - p_tilde) / n_tilde, math.inf)


def paired_part(hits_a: np.ndarray, hits_b: np.ndarray) -> Part:
    """The test set's part of a difference of two variants scored on the same images (in points^2):
    the variance of the mean of the per-image differences of their seed-averaged hits, ``(images, seeds)``
    bool arrays each, with N - 1 degrees of freedom."""
    d = hits_a.mean(axis=1) - hits_b.mean(axis=1)  # (images,): each image's accuracy difference
    return Part(1e4 * float(d.var(ddof=1)) / len(d), len(d) - 1)


@dataclass(frozen=True)
class Summary:
    """One variant's test top-1 over seeds; ``std``, ``se`` and the interval are None for a single seed.

    ``se`` (and the interval) include the test set's binomial error when the number of test
    images is known.
    """

    n: int
    mean: float
    std: float | None
    ci_low: float | None
    ci_high: float | None
    se: float | None = None
    df: float | None = None


def describe(values: Sequence[float], n_images: int | None = None) -> Summary:
    """n, mean, sample std (n - 1), and the 95 % t-interval of the mean from the seeds' part and, with
    ``n_images``, the test set's binomial part (Satterthwaite's degrees of freedom)."""
    n = len(values)
    if n == 0:
        raise ValueError("describe() needs at least one value")
    mean = float(np.mean(values))
    if n == 1:
        return Summary(1, mean, None, None, None)
    seeds = seed_part(values)
    parts = [seeds] + ([binomial_part(mean, n_images)] if n_images else [])
    se, df = math.sqrt(sum(p.var for p in parts)), satterthwaite(parts)
    if se == 0:
        return Summary(n, mean, 0.0, mean, mean, 0.0, df)
    low, high = _t().interval(CONFIDENCE, df, loc=mean, scale=se)
    return Summary(n, mean, math.sqrt(seeds.var * n), float(low), float(high), se, df)


@dataclass(frozen=True)
class Comparison:
    """``mean(a) - mean(b)``: its interval, Welch's p and the equivalence (TOST) p within ``± margin``.

    ``p`` is None when it cannot be computed, and ``why`` says so; ``paired`` says whether the
    test-set part used both variants' per-image results.
    """

    delta: float
    se: float | None = None
    df: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    p: float | None = None
    p_equivalent: float | None = None
    margin: float | None = None
    paired: bool = False
    why: str = ""


def compare(a: Sequence[float], b: Sequence[float], margin: float, n_images: int | None = None,
            hits: tuple[np.ndarray, np.ndarray] | None = None) -> Comparison:
    """Compare the seeds ``a`` of one variant with the seeds ``b`` of its reference.

    The error of the difference: both seed parts, plus the test set's part: paired over the images
    when ``hits`` gives both variants' per-image results ((images, seeds) bool arrays), else the
    two binomial parts of ``n_images`` (unpaired, larger), else none.
    """
    delta = float(np.mean(a) - np.mean(b))
    if len(a) < 2 or len(b) < 2:
        return Comparison(delta, why="needs at least 2 seeds on both sides")
    parts = [seed_part(a), seed_part(b)]
    if hits is not None:
        parts.append(paired_part(*hits))
    elif n_images:
        parts += [binomial_part(float(np.mean(a)), n_images), binomial_part(float(np.mean(b)), n_images)]
    se, df = math.sqrt(sum(p.var for p in parts)), satterthwaite(parts)
    if se == 0:
        return Comparison(delta, why="no spread: every seed of both gave the same value on the same images")
    t = _t()
    low, high = t.interval(CONFIDENCE, df, loc=delta, scale=se)
    p = float(2 * t.sf(abs(delta) / se, df))
    # TOST: H0 delta <= -margin (upper tail) and H0 delta >= +margin (lower tail); the larger p decides.
    p_eq = float(max(t.sf((delta + margin) / se, df), t.cdf((delta - margin) / se, df)))
    return Comparison(delta, se, df, float(low), float(high), p, p_eq, margin, hits is not None)


def mde(se: float, df: float, alpha: float = ALPHA, power: float = POWER) -> float:
    """The smallest true difference a two-sided t-test with standard error ``se`` and ``df`` degrees of
    freedom detects with ``power`` at level ``alpha`` (statsmodels' noncentral-t power, inverted)."""
    from scipy.optimize import brentq
    from statsmodels.stats.power import ttest_power

    def short(d: float) -> float:
        achieved = float(ttest_power(d, nobs=1, alpha=alpha, df=df, alternative="two-sided"))
        # scipy's noncentral t returns NaN far in its tail, where the power is 1 to double precision
        return (1.0 if math.isnan(achieved) else achieved) - power

    high = 1.0
    while short(high) < 0:
        high *= 2
    return brentq(short, 0.0, high, xtol=1e-10) * se


def holm(pvalues: Sequence[float | None]) -> list[float | None]:
    """Holm's step-down adjusted p-values, in the input order; ``None`` entries stay None and do not count.

    Written out (it equals statsmodels' ``multipletests(method="holm")``, which tests/test_stats.py checks)
    because statsmodels' runs a full ``gc.collect()`` on every call: a fraction of a second in a small process,
    seconds in one that holds models, and the report adjusts every table's comparisons."""
    given = sorted(((p, i) for i, p in enumerate(pvalues) if p is not None))
    adjusted: list[float | None] = [None] * len(pvalues)
    running = 0.0
    for rank, (p, i) in enumerate(given):  # the k-th smallest of m: min(1, (m - k) p), kept non-decreasing
        running = max(running, min(1.0, (len(given) - rank) * p))
        adjusted[i] = running
    return adjusted


def verdict(delta: float, p_holm: float | None, p_equivalent_holm: float | None) -> str:
    """``better`` / ``worse`` when the Holm-adjusted Welch p is below :data:`ALPHA`, else ``equivalent``
    when the Holm-adjusted TOST p is, else ``undecided`` (also when nothing could be tested)."""
    if p_holm is not None and p_holm < ALPHA:
        return "better" if delta > 0 else "worse"
    if p_equivalent_holm is not None and p_equivalent_holm < ALPHA:
        return "equivalent"
    return "undecided"
