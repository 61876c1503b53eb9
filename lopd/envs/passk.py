"""The unbiased pass@k estimator of the Codex paper (Chen et al., 2021).

With ``n`` samples of which ``c`` pass, pass@k = 1 − C(n−c, k) / C(n, k): the chance that k
samples drawn without replacement include a passing one. The binomials overflow floats for
large n, so it is computed as the product 1 − ∏_{i=n−c+1}^{n} (1 − k/i), which is the same
ratio term by term.
"""

from __future__ import annotations

import math


def humaneval_pass_at_k(n: int, c: int, k: int) -> float:
    """pass@k from ``n`` samples with ``c`` correct (see the module docstring)."""
    for name, value in (("n", n), ("c", c), ("k", k)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"humaneval_pass_at_k: {name} must be an int, got {value!r}")
    if n < 1 or not 0 <= c <= n:
        raise ValueError(f"humaneval_pass_at_k: need n >= 1 and 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"humaneval_pass_at_k: k must be in 1..n={n}, got {k}; draw at least k samples per task")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))
