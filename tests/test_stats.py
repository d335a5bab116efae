"""The report's statistics against cases worked out by hand (closed forms of Student's t for df 1 and 2)."""

import math

import pytest

from locvit.report.stats import describe, holm, verdict, welch


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


def test_welch_equal_variances_df2():
    # a: mean 1, var 2; b: mean 4, var 2; n = 2 each -> se^2 = 1 + 1, t = -3 / sqrt(2), df = 2.
    r = welch([0.0, 2.0], [3.0, 5.0])
    assert r.delta == -3.0
    assert r.t == pytest.approx(-3 / math.sqrt(2))
    assert r.df == pytest.approx(2.0)
    # df = 2: two-sided p = 1 - |t| / sqrt(2 + t^2) = 1 - 3 / sqrt(13).
    assert r.p == pytest.approx(1 - 3 / math.sqrt(13), abs=1e-12)


def test_welch_unequal_variances_df1():
    # a = [0, 2] (var 2, se^2 1), b = [10, 10] (var 0): df = 1^2 / (1^2 / 1) = 1 (Cauchy),
    # t = (1 - 10) / 1 = -9, two-sided p = 1 - 2 atan(9) / pi.
    r = welch([0.0, 2.0], [10.0, 10.0])
    assert r.t == pytest.approx(-9.0)
    assert r.df == pytest.approx(1.0)
    assert r.p == pytest.approx(1 - 2 * math.atan(9) / math.pi, abs=1e-12)


def test_welch_satterthwaite_df():
    # a = [1, 2, 3] (var 1, n 3), b = [2, 4, 6, 8] (var 20/3, n 4):
    # se^2 = 1/3 + 5/3 = 2; df = 2^2 / ((1/3)^2 / 2 + (5/3)^2 / 3) = 4 / (1/18 + 25/27) = 216 / 53.
    r = welch([1.0, 2.0, 3.0], [2.0, 4.0, 6.0, 8.0])
    assert r.t == pytest.approx(-3 / math.sqrt(2))
    assert r.df == pytest.approx(216 / 53)
    assert 0.05 < r.p < 0.5


def test_welch_without_spread_or_seeds_gives_no_p():
    assert welch([90.0, 90.0], [95.0, 95.0]).p is None
    one = welch([90.0], [95.0, 96.0])
    assert one.p is None and one.delta == pytest.approx(-5.5) and "2 seeds" in one.why


def test_holm_step_down():
    # sorted 0.005 (x4 = 0.02), 0.01 (x3 = 0.03), 0.03 (x2 = 0.06), 0.04 (x1 = 0.04 -> kept monotone at 0.06)
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    # None does not count: m = 2, so 0.5 x 2 = 1.0, and 0.6 x 1 is raised to 1.0 (monotone)
    assert holm([0.5, None, 0.6]) == [pytest.approx(1.0), None, pytest.approx(1.0)]
    assert holm([0.01, None, 0.2]) == [pytest.approx(0.02), None, pytest.approx(0.2)]
    assert holm([0.9, 0.8]) == [pytest.approx(1.0), pytest.approx(1.0)]  # capped at 1


def test_verdict_says_in_words_whether_a_difference_is_significant():
    big = welch([99.0, 99.5, 99.2], [90.0, 91.0, 92.0])
    assert "significant at 0.05" in verdict("lsa", "deit", big, 0.001)
    assert "not significant" in verdict("lsa", "deit", big, 0.2)
    assert "not tested" in verdict("x", "deit", welch([1.0], [2.0, 3.0]), None)
    assert verdict("deit", "deit", None, None) == "deit is the baseline."
