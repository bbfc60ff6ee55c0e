"""The demand forecast: the demand (demand.py) a lead time ahead, so that groups serve before the
SLO breaks.

The lead is the policy's ``lead_s`` (latency.py: the configured ``lead_s`` or the load time
observed, whichever is longer, plus one decision interval; loading.py times the loads). The
forecast is a least-squares line (fit.py) through the last ``trend_window_s`` of demand once
that history spans half of it, a parabola once it spans all of it (a ramp that accelerates, like
a day's rise from its trough, outgrows its line over a 15-minute load). Scale-up uses each term
shrunk by its standard error (noise is no trend; successive windows overlap, so the errors are
scaled by sqrt(window / interval)) and only an upward acceleration; scale-down keeps the
unshrunk trend (``keep``: removing a group on an upswing costs a load time to get it back). A
level shift (the demand is ``SHIFT`` times its usual relative deviation away from what the
readings up to one window back expect now: their parabola carried forward once they span half
the trend window, else the last of them; a step, a burst, not a ramp's noisy reading) restarts
the history: a step is not a trend. The forecast is raised to its own measured shortfall
(``Shortfall``: forecasts made a lead time ago against the demand that came, exponentially
averaged; shifts excluded): at least the demand now grown by that share, not the trend's
forecast multiplied by it (the two are estimates of one rise over the lead; their product counts
it twice once the trend has caught up).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from kimik3.autoscaler.policy.fit import line_now, quadratic_now, slope_se
from kimik3.autoscaler.window import Samples

SHIFT = 4.0
"""A demand this many times its usual relative change away from what the readings of one window
back expect is a level shift (a step, a burst starting or ending): the trend's history restarts."""
PARABOLA_MIN_POINTS = 6
"""Readings a parabola is fitted to at least (three coefficients and three readings for their
standard errors); fewer get a line, or the last reading."""
SHIFT_FLOOR = 0.03
"""The usual relative change used for level shifts is at least this."""


@dataclass
class Shortfall:
    """How far the forecasts fell short of the demand that came a lead time later, as a share of
    the forecast (exponentially averaged: each decision moves it ``gain`` of the way to the
    newest shortfall).

    It is a second estimate of the rise over a lead time beside the trend's: the demand grew
    that much more than forecast, so the demand now may grow by it again. The forecast is raised
    to the demand now grown by the shortfall, never lowered, and not multiplied by it: the
    shortfall was measured on forecasts made before the trend saw the rise, and once the trend
    has caught up it holds that rise already (agentic trace, seed 0, after the hour's trough: the
    flat forecasts made at the trough fell 37% short while the parabola then made was already
    1.5-2x the demand; their product asked for 15 groups where 7 serve the peak)."""

    gain: float
    """``LatencyPolicySettings.correct_gain``."""
    value: float = 0.0
    _made: Samples[float] = field(default_factory=Samples)
    """Forecasts made (demand units), kept a lead time and two intervals."""

    def raised(self, now: float, demand: float, forecast: float, lead_s: float, interval_s: float,
               shifted: bool) -> float:
        """``forecast`` (made ``now`` for ``lead_s`` ahead), raised to at least ``demand`` (the
        demand now) grown by the shortfall, after measuring the one of the forecast made a lead
        time ago against ``demand``; ``shifted``: a level shift lies between them (no shortfall:
        the measure restarts at 0). Demand units in, demand units out."""
        made = self._made
        made.add(now, forecast)
        made.forget_before(now - lead_s - 2 * interval_s)
        due = made.until(now - lead_s + 1e-6)
        if shifted:
            due, self.value = [], 0.0
        if due and due[-1] > 0:
            self.value += self.gain * ((demand - due[-1]) / due[-1] - self.value)
        return max(forecast, demand * (1 + max(0.0, self.value)))


