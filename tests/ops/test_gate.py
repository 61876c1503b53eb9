"""The promotion gate's statistics (McNemar, paired) against hand-computed values, and its decision rule."""

import math

import pytest

from lopd.ops.gate import decide, mcnemar_p, paired


def outcomes(pairs: list[tuple[int, int]]) -> tuple[dict, dict]:
    """(challenger, champion) outcome dicts over tasks t0, t1, … from (challenger solved, champion solved) pairs."""
    return ({f"t{i}": bool(a) for i, (a, _) in enumerate(pairs)}, {f"t{i}": bool(b) for i, (_, b) in enumerate(pairs)})


def test_mcnemar_interval_and_exact_p_by_hand():
    # 40 tasks: 12 only the challenger solved (b), 4 only the champion (c), 10 both, 14 neither
    ch, cp = outcomes([(1, 0)] * 12 + [(0, 1)] * 4 + [(1, 1)] * 10 + [(0, 0)] * 14)
    s = paired(ch, cp, 0.9)
    assert (s.n, s.b, s.c) == (40, 12, 4)
    assert s.challenger == pytest.approx(22 / 40) and s.champion == pytest.approx(14 / 40)
    assert s.diff == pytest.approx(0.2)
    # se = sqrt(b + c - (b - c)^2 / n) / n = sqrt(16 - 1.6) / 40 = 0.0948683; z(0.95) = 1.6448536
    half = 1.6448536 * math.sqrt(14.4) / 40
    assert (s.ci_low, s.ci_high) == pytest.approx((0.2 - half, 0.2 + half), abs=1e-6)
    assert (s.ci_low, s.ci_high) == pytest.approx((0.043956, 0.356044), abs=1e-6)
    # exact: 2 * P(X <= 4), X ~ Bin(16, 1/2) = 2 * (1 + 16 + 120 + 560 + 1820) / 65536
    assert s.p_value == pytest.approx(2 * 2517 / 65536)
    assert mcnemar_p(0, 0) == 1.0 and mcnemar_p(3, 3) == 1.0  # no discordant pair / a perfect tie
    assert mcnemar_p(5, 0) == pytest.approx(2 / 32)


def test_identical_outcomes_give_a_zero_width_interval_at_zero():
    ch, cp = outcomes([(1, 1)] * 5 + [(0, 0)] * 5)
    s = paired(ch, cp, 0.95)
    assert (s.diff, s.ci_low, s.ci_high, s.p_value) == (0.0, 0.0, 0.0, 1.0)


def test_only_shared_tasks_are_paired_and_none_shared_is_an_error():
    s = paired({"a": True, "b": False, "x": True}, {"a": False, "b": False, "y": True}, 0.9)
    assert (s.n, s.b, s.c) == (2, 1, 0)
    with pytest.raises(ValueError, match="share no task"):
        paired({"a": True}, {"b": True}, 0.9)


def test_decision_needs_the_lower_end_above_min_gain_and_no_group_regression():
    # group A: the challenger gains 8 of 10; group B: it loses 2 of 10
    ch_a, cp_a = outcomes([(1, 0)] * 8 + [(1, 1)] * 2)
    ch_b, cp_b = outcomes([(0, 1)] * 2 + [(1, 1)] * 8)
    ch = {**{f"a{k}": v for k, v in ch_a.items()}, **{f"b{k}": v for k, v in ch_b.items()}}
    cp = {**{f"a{k}": v for k, v in cp_a.items()}, **{f"b{k}": v for k, v in cp_b.items()}}
    groups = {t: t[0] for t in ch}
    # overall: b = 8, c = 2, n = 20: diff 0.3, half-width 1.6448536 * sqrt(10 - 1.8) / 20 = 0.23551
    lenient = decide(ch, cp, groups, ci=0.9, min_gain=0.0, max_regression=0.25)
    assert lenient.promoted and lenient.overall.ci_low == pytest.approx(0.3 - 1.6448536 * math.sqrt(8.2) / 20, abs=1e-6)
    assert lenient.groups["a"].diff == pytest.approx(0.8) and lenient.groups["b"].diff == pytest.approx(-0.2)
    assert lenient.reason.startswith("promoted:")
    strict = decide(ch, cp, groups, ci=0.9, min_gain=0.0, max_regression=0.1)  # group b falls by 0.2 > 0.1
    assert not strict.promoted and "regresses at b -0.200" in strict.reason
    greedy = decide(ch, cp, groups, ci=0.9, min_gain=0.1, max_regression=0.25)  # lower end 0.0645 is not above 0.1
    assert not greedy.promoted and "lower end is not above registry.min_gain = 0.1" in greedy.reason
    d = strict.as_dict()
    assert d["overall"]["b"] == 8 and set(d["groups"]) == {"a", "b"} and d["promoted"] is False


def test_a_worse_challenger_is_rejected():
    ch, cp = outcomes([(0, 1)] * 6 + [(1, 1)] * 4 + [(0, 0)] * 10)
    d = decide(ch, cp, {}, ci=0.9, min_gain=0.0, max_regression=0.05)
    assert not d.promoted and d.overall.diff == pytest.approx(-0.3) and d.overall.ci_high < 0
