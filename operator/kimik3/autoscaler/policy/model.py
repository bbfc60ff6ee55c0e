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

Prefill, the second load dimension. With chunked prefill (vLLM's default) the prompt tokens a
group computes share its steps with decoding: the perf model's step is
``a + m coverage + b n + p / prefill_rate`` (perfmodel.step_time), so over time a group computing
``pi`` prompt tokens/s (prompt tokens less the prefix cache's hits: those cost no step) spends a
share ``rho = pi theta`` of its time on prefill, ``theta`` seconds per prompt token (seed: the perf
model's ``1 / prefill_rate``). Its decode steps, and every latency above, stretch by
``1 / (1 - rho)``::

    quantile(c, n, pi) = (t0 + k (c + z sqrt(c / n))) / (1 - pi theta)

and Little's law keeps its form with ``t0`` and ``k`` so stretched. vLLM's scheduler caps a step
at ``max_num_batched_tokens`` (B) tokens, so a group prefills at most ``B / (d + B theta)``
prompt tokens/s (``d``: the decode part of a step): ``rho`` past ``max_prefill_share``
(``B theta / (d + B theta)``) is saturation, whatever the decode load. Assumed: prefill spreads
over the steps (the mean stretch); the P90 also feels the steps that carry a chunk, which is
why ``theta`` is learned (below) rather than kept at the perf model's figure; prompts are routed
like requests (each group computes ``1 / n`` of them).

Learned online: each window gives ``c`` by Little's law (demand.py), the quantile at
``c + z sqrt(c / n)`` and the mean at ``c + w / n`` (two points at different effective batches:
each window measures the slope), and the window's ``pi``; ``(t0, k, theta)`` follow by
exponentially weighted least squares of ``y = t0 + k x + theta (pi y)`` (the stretch written
linearly) regularised toward the seed, only from windows near the target (0.5-1.5 T:
``LEARN_RANGE``) in which no group joined and the demand did not jump (the policy's gate,
latency.py). Without prompt tokens in the windows ``theta`` stays at its seed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

THETA_PRIOR = 10.0
"""``theta``'s prior weighs this many times the line's (``prior_weight``): on steady traffic the
prompt and output rates move together, the split of the latency between the decode slope and
the prefill share is barely measured, and the perf model's figure is the better guess of it."""

LEARN_RANGE = (0.5, 1.5)
"""Observed latencies, as multiples of the target, the model learns from."""


@dataclass
class GroupLatencyModel:
    """Per-token latency of one group of ``n`` serving a mean of ``c`` requests each while it
    computes ``pi`` prompt tokens/s (module docstring).

    The latency of a step is linear in its batch (the perf model near the target):
    ``t(b) = t0 + k b``. A group's batch is not its mean ``c``: the fleet's requests come and go at
    random (Poisson in number, mean ``n c``) and the router spreads them over ``n`` groups, so a
    group's batch varies around ``c`` with a standard deviation ``sqrt(c / n)``. The token-weighted
    quantile the target is written in (P90) sits ``z`` standard deviations above the mean, and the
    token-weighted mean at ``c + w / n`` (a token is more likely emitted in a large batch: the
    mean of the token-weighted batch of a Poisson total shared by ``n`` is ``c + 1 / n``). Prefill
    takes a share ``pi theta`` of the group's time and stretches both::

        quantile(c, n, pi) = (t0 + k (c + z sqrt(c / n))) / (1 - pi theta)
        mean(c, n, pi) = (t0 + k (c + w / n)) / (1 - pi theta)

    ``z = w = 0`` is a plain line in ``c``; ``theta = 0`` ignores prefill. Fitted online:
    exponentially weighted least squares of ``t = t0 + k x + theta pi t`` on the effective batch
    ``x`` and the prefill ``pi t`` (both points of every window: the quantile and the mean), with
    forgetting factor ``forget`` per window, a prior of ``prior_weight`` pseudo-observations on
    the seed line at effective batches ``seed_c_low`` and ``seed_c`` (the range the seed was fitted
    on), so the prior pins both intercept and slope where the policy works, and as many on
    ``theta`` at a 10% prefill share."""

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
    theta: float = 0.0
    """Seconds of a group's time per prompt token it computes (seed: 1 / the perf model's prefill
    tokens/s; 0: prefill ignored)."""
    max_prefill_share: float = 1.0
    """Share of a group's time prefill may take at most: vLLM's token budget per step (seed:
    ``B theta / (d + B theta)``, module docstring); at or past it the group saturates."""
    _a: list[list[float]] | None = None
    _b: list[float] | None = None

    def __post_init__(self) -> None:
        self._seed = (self.t0, self.k, self.theta)
        self._a = [[0.0] * 3 for _ in range(3)]
        self._b = [0.0] * 3

    def quantile_batch(self, c: float, n: int = 1, extra_z: float = 0.0) -> float:
        return c + (self.z + extra_z) * math.sqrt(max(c, 0.0) / max(n, 1))

    def mean_batch(self, c: float, n: int = 1) -> float:
        return c + self.w / max(n, 1)

    def stretch(self, pi: float) -> float:
        """``1 / (1 - pi theta)``: how much a group computing ``pi`` prompt tokens/s slows its
        decode; infinite at or past ``max_prefill_share``."""
        rho = max(pi, 0.0) * self.theta
        return math.inf if rho >= self.max_prefill_share or rho >= 1.0 else 1.0 / (1.0 - rho)

    def latency(self, c: float, n: int = 1, extra_z: float = 0.0, pi: float = 0.0) -> float:
        """The target's quantile at ``c`` requests per group, ``n`` groups, each computing ``pi``
        prompt tokens/s (``extra_z`` more standard deviations of the batch: a margin for the
        minute-to-minute variation)."""
        return (self.t0 + self.k * self.quantile_batch(c, n, extra_z)) * self.stretch(pi)

    def mean_latency(self, c: float, n: int = 1, pi: float = 0.0) -> float:
        return (self.t0 + self.k * self.mean_batch(c, n)) * self.stretch(pi)

    def capacity(self, latency_s: float, n: int = 1, pi: float = 0.0) -> float:
        """Largest concurrency per group whose quantile stays <= ``latency_s`` while each group
        computes ``pi`` prompt tokens/s (0 if none)."""
        bound = latency_s / self.stretch(pi)
        if bound <= self.t0:
            return 0.0
        if self.k <= 0:
            return math.inf
        x = (bound - self.t0) / self.k
        a = self.z / math.sqrt(max(n, 1))
        u = (-a + math.sqrt(a * a + 4 * x)) / 2  # c = u^2 solves u^2 + a u = x
        return u * u

    def concurrency(self, demand: float, n: int, prefill: float = 0.0) -> float:
        """Requests per group when ``n`` groups serve ``demand`` tokens/s (per step for a per-step
        model) and compute ``prefill`` prompt tokens/s in all: Little's law
        ``n c = demand x mean(c, n, prefill / n)`` solved for ``c``. Infinite when the groups
        cannot keep up (``n <= demand x k x stretch``, or prefill past its share): the line's
        queueing term ``1 / (1 - rho)``."""
        s = self.stretch(prefill / max(n, 1))
        if math.isinf(s):
            return math.inf
        if demand <= 0:
            return 0.0
        spare = n - demand * self.k * s
        if spare <= 0:
            return math.inf
        return demand * s * (self.t0 + self.k * self.w / n) / spare

    def predict(self, demand: float, n: int, extra_z: float = 0.0, prefill: float = 0.0) -> float:
        """The quantile ``n`` groups give at ``demand`` and ``prefill`` prompt tokens/s (infinite
        past saturation)."""
        if n <= 0:
            return math.inf if demand > 0 or prefill > 0 else 0.0
        c = self.concurrency(demand, n, prefill)
        return math.inf if math.isinf(c) else self.latency(c, n, extra_z, prefill / n)

    def groups_for(self, demand: float, latency_s: float, most: int, extra_z: float = 0.0,
                   prefill: float = 0.0) -> int | None:
        """Fewest groups (1..``most``) whose predicted quantile at ``demand`` and ``prefill`` is
        <= ``latency_s``; None if even ``most`` do not."""
        for n in range(1, most + 1):
            if self.predict(demand, n, extra_z, prefill) <= latency_s:
                return n
        return None

    def update(self, c: float, y: float, n: int = 1, mean: float | None = None, pi: float = 0.0) -> None:
        """One window: quantile ``y`` (and the mean latency, when known) at ``c`` requests per group
        over ``n`` groups, each computing ``pi`` prompt tokens/s."""
        if c <= 0 or y <= 0 or not math.isfinite(y):
            return
        points = [(self.quantile_batch(c, n), y)]
        if mean is not None and mean > 0 and math.isfinite(mean):
            points.append((self.mean_batch(c, n), mean))
        assert self._a is not None and self._b is not None
        f = self.forget
        a = [[f * v for v in row] for row in self._a]
        b = [f * v for v in self._b]
        for x, v in points:
            row = (1.0, x, max(pi, 0.0) * v)
            for i in range(3):
                b[i] += row[i] * v
                for j in range(3):
                    a[i][j] += row[i] * row[j]
        self._a, self._b = a, b
        self._solve()

    def _solve(self) -> None:
        """(t0, k, theta) from the data and the prior (class docstring), within physical bounds:
        latency cannot fall with load, batch-1 latency stays positive, prefill costs time."""
        assert self._a is not None and self._b is not None
        t0s, ks, ths = self._seed
        a = [row[:] for row in self._a]
        b = self._b[:]
        w = self.prior_weight / 2
        for x in (self.seed_c_low, self.seed_c):
            y = t0s + ks * x
            for i, ri in enumerate((1.0, x)):
                b[i] += w * ri * y
                for j, rj in enumerate((1.0, x)):
                    a[i][j] += w * ri * rj
        if ths <= 0:  # prefill ignored: theta stays 0
            sol = _solve_fixed(a, b, {2: 0.0})
        else:
            # theta's prior: prior_weight pseudo-observations of the regressor pi y at a 10% prefill
            # share (pi = 0.1 / theta) of the seed line's latency at seed_c.
            ref = 0.1 / ths * (t0s + ks * self.seed_c)
            a[2][2] += THETA_PRIOR * self.prior_weight * ref * ref
            b[2] += THETA_PRIOR * self.prior_weight * ref * ref * ths
            sol = _gauss(a, b)
        if sol is None:
            return
        t0, k, theta = sol
        # theta stays within 0..20x its seed (the P90 may feel prefill more than the mean does).
        # When the data barely spread the slope is unknowable: keep the seed's slope (at least
        # 0.1x) and move the line through the data (the intercept takes the shift).
        bounded = min(max(theta, 0.0), 20 * ths)
        if bounded != theta:
            theta = bounded
            sol = _solve_fixed(a, b, {2: theta})
            if sol is None:
                return
            t0, k = sol[0], sol[1]
        if k < ks * 0.1:
            k = ks * 0.1
            sol = _solve_fixed(a, b, {1: k, 2: theta})
            if sol is None:
                return
            t0 = sol[0]
        self.k = k
        self.theta = theta
        self.t0 = max(t0, abs(t0s) * 0.25)


def _solve_fixed(a: list[list[float]], b: list[float], fixed: dict[int, float]) -> list[float] | None:
    """The normal equations ``a x = b`` with the unknowns in ``fixed`` held at their values."""
    free = [i for i in range(3) if i not in fixed]
    a2 = [[a[i][j] for j in free] for i in free]
    b2 = [b[i] - sum(a[i][j] * v for j, v in fixed.items()) for i in free]
    sol = _gauss(a2, b2)
    if sol is None:
        return None
    out = [0.0] * 3
    for i, v in fixed.items():
        out[i] = v
    for i, v in zip(free, sol):
        out[i] = v
    return out


def _gauss(a: list[list[float]], b: list[float]) -> list[float] | None:
    """Solve ``a x = b`` (a small symmetric positive system) by elimination with partial
    pivoting; None when singular."""
    n = len(b)
    a = [row[:] + [b[i]] for i, row in enumerate(a)]
    for col in range(n):
        piv = max(range(col, n), key=lambda r: abs(a[r][col]))
        scale = max(abs(a[r][c]) for r in range(n) for c in range(n)) or 1.0
        if abs(a[piv][col]) <= 1e-12 * scale:
            return None
        a[col], a[piv] = a[piv], a[col]
        for r in range(col + 1, n):
            f = a[r][col] / a[col][col]
            for c in range(col, n + 1):
                a[r][c] -= f * a[col][c]
    x = [0.0] * n
    for r in range(n - 1, -1, -1):
        x[r] = (a[r][n] - sum(a[r][c] * x[c] for c in range(r + 1, n))) / a[r][r]
    return x
