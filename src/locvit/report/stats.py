"""Statistics for comparing variants trained over a few seeds and scored on one finite test set.

Every interval carries both errors, the seeds' and the test set's. Per-image hits (``test_hits``, (images,
seeds) 0/1) form a crossed seeds x images design, whose mean's variance is a two-way random-effects model's
(Searle, Casella and McCulloch, *Variance Components*, 1992, ch. 4; Owen, Ann. Appl. Stat. 2007): ANOVA mean
squares (``crossed``), df by Satterthwaite's rule; without them the test set's part is Agresti-Coull's
binomial error (wider, never narrower). ``compare``, ``mde``, ``equivalence_bound``, ``holm`` and ``verdict``
decide a comparison; accuracy intervals stay in [0, 100] (``describe``), differences are cut to [-100, 100].
Ours: the decomposition, its degenerate cases, the verdict; scipy's: distributions, power, bootstrap.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

ALPHA = 0.05  # the tables' level, after Holm's correction
CONFIDENCE = 0.95  # intervals
POWER = 0.80  # the power of the minimum detectable effect
VERDICTS = ("baseline", "better", "worse", "equivalent", "undecided")
MOST_SEEDS = 10_000  # the most seeds per variant a power plan considers (seeds_needed)


@dataclass(frozen=True)
class Part:
    """One part of an estimate's error: its (signed) squared standard error and degrees of freedom (inf: normal)."""

    var: float
    df: float


def satterthwaite(parts: Sequence[Part]) -> float:
    """Satterthwaite's degrees of freedom of a sum of independent parts, ``(sum v)^2 / sum(v^2 / df)``
    (a part may enter with a negative sign); inf when no part has finite df."""
    total = sum(p.var for p in parts)
    denominator = sum(p.var**2 / p.df for p in parts if p.var != 0 and math.isfinite(p.df))
    return total**2 / denominator if denominator > 0 else math.inf


def _t():
    from scipy.stats import t as student_t

    return student_t


def _z2() -> float:
    from scipy.stats import norm

    return float(norm.ppf(0.5 + CONFIDENCE / 2)) ** 2


def seed_part(values: Sequence[float]) -> Part:
    """The seeds' part of the error of their mean: ``std^2 / n`` with n - 1 degrees of freedom."""
    values = np.asarray(values, dtype=float)
    return Part(float(values.var(ddof=1)) / len(values), len(values) - 1)


def binomial_part(accuracy: float, n_images: int) -> Part:
    """The test set's part of a variant's accuracy (in points^2) without per-image results: Agresti-Coull's
    variance of a proportion, ``p~(1 - p~) / (N + z^2)`` with ``p~ = (x + z^2 / 2) / (N + z^2)``."""
    z2 = _z2()
    n_tilde = n_images + z2
    p_tilde = (accuracy / 100.0 * n_images + z2 / 2) / n_tilde
    return Part(1e4 * p_tilde * (1 - p_tilde) / n_tilde, math.inf)


def _mean_squares(hits: np.ndarray):
    """Two-way ANOVA of ``(..., images, seeds)`` 0/1 hits: seed means, image means, the sample variance of
    the seed means and the interaction (residual) mean square, in fractions (not points)."""
    h = np.asarray(hits, dtype=np.float64)
    n_img, n_seed = h.shape[-2:]
    # sums as products with ones (BLAS: several times faster than a reduction over the short seed axis),
    # exact for 0/1 hits in any order, so the means are the bits h.mean would give
    seeds, images = (np.ones(n_img) @ h) / n_img, (h @ np.ones(n_seed)) / n_seed
    grand = seeds.mean(-1)
    total = np.einsum("...ij,...ij->...", h, h) - n_img * n_seed * grand**2
    ss_images = n_seed * ((images - grand[..., None]) ** 2).sum(-1)
    ss_seeds = n_img * ((seeds - grand[..., None]) ** 2).sum(-1)
    inter = np.maximum(total - ss_images - ss_seeds, 0.0) / ((n_img - 1) * (n_seed - 1))
    return seeds, images, seeds.var(-1, ddof=1), inter


def _satterthwaite(terms) -> tuple[np.ndarray, np.ndarray]:
    """The variance ``sum(v)`` of (value, df) terms and its Satterthwaite df (inf where no term varies). Arrays."""
    var = sum(v for v, _ in terms)
    den = sum(v**2 / d for v, d in terms)
    with np.errstate(divide="ignore", invalid="ignore"):
        df = np.where(den > 0, var**2 / np.where(den > 0, den, 1.0), np.inf)
    return var, df


