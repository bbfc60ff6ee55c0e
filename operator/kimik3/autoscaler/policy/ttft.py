"""The TTFT model: the time-to-first-token quantile ``n`` groups give at a prefill load, learned online.

A prompt of ``L`` tokens not in the prefix cache is prefilled in chunks of at most
``max_num_batched_tokens`` (B) tokens, one per step (vLLM's chunked prefill): ``ceil(L / B)``
steps of ``d + chunk theta`` seconds (``d``: the step's decode part, ``theta``: seconds per prompt
token, the perf model's ``1 / prefill_rate``), about ``L theta + ceil(L / B) d``. Prompts queue
for the scheduler's token budget, which a group computing ``pi`` prompt tokens/s keeps busy a
share ``u = pi (theta + d / B)`` of its steps (at ``u = 1`` every step carries a full chunk:
the most a group prefills). The quantile is taken as an M/G/1 queue's::

    ttft_q(pi) = base / (1 - u(pi))

``base`` (the quantile with no queueing: the prompts' own prefill, their length distribution's
tail, the wait for a batch slot) is learned from each window, ``ttft_q x (1 - u)``, by an
exponential average (``forget`` per window); the first window sets it. Until one is seen the
model asks for nothing. Assumed: prompts are routed like requests (each of ``n`` groups computes
``1 / n`` of them); a target below ``base`` cannot be met by more groups (the longest prompts'
own prefill sets it) and then the model asks for none.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class TTFTModel:
    """TTFT quantile (seconds) of ``n`` groups computing ``prefill`` prompt tokens/s in all."""

    theta: float
    """Seconds of a group's time per prompt token computed (perf model: 1 / prefill tokens/s)."""
    step_s: float
    """Seconds of a step's decode part near the target (the perf model's step at its batch)."""
    budget: int
    """vLLM's ``max_num_batched_tokens`` per step of a group."""
    forget: float = 0.9
    """Weight of the old ``base`` against a new window's."""
    base: float | None = None
    """The quantile without queueing, seconds (None: no window measured yet)."""

    def busy(self, pi: float) -> float:
        """Share of a group's steps whose token budget prefill takes at ``pi`` prompt tokens/s."""
        return max(pi, 0.0) * (self.theta + self.step_s / self.budget)

    def predict(self, prefill: float, n: int) -> float:
        """The quantile of ``n`` groups computing ``prefill`` prompt tokens/s (0 before any window;
        infinite when the groups cannot keep up)."""
        if self.base is None:
            return 0.0
        if n <= 0:
            return math.inf if prefill > 0 else 0.0
        u = self.busy(prefill / n)
        return math.inf if u >= 1 else self.base / (1 - u)

    def reachable(self, target_s: float) -> bool:
        """More groups can bring the quantile under ``target_s`` (it is above ``base``)."""
        return self.base is None or self.base < target_s

    def groups_for(self, prefill: float, target_s: float, most: int) -> int | None:
        """Fewest groups (1..``most``) whose quantile at ``prefill`` is <= ``target_s``; None if
        even ``most`` do not, or the target is not ``reachable``."""
        if not self.reachable(target_s):
            return None
        return next((n for n in range(1, most + 1) if self.predict(prefill, n) <= target_s), None)

    def update(self, ttft_s: float, pi: float) -> None:
        """One window: quantile ``ttft_s`` while each group computed ``pi`` prompt tokens/s."""
        u = self.busy(pi)
        if ttft_s <= 0 or not math.isfinite(ttft_s) or u >= 1:
            return
        seen = ttft_s * (1 - u)
        self.base = seen if self.base is None else self.forget * self.base + (1 - self.forget) * seen
