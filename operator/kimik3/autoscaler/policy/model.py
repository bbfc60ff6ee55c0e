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
``a + m coverage(n + p) + b n + p / prefill_rate`` (perfmodel.step_time). A group computing ``pi``
prompt tokens/s (prompt tokens less the prefix cache's hits: those cost no step) emits its
tokens from two kinds of step, each one token per running request (``al`` under speculative
decoding):

- chunk steps, which carry a chunk of a prompt: vLLM's scheduler gives a step at most
  ``max_num_batched_tokens`` (``budget``, B) tokens, so a prompt of ``L`` computed tokens takes
  ``ceil(L / B)`` steps; the mean chunk is ``C = L / max(1, L / B + 1/2)`` (``E[ceil(L / B)]``
  is ``L / B + 1/2`` within 2% for the agentic trace's lognormal prompts, 1 for prompts under
  ``B / 2``). A chunk adds ``chunk_extra = chunk_step_s + C chunk_theta`` to its step: the
  chunk's tokens at the perf model's ``1 / prefill_rate`` and a fixed part, the experts' weights
  the prompt tokens stream (``coverage`` jumps to ~1 for any chunk: 18.9 ms of the latency
  recipe's 129 ms for a full chunk at the target's batch). Per token a chunk step takes
  ``chunk(c, n) = line(c, n) + chunk_extra / al``.
- decode-only steps, on the line ``line(c, n) = t0 + k (c + z sqrt(c / n))``.

A group makes ``pi / C`` chunk steps per second, which take a share ``rho = (pi / C) chunk_extra``
of its time, and ``(1 - rho) / d`` decode-only ones (``d = al (t0 + k c)``, the decode step at
its mean batch), each with the same batch, so chunk steps hold a token share
``s = (pi / C) d / (1 - rho)``. The target's token-weighted quantile ``q`` (P90) is the decode
steps' own ``q / (1 - s)`` quantile while ``s < 1 - q`` (the chunk steps' tokens are the slowest:
they take the top ``s`` of the ranks), taken on the line as ``deeper`` more standard deviations
of the batch (a normal's: ``Phi^-1(q / (1 - s)) - Phi^-1(q)``), and the chunk step's time once
``s >= 1 - q`` (the slowest tenth of the tokens are then all chunk-step tokens)::

    quantile(c, n, pi) = line(c + deeper sqrt(c / n), n) / (1 - pi theta')   s(c, pi) <  1 - q
                       = max(line(c, n) / (1 - pi theta'), chunk(c, n))       s(c, pi) >= 1 - q

(the first never above the second: the decode steps are the faster ones).

The decode steps are stretched by ``1 / (1 - pi theta')``, ``theta' = theta + chunk_step_s / C``
(``rho`` with a learned ``theta`` in place of ``chunk_theta``): a step that carries no chunk is
no slower, but its batch is larger by the requests that came while chunk steps ran (the
decoders stalled meanwhile); the stretch is that growth as Little's law gives it for the mean
(which it is exactly: ``mean = line_mean + s chunk_extra / al = line_mean / (1 - rho)``), and
``theta`` is learned (below) so that it fits the quantile too. Little's law keeps its form with
``t0`` and ``k`` so stretched. vLLM caps a step at ``B`` tokens: a prefill share past
``max_prefill_share`` is saturation, whatever the decode load. More groups lower ``pi`` per
group, hence ``s``: the capacity per group (``capacity``) is the batch whose quantile holds the
target: below the batch where ``s`` reaches ``1 - q`` (``chunk_reach``) while the chunk step is
over the target, past it where the chunk step is under it.

Assumed: prompts are routed like requests (each group computes ``1 / n`` of them); each chunk
step carries one prompt's chunk (vLLM packs several short prompts into one step's budget when
they wait together: fewer, longer chunk steps than assumed, so ``s`` is over-stated at high
prefill load); a chunk step's decoders are the group's mean batch; the decode steps' batch is
normal enough for ``deeper``; the chunk steps of one window are spread evenly over its minutes.
Against the fleet simulator on the agentic trace the share comes out low: after a long prompt's
run of chunk steps the decode batch is swollen by the requests that arrived meanwhile, larger
than Little's law's mean, which ``theta`` and the line learn only in part.

Learned online: each window gives ``c`` by Little's law (demand.py), the quantile at
``c + z sqrt(c / n)`` and the mean at ``c + w / n`` (two points at different effective batches:
each window measures the slope), and the window's ``pi``; ``(t0, k, theta)`` follow by
exponentially weighted least squares of ``y = t0 + k x + theta (pi y)`` (the stretch written
linearly) regularised toward the seed, the quantile left out when it lies nearer the chunk
step's time than the decode line's (the chunk steps set it: it says nothing of the line). Of the
chunk term the mean chunk ``C`` is learned, from the windows' mean computed prompt
(``observe_prompts``, the same forgetting factor; ``al`` is each window's acceptance length);
``chunk_theta`` and ``chunk_step_s`` stay the perf model's: a window whose quantile is a chunk
step (~28 ms per token for 6k-token chunks on the latency recipe) lies far outside the range the
model learns from. The decode points are read through the known part of the stretch,
``y (1 - pi chunk_step_s / C) = t0 + k x + theta (pi y)``, the quantile's ``x`` with its
``deeper``. The fit takes only windows near the target (0.5-1.5 T:
``LEARN_RANGE``) in which no group joined and the demand did not jump (the policy's gate,
latency.py). Without prompt tokens in the windows ``theta`` stays at its seed.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from statistics import NormalDist

THETA_PRIOR = 10.0
"""``theta``'s prior weighs this many times the line's (``prior_weight``): on steady traffic the
prompt and output rates move together, the split of the latency between the decode slope and
the prefill share is barely measured, and the perf model's figure is the better guess of it."""

_NORMAL = NormalDist()
"""The standard normal: the decode steps' quantile under the chunk steps (``deeper``)."""

LEARN_RANGE = (0.5, 1.5)
"""Observed latencies, as multiples of the target, the model learns from."""


@dataclass
class GroupLatencyModel:
    """Per-token latency of one group of ``n`` serving a mean of ``c`` requests each while it
    computes ``pi`` prompt tokens/s (module docstring).

    The latency of a decode-only step is linear in its batch (the perf model near the target):
    ``t(b) = t0 + k b``. A group's batch is not its mean ``c``: the fleet's requests come and go at
    random (Poisson in number, mean ``n c``) and the router spreads them over ``n`` groups, so a
    group's batch varies around ``c`` with a standard deviation ``sqrt(c / n)``. The token-weighted
    quantile the target is written in (P90) sits ``z`` standard deviations above the mean, and the
    token-weighted mean at ``c + w / n`` (a token is more likely emitted in a large batch: the
    mean of the token-weighted batch of a Poisson total shared by ``n`` is ``c + 1 / n``). Prefill
    takes a share ``pi theta'`` of the group's time (``theta' = theta + chunk_step_s /
    chunk_tokens``) and stretches the decode steps; its chunk steps, a token share
    ``s = chunk_share(c, pi)``, push the quantile deeper into the decode steps' (``deeper``) and
    take it once ``s`` reaches ``1 - q``::

        line(c, n) = t0 + k (c + z sqrt(c / n))
        chunk(c, n, pi) = max(line / (1 - pi theta'), line + chunk_extra / al)
        quantile(c, n, pi) = min(line(c + deeper sqrt(c / n), n) / (1 - pi theta'), chunk)   s < 1 - q
                           = chunk                                                          s >= 1 - q
        mean(c, n, pi) = (t0 + k (c + w / n)) / (1 - pi theta')

    ``z = w = 0`` is a plain line in ``c``; ``theta = 0`` ignores prefill, ``chunk_theta = 0``
    the chunk steps. Fitted online: exponentially weighted least squares of ``t (1 - pi
    chunk_step_s / chunk_tokens) = t0 + k x + theta pi t`` on the effective batch ``x`` and the
    prefill ``pi t`` (the mean, and the quantile unless it lies nearer the chunk step's time than
    the line's), with forgetting factor ``forget`` per window, a prior of ``prior_weight``
    pseudo-observations on the seed line at effective batches ``seed_c_low`` and ``seed_c`` (the
    range the seed was fitted on), so the prior pins both intercept and slope where the policy
    works, and as many on ``theta`` at a 10% prefill share."""

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
    q: float = 0.9
    """The target's percentile as a fraction: chunk steps take the quantile once they hold
    ``1 - q`` of the tokens."""
    budget: int = 8192
    """vLLM's ``max_num_batched_tokens``: the most prompt tokens one step computes."""
    al: float = 1.0
    """Tokens per running request per step in the model's unit (the acceptance length for a
    per-token target, 1 for a per-step one; seed: the perf model's, then each window's)."""
    chunk_theta: float = 0.0
    """Seconds a step takes per prompt token of its chunk (the perf model's ``1 / prefill_rate``;
    0: no chunk steps modelled)."""
    chunk_step_s: float = 0.0
    """Seconds a step that carries a chunk takes beyond its decode part and its chunk's
    ``chunk_theta`` per token (the perf model: the experts' weights the prompt tokens stream,
    whatever the chunk's size)."""
    chunk_tokens: float = 8192.0
    """Mean prompt tokens a chunk step computes (seed: ``budget``; then from the windows' mean
    computed prompt, ``observe_prompts``)."""
    _a: list[list[float]] | None = None
    _b: list[float] | None = None
    _prompts: tuple[float, float] = (0.0, 0.0)
    """Forgetting-weighted computed prompt tokens and prompts of the windows seen."""

    def __post_init__(self) -> None:
        self._seed = (self.t0, self.k, self.theta)
        self._a = [[0.0] * 3 for _ in range(3)]
        self._b = [0.0] * 3

    def quantile_batch(self, c: float, n: int = 1, extra_z: float = 0.0) -> float:
        return c + (self.z + extra_z) * math.sqrt(max(c, 0.0) / max(n, 1))

    def mean_batch(self, c: float, n: int = 1) -> float:
        return c + self.w / max(n, 1)

    def stretch(self, pi: float) -> float:
        """``1 / (1 - pi (theta + chunk_step_s / chunk_tokens))``: how much a group computing ``pi``
        prompt tokens/s slows its mean per-token latency; infinite at or past ``max_prefill_share``."""
        rho = max(pi, 0.0) * (self.theta + self._overhead())
        return math.inf if rho >= self.max_prefill_share or rho >= 1.0 else 1.0 / (1.0 - rho)

    def deeper(self, c: float, pi: float) -> float:
        """Standard deviations of the batch between the decode steps' ``q`` quantile and their
        ``q / (1 - s)`` one, which is the group's ``q`` quantile while chunk steps hold a token
        share ``s < 1 - q`` (``chunk_share``; 0 without chunk steps or at ``s >= 1 - q``)."""
        share = self.chunk_share(c, pi)
        if share <= 0 or share >= 1 - self.q:
            return 0.0
        return _NORMAL.inv_cdf(min(self.q / (1 - share), 1 - 1e-12)) - _NORMAL.inv_cdf(self.q)

    def _overhead(self) -> float:
        """Seconds of a chunk step's fixed part per prompt token: ``chunk_step_s / chunk_tokens``."""
        return self.chunk_step_s / self.chunk_tokens if self.chunk_tokens > 0 else 0.0

    def chunk_share(self, c: float, pi: float) -> float:
        """Share of a group's tokens emitted by steps that carry a prompt chunk, at a mean of
        ``c`` requests and ``pi`` prompt tokens/s: ``(pi / C) d / (1 - rho)`` with ``C`` the mean
        chunk, ``d = al (t0 + k c)`` and ``rho = (pi / C) chunk_extra`` (module docstring); 1 when
        prefill saturates the group."""
        if pi <= 0 or self.chunk_tokens <= 0 or self.chunk_theta <= 0:
            return 0.0
        rho = pi / self.chunk_tokens * self.chunk_extra()
        if math.isinf(self.stretch(pi)) or rho >= 1:
            return 1.0
        step = self.al * (self.t0 + self.k * max(c, 0.0))
        return min(1.0, pi / self.chunk_tokens * step / (1 - rho))

    def chunk_extra(self) -> float:
        """Seconds a chunk adds to the step that carries it: ``chunk_step_s + chunk_tokens
        chunk_theta``."""
        return self.chunk_step_s + self.chunk_tokens * self.chunk_theta

    def chunk_latency(self) -> float:
        """Seconds per token a chunk step adds to the decode step it carries: ``chunk_extra / al``."""
        return self.chunk_extra() / self.al

    def latency(self, c: float, n: int = 1, extra_z: float = 0.0, pi: float = 0.0) -> float:
        """The target's quantile at ``c`` requests per group, ``n`` groups, each computing ``pi``
        prompt tokens/s (``extra_z`` more standard deviations of the batch: a margin for the
        minute-to-minute variation): the decode line, or the chunk step once chunk steps hold
        ``1 - q`` of the tokens."""
        if math.isinf(self.stretch(pi)):
            return math.inf
        line = self.t0 + self.k * self.quantile_batch(c, n, extra_z)
        chunk = max(line * self.stretch(pi), line + self.chunk_latency())
        if c >= self.chunk_reach(pi):
            return chunk
        # Deeper into the decode steps, never past the chunk steps' time (they are slower).
        return min((self.t0 + self.k * self.quantile_batch(c, n, extra_z + self.deeper(c, pi))) * self.stretch(pi),
                   chunk)

    def mean_latency(self, c: float, n: int = 1, pi: float = 0.0) -> float:
        return (self.t0 + self.k * self.mean_batch(c, n)) * self.stretch(pi)

    def capacity(self, latency_s: float, n: int = 1, pi: float = 0.0) -> float:
        """Largest concurrency per group whose quantile stays <= ``latency_s`` while each group
        computes ``pi`` prompt tokens/s (0 if none): on the decode steps short of the batch where
        chunk steps reach ``1 - q`` of the tokens (``chunk_reach``), past it only if the chunk step
        itself is under ``latency_s``. Each piece rises with ``c``: found by bisection."""
        if math.isinf(self.stretch(pi)):
            return 0.0
        top = self._line_capacity(latency_s, n)  # the unstretched line: no piece is faster
        if math.isinf(top):
            return math.inf
        reach = min(self.chunk_reach(pi), top)
        best = _largest(lambda c: self.latency(c, n, 0.0, pi) <= latency_s, 0.0, reach)
        if reach < top and self.latency(reach, n, 0.0, pi) <= latency_s:
            best = max(best, _largest(lambda c: self.latency(c, n, 0.0, pi) <= latency_s, reach, top))
        return best

    def chunk_reach(self, pi: float) -> float:
        """Mean requests per group at which chunk steps reach ``1 - q`` of a group's tokens while it
        computes ``pi`` prompt tokens/s (``chunk_share`` solved for ``c``; infinite without chunk
        steps, 0 when they hold that share at any batch)."""
        if pi <= 0 or self.chunk_theta <= 0 or self.chunk_tokens <= 0:
            return math.inf
        rho = pi / self.chunk_tokens * self.chunk_extra()
        if rho >= 1 or math.isinf(self.stretch(pi)):
            return 0.0
        step = (1 - self.q) * self.chunk_tokens * (1 - rho) / pi  # the decode step at that share
        if self.k <= 0:
            return math.inf if step > self.al * self.t0 else 0.0
        return max(0.0, (step / self.al - self.t0) / self.k)

    def _line_capacity(self, latency_s: float, n: int) -> float:
        """Largest ``c`` whose decode line's quantile ``t0 + k (c + z sqrt(c / n))`` is <= ``latency_s``."""
        if latency_s <= self.t0:
            return 0.0
        if self.k <= 0:
            return math.inf
        x = (latency_s - self.t0) / self.k
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

    def observe_prompts(self, computed_tokens: float, prompts: float, al: float) -> None:
        """One window's computed prompt tokens (less the prefix cache's hits) over its
        ``prompts`` prefilled, and its acceptance length ``al`` (1 for a per-step model): the mean
        chunk ``C = L / max(1, L / B + 1/2)`` of the forgetting-weighted mean prompt ``L``
        (module docstring)."""
        if al > 0:
            self.al = al
        if prompts <= 0 or computed_tokens <= 0:
            return
        tokens, count = self._prompts
        tokens, count = self.forget * tokens + computed_tokens, self.forget * count + prompts
        self._prompts = (tokens, count)
        mean = tokens / count
        self.chunk_tokens = mean / max(1.0, mean / self.budget + 0.5)

    def update(self, c: float, y: float, n: int = 1, mean: float | None = None, pi: float = 0.0) -> None:
        """One window: quantile ``y`` (and the mean latency, when known) at ``c`` requests per group
        over ``n`` groups, each computing ``pi`` prompt tokens/s."""
        if c <= 0 or y <= 0 or not math.isfinite(y):
            return
        # A quantile nearer the chunk step's predicted time than the decode line's was set by the
        # chunk steps: it says nothing of the line.
        line = self.t0 + self.k * self.quantile_batch(c, n)
        decode, chunk = line * self.stretch(pi), line + self.chunk_latency()
        xq = self.quantile_batch(c, n, self.deeper(c, pi))
        on_chunk = pi > 0 and chunk > decode and y > (decode + chunk) / 2
        # t (1 - pi overhead) = t0 + k x + theta pi t: the chunk steps' fixed part is the perf model's.
        known = 1 - max(pi, 0.0) * self._overhead()
        rows = [] if on_chunk else [((1.0, xq, max(pi, 0.0) * y), y * known)]
        if mean is not None and mean > 0 and math.isfinite(mean):
            rows.append(((1.0, self.mean_batch(c, n), max(pi, 0.0) * mean), mean * known))
        if not rows:
            return
        assert self._a is not None and self._b is not None
        f = self.forget
        a = [[f * v for v in row] for row in self._a]
        b = [f * v for v in self._b]
        for row, v in rows:
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


def _largest(holds: Callable[[float], bool], lo: float, hi: float, steps: int = 60) -> float:
    """Largest ``c`` in ``[lo, hi]`` for which ``holds(c)``, ``holds`` true up to a point and false
    after it (``lo`` if it fails already there)."""
    if not holds(lo):
        return lo
    if holds(hi):
        return hi
    for _ in range(steps):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if holds(mid) else (lo, mid)
    return lo
