"""The latency reaction: where the observed quantile overrules the model's sizing.

- Over target: one more group when the window's quantile is over ``tolerated`` (1.1 T) and the
  model says enough already. The model lags reality; this only runs with nothing loading and
  nothing unplaceable (F10), and once the window has seen only the groups serving now (new
  groups first clear what queued before them; loading.py).
- Under it, scale-down is anchored: never to a count whose quantile, predicted as the one
  observed now plus the model's step to that count, passes the scale-down level (the model can
  be off where it stands, its slope less so).
"""

from __future__ import annotations

from kimik3.autoscaler.policy.interface import FleetState
from kimik3.autoscaler.policy.model import GroupLatencyModel

REACT_TOLERANCE = 0.1
"""The latency reaction (one more group when the model says enough) needs the quantile this far
over the target: HPA's default tolerance; below it a window's quantile is noise."""


def tolerated(target_s: float) -> float:
    """The highest quantile (seconds) the reaction leaves alone for a target of ``target_s``."""
    return target_s * (1 + REACT_TOLERANCE)


def over_target(latency: float | None, target_s: float, n: int, fleet: FleetState, joined: bool) -> bool:
    """One group more than ``fleet.current`` is due although the model asks for ``n``: the
    quantile ``latency`` (seconds) is over ``tolerated(target_s)``, ``n`` adds none, no group
    loads or waits for a place, and no group ``joined`` within the window."""
    return latency is not None and latency > tolerated(target_s) and n <= fleet.current \
        and fleet.loading == 0 and fleet.unplaceable == 0 and not joined


def anchored_down(n_down: int, serving: int, latency: float, model: GroupLatencyModel, demand: float,
                  keep: float, noise_z: float, plan_down: float, mix: float = 0.0) -> int:
    """``n_down`` groups, raised (toward ``serving``, the groups serving now at quantile
    ``latency``) until the quantile predicted as the observed one plus the model's step from
    ``serving`` groups at ``demand`` to ``n_down`` at ``keep`` (with ``noise_z`` more standard
    deviations; ``mix`` prompt tokens computed per output token) stays under ``plan_down`` seconds."""
    if n_down < serving:
        base = model.predict(demand, serving, 0.0, demand * mix)
        while n_down < serving and latency + model.predict(keep, n_down, noise_z, keep * mix) - base > plan_down:
            n_down += 1
    return n_down
