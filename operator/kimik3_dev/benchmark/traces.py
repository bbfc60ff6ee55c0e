"""Request traces for the fleet simulator (issue 4, part 4): steady, diurnal, bursts, a step, and
agentic (long prompts).

A ``Trace`` is a request rate per second (requests/s, one value per second of the trace) plus the
moments where the rate jumps (for "time to recover"). ``Trace.requests(seed)`` draws the
requests: arrivals are Poisson within each second at that second's rate (exponential gaps, so
the count in a second is Poisson(rate) and the times uniform), and each request gets a prompt
and an output length from ``LengthShape``. Everything is drawn from one ``random.Random(seed)``:
the same trace and seed give the same requests, on every machine and Python 3.11 run.

Sizes (documented choices, not measurements)
============================================
The rates are sized for the latency recipe (recipes/gb300-tp8-megakernel-dspark.yaml) at a 5 ms
per-token target, and for 2 GB300 NVL72 racks (18 groups of 2 trays): in the fleet simulator one
group holds P90 <= 5 ms up to ~650 output tokens/s, ~1.6 requests/s of 400 tokens (the perf
model's batch-4 latency is 4.4 ms, batch-6 5.5 ms, and random arrivals move a group's batch
around its mean). Each trace peaks at 11-13 groups, most of the two racks, so that one group is
under 10% of the fleet: with 5-6 groups a single group is 17-20%, and a comparison of GPU-hours
against the hindsight optimum (which adds a group exactly in the minutes that need it) would
measure integer rounding rather than the policy.

============ ======== =========================================================================
trace        length   shape
============ ======== =========================================================================
steady       2 h      20 requests/s throughout (~13 groups)
diurnal      4 h      one day compressed 6x (1 simulated hour = 10 minutes): a sinusoid with its
                      trough at 03:00 and peak at 15:00, peak/trough 4 (4.5 -> 18 req/s, mean
                      11.25); the compression makes the ramps 6x steeper than a real day's
                      relative to the 15 min load time: a harder test of prediction
bursts       2 h      8 requests/s, with 5 bursts to x2.5 (20 req/s) of 3-6 minutes each, rising
                      within 20 s, at seeded random times at least 10 minutes apart
step         2 h      4 requests/s, at 30 min x4 (16 req/s) within one minute, held for 60 min,
                      then back to 4 requests/s within one minute
agentic      2 h      agentic / long-context traffic (issue 23): prompts lognormal with a
                      median of 8k tokens and a heavy tail (sigma 1.1: 1% past ~100k, clipped at
                      128k), outputs of ~250 tokens; 7 requests/s swinging +-30% over an hour
                      (~4.9-9.1 req/s), ~80k prompt tokens/s at the mean
============ ======== =========================================================================

The agentic shape (``AGENTIC_SHAPE``) is our assumption of what coding agents and long-context
chat send (tool schemas, file contents and histories in every prompt, short answers); the
Mooncake conversation trace, replayed beside it (bench/traces/), has a median prompt of ~6.9k
tokens and a mean of 12k with outputs of ~340.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from kimik3_dev.sim.tracefile import Request, read, replay_seconds, superpose


@dataclass(frozen=True)
class LengthShape:
    """Prompt and output lengths of the built-in workload (tokens).

    Lognormal around a chat-like mean (prompt ~2k tokens: a system prompt, a few turns of history;
    output ~400 tokens: an answer), clipped. The means are the brief's shape; the spreads (sigma
    of the log) are our assumption of a moderately varied chat workload."""

    prompt_mean: float = 2000.0
    output_mean: float = 400.0
    prompt_sigma: float = 0.6
    output_sigma: float = 0.5
    prompt_range: tuple[int, int] = (64, 32_000)
    output_range: tuple[int, int] = (16, 4_000)

    def draw(self, rng: random.Random) -> tuple[int, int]:
        """One (prompt_tokens, output_tokens) pair; the lognormal's mu is set so the mean before
        clipping is ``*_mean``."""
        def one(mean: float, sigma: float, lo: int, hi: int) -> int:
            mu = math.log(mean) - sigma * sigma / 2
            return int(min(hi, max(lo, round(rng.lognormvariate(mu, sigma)))))
        return (one(self.prompt_mean, self.prompt_sigma, *self.prompt_range),
                one(self.output_mean, self.output_sigma, *self.output_range))


DEFAULT_SHAPE = LengthShape()


@dataclass(frozen=True)
class Trace:
    name: str
    rates: tuple[float, ...]
    """Requests/s for each second of the trace (index = second)."""
    jumps: tuple[float, ...] = ()
    """Seconds at which the rate jumps up (a step or a burst starts): "time to recover" is measured from each."""
    description: str = ""
    shape: LengthShape = field(default=DEFAULT_SHAPE)
    replay: tuple[Request, ...] = ()
    """Recorded requests (a trace file, ``recorded``): replayed as they are, not drawn."""
    copies: int = 1
    """Superposed copies of ``replay``: copy 0 as recorded, each other one shifted by a seeded
    offset and wrapped around the trace's end (a recorded trace scaled to a fleet's size)."""

    @property
    def duration_s(self) -> int:
        return len(self.rates)

    def rate(self, t: float) -> float:
        """Requests/s at second ``t`` (0 outside the trace)."""
        i = int(t)
        return self.rates[i] if 0 <= i < len(self.rates) else 0.0

    def requests(self, seed: int = 0) -> list[Request]:
        """The trace's requests, sorted by arrival (deterministic for a given seed). A replayed
        trace keeps every recorded arrival and length; the seed only places its copies."""
        rng = random.Random(f"{self.name}:{seed}")
        if self.replay:
            return self._superposed(rng)
        out: list[Request] = []
        for second, rate in enumerate(self.rates):
            if rate <= 0:
                continue
            t = second + rng.expovariate(rate)
            while t < second + 1:
                p, o = self.shape.draw(rng)
                out.append(Request(t, p, o))
                t += rng.expovariate(rate)
        return out

    def _superposed(self, rng: random.Random) -> list[Request]:
        return superpose(self.replay, self.copies, self.duration_s, rng)


def recorded(path: Path, compression: float = 1.0, copies: int = 1, name: str | None = None) -> Trace:
    """The requests of a trace file (``kimik3_dev.sim.tracefile.read``: CSV or Mooncake JSON Lines)
    as a replayed ``Trace`` named ``name`` (default: the file's stem), ``copies`` superposed; the
    trace lasts until the last arrival plus a minute, whole seconds. Raises ``TraceFileError`` for a
    file it cannot read and ValueError for a compression <= 0 or fewer than 1 copy."""
    if copies < 1:
        raise ValueError(f"copies must be >= 1 (got {copies})")
    replay = read(path, compression)
    rates = [0.0] * replay_seconds(replay)
    for r in replay:
        rates[int(r.arrival_s)] += copies
    return Trace(name or path.stem, tuple(rates), (),
                 f"{len(replay)} recorded requests from {path.name}" + (f" x{copies} copies" if copies > 1 else "")
                 + (f", {compression:g}x faster" if compression != 1 else ""), replay=replay, copies=copies)


def _from(fn: Callable[[float], float], duration_s: int) -> tuple[float, ...]:
    return tuple(max(0.0, fn(s + 0.5)) for s in range(duration_s))


def steady(rate: float = 20.0, duration_s: int = 7200) -> Trace:
    """Constant ``rate`` requests/s."""
    return Trace("steady", _from(lambda t: rate, duration_s), (),
                 f"{rate:g} req/s for {duration_s / 3600:g} h")


def diurnal(mean: float = 11.25, peak_to_trough: float = 4.0, duration_s: int = 4 * 3600,
            compression: float = 6.0) -> Trace:
    """A day compressed ``compression`` times into ``duration_s`` (default 4 h, 1 simulated hour =
    10 real minutes): ``mean x (1 + a sin(2 pi (h - 9) / 24))`` with h the hour of the simulated
    day, trough at 03:00 and peak at 15:00, ``a`` such that peak / trough = ``peak_to_trough``.
    The simulated day starts at 00:00."""
    a = (peak_to_trough - 1) / (peak_to_trough + 1)

    def rate(t: float) -> float:
        hour = (t * compression / 3600.0) % 24
        return mean * (1 + a * math.sin(2 * math.pi * (hour - 9) / 24))
    return Trace("diurnal", _from(rate, duration_s), (),
                 f"a day compressed {compression:g}x into {duration_s / 3600:g} h: {mean * (1 - a):.1f}"
                 f" -> {mean * (1 + a):.1f} req/s (trough 03:00, peak 15:00)")


def bursts(base: float = 8.0, factor: float = 2.5, count: int = 5, duration_s: int = 7200,
           length_s: tuple[int, int] = (180, 360), rise_s: int = 20, min_gap_s: int = 600,
           seed: int = 7) -> Trace:
    """``base`` requests/s with ``count`` bursts to ``factor x base``, each ``length_s`` long
    (uniform), rising and falling linearly within ``rise_s``, starting at seeded random times
    at least ``min_gap_s`` apart (after the first 10 minutes, ending 10 minutes before the end)."""
    rng = random.Random(f"bursts:{seed}")
    starts: list[tuple[int, int]] = []
    while len(starts) < count:
        start = rng.randrange(600, duration_s - 600 - length_s[1])
        length = rng.randint(*length_s)
        if all(abs(start - s) >= min_gap_s + max(length, ln) for s, ln in starts):
            starts.append((start, length))
    starts.sort()

    def rate(t: float) -> float:
        boost = 0.0
        for s, ln in starts:
            up = min(1.0, max(0.0, (t - s) / rise_s))
            down = min(1.0, max(0.0, (s + ln - t) / rise_s))
            boost = max(boost, min(up, down))
        return base * (1 + (factor - 1) * boost)
    return Trace("bursts", _from(rate, duration_s), tuple(float(s) for s, _ in starts),
                 f"{base:g} req/s with {count} bursts to x{factor:g} of {length_s[0] // 60}-{length_s[1] // 60} min")


def step(base: float = 4.0, factor: float = 4.0, at_s: int = 1800, hold_s: int = 3600,
         ramp_s: int = 60, duration_s: int = 7200) -> Trace:
    """``base`` requests/s, rising linearly to ``factor x base`` over ``ramp_s`` (one minute)
    from ``at_s``, held ``hold_s``, then falling back over ``ramp_s``."""
    def rate(t: float) -> float:
        if t < at_s:
            x = 0.0
        elif t < at_s + ramp_s:
            x = (t - at_s) / ramp_s
        elif t < at_s + ramp_s + hold_s:
            x = 1.0
        elif t < at_s + 2 * ramp_s + hold_s:
            x = 1 - (t - at_s - ramp_s - hold_s) / ramp_s
        else:
            x = 0.0
        return base * (1 + (factor - 1) * x)
    return Trace("step", _from(rate, duration_s), (float(at_s),),
                 f"{base:g} req/s, x{factor:g} within {ramp_s} s at {at_s // 60} min for {hold_s // 60} min")


AGENTIC_SHAPE = LengthShape(prompt_mean=8000 * math.exp(1.1 ** 2 / 2), output_mean=250.0, prompt_sigma=1.1,
                            output_sigma=0.6, prompt_range=(256, 131_072), output_range=(8, 4_000))
"""Agentic / long-context lengths: prompt median 8k tokens (mean ~14.6k before clipping), heavy
tailed; outputs ~250 tokens."""


def agentic(mean: float = 7.0, swing: float = 0.3, period_s: int = 3600, duration_s: int = 7200) -> Trace:
    """``mean`` requests/s of ``AGENTIC_SHAPE`` lengths, ``x (1 + swing sin(2 pi t / period_s))``."""
    return Trace("agentic", _from(lambda t: mean * (1 + swing * math.sin(2 * math.pi * t / period_s)), duration_s),
                 (), f"{mean:g} req/s +-{swing * 100:g}% over {period_s // 60} min, prompts median 8k tokens "
                     "(heavy tail to 128k), outputs ~250", shape=AGENTIC_SHAPE)


def all_traces() -> list[Trace]:
    """The benchmark's synthetic traces at their documented sizes."""
    return [steady(), diurnal(), bursts(), step(), agentic()]