@dataclass
class DemandForecast:
    """The demand ``lead_s`` ahead, from the readings since the last level shift (module
    docstring). Times in seconds; demand in the reading's units (tokens/s or request-steps/s)."""

    trend_window_s: float
    """Demand history fitted (``LatencyPolicySettings.trend_window_s``)."""
    trend_shrink: float
    """Standard errors each term is shrunk by for scale-up (``LatencyPolicySettings.trend_shrink``)."""
    interval_s: float
    """Seconds between decisions (readings)."""
    shortfall: Shortfall
    keep: float = 0.0
    """The last forecast with the trend unshrunk: what scale-down must keep serving."""
    shift_at: float | None = None
    """Last level shift of the demand (None: none yet)."""
    shift_up: bool = False
    """Whether that shift went up."""
    _history: Samples[float] = field(default_factory=Samples)
    """Demand since the last level shift, for the trend."""
    _noise: float = 0.05 ** 2
    """Relative variance of the demand's change over one window (level shifts left out)."""

    def settled(self, now: float, window_s: float) -> bool:
        """No level shift within the last ``window_s`` seconds."""
        return self.shift_at is None or now - self.shift_at >= window_s

    def predict(self, now: float, demand: float, window_s: float, lead_s: float) -> float:
        """``demand`` (read over the ``window_s`` ending ``now``) ``lead_s`` ahead, for scale-up.
        Also sets ``keep``, the same forecast with the trend unshrunk (for scale-down)."""
        hist = self._history
        # A level shift: the demand is more than SHIFT times its usual relative deviation away
        # from what the windows that do not overlap this one expect now (their trend: compared
        # with the last reading alone, a noisy reading on a ramp passed for a step).
        past = [(t, d) for t, d in hist if t <= now - window_s + 1e-6]
        expected = self._expected(past, now)
        if not self.settled(now, window_s):
            hist.clear()  # the window still straddles the shift: its demand moves on its own
        elif expected is not None and expected > 0:
            r = (demand - expected) / expected
            sd = max(math.sqrt(self._noise), SHIFT_FLOOR)
            if abs(r) > SHIFT * sd:
                hist.clear()
                self.shift_at, self.shift_up = now, r > 0
            else:
                # Winsorized: a change building up over several windows must not teach the noise.
                self._noise += 0.1 * (min(r * r, (2 * sd) ** 2) - self._noise)
        hist.add(now, demand)
        hist.forget_before(now - self.trend_window_s)
        self.keep = demand
        pts = list(hist)
        if len(pts) < 4 or pts[-1][0] - pts[0][0] < self.trend_window_s / 2:
            return self._raised(now, demand, demand, window_s, lead_s)
        # Successive windows overlap (a 2-minute window every 30 s): their errors are correlated,
        # so the fit's standard errors are scaled up by sqrt(window / interval).
        overlap = math.sqrt(window_s / self.interval_s) if 0 < self.interval_s < window_s else 1.0
        if len(pts) >= PARABOLA_MIN_POINTS and pts[-1][0] - pts[0][0] >= self.trend_window_s - self.interval_s - 1e-6:
            level, slope, accel, se_b, se_c = quadratic_now(pts, now)
        else:
            level, slope, _ = line_now(pts, now)
            accel, se_b, se_c = 0.0, slope_se(pts), 0.0
        se_b, se_c = se_b * overlap, se_c * overlap
        # Removing a group on an upswing costs a load time to get it back: scale-down keeps the
        # trend as it is. Adding one on noise costs a load time of GPU-hours: scale-up takes each
        # term shrunk by its standard errors. Only an accelerating ramp is bent upward.
        self.keep = max(demand, level + max(0.0, slope) * lead_s + max(0.0, accel) * lead_s * lead_s)
        slope = max(0.0, slope - self.trend_shrink * se_b)
        accel = max(0.0, accel - self.trend_shrink * se_c)
        return self._raised(now, demand, max(demand, level + slope * lead_s + accel * lead_s * lead_s),
                            window_s, lead_s)

    def _expected(self, past: list[tuple[float, float]], now: float) -> float | None:
        """The demand ``past`` (readings of windows that do not overlap the one ending ``now``)
        expects now: its least-squares parabola carried to ``now`` once it spans half the trend
        window (a ramp moves the demand too: a trend is no level shift), else its last reading;
        None without any."""
        if not past:
            return None
        if len(past) >= PARABOLA_MIN_POINTS and past[-1][0] - past[0][0] >= self.trend_window_s / 2:
            return quadratic_now(past, now)[0]
        return past[-1][1]

    def _raised(self, now: float, demand: float, forecast: float, window_s: float, lead_s: float) -> float:
        """``forecast`` raised to the measured shortfall (``Shortfall.raised``); a level shift
        within the lead time and the window before it is no shortfall."""
        return self.shortfall.raised(now, demand, forecast, lead_s, self.interval_s,
                                     not self.settled(now, lead_s + window_s))
