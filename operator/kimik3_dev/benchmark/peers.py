"""The peers' settings that their users choose, chosen once (issue 16: "peers at their best").

Each peer's rule and defaults are in ``benchmark/baselines.py``, with their sources. Where a peer
leaves a number to its user (HPA's target value, the llm-d SLO band, KPA's target concurrency,
Dynamo's ITL target and predictor), ``GRID`` lists the candidates a user would try, all as
multiples of the SLO (``target_s``) or named options. ``tune`` runs every candidate on ONE seed
of ONE trace (``TUNE_TRACE``, ``TUNE_SEED``) and ``choose`` picks, as a user after one load test
would: the fewest GPU-hours among the candidates with at least ``SLO_GOAL`` of the minutes
within the SLO, or the highest SLO attainment when none reaches it (then the fewest GPU-hours).
``CHOSEN`` holds the choice (the output of ``kimik3 simulate --tune-peers``, 2026-12-01, in
docs/benchmarks.md) and is what every seed and trace of the benchmark runs, unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from kimik3.autoscaler.policy import Policy
from kimik3_dev.benchmark.baselines import DynamoPlannerPolicy, HPAPolicy, KEDASLOPolicy, KPAPolicy, Profile

Setting = dict[str, Any]

GRID: dict[str, list[Setting]] = {
    "hpa": [{"target": f} for f in (1.0, 0.9, 0.8, 0.7)],
    "keda": [{"band": b} for b in ((0.40, 0.55), (0.55, 0.70), (0.70, 0.85), (0.80, 0.95))],
    "aibrix-kpa": [{"latency": f} for f in (1.0, 0.9, 0.8, 0.7)],
    "dynamo-planner": [{"itl": f, "predictor": p} for p in ("constant", "kalman") for f in (1.0, 0.9, 0.8)],
}
"""hpa: the External metric's target, x SLO. keda: llm-d's band (theta_dn, theta_up) on P90 /
SLO (0.40 / 0.55 is llm-d's benchmarked one). aibrix-kpa: the target concurrency is the
profile's batch whose per-token latency is this x SLO. dynamo-planner: the ITL target (a mean),
x SLO, and the load predictor."""

TUNE_TRACE, TUNE_SEED = "diurnal", 0
"""Where the grid is run: the trace with both ramps and a plateau, its first draw."""

SLO_GOAL = 0.99

CHOSEN: dict[str, Setting] = {
    "hpa": {"target": 0.7},
    "keda": {"band": (0.55, 0.70)},
    "aibrix-kpa": {"latency": 0.7},
    "dynamo-planner": {"itl": 0.8, "predictor": "kalman"},
}


def build(name: str, setting: Setting, target_s: float, profile: Profile, min_replicas: int,
          max_replicas: int, ttft_target_s: float | None = None) -> Policy:
    """Peer ``name`` with its user's ``setting`` (a ``GRID`` entry) for a per-token SLO ``target_s``
    (and a TTFT SLO ``ttft_target_s``, given to the peer that has such a signal: Dynamo's
    planner sizes prefill on it)."""
    lo, hi = min_replicas, max_replicas
    if name == "hpa":
        return HPAPolicy(target_s=setting["target"] * target_s, min_replicas=lo, max_replicas=hi)
    if name == "keda":
        dn, up = setting["band"]
        return KEDASLOPolicy(slo_s=target_s, theta_dn=dn, theta_up=up, min_replicas=lo, max_replicas=hi)
    if name == "aibrix-kpa":
        return KPAPolicy(target=profile.concurrency_at(setting["latency"] * target_s), min_replicas=lo,
                         max_replicas=hi)
    if name == "dynamo-planner":
        return DynamoPlannerPolicy(target_s=setting["itl"] * target_s, profile=profile,
                                   predictor=setting["predictor"], min_replicas=lo, max_replicas=hi,
                                   ttft_target_s=ttft_target_s)
    raise KeyError(name)


def choose(tried: Sequence[tuple[Setting, dict[str, Any]]]) -> Setting:
    """The user's pick among ``(setting, figures)`` pairs (module docstring)."""
    if not tried:
        raise ValueError("nothing was tried")
    ok = [t for t in tried if t[1]["slo_attainment"] >= SLO_GOAL]
    if ok:
        return min(ok, key=lambda t: t[1]["gpu_hours"])[0]
    return min(tried, key=lambda t: (-t[1]["slo_attainment"], t[1]["gpu_hours"]))[0]


def tune(run: Callable[[str, Setting], dict[str, Any]], names: Sequence[str] = tuple(GRID),
         log: Callable[[str], None] = lambda _: None) -> dict[str, dict[str, Any]]:
    """``{peer: {"tried": [[setting, figures], ...], "chosen": setting}}``, ``run(peer, setting)``
    giving a candidate's figures (``simulate.summarize``) on ``TUNE_TRACE`` seed ``TUNE_SEED``."""
    out = {}
    for name in names:
        tried = []
        for setting in GRID[name]:
            figures = run(name, setting)
            tried.append((setting, figures))
            log(f"  {name} {setting}: {figures['slo_attainment'] * 100:.1f}% SLO, {figures['gpu_hours']:.1f} GPU-h")
        out[name] = {"tried": [list(t) for t in tried], "chosen": choose(tried)}
        log(f"  {name}: chosen {out[name]['chosen']}")
    return out
