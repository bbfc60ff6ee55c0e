"""The idle decision of spec.idle.stopAfter: when a deployment has seen no request for long enough.

Each reading is one ``DecodeObservation`` of the autoscaler's metric source over its window
(vLLM's request counters and gauges: requests running, waiting, finished; tokens prefilled and
generated). ``IdleClock`` keeps when the deployment was last seen active: a reading with any
request, a reading that cannot be trusted (the source unreadable, a serving group missing from
it or its counters not covering the window, or a gap since the previous reading longer than the
window), or a start or wake of the clock. Only whole, quiet, back-to-back readings let it run, so
an unreadable source never stops anything.
"""

from __future__ import annotations

from collections.abc import Set
from dataclasses import dataclass

from kimik3.autoscaler.observation import DecodeObservation


def quiet(obs: DecodeObservation, serving: Set[str]) -> bool:
    """The reading ``obs`` shows no request in its window and covers every group of ``serving``
    (the group indexes whose every pod is Ready): nothing ran, waited, finished, prefilled or
    decoded, and no serving group's counters are missing or partial."""
    return (not obs.has_traffic and obs.requests_finished == 0 and obs.prompt_tokens == 0
            and set(serving) <= obs.covered)


@dataclass
class IdleClock:
    """When a deployment was last seen active, from readings (unix seconds throughout)."""

    active_at: float
    """Last time a request, an untrusted reading, a start or a wake was seen."""
    read_at: float | None = None
    """Time of the previous reading (None: none yet)."""

    def read(self, now: float, obs: DecodeObservation | None, serving: Set[str]) -> None:
        """One reading at ``now``: ``obs`` (None: the source could not be read). Anything but a
        ``quiet`` reading that follows the previous one within its window restarts the clock."""
        back_to_back = self.read_at is not None and obs is not None and now - self.read_at <= obs.window_s
        if obs is None or not back_to_back or not quiet(obs, serving):
            self.active_at = now
        self.read_at = now

    def restart(self, at: float) -> None:
        """A wake (or a wake request) at ``at``: the clock counts from then at the latest."""
        self.active_at = max(self.active_at, at)

    def idle_for(self, now: float) -> float:
        """Seconds without a request as of ``now``."""
        return max(0.0, now - self.active_at)

    def due(self, now: float, stop_after_s: float) -> bool:
        """Idle for at least ``stop_after_s`` seconds (spec.idle.stopAfter) at ``now``."""
        return self.idle_for(now) >= stop_after_s
