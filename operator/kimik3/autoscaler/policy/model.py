"""The latency model: the per-token latency ``n`` groups give at a demand, learned online.

``GroupLatencyModel`` (seeded in autoscaler/seed.py from the perf model). A step's latency is
linear in its batch, ``t0 + k b``. A group does not sit at its mean batch ``c``: requests come
and go at random (the fleet's total is Poisson, mean ``n c``) and the router shares them among
the ``n`` groups, so a group's batch varies around ``c`` with standard deviation ``sqrt(c / n)``.
The token-weighted quantile of the target (P90 per token by default) sits ``z`` of those above
the mean, the token-weighted mean ``w / n`` above it::

    quantile(c, n) = t0 + k (c + z sqrt(c / n))          mean(c, n) = t0 + k (c + w / n)

(seed: ``z`` fitted, 2.0 for the latency recipe; ``w = 1``, Poisson). The same per-group load
is slower with few groups than with many, so capacity per group grows with the group count.
Demand ``D`` (output tokens/s; request-steps/s for a per-step target) becomes concurrency by
Little's law, ``n c = D x mean(c, n)``, i.e. ``c = D (t0 + k w / n) / (n - D k)``: latency is not
linear in load but rises as ``1 / (1 - rho)`` and is infinite past ``n = D k`` (saturation).

Learned online: each window gives ``c`` by Little's law (demand.py), the quantile at
``c + z sqrt(c / n)`` and the mean at ``c + w / n`` (two points at different effective batches:
each window measures the slope); ``(t0, k)`` follow by exponentially weighted least squares
regularised toward the seed, only from windows near the target (0.5-1.5 T: ``LEARN_RANGE``) in
which no group joined and the demand did not jump (the policy's gate, latency.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

LEARN_RANGE = (0.5, 1.5)
"""Observed latencies, as multiples of the target, the model learns from."""


@dataclass
class GroupLatencyModel:
    """Per-token latency of one group of ``n`` serving a mean of ``c`` requests each.

    The latency of a step is linear in its batch (the perf model near the target):
    ``t(b) = t0 + k b``. A group's batch is not its mean ``c``: the fleet's requests come and go at
    random (Poisson in number, mean ``n c``) and the router spreads them over ``n`` groups, so a
    group's batch varies around ``c`` with a standard deviation ``sqrt(c / n)``. The token-weighted
    quantile the target is written in (P90) sits ``z`` standard deviations above the mean, and the
    token-weighted mean at ``c + w / n`` (a token is more likely emitted in a large batch: the
    mean of the token-weighted batch of a Poisson total shared by ``n`` is ``c + 1 / n``)::

        quantile(c, n) = t0 + k (c + z sqrt(c / n))        mean(c, n) = t0 + k (c + w / n)

    ``z = w = 0`` is a plain line in ``c``. Fitted online: exponentially weighted least squares of
    ``t`` on the effective batch (both points of every window: the quantile and the mean), with
    forgetting factor ``forget`` per window and a prior of ``prior_weight`` pseudo-observations on
    the seed line at effective batches ``seed_c_low`` and ``seed_c`` (the range the seed was fitted
    on), so the prior pins both intercept and slope where the policy works."""

    t0: float
    k: float
    seed_c: float = 32.0
    forget: float = 0.9
    prior_weight: float = 2.0
    seed_c_low: float = 1.0
    z: float = 0.0
    """Standard deviations of a group's batch between its mean and the target's quantile."""
    w: float = 0.0
    """Extra batch of the token-weighted mean, times the number of groups (1 for Poisson)."""
    _n: float = 0.0
    _sc: float = 0.0
    _sy: float = 0.0
    _scc: float = 0.0
    _scy: float = 0.0

    def __post_init__(self) -> None:
        self._seed = (self.t0, self.k)

    def quantile_batch(self, c: float, n: int = 1, extra_z: float = 0.0) -> float:
        return c + (self.z + extra_z) * math.sqrt(max(c, 0.0) / max(n, 1))

    def mean_batch(self, c: float, n: int = 1) -> float:
        return c + self.w / max(n, 1)

    def latency(self, c: float, n: int = 1, extra_z: float = 0.0) -> float:
        """The target's quantile at ``c`` requests per group, ``n`` groups (``extra_z`` more
        standard deviations of the batch: a margin for the minute-to-minute variation)."""
        return self.t0 + self.k * self.quantile_batch(c, n, extra_z)

    def mean_latency(self, c: float, n: int = 1) -> float:
        return self.t0 + self.k * self.mean_batch(c, n)

    def capacity(self, latency_s: float, n: int = 1) -> float:
        """Largest concurrency per group whose quantile stays <= ``latency_s`` (0 if none)."""
        if latency_s <= self.t0:
            return 0.0
        if self.k <= 0:
            return math.inf
        x = (latency_s - self.t0) / self.k
        a = self.z / math.sqrt(max(n, 1))
        u = (-a + math.sqrt(a * a + 4 * x)) / 2  # c = u^2 solves u^2 + a u = x
        return u * u

    def concurrency(self, demand: float, n: int) -> float:
        """Requests per group when ``n`` groups serve ``demand`` tokens/s (per step for a per-step
        model): Little's law ``n c = demand x mean(c, n)`` solved for ``c``. Infinite when the
        groups cannot keep up (``n <= demand x k``): the line's queueing term ``1 / (1 - rho)``."""
        if demand <= 0:
            return 0.0
        spare = n - demand * self.k
        if spare <= 0:
            return math.inf
        return demand * (self.t0 + self.k * self.w / n) / spare

    def predict(self, demand: float, n: int, extra_z: float = 0.0) -> float:
        """The quantile ``n`` groups give at ``demand`` (infinite past saturation)."""
        if n <= 0:
            return math.inf if demand > 0 else 0.0
        c = self.concurrency(demand, n)
        return math.inf if math.isinf(c) else self.latency(c, n, extra_z)

    def groups_for(self, demand: float, latency_s: float, most: int, extra_z: float = 0.0) -> int | None:
        """Fewest groups (1..``most``) whose predicted quantile at ``demand`` is <= ``latency_s``;
        None if even ``most`` do not."""
        for n in range(1, most + 1):
            if self.predict(demand, n, extra_z) <= latency_s:
                return n
        return None

    def update(self, c: float, y: float, n: int = 1, mean: float | None = None) -> None:
        """One window: quantile ``y`` (and the mean latency, when known) at ``c`` requests per group
        over ``n`` groups."""
        if c <= 0 or y <= 0 or not math.isfinite(y):
            return
        points = [(self.quantile_batch(c, n), y)]
        if mean is not None and mean > 0 and math.isfinite(mean):
            points.append((self.mean_batch(c, n), mean))
        f = self.forget
        self._n, self._sc, self._sy, self._scc, self._scy = (f * self._n, f * self._sc, f * self._sy,
                                                             f * self._scc, f * self._scy)
        for x, v in points:
            self._n += 1
            self._sc += x
            self._sy += v
            self._scc += x * x
            self._scy += x * v
        t0s, ks = self._seed
        w = self.prior_weight / 2
        lo, hi = self.seed_c_low, self.seed_c
        n_ = self._n + 2 * w
        sc = self._sc + w * (lo + hi)
        sy = self._sy + w * ((t0s + ks * lo) + (t0s + ks * hi))
        scc = self._scc + w * (lo ** 2 + hi ** 2)
        scy = self._scy + w * (lo * (t0s + ks * lo) + hi * (t0s + ks * hi))
        det = n_ * scc - sc * sc
        if det <= 1e-12:
            return
        k = (n_ * scy - sc * sy) / det
        t0 = (sy - k * sc) / n_
        # Physical bounds: latency cannot fall with load, and batch-1 latency stays positive.
        # When the data barely spread the slope is unknowable: keep the seed's slope (at least
        # 0.1x) and move the line through the data (the intercept takes the shift).
        if k < ks * 0.1:
            k = ks * 0.1
            t0 = (sy - k * sc) / n_
        self.k = k
        self.t0 = max(t0, abs(t0s) * 0.25)
