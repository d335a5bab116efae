"""Reference values for tests/test_stats.py's MDE tests, computed without scipy.stats.nct.

The power of a two-sided t-test at level alpha with df degrees of freedom, for a true difference
of ``nc`` standard errors, is P(|T'| > c) with c = t(1 - alpha/2, df) and T' = (Z + nc) / S,
S = chi_df / sqrt(df). Conditioning on S = s:

    power(nc) = integral over s of [Phi(nc - c s) + Phi(-nc - c s)] f_S(s) ds

which is integrated here with scipy.integrate.quad over the chi density (scipy.stats.chi), and
inverted for 80 % power with brentq; a Monte Carlo estimate (normal and chi draws, fixed seed)
checks each integral. Run from the repository root:

    .venv/bin/python tests/mde_reference.py

and copy the printed rows into tests/test_stats.py (MDE_REFERENCE).
"""

from __future__ import annotations

import math

import numpy as np
from scipy import integrate, optimize
from scipy.stats import chi, norm, t

CASES = [  # (se, df, alpha): ConViT against DeiT in the demo, then df 4, 10, 100
    (3.67099, 2.43245, 0.05 / 7),
    (1.0, 4.0, 0.05),
    (0.8, 10.0, 0.05 / 3),
    (0.5, 100.0, 0.05),
]


def power_quad(nc: float, df: float, alpha: float) -> float:
    c = t.ppf(1 - alpha / 2, df)
    scale = 1 / math.sqrt(df)  # S = chi_df / sqrt(df)

    def integrand(s: float) -> float:
        return (norm.cdf(nc - c * s) + norm.cdf(-nc - c * s)) * chi.pdf(s / scale, df) / scale

    value, _ = integrate.quad(integrand, 0, np.inf, epsabs=1e-13, epsrel=1e-11, limit=500)
    return value


def power_mc(nc: float, df: float, alpha: float, draws: int = 4_000_000, seed: int = 0) -> float:
    rng = np.random.default_rng(seed)
    c = t.ppf(1 - alpha / 2, df)
    s = np.sqrt(rng.chisquare(df, draws) / df)
    tprime = (rng.standard_normal(draws) + nc) / s
    return float(np.mean(np.abs(tprime) > c))


def main() -> None:
    for se, df, alpha in CASES:
        nc = optimize.brentq(lambda d: power_quad(d, df, alpha) - 0.8, 0.1, 200, xtol=1e-12)
        check = power_mc(nc, df, alpha)
        half = power_quad(nc / 2, df, alpha)
        print(
            f"({se}, {df}, {alpha!r}, {nc * se:.5f}, {nc / 2!r}, {half:.6f}),"
            f"  # Monte Carlo power at the MDE: {check:.4f}"
        )


if __name__ == "__main__":
    main()
