"""The burst hold: bursts shorter than a load time are served by the groups kept from the last one.

Groups that arrive to a demand ``BURST_DROP`` times lower than the one that asked for them mark
the load as bursty; scale-down then keeps what the burst asked for during ``burst_hold_loads``
load times, extended by each new upward shift of the demand (forecast.py), so that the groups
one burst brought serve the next one. That first ask was sized on a saturated fleet (the panic
path's estimate, demand.py, and a window that lagged the burst); each later burst the held
groups serve is measured, and the hold keeps the most the bursts measured within it needed.

A burst's need is the most groups a whole observation window of its readings asked for (each
decision passes the lowest recommendation of the window it ends, ``Stabilization.sustained``),
not the highest single recommendation: on the way up, while the target holds, groups wait for a
window of readings to agree (stabilization.py), and one reading at a burst's peak asking a
group more than the rest is that same noise; kept, it is a group held for the whole hold
(bursts seed 3: 12 groups kept for 82 minutes where each burst's readings agreed on 11, 8.4
GPU-h). A reading over the target (or the TTFT target) counts at face value: the held groups
were too few, as measured.

The first ask is a burst's need the same way: what its run of readings over the target agreed
on. Once the run spans ``agree_s``, each reading's level is the lowest recommendation of the
run's last ``agree_s``; a run that ends shorter than that has one level, the lowest of all its
readings; the first ask is the most such level since the ask, at most what was asked. A surge on a
broken target does not wait for a window to agree (stabilization.py), so it may ask on one reading of a
saturated fleet's running gauge: bursts seeds 2 and 3 asked 12 groups on one reading at the
first burst's peak where the rest of its readings agreed on 11; on azure-code seed 2 a one-minute
spike of the trace's arrivals read over the target at 8 groups, asked 12 on its first reading
and 9 on the next three, and the hold kept 12 for the rest of the trace.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kimik3.autoscaler.policy.loading import ScaleUp
from kimik3.autoscaler.window import Samples

BURST_DROP = 1.5
"""Groups that arrive to a demand this many times lower than the one they were asked for were
asked for by a burst shorter than the load time."""


@dataclass(frozen=True)
class OpenBurst:
    """The burst being served, measured with no group loading."""

    before: float
    """The demand just before it."""
    top: float
    """The highest demand since."""
    need: int
    """The most groups (``follow``'s ``rec``) asked for since."""


@dataclass
class BurstHold:
    """Whether the load is bursty, and how many groups scale-down keeps while it is. Times in
    seconds; demand in the reading's units (demand.py)."""

    hold_loads: float
    """Load times the hold lasts (``LatencyPolicySettings.burst_hold_loads``; 0 disables)."""
    agree_s: float = 90.0
    """Seconds of readings that agree on a need: an observation window less one decision interval
    (``Stabilization.sustained``'s span; 120 s and 30 s by default)."""
    until: float | None = None
    """Until then scale-down keeps ``level`` groups (None: not bursty)."""
    first_ask: int = 0
    """What the groups that marked the load bursty were asked for (the first guess of a burst's need)."""
    open: OpenBurst | None = None
    """The burst being served; None: none is."""
    peaks: Samples[int] = field(default_factory=Samples)
    """The need (groups) of each burst the held groups served, at its end (seconds), within the hold."""
    _calm: float | None = None
    """The previous decision's demand."""
    _run: list[tuple[float, int]] = field(default_factory=list)
    """The current run of consecutive readings over a target, its last ``agree_s``: (time,
    recommendation)."""
    _run_start: float | None = None
    """When the current run began (None: no run)."""
    _over_agreed: Samples[int] = field(default_factory=Samples)
    """What runs of readings over a target agreed on (module docstring), at the reading that
    settled it; kept for two lead times (a scale-up serves about one lead time after its ask)."""

    def hold_s(self, lead_s: float) -> float:
        """Seconds the hold lasts, for a policy looking ``lead_s`` ahead (a load time and an interval)."""
        return self.hold_loads * lead_s

    def bursty(self, now: float) -> bool:
        """The hold is on at ``now``."""
        return self.until is not None and now < self.until

    def end(self) -> None:
        """No traffic is no burst to come (F11 may scale to zero)."""
        self.until = None

    def follow(self, now: float, arrived: list[ScaleUp], rec: int, over: bool, loading: int,
               demand: float | None, new_shift: bool, shift_up: bool, lead_s: float) -> None:
        """One decision (module docstring): ``arrived``, the scale-ups whose groups began serving;
        ``rec``, the groups it measures the burst needs (the window's agreed recommendation, or
        its own when a target broke: ``over``); ``loading``, groups loading; ``demand``, the last
        demand read (None: none yet); ``new_shift``, a level shift of the demand at this
        decision, ``shift_up`` its direction. A burst ends at the demand's downward shift, or at
        the next upward one, and counts if its demand rose ``BURST_DROP`` times over the one
        before it (a smaller rise is no burst) and a recommendation was taken with no group
        loading."""
        if self.hold_loads <= 0:
            return
        if over:
            self._join_run(now, rec)
        if arrived or not over:  # an arrival closes the asks the run made
            self._end_run()
        self._over_agreed.forget_before(now - 2 * lead_s)
        late = [self._agreed_ask(up) for up in arrived if demand is not None and demand * BURST_DROP < up.demand]
        calm, self._calm = self._calm, demand
        hold_s = self.hold_s(lead_s)
        if late:
            # Only groups kept from one burst can serve the next: keep what the burst asked for.
            self.first_ask = max(late)
            self.until = now + hold_s
            self.peaks.clear()
            self.open = None
            return
        if self.until is None or now >= self.until:
            self.open = None
            return
        if self.open is not None and new_shift:
            if self.open.need > 0 and self.open.top >= BURST_DROP * self.open.before:  # the burst served is over
                self.peaks.add(now, self.open.need)
            self.open = None
        if new_shift and shift_up:
            self.until = now + hold_s  # another burst: keep holding, and measure it
            self.open = OpenBurst(calm or 0.0, 0.0, 0)
        if self.open is not None and loading == 0:
            self.open = OpenBurst(self.open.before, max(self.open.top, demand or 0.0), max(self.open.need, rec))
        self.peaks.forget_before(now - hold_s)

    def _join_run(self, now: float, rec: int) -> None:
        """A reading over a target joins the run; once the run spans ``agree_s`` its level is the
        lowest recommendation of the last ``agree_s``."""
        if self._run_start is None:
            self._run_start = now
        self._run = [(t, r) for t, r in self._run if t >= now - self.agree_s - 1e-6] + [(now, rec)]
        if now - self._run_start >= self.agree_s - 1e-6:
            self._over_agreed.add(now, min(r for _, r in self._run))

    def _end_run(self) -> None:
        """The run is over: one shorter than ``agree_s`` agreed on the lowest of its readings."""
        if self._run and self._run_start is not None and self._run[-1][0] - self._run_start < self.agree_s - 1e-6:
            self._over_agreed.add(self._run[-1][0], min(r for _, r in self._run))
        self._run, self._run_start = [], None

    def _agreed_ask(self, up: ScaleUp) -> int:
        """What the burst that asked for ``up`` needs, as its readings over the target since the
        ask agreed (module docstring), at most ``up.target``; ``up.target`` without such a reading."""
        return min(up.target, max(self._over_agreed.since(up.at), default=up.target))

    def level(self, now: float, lead_s: float) -> int:
        """Groups scale-down keeps while the load is bursty: the highest need of the bursts the
        held groups served within the hold (else, before any was measured, what the first burst
        asked for), and of the one being served."""
        measured = self.peaks.since(now - self.hold_s(lead_s)) or [self.first_ask]
        return max(measured + ([self.open.need] if self.open is not None else []))