def crossed(
    hits_a: np.ndarray, hits_b: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Mean (or difference of means) in points, its variance in points^2, its degrees of freedom and whether
    the image component was truncated, from ``(..., images, seeds)`` 0/1 hits (leading axes: independent
    replicates, e.g. of a simulation).

    One variant: ``S2_seeds / n + max(0, S2_images - MS_inter / n) / N``. A difference of two variants scored
    on the same images, with independent seeds: ``S2_seeds_a / n_a + S2_seeds_b / n_b + max(0, S2_d - MS_a /
    n_a - MS_b / n_b) / N``, ``S2_d`` the variance over images of the difference of the per-image hit rates.
    A seed term estimates the seed component and its share of the interaction, never negative; the image
    component is the ANOVA estimate, truncated at zero (the positive-part estimator), and the df are
    Satterthwaite's over the terms that remain, so a truncated estimate keeps only the seeds' df."""
    sa, ra, s2a, ia = _mean_squares(hits_a)
    n_img, na = np.shape(hits_a)[-2:]
    if hits_b is None:
        spread, seed_terms, inter = ra.var(-1, ddof=1), [(s2a / na, na - 1)], [(ia, na)]
        mean = 100 * sa.mean(-1)
    else:
        sb, rb, s2b, ib = _mean_squares(hits_b)
        nb = np.shape(hits_b)[-1]
        if np.shape(hits_b)[-2] != n_img:
            raise ValueError(f"paired hits need the same images: {n_img} and {np.shape(hits_b)[-2]}")
        spread, seed_terms = (ra - rb).var(-1, ddof=1), [(s2a / na, na - 1), (s2b / nb, nb - 1)]
        inter, mean = [(ia, na), (ib, nb)], 100 * (sa.mean(-1) - sb.mean(-1))
    kept = spread - sum(ms / n for ms, n in inter) > 0
    image_terms = [(np.where(kept, spread / n_img, 0.0), n_img - 1)] + [
        (np.where(kept, -ms / (n_img * n), 0.0), (n_img - 1) * (n - 1)) for ms, n in inter
    ]
    var, df = _satterthwaite(seed_terms + image_terms)
    return mean, 1e4 * var, df, ~kept


@dataclass(frozen=True)
class Components:
    """A paired difference's variance components in points^2 (``components``): each side's seed component,
    each side's image x seed interaction, and the paired image component."""

    seed_a: float
    seed_b: float
    inter_a: float
    inter_b: float
    image: float

    def error(self, seeds: int, images: int) -> tuple[float, float]:
        """The standard error (points) and Satterthwaite df of a difference at ``seeds`` per variant and
        ``images`` test images."""
        terms = [
            (self.seed_a / seeds + self.inter_a / (images * seeds), seeds - 1),
            (self.seed_b / seeds + self.inter_b / (images * seeds), seeds - 1),
            (self.image / images, images - 1),
        ]
        var, df = _satterthwaite([(np.float64(v), d) for v, d in terms])
        return math.sqrt(float(var)), float(df)


def components(hits_a: np.ndarray, hits_b: np.ndarray) -> Components:
    """The components a pilot's paired hits ((images, seeds) 0/1 each) estimate, negative ones truncated at
    zero as in ``crossed``."""
    _, ra, s2a, ia = _mean_squares(hits_a)
    _, rb, s2b, ib = _mean_squares(hits_b)
    n_img, na, nb = hits_a.shape[0], hits_a.shape[1], hits_b.shape[1]
    image = (ra - rb).var(ddof=1) - ia / na - ib / nb
    return Components(*(1e4 * max(float(x), 0.0) for x in (s2a - ia / n_img, s2b - ib / n_img, ia, ib, image)))


def seeds_needed(c: Components, delta: float, images: int, alpha: float, most: int | None = None) -> int | None:
    """The fewest seeds per variant at which a difference of ``delta`` points is detected with ``POWER``
    at level ``alpha`` on ``images`` test images (``mde`` at the projected error); None above ``most``."""

    most = most or MOST_SEEDS

    def enough(n: int) -> bool:
        se, df = c.error(n, images)
        return se == 0 or mde(se, df, alpha) <= delta

    if not enough(most):
        return None
    low, high = 1, 2  # enough(high), not enough(low) once the bracket is found
    while not enough(high):
        low, high = high, high * 2
    high = min(high, most)
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if enough(mid) else (mid, high)
    return high


def images_needed(c: Components, delta: float, alpha: float) -> int:
    """The fewest test images at which the image component alone, with unlimited seeds, leaves a difference of
    ``delta`` points detectable with ``POWER`` at level ``alpha`` (normal quantiles)."""
    from scipy.stats import norm

    z = float(norm.ppf(1 - alpha / 2) + norm.ppf(POWER))
    return max(2, math.ceil(z * z * c.image / (delta * delta)))


def agreement_floor(disagree: int, n_images: int) -> float:
    """The variance (points^2) of a difference whose runs show no spread at all: Agresti-Coull's variance
    of the share of the N images on which the two variants differ, ``disagree`` of them seen."""
    z2 = _z2()
    p = (disagree + z2 / 2) / (n_images + z2)
    return 1e4 * p * (1 - p) / (n_images + z2)


def wilson(mean, var, q, n):
    """Wilson's score interval (in points) of a proportion ``mean`` (points) whose estimate has variance
    ``var`` (points^2): at ``n`` effective images, quantile ``q``; inside [0, 100] by construction.
    Numbers or numpy arrays."""
    p = np.asarray(mean, dtype=float) / 100.0
    k = q * q / n
    centre = (p + k / 2) / (1 + k)
    half = q / (1 + k) * np.sqrt(np.maximum(var, 0.0) / 1e4 + q * q / (4 * n * n))
    return 100 * np.maximum(centre - half, 0.0), 100 * np.minimum(centre + half, 1.0)


def accuracy_interval(mean, var, df, n_images):
    """The 95 % interval of an accuracy (points) with variance ``var`` and ``df``: Wilson's at the effective
    number of images ``p(1 - p) / var`` with Student's quantile (Korn and Graubard, Survey Methodology 1998),
    at the N images where the error is zero or p is 0 or 1. Numbers or numpy arrays (a simulation's)."""
    p, var = np.asarray(mean, dtype=float) / 100.0, np.asarray(var, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        effective = np.where(
            (var > 0) & (p > 0) & (p < 1),
            1e4 * p * (1 - p) / np.where(var > 0, var, 1.0),
            np.nan if n_images is None else n_images,
        )
    return wilson(mean, var, _t().ppf(0.5 + CONFIDENCE / 2, df), effective)


@dataclass(frozen=True)
class Summary:
    """One variant's test top-1 over seeds; ``std``, ``se`` and the interval are None for a single seed."""

    n: int
    mean: float
    std: float | None
    ci_low: float | None
    ci_high: float | None
    se: float | None = None
    df: float | None = None


def describe(
    values: Sequence[float], n_images: int | None = None, hits: np.ndarray | None = None, resample: float | None = None
) -> Summary:
    """n, mean, sample std (n - 1), and the 95 % interval of the mean.

    The error: with ``hits`` ((images, seeds) 0/1) the crossed estimate (``crossed``); else the seeds'
    part plus, with ``n_images``, the test set's binomial part; else the seeds' alone; with ``resample`` (a
    split per seed) ``resampled``'s. The interval: ``accuracy_interval``."""
    n = len(values)
    if n == 0:
        raise ValueError("describe() needs at least one value")
    mean = float(np.mean(values))
    if n == 1:
        return Summary(1, mean, None, None, None)
    seeds = seed_part(values)
    if resample is not None:
        _, var, df = resampled(values, None, resample)
        var, df = float(var), float(df)
    elif hits is not None:
        _, var, df, _ = crossed(hits)
        var, df = float(var), float(df)
        n_images = hits.shape[0]
    else:
        parts = [seeds] + ([binomial_part(mean, n_images)] if n_images else [])
        var, df = sum(p.var for p in parts), satterthwaite(parts)
    se, std = math.sqrt(var), math.sqrt(seeds.var * n)
    if var == 0 and not n_images:
        return Summary(n, mean, std, mean, mean, 0.0, df)
    low, high = accuracy_interval(mean, var, df, n_images)
    return Summary(n, mean, std, float(low), float(high), se, df)


@dataclass(frozen=True)
class Comparison:
    """``mean(a) - mean(b)``: its intervals, Welch-Satterthwaite's p, the equivalence (TOST) p within
    ``± margin`` and the probability of improvement.

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
    ci90_low: float | None = None  # the interval TOST at 5 % decides on (inside ± margin: equivalent)
    ci90_high: float | None = None
    p_improvement: float | None = None  # P(a seed of a > a seed of b), ties 1/2; no interval (see its function)


def _interval(delta: float, se: float, df: float, confidence: float) -> tuple[float, float]:
    low, high = _t().interval(confidence, df, loc=delta, scale=se)
    return max(float(low), -100.0), min(float(high), 100.0)


def compare(
    a: Sequence[float],
    b: Sequence[float],
    margin: float,
    n_images: int | None = None,
    hits: tuple[np.ndarray, np.ndarray] | None = None,
    resample: float | tuple[float, float] | None = None,
) -> Comparison:
    """Compare the seeds ``a`` of one variant with the seeds ``b`` of its reference.

    The error of the difference: paired over the images when ``hits`` gives both variants' per-image
    results ((images, seeds) 0/1 arrays on the same images, ``crossed``); else both seed parts plus
    the two binomial parts of ``n_images`` (unpaired, wider), else the seed parts alone (Welch's test).
    When the paired runs show no spread at all the error is ``agreement_floor``'s. With ``resample`` (a split
    per seed: n_test / n_train) ``a[k]`` and ``b[k]`` share seed k's split, and the error is ``resampled``'s;
    with a pair of ratios (no shared splits) each side's ``resampled`` error, added (Satterthwaite's df).
    """
    delta = float(np.mean(a) - np.mean(b))
    if len(a) < 2 or len(b) < 2:
        return Comparison(delta, why="needs at least 2 seeds on both sides")
    pi = probability_of_improvement(a, b)
    if hits is not None and hits[0].shape[0] < 2:
        hits = None  # one image has no spread over images to estimate
    if isinstance(resample, tuple):
        parts = [Part(float(resampled(x, None, r)[1]), len(x) - 1) for x, r in zip((a, b), resample)]
        var, df = sum(p.var for p in parts), satterthwaite(parts)
    elif resample is not None:
        _, var, df = resampled(a, b, resample)
        var, df = float(var), float(df)
    elif hits is not None:
        _, var, df, _ = crossed(*hits)
        var, df = float(var), float(df)
        if var <= 0:
            disagree = int((hits[0].mean(1) != hits[1].mean(1)).sum())
            var, df = agreement_floor(disagree, hits[0].shape[0]), math.inf
    else:
        parts = [seed_part(a), seed_part(b)]
        if n_images:
            parts += [binomial_part(float(np.mean(a)), n_images), binomial_part(float(np.mean(b)), n_images)]
        var, df = sum(p.var for p in parts), satterthwaite(parts)
    se = math.sqrt(var)
    if se == 0:
        return Comparison(
            delta,
            why="no spread: every seed of both gave the same value, and "
            + ("a split per seed has no other error to count" if resample is not None else "no test set is known"),
            p_improvement=pi,
        )
    t = _t()
    low, high = _interval(delta, se, df, CONFIDENCE)
    low90, high90 = _interval(delta, se, df, 1 - 2 * ALPHA)
    p = float(2 * t.sf(abs(delta) / se, df))
    # TOST: H0 delta <= -margin (upper tail) and H0 delta >= +margin (lower tail); the larger p decides.
    p_eq = float(max(t.sf((delta + margin) / se, df), t.cdf((delta - margin) / se, df)))
    paired = hits is not None or (resample is not None and not isinstance(resample, tuple))
    return Comparison(delta, se, df, low, high, p, p_eq, margin, paired, "", low90, high90, pi)


def resampled(a, b=None, test_over_train: float = 0.0):
    """Mean (or paired difference) in points, its variance and df when seed k has its own random split
    (``data.split: per_seed``): Nadeau and Bengio's corrected resampled t (Machine Learning 52, 2003),
    ``(1/J + n_test/n_train) S2`` over the J per-seed values (differences on the seeds both have, each on
    its seed's test images), J - 1 df. The correction stands for the overlap of the J training sets, which
    the plain ``S2 / J`` ignores. Numbers or numpy arrays of ``(..., seeds)``; no library offers it."""
    x = np.asarray(a, dtype=float) if b is None else np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    j = x.shape[-1]
    return x.mean(-1), (1 / j + test_over_train) * x.var(-1, ddof=1), j - 1


def interaction(small: Comparison, full: Comparison) -> Comparison:
    """``small.delta - full.delta``: how much more a variant gains over its reference at a small training fraction
    than with all the data (the fraction x family interaction). Separate runs: the variances add, Satterthwaite's
    df. The covariance through the shared test images is left out; positive where a family gains on the same
    images at both fractions, it makes the interval wider than need be."""
    delta = small.delta - full.delta
    if small.se is None or full.se is None:
        return Comparison(delta, why=small.why or full.why)
    parts = [Part(small.se**2, small.df), Part(full.se**2, full.df)]
    se, df = math.sqrt(sum(p.var for p in parts)), satterthwaite(parts)
    low, high = _t().interval(CONFIDENCE, df, loc=delta, scale=se)
    return Comparison(delta, se, df, float(low), float(high), float(2 * _t().sf(abs(delta) / se, df)))


def probability_of_improvement(a: Sequence[float], b: Sequence[float]) -> float:
    """P(X > Y) for a seed X of ``a`` and a seed Y of ``b`` over all pairs, ties counting 1/2 (rliable's
    probability of improvement, Agarwal et al. 2021, for one task): scipy's Mann-Whitney U / (n_a n_b).

    No interval: rliable's percentile bootstrap collapses to one point when one side wins every pair (at 3
    seeds a side 1 in 10 with no difference at all) and, near 0 or 1, covers far less than 95 % even at 10-20
    seeds a side (``python -m benchmarks.coverage``: its improvement cells); Brunner-Munzel's interval
    (statsmodels) is undefined there."""
    from scipy.stats import mannwhitneyu

    return float(mannwhitneyu(np.asarray(a, dtype=float), np.asarray(b, dtype=float)).statistic / (len(a) * len(b)))


def power(nc: float, df: float, alpha: float) -> float:
    """The power of a two-sided t-test at level ``alpha`` with ``df`` degrees of freedom against a true
    difference of ``nc`` standard errors (nc >= 0): P(T' > c) + P(T' < -c), T' noncentral t.

    scipy's noncentral t gives the upper tail (``sf``) stably; its lower tail (``cdf``) is NaN in places
    where it is tiny. That tail is bounded: T' < -c < 0 needs Z + nc < 0, so P(T' < -c) <= Phi(-nc); a
    NaN is read as 0, an error of at most that bound, which is checked to be negligible."""
    from scipy.stats import nct, norm

    if not math.isfinite(df):
        z = float(norm.ppf(1 - alpha / 2))
        return float(norm.sf(z - nc) + norm.cdf(-z - nc))
    c = float(_t().ppf(1 - alpha / 2, df))
    upper = float(nct.sf(c, df, nc))
    lower = float(nct.cdf(-c, df, nc))
    bound = float(norm.cdf(-nc))
    if not math.isfinite(lower):
        if bound > 1e-6:
            raise ArithmeticError(f"noncentral t's lower tail is NaN at df {df}, nc {nc} where it may exceed 1e-6")
        lower = 0.0
    if not math.isfinite(upper):
        raise ArithmeticError(f"noncentral t's upper tail is NaN at df {df}, nc {nc}")
    return upper + min(lower, bound)


def mde(se: float, df: float, alpha: float = ALPHA, power_: float = POWER) -> float:
    """The smallest true difference a two-sided t-test with standard error ``se`` and ``df`` degrees of
    freedom detects with ``power_`` at level ``alpha`` (``power`` inverted with scipy's brentq)."""
    from scipy.optimize import brentq

    def short(d: float) -> float:
        return power(d, df, alpha) - power_

    high = 1.0
    while short(high) < 0:
        high *= 2
    return brentq(short, 0.0, high, xtol=1e-10) * se


def equivalence_bound(delta: float, se: float, df: float, alpha: float = ALPHA) -> float:
    """The smallest margin m that two one-sided tests at level ``alpha`` would show the difference inside
    (the counterpart of the MDE): ``|delta| + t(1 - alpha, df) se``."""
    return abs(delta) + float(_t().ppf(1 - alpha, df)) * se


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
    """``better`` / ``worse`` when the Holm-adjusted p is below ``ALPHA``, else ``equivalent``
    when the Holm-adjusted TOST p is, else ``undecided`` (also when nothing could be tested)."""
    if p_holm is not None and p_holm < ALPHA:
        return "better" if delta > 0 else "worse"
    if p_equivalent_holm is not None and p_equivalent_holm < ALPHA:
        return "equivalent"
    return "undecided"


def within_margin(p_holm: float | None, p_equivalent_holm: float | None) -> bool:
    """A difference shown (``better`` / ``worse``) that two one-sided tests also show inside the margin."""
    return p_holm is not None and p_holm < ALPHA and p_equivalent_holm is not None and p_equivalent_holm < ALPHA
