"""What a policy is given and what it returns: ``FleetState`` in, ``Decision`` out, and the
``Policy`` protocol every autoscaling rule (ours, the kit's baselines) is driven through."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from kimik3.autoscaler.observation import DecodeObservation


@dataclass(frozen=True)
class FleetState:
    """Groups as the cluster reports them."""

    current: int
    """Groups asked for (LeaderWorkerSet spec.replicas)."""
    ready: int
    """Groups serving."""
    loading: int = 0
    """Groups created, not yet ready, still inside their load timeout (coming)."""
    unplaceable: int = 0
    """Groups whose pods the scheduler cannot place (never coming on their own)."""
    serving: frozenset[str] = frozenset()
    """Indexes of the groups serving (every pod Ready), when the caller knows them: a serving
    group absent from the observation's ``groups`` is unmeasured, and a decision with an
    unmeasured group may scale up but never down (its load is unknown, not low)."""
    load_time_s: float | None = None
    """Seconds from a serving group's pods' creation to every one of them Ready, the shortest over
    the serving groups (None: unknown). The groups that served before the policy started loaded
    too: until the policy has timed a scale-up of its own, this is how far ahead it must look."""


@dataclass(frozen=True)
class Decision:
    desired: int
    reason: str
    """CamelCase reason, also used in Events and status.lastScale."""
    message: str = ""
    recommendation: int | None = None
    """The unstabilized recommendation, for observability."""


class Policy(Protocol):
    """Anything that turns (time, observation or None, fleet) into a Decision, at its own cadence.

    Whoever drives a policy (the controller, the kit's fleet simulator) calls ``decide`` every
    ``interval_s`` seconds with an observation over the last ``window_s`` seconds, or None when
    no reading could be made. A policy that reads no metrics (a fixed schedule) declares
    ``window_s`` None and is always given None."""

    @property
    def interval_s(self) -> float:
        """Seconds between decisions."""
        ...

    @property
    def window_s(self) -> float | None:
        """Seconds of metrics each decision reads (the observation window); None: reads none."""
        ...

    def decide(self, now: float, obs: DecodeObservation | None, fleet: FleetState) -> Decision: ...
