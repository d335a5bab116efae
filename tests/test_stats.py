"""The report's statistics against cases worked out by hand, and our use of scipy and statsmodels against
their own two-sample functions where the two must agree (no test-set part)."""

import math

import numpy as np
import pytest
from scipy import stats as sps
from statsmodels.stats.power import TTestIndPower
from statsmodels.stats.proportion import proportion_confint
from statsmodels.stats.weightstats import ttost_ind

from locvit.report.stats import (ALPHA, Part, binomial_part, compare, describe, holm, mde, paired_part,
                                 satterthwaite, verdict)

Z975 = 1.959963984540054


def test_describe_mean_std_and_t_interval():
    s = describe([1.0, 2.0, 3.0])
    assert (s.n, s.mean, s.std) == (3, 2.0, 1.0)
    # df = 2: the t quantile has the closed form (2p - 1) / sqrt(2 p (1 - p)); p = 0.975 gives 4.3027.
    t975 = 0.95 / math.sqrt(2 * 0.975 * 0.025)
    half = t975 * 1.0 / math.sqrt(3)
    assert s.ci_low == pytest.approx(2.0 - half, abs=1e-9)
    assert s.ci_high == pytest.approx(2.0 + half, abs=1e-9)
    assert half == pytest.approx(2.4841, abs=1e-4)


def test_describe_one_value_has_no_spread():
    s = describe([97.5])
    assert (s.n, s.mean, s.std, s.ci_low, s.ci_high) == (1, 97.5, None, None, None)
    with pytest.raises(ValueError):
        describe([])


def test_binomial_part_is_agresti_coull():
    # 97 of 100 right: p~ = (97 + z^2/2) / (100 + z^2), variance p~(1 - p~) / (100 + z^2), in points^2.
    z2 = Z975 ** 2
    p = (97 + z2 / 2) / (100 + z2)
    part = binomial_part(97.0, 100)
    assert part.var == pytest.approx(1e4 * p * (1 - p) / (100 + z2), rel=1e-12) and part.df == math.inf
    low, high = proportion_confint(97, 100, alpha=0.05, method="agresti_coull")  # half-width z * se
    assert math.sqrt(part.var) / 100 == pytest.approx((high - low) / 2 / Z975, rel=1e-9)
    assert binomial_part(100.0, 360).var > 0  # a perfect score still has an error


def test_satterthwaite_by_hand():
    # 1/3 (df 2) + 5/3 (df 3): 2^2 / ((1/3)^2 / 2 + (5/3)^2 / 3) = 216 / 53; a normal part adds no term.
    assert satterthwaite([Part(1 / 3, 2), Part(5 / 3, 3)]) == pytest.approx(216 / 53)
    assert satterthwaite([Part(1.0, 2), Part(1.0, math.inf)]) == pytest.approx(2 ** 2 / (1 / 2))
    assert satterthwaite([Part(1.0, math.inf)]) == math.inf


def test_describe_adds_the_test_set_to_the_seeds():
    # seeds 96, 97, 98 (var 1, se^2 1/3, df 2) on 100 images: se^2 = 1/3 + Agresti-Coull's part.
    b = binomial_part(97.0, 100).var
    s = describe([96.0, 97.0, 98.0], n_images=100)
    se2 = 1 / 3 + b
    df = se2 ** 2 / ((1 / 3) ** 2 / 2)
    assert s.se == pytest.approx(math.sqrt(se2)) and s.df == pytest.approx(df)
    half = sps.t.ppf(0.975, df) * math.sqrt(se2)
    assert (s.ci_low, s.ci_high) == (pytest.approx(97 - half), pytest.approx(97 + half))
    assert s.std == pytest.approx(1.0)


def test_seeds_that_agree_keep_the_test_sets_interval():
    # LSA's 99.17 on 360 images three times: the seeds' part is 0, the test set's is not.
    s = describe([99.17, 99.17, 99.17], n_images=360)
    se = math.sqrt(binomial_part(99.17, 360).var)
    assert s.std == 0 and s.df == math.inf
    assert s.ci_high - s.ci_low == pytest.approx(2 * Z975 * se) and s.ci_high - s.ci_low > 1.0


def test_compare_without_test_set_is_welchs_test():
    a, b = [96.1, 97.3, 98.0, 97.2], [94.0, 95.5, 96.9]
    c = compare(a, b, margin=1.0)
    ref = sps.ttest_ind(a, b, equal_var=False)
    assert c.delta == pytest.approx(np.mean(a) - np.mean(b))
    assert c.p == pytest.approx(ref.pvalue, rel=1e-10) and c.df == pytest.approx(ref.df, rel=1e-10)
    ci = ref.confidence_interval(0.95)
    assert (c.ci_low, c.ci_high) == (pytest.approx(ci.low, rel=1e-10), pytest.approx(ci.high, rel=1e-10))
    p_tost, _, _ = ttost_ind(np.array(a), np.array(b), -1.0, 1.0, usevar="unequal")
    assert c.p_equivalent == pytest.approx(p_tost, rel=1e-10)


