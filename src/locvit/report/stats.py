"""Statistics for comparing variants over a few seeds.

With 3-5 seeds a variant's mean is uncertain, so every number a table gives comes with
what a reviewer needs to judge it:

- :func:`describe`: n, mean, sample standard deviation and a Student-t confidence
  interval of the mean (not mean ± 2 std, which is too narrow for small n).
- :func:`welch`: Welch's two-sided t-test of two variants' means (unequal variances).
  Seeds are not paired: a seed fixes the data order of every variant, but each
  architecture draws its own initial weights from it, so two variants' runs at one
  seed are not matched measurements. Welch on independent samples is the safe choice.
- :func:`holm`: Holm's step-down correction of the p-values of the variants compared
  with one baseline (family-wise error at the chosen level, less conservative than
  Bonferroni).

Bootstrap intervals are deliberately absent: on 3 seeds they are not meaningful.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

ALPHA = 0.05  # significance level of the tables' tests (after Holm's correction)


@dataclass(frozen=True)
class Summary:
    """One variant's values over seeds: ``std`` and the interval are None for a single value."""

    n: int
    mean: float
    std: float | None
    ci_low: float | None
    ci_high: float | None


@dataclass(frozen=True)
class Test:
    """Welch's test of ``mean(a) - mean(b)``; ``p`` is None when it cannot be computed (and ``why`` says so)."""

    delta: float
    t: float | None
    df: float | None
    p: float | None
    why: str = ""


def _t_quantile(q: float, df: float) -> float:
    from scipy.stats import t as student_t

    return float(student_t.ppf(q, df))


def _t_two_sided_p(t: float, df: float) -> float:
    from scipy.stats import t as student_t

    return float(2.0 * student_t.sf(abs(t), df))


def describe(values: Sequence[float], confidence: float = 0.95) -> Summary:
    """n, mean, sample std (n - 1) and the Student-t interval ``mean ± t(n-1) * std / sqrt(n)``."""
    n = len(values)
    if n == 0:
        raise ValueError("describe() needs at least one value")
    mean = sum(values) / n
    if n == 1:
        return Summary(1, mean, None, None, None)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = _t_quantile(0.5 + confidence / 2, n - 1) * std / math.sqrt(n)
    return Summary(n, mean, std, mean - half, mean + half)


def welch(a: Sequence[float], b: Sequence[float]) -> Test:
    """Welch's two-sided t-test of ``mean(a) - mean(b)``, with the Welch-Satterthwaite degrees of freedom."""
    sa, sb = describe(a), describe(b)
    delta = sa.mean - sb.mean
    if sa.n < 2 or sb.n < 2:
        return Test(delta, None, None, None, "needs at least 2 seeds on both sides")
    va, vb = sa.std ** 2 / sa.n, sb.std ** 2 / sb.n  # squared standard errors of the two means
    if va + vb == 0:
        return Test(delta, None, None, None, "no spread on either side: every seed gave the same value")
    t = delta / math.sqrt(va + vb)
    df = (va + vb) ** 2 / ((va ** 2 / (sa.n - 1) if va else 0.0) + (vb ** 2 / (sb.n - 1) if vb else 0.0))
    return Test(delta, t, df, _t_two_sided_p(t, df))


def holm(pvalues: Sequence[float | None]) -> list[float | None]:
    """Holm's step-down adjusted p-values, in the input order; ``None`` entries stay None and do not count.

    The k-th smallest of m p-values is multiplied by (m - k + 1); each adjusted value is at
    least the one before it (monotone) and at most 1.
    """
    order = sorted((p, i) for i, p in enumerate(pvalues) if p is not None)
    m = len(order)
    adjusted: list[float | None] = [None] * len(pvalues)
    running = 0.0
    for k, (p, i) in enumerate(order):
        running = max(running, min(1.0, (m - k) * p))
        adjusted[i] = running
    return adjusted


def verdict(variant: str, reference: str, test: Test | None, p_holm: float | None) -> str:
    """One sentence on a variant's difference to its reference, for the tables' notes."""
    if variant == reference:
        return f"{variant} is the baseline."
    if test is None:
        return f"{variant}: not compared with {reference} (no evaluated seed on one side)."
    if test.p is None or p_holm is None:
        return f"{variant} vs {reference}: {test.delta:+.2f} points, not tested ({test.why})."
    word = "significant" if p_holm < ALPHA else "not significant"
    return (f"{variant} vs {reference}: {test.delta:+.2f} points, {word} at {ALPHA:g} "
            f"(Welch p = {test.p:.3g}, Holm-adjusted p = {p_holm:.3g}).")
