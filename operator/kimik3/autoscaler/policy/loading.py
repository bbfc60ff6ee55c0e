"""Groups coming: the policy's scale-ups until their groups serve, the load time they take, and
when the serving count last moved.

Groups still loading are counted as coming: they are not cancelled, and while one loads no
scale-up follows from latency (failure case F10; latency.py, reaction.py); a higher DEMAND (which
does not compound with the groups' count) may still add groups. New groups first clear what
queued before them, so the windows they joined teach the model nothing and start no reaction.
The load time is the policy's own, from a scale-up decision to its groups serving, or until it
has one the cluster's (``FleetState.load_time_s``, from the serving groups' pods: the groups that
served before the policy started loaded too, so the first rise is already forecast a whole load
ahead).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kimik3.autoscaler.policy.interface import FleetState


@dataclass(frozen=True)
class ScaleUp:
    """A scale-up this policy decided."""

    at: float
    """When (seconds)."""
    target: int
    """Groups asked for."""
    demand: float
    """The demand read then (demand.py's units), to tell a burst gone by the time they serve."""


@dataclass
class GroupArrivals:
    """The fleet's serving count over decisions, and this policy's scale-ups until they serve."""

    ready_changed: float | None = None
    """Last time the serving count changed (None: never seen to)."""
    ready_rose: float | None = None
    """Last time more groups served than at the decision before."""
    _last_ready: int | None = None
    _coming: list[ScaleUp] = field(default_factory=list)
    """Scale-ups whose groups are still coming."""
    _own_load_s: float | None = None
    """Last observed time from a scale-up decision to its groups serving."""
    _cluster_load_s: float | None = None
    """The last load time the cluster reported (``FleetState.load_time_s``)."""

    @property
    def load_time_s(self) -> float | None:
        """Seconds a group takes to load: this policy's last timed scale-up, else the cluster's
        figure; None while neither is known."""
        return self._own_load_s if self._own_load_s is not None else self._cluster_load_s

    def observe(self, now: float, fleet: FleetState) -> list[ScaleUp]:
        """One decision's view of the fleet: the scale-ups whose groups now serve are returned
        (and time the load); those undone by someone else (or unplaceable) are forgotten."""
        if fleet.load_time_s is not None:
            self._cluster_load_s = fleet.load_time_s
        if self._last_ready != fleet.ready:
            if self._last_ready is not None and fleet.ready > self._last_ready:
                self.ready_rose = now
            self.ready_changed, self._last_ready = now, fleet.ready
        still, done = [], []
        for up in self._coming:
            if fleet.ready >= up.target:
                self._own_load_s = now - up.at
                done.append(up)
            elif fleet.current >= up.target and fleet.unplaceable == 0:
                still.append(up)
        self._coming = still
        return done

    def asked(self, up: ScaleUp) -> None:
        """This policy decided ``up``: follow it until its groups serve."""
        self._coming.append(up)

    def settled(self, now: float, window_s: float) -> bool:
        """The serving count has not changed within the last ``window_s`` seconds."""
        return self.ready_changed is None or now - self.ready_changed >= window_s

    def joined(self, now: float, window_s: float) -> bool:
        """Groups began serving within the last ``window_s`` seconds."""
        return self.ready_rose is not None and now - self.ready_rose < window_s
