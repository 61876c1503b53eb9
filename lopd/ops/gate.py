"""The promotion gate's statistics: a challenger against the champion on the same dev tasks.

Both policies play the same dev tasks once each, with the same seed; each task gives one pair of
outcomes (challenger solved it or not, champion solved it or not). The comparison is **McNemar's**
(paired binary outcomes):

- ``b`` = tasks only the challenger solved, ``c`` = tasks only the champion solved, ``n`` = tasks;
- the difference in success ``d = (b - c) / n`` (challenger − champion);
- its interval: the Wald interval of a difference of paired proportions,
  ``d ± z · sqrt(b + c - (b - c)² / n) / n`` with ``z`` the normal quantile of ``ci``, cut to [-1, 1];
- the exact McNemar p-value: two-sided binomial test of ``b`` among the ``b + c`` discordant tasks at 1/2.

McNemar rather than a paired bootstrap: with one sample per task the outcomes are paired binary
values, for which the McNemar counts are sufficient; the interval and the test are closed forms
(a test checks them against hand-computed values) and need no resampling seed.

The decision (:func:`decide`): promote only if the interval's lower end is above
``registry.min_gain`` and no report group's difference (point estimate) is below
``-registry.max_regression``. Pure functions: no MLflow, no model.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from statistics import NormalDist


@dataclass(frozen=True)
class Paired:
    """McNemar's summary of paired outcomes (see the module docstring)."""

    n: int
    challenger: float  # challenger's success rate on the n tasks
    champion: float
    b: int  # challenger only
    c: int  # champion only
    diff: float
    ci_low: float
    ci_high: float
    p_value: float
    ci: float

    def as_dict(self) -> dict:
        return asdict(self)


def _binom_cdf_half(k: int, n: int) -> float:
    """P(X <= k) for X ~ Binomial(n, 1/2), exactly."""
    return sum(math.comb(n, i) for i in range(k + 1)) / 2**n


def mcnemar_p(b: int, c: int) -> float:
    """Exact two-sided McNemar p-value: 2 · P(X <= min(b, c)), X ~ Binomial(b + c, 1/2), at most 1; 1 when b + c = 0."""
    if b + c == 0:
        return 1.0
    return min(1.0, 2.0 * _binom_cdf_half(min(b, c), b + c))


def paired(challenger: Mapping[str, bool], champion: Mapping[str, bool], ci: float) -> Paired:
    """McNemar's comparison over the tasks both played (task id -> solved)."""
    if not 0.0 < ci < 1.0:
        raise ValueError(f"ci = {ci} must be in (0, 1)")
    tasks = sorted(set(challenger) & set(champion))
    n = len(tasks)
    if n == 0:
        raise ValueError("the challenger and the champion share no task: nothing to compare")
    b = sum(bool(challenger[t]) and not champion[t] for t in tasks)
    c = sum(bool(champion[t]) and not challenger[t] for t in tasks)
    diff = (b - c) / n
    se = math.sqrt(max(0.0, b + c - (b - c) ** 2 / n)) / n
    z = NormalDist().inv_cdf(1.0 - (1.0 - ci) / 2.0)
    return Paired(n=n, challenger=sum(bool(challenger[t]) for t in tasks) / n, champion=sum(bool(champion[t]) for t in tasks) / n,
                  b=b, c=c, diff=diff, ci_low=max(-1.0, diff - z * se), ci_high=min(1.0, diff + z * se),
                  p_value=mcnemar_p(b, c), ci=ci)


@dataclass(frozen=True)
class Decision:
    """The gate's verdict with every figure it rests on."""

    promoted: bool
    reason: str
    overall: Paired
    groups: dict[str, Paired] = field(default_factory=dict)
    min_gain: float = 0.0
    max_regression: float = 0.0

    def as_dict(self) -> dict:
        return {"promoted": self.promoted, "reason": self.reason, "min_gain": self.min_gain, "max_regression": self.max_regression,
                "overall": self.overall.as_dict(), "groups": {g: s.as_dict() for g, s in self.groups.items()}}


def decide(challenger: Mapping[str, bool], champion: Mapping[str, bool], groups: Mapping[str, str], *, ci: float,
           min_gain: float, max_regression: float) -> Decision:
    """Promote or not (module docstring). ``groups``: task id -> report group ({} = no grouping)."""
    overall = paired(challenger, champion, ci)
    by_group: dict[str, Paired] = {}
    for g in sorted(set(groups.values())):
        ids = [t for t, tg in groups.items() if tg == g and t in challenger and t in champion]
        if ids:
            by_group[g] = paired({t: challenger[t] for t in ids}, {t: champion[t] for t in ids}, ci)
    regressed = {g: s.diff for g, s in by_group.items() if s.diff < -max_regression - 1e-12}
    gain = overall.ci_low > min_gain + 1e-12
    what = (f"dev success {overall.challenger:.3f} vs {overall.champion:.3f} on {overall.n} tasks: "
            f"difference {overall.diff:+.3f}, {ci:.0%} CI [{overall.ci_low:+.3f}, {overall.ci_high:+.3f}], McNemar p = {overall.p_value:.3g}")
    if regressed:
        worst = ", ".join(f"{g} {d:+.3f}" for g, d in regressed.items())
        reason = f"rejected: {what}; regresses at {worst} (more than registry.max_regression = {max_regression})"
    elif not gain:
        reason = f"rejected: {what}; the interval's lower end is not above registry.min_gain = {min_gain}"
    else:
        reason = f"promoted: {what}; lower end above registry.min_gain = {min_gain}, no group falls by more than {max_regression}"
    return Decision(promoted=gain and not regressed, reason=reason, overall=overall, groups=by_group,
                    min_gain=min_gain, max_regression=max_regression)