def test_compare_by_hand_df4():
    # a = 96, 97, 98; b = 94, 95, 96: delta 2, se^2 = 1/3 + 1/3, df = (2/3)^2 / (2 (1/3)^2 / 2) = 4.
    c = compare([96.0, 97.0, 98.0], [94.0, 95.0, 96.0], margin=1.0)
    se = math.sqrt(2 / 3)
    assert c.df == pytest.approx(4.0) and c.se == pytest.approx(se)
    t4 = 2.7764451051977987  # t(0.975, 4)
    assert (c.ci_low, c.ci_high) == (pytest.approx(2 - t4 * se), pytest.approx(2 + t4 * se))
    # TOST within +-1: the lower test (delta >= 1) has t = (2 - 1) / se, p = P(T4 <= 1 / se), the larger of two.
    assert c.p_equivalent == pytest.approx(sps.t.cdf(1 / se, 4))


def test_paired_part_by_hand():
    # 4 images, 2 seeds each. a's per-image means 1, 1, .5, 0; b's 1, .5, .5, 0 -> d = 0, .5, 0, 0:
    # mean 1/8, var (ddof 1) = (3 (1/8)^2 + (3/8)^2) / 3 = 1/16, part = 1e4 * (1/16) / 4.
    a = np.array([[1, 1], [1, 1], [1, 0], [0, 0]], dtype=bool)
    b = np.array([[1, 1], [1, 0], [0, 1], [0, 0]], dtype=bool)
    part = paired_part(a, b)
    assert part.var == pytest.approx(1e4 / 64) and part.df == 3


def test_pairing_on_shared_images_narrows_the_difference():
    rng = np.random.default_rng(0)
    hard = rng.random(360) < 0.1  # the same hard images defeat both variants
    a = np.repeat((~hard)[:, None], 3, axis=1)
    b = a.copy()
    b[:4, :] = ~b[:4, :]  # b differs on 4 images
    acc = lambda h: list(100 * h.mean(axis=0))
    paired = compare(acc(a), acc(b), 1.0, 360, (a, b))
    unpaired = compare(acc(a), acc(b), 1.0, 360)
    assert paired.paired and not unpaired.paired
    assert 0 < paired.se < unpaired.se / 3


def test_compare_without_seeds_or_spread_gives_no_p():
    one = compare([90.0], [95.0, 96.0], margin=1.0)
    assert one.p is None and one.delta == pytest.approx(-5.5) and "2 seeds" in one.why
    flat = compare([90.0, 90.0], [95.0, 95.0], margin=1.0)
    assert flat.p is None and "no spread" in flat.why
    # the same seeds with the test set counted: testable
    assert compare([90.0, 90.0], [95.0, 95.0], 1.0, n_images=360).p < 0.05


def test_mde_matches_statsmodels_two_sample_power():
    # equal n and variance: Welch's df is the pooled 2n - 2, so the MDE is Cohen's d of TTestIndPower times std.
    n, std = 5, 2.0
    se, df = std * math.sqrt(2 / n), 2 * n - 2
    d = TTestIndPower().solve_power(nobs1=n, alpha=0.05, power=0.8, ratio=1.0)
    assert mde(se, df) == pytest.approx(d * std, rel=1e-6)


def test_mde_by_hand_large_df():
    # with df -> inf the two-sided test's power at delta = (z(1 - a/2) + z(0.8)) se is 0.8 (the far tail is ~0)
    assert mde(1.5, 1e7) == pytest.approx((Z975 + 0.8416212335729143) * 1.5, rel=1e-5)
    # a stricter level (Holm's alpha / m) asks for a larger difference
    assert mde(1.5, 4, ALPHA / 7) > mde(1.5, 4, ALPHA)


def test_holm_step_down():
    # sorted 0.005 (x4 = 0.02), 0.01 (x3 = 0.03), 0.03 (x2 = 0.06), 0.04 (x1 = 0.04 -> kept monotone at 0.06)
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    # None does not count: m = 2, so 0.5 x 2 = 1.0, and 0.6 x 1 is raised to 1.0 (monotone)
    assert holm([0.5, None, 0.6]) == [pytest.approx(1.0), None, pytest.approx(1.0)]
    assert holm([0.01, None, 0.2]) == [pytest.approx(0.02), None, pytest.approx(0.2)]
    assert holm([0.9, 0.8]) == [pytest.approx(1.0), pytest.approx(1.0)]  # capped at 1
    assert holm([None]) == [None]


def test_holm_equals_statsmodels():
    from statsmodels.stats.multitest import multipletests

    rng = np.random.default_rng(0)  # a few calls: statsmodels' runs gc.collect() on each
    for p in (rng.uniform(0, 0.2, 7), rng.uniform(0, 1, 20), np.repeat(rng.uniform(0, 0.1), 3)):
        assert holm(list(p)) == pytest.approx(list(multipletests(p, alpha=0.05, method="holm")[1]), abs=1e-15)


def test_verdict_words():
    assert verdict(+3.0, 0.01, 0.9) == "better"
    assert verdict(-3.0, 0.01, 0.9) == "worse"
    assert verdict(+0.2, 0.6, 0.01) == "equivalent"
    assert verdict(+0.2, 0.01, 0.01) == "better"  # a shown difference wins over a shown tie
    assert verdict(+5.0, 0.2, 0.8) == "undecided"
    assert verdict(+5.0, None, None) == "undecided"
