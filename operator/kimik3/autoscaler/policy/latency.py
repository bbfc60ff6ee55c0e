"""kimik3's latency policy: how many groups keep the per-token latency (and the TTFT, when a
target is set) under target, one decision at a time, from the parts of this package.

Desired groups = the fewest ``n`` whose predicted quantile (model.py), with ``noise_z`` more
standard deviations of the batch (a window's quantile at the target still leaves minutes over
it), is ``<= headroom x T`` at the demand forecast a lead time ahead (forecast.py) and the prompt
tokens/s that come with it (prefill, the second load dimension: output and prompt tokens keep
the window's ratio), and, with a TTFT target, whose predicted TTFT quantile (ttft.py) is
``<= headroom x`` that target: the larger of the two; scale-down sizes the demand it must keep
(the unshrunk forecast, at least the demand now) at ``scale_down_headroom x`` the targets. A
decision, in order:

1. loading.py: which of the policy's scale-ups now serve (they time the load, hence the lead).
   No reading -> hold (never scale down).
2. demand.py: the demand now (the queue's share; on a saturated fleet the panic path);
   forecast.py: a lead time ahead; the model learns from the window when the fleet and the
   demand held still through it and the quantile is near the target.
3. Sizing (below), then reaction.py: one more group over either target (the TTFT one only when
   more groups can meet it: ttft.py), the scale-down anchored on the observed quantile.
4. stabilization.py: bounded, recorded, the windows' levels; bursts.py: the burst hold raises
   the scale-down level to what the bursts measured they need (what a window of a burst's
   readings agreed on while the targets held).
5. The verdict: scale up (while the target holds, or beyond the demand now, a forecast, only
   as far as a whole window of recommendations agrees; not while groups cannot be placed: they
   are not capacity, and adding more cannot help: the policy holds and says so), hold while groups load (F10: they are
   neither added to on latency nor cancelled), hold while the quantile is over the scale-down
   level (either target's), else scale down once warmed, and never on a partial reading
   (``decide``).

A reading is partial when a serving group's counters do not cover its window
(``DecodeObservation.covered``: the group gave no metrics, its series just came back, it joined
without a known zero, its engine restarted): its demand reads low. A partial reading may scale
up; it never scales down, its scale-down recommendation is recorded as at least the groups there
are (so no later scale-down counts on it: the scale-down window must pass on whole readings),
the model does not learn from it and the forecast does not take its demand.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kimik3.api.conditions import EventReason
from kimik3.autoscaler.observation import DecodeObservation
from kimik3.autoscaler.policy.bursts import BurstHold
from kimik3.autoscaler.policy.demand import Reading, read
from kimik3.autoscaler.policy.forecast import DemandForecast, Shortfall
from kimik3.autoscaler.policy.interface import Decision, FleetState
from kimik3.autoscaler.policy.loading import GroupArrivals, ScaleUp
from kimik3.autoscaler.policy.model import LEARN_RANGE, GroupLatencyModel
from kimik3.autoscaler.policy.reaction import anchored_down, over_target, tolerated
from kimik3.autoscaler.policy.settings import LatencyPolicySettings
from kimik3.autoscaler.policy.stabilization import Stabilization
from kimik3.autoscaler.policy.ttft import TTFTModel


@dataclass
class LatencyPolicy:
    """kimik3's policy (module docstring). One instance per deployment: its parts keep the history."""

    settings: LatencyPolicySettings
    model: GroupLatencyModel
    ttft: TTFTModel | None = None
    """The TTFT model (ttft.py), used when ``settings.ttft_target_s`` is set."""
    arrivals: GroupArrivals = field(init=False, default_factory=GroupArrivals)
    """Its scale-ups until they serve, the load time (loading.py)."""
    forecast: DemandForecast = field(init=False)
    """The demand a lead time ahead (forecast.py)."""
    bursts: BurstHold = field(init=False)
    """The burst hold (bursts.py)."""
    stabilization: Stabilization = field(init=False)
    """The recommendations' windows and the bounds (stabilization.py)."""
    reading: Reading | None = field(init=False, default=None)
    """The last window with traffic, read (None: none yet)."""

    def __post_init__(self) -> None:
        s = self.settings
        self.forecast = DemandForecast(s.trend_window_s, s.trend_shrink, s.interval_s, Shortfall(s.correct_gain))
        self.bursts = BurstHold(s.burst_hold_loads, s.window_s - s.interval_s)
        self.stabilization = Stabilization(s.min_replicas, s.max_replicas, s.scale_up_window_s,
                                           s.scale_down_window_s)

    @property
    def interval_s(self) -> float:
        return self.settings.interval_s

    @property
    def window_s(self) -> float:
        return self.settings.window_s

    @property
    def lead_s(self) -> float:
        """Seconds ahead demand is predicted: the configured lead or the observed load time (of
        this policy's own last scale-up, else the one the cluster reports for its newest serving
        groups), whichever is longer, plus one decision interval (a group asked for at the next
        decision serves that much later)."""
        return max(self.settings.lead_s, self.arrivals.load_time_s or 0.0) + self.interval_s

    def decide(self, now: float, obs: DecodeObservation | None, fleet: FleetState) -> Decision:
        partial = fleet.serving - obs.covered if obs is not None else frozenset()
        decision = self._decide(now, obs, fleet, bool(partial))
        lower = decision.desired < fleet.current or (decision.reason == EventReason.HOLD and
                                                     (decision.recommendation or 0) < fleet.current)
        if obs is not None and partial and lower:
            unmeasured, short = _named(fleet.serving - obs.groups), _named(partial & obs.groups)
            why = "; ".join([f"group(s) {unmeasured} of {len(fleet.serving)} serving gave no metrics"] * bool(unmeasured)
                            + [f"the counters of group(s) {short} of {len(fleet.serving)} serving do not cover "
                               f"the {obs.window_s:.0f} s window"] * bool(short))
            return Decision(fleet.current, EventReason.METRICS_INCOMPLETE,
                            f"{why}: not scaling down on a partial reading ({decision.reason}: {decision.message})",
                            decision.recommendation)
        return decision

    def _decide(self, now: float, obs: DecodeObservation | None, fleet: FleetState, partial: bool) -> Decision:
        s = self.settings
        self.stabilization.start(now)
        arrived = self.arrivals.observe(now, fleet)
        if obs is None:
            return Decision(fleet.current, EventReason.METRICS_UNAVAILABLE, "no reading: holding replicas")
        latency = obs.latency_quantile(s.metric, s.percentile)
        ttft = obs.ttft_quantile(s.ttft_percentile) if s.ttft_target_s is not None else None
        shifted = self.forecast.shift_at
        rec, rec_down, why = self._recommend(now, obs, fleet, latency, ttft, partial)
        if partial:  # its demand reads low: no later scale-down may count on it
            rec_down = max(rec_down, fleet.current)
        rec, _ = self.stabilization.record(now, rec, rec_down, obs.window_s)
        demand = self.reading.demand if self.reading is not None else None
        held = (latency is None or latency <= tolerated(s.target_s)) and (
            ttft is None or s.ttft_target_s is None or ttft <= tolerated(s.ttft_target_s))
        # A burst needs what a whole window of its readings agreed on while the targets held
        # (bursts.py), each reading's recommendation where they broke.
        agreed = self.stabilization.sustained(now, obs.window_s, self.interval_s)
        self.bursts.follow(now, arrived, agreed if held and agreed is not None else rec, not held, fleet.loading, demand,
                           self.forecast.shift_at == now and shifted != now, self.forecast.shift_up, self.lead_s)
        if not obs.has_traffic:
            self.bursts.end()
        bursty = self.bursts.bursty(now)
        up, down = self.stabilization.levels(now)
        if bursty:
            down = max(down, min(self.bursts.level(now, self.lead_s), s.max_replicas))
        if up > fleet.current and (held or why == "Predicted"):
            # More groups while the target holds (within the reaction's tolerance: a forecast,
            # or noise), or more than the demand now needs (a forecast), cost a load time of
            # GPU-hours each: only as many as the readings of a whole window agree on; a broken
            # target still gets one group more at once.
            agreed_up = self.stabilization.sustained(now, obs.window_s, self.interval_s) or 0
            up = max(fleet.current + (0 if held else 1), min(up, agreed_up))
        detail = _detail(obs, latency, ttft, s, rec, why)
        if up > fleet.current:
            if fleet.unplaceable > 0:
                return Decision(fleet.current, EventReason.UNPLACEABLE,
                                f"{fleet.unplaceable} group(s) cannot be placed: not adding more; {detail}", rec)
            self.arrivals.asked(ScaleUp(now, up, demand or 0.0))
            scaled_up = EventReason.SCALE_UP if why != "Predicted" else EventReason.SCALE_UP_PREDICTED
            return Decision(up, scaled_up, detail, rec)
        if fleet.loading > 0 and (down < fleet.current or (latency is not None and latency > s.target_s)):
            # Coming groups are neither added to (F10) nor cancelled: a group half loaded was asked
            # for less than a load time ago (cancelling them, as HPA's window does, measured 78%
            # SLO instead of 96% on the bursts trace).
            return Decision(fleet.current, EventReason.GROUPS_LOADING,
                            f"{fleet.loading} group(s) still loading count as coming; {detail}", rec)
        # Scale down only once a whole window of recommendations allowed it (not on a restart),
        # and not while the observed quantile is over the scale-down level (the model may lag).
        if down < fleet.current and ((latency is not None and latency > s.scale_down_headroom * s.target_s) or (
                ttft is not None and s.ttft_target_s is not None and ttft > s.scale_down_headroom * s.ttft_target_s)):
            return Decision(fleet.current, EventReason.HOLD, detail, rec)
        if down < fleet.current and self.stabilization.warmed(now):
            return Decision(down, EventReason.SCALE_DOWN if down > 0 else EventReason.SCALED_TO_ZERO, detail, rec)
        kept = ", keeping the last bursts' groups" if bursty else ""
        return Decision(fleet.current, EventReason.HOLD, detail + kept, rec)

    def _recommend(self, now: float, obs: DecodeObservation, fleet: FleetState,
                   latency: float | None, ttft: float | None, partial: bool) -> tuple[int, int, str]:
        """(groups at the scale-up level, groups at the scale-down level, reason), unbounded;
        ``ttft``: the window's TTFT quantile (None: no TTFT target, or no first token);
        ``partial``: some serving group's counters do not cover the window (module docstring)."""
        s, model, forecast = self.settings, self.model, self.forecast
        if not obs.has_traffic:
            n, why = self.stabilization.without_traffic(now, fleet.current)
            return n, n, why
        self.stabilization.traffic(now)
        serving = max(1, fleet.ready)
        self.reading = reading = read(obs, latency, model, serving, s.target_s, s.metric == "interTokenLatency")
        demand = reading.demand
        # The forecast first: it tells whether the demand jumped inside the window.
        # A partial reading's demand is low by the groups it lacks: no trend, no lesson.
        predicted = forecast.predict(now, demand, obs.window_s, self.lead_s) if demand > 0 and not partial \
            else demand
        # Learn only from whole windows of one fleet and one level of load (no group joined, no
        # level shift of the demand inside the window), near the target (a saturated or an idle
        # fleet would bend the line).
        steady = self.arrivals.settled(now, obs.window_s) and forecast.settled(now, obs.window_s) and not partial
        near = latency is not None and LEARN_RANGE[0] * s.target_s <= latency <= LEARN_RANGE[1] * s.target_s
        self._learn(obs, reading, latency, ttft, serving, steady and near, steady, partial)
        # Prompt tokens come with the output tokens at the window's ratio.
        mix = reading.prefill / demand if demand > 0 else 0.0
        plan, plan_down = s.headroom * s.target_s, s.scale_down_headroom * s.target_s
        if model.latency(0.0, 1) >= plan:
            return s.max_replicas, s.max_replicas, "TargetBelowBatch1Latency"
        if demand <= 0 and obs.running + obs.waiting > 0:
            # Requests present but no finished tokens in the window: size by concurrency.
            total = obs.running + obs.waiting
            n = next((n for n in range(1, s.max_replicas + 1)
                      if model.latency(total / n, n, 0.0, reading.prefill / n) <= plan), s.max_replicas)
            return n, n, "Concurrency"
        most = max(s.max_replicas, fleet.current)
        up = model.groups_for(predicted, plan, most, s.noise_z, predicted * mix)
        keep = max(predicted, forecast.keep, demand)
        down = model.groups_for(keep, plan_down, most, s.noise_z, keep * mix)
        if up is None:
            n, reason = s.max_replicas, "Saturated"
        else:
            now_n = model.groups_for(demand, plan, most, s.noise_z, reading.prefill)
            n, reason = up, "Predicted" if up > (now_n or most) else "Load"
        n_down = max(n, down if down is not None else most)
        if latency is not None and steady and near:
            n_down = anchored_down(n_down, serving, latency, model, demand, keep, s.noise_z, plan_down, mix)
        joined = self.arrivals.joined(now, obs.window_s)
        if over_target(latency, s.target_s, n, fleet, joined):
            n, reason = fleet.current + 1, "OverTarget"
            n_down = max(n_down, n)
        if s.ttft_target_s is not None and self.ttft is not None:
            n, n_down, reason = self._ttft_sizing(n, n_down, reason, ttft, predicted * mix, keep * mix, fleet,
                                                  joined, most)
        return n, n_down, reason

    def _learn(self, obs: DecodeObservation, reading: Reading, latency: float | None, ttft: float | None,
               serving: int, decode_line: bool, steady: bool, partial: bool) -> None:
        """Learn from the window: the prompts' chunks from every whole reading (model.py: the window's
        computed prompts, each a first token); the decode line when ``decode_line`` (a steady window
        near the target); the TTFT model from a steady window."""
        s, model, pi_now = self.settings, self.model, reading.prefill_now / serving
        if not partial:
            model.observe_prompts(reading.prefill_now * obs.window_s, obs.ttft.count,
                                  1.0 if s.metric == "interTokenLatency" else obs.acceptance_length)
        if latency is not None and decode_line and reading.per_group_c > 0:
            model.update(reading.per_group_c, latency, serving, reading.mean_latency, pi_now)
        if self.ttft is not None and ttft is not None and steady:
            self.ttft.update(ttft, pi_now)

    def _ttft_sizing(self, n: int, n_down: int, reason: str, ttft: float | None, prefill: float,
                     prefill_keep: float, fleet: FleetState, joined: bool, most: int) -> tuple[int, int, str]:
        """``(n, n_down, reason)`` raised to what the TTFT target needs (ttft.py) at the forecast
        ``prefill`` (and ``prefill_keep`` for scale-down) prompt tokens/s, and by one group when
        the window's TTFT quantile ``ttft`` is over it although the model says enough. A target
        more groups cannot meet (below the model's ``base``) adds none."""
        s, model = self.settings, self.ttft
        assert s.ttft_target_s is not None and model is not None
        if not model.reachable(s.headroom * s.ttft_target_s):
            return n, n_down, reason
        up = model.groups_for(prefill, s.headroom * s.ttft_target_s, most) or most
        down = model.groups_for(prefill_keep, s.scale_down_headroom * s.ttft_target_s, most) or most
        if up > n:
            n, reason = up, "TTFT"
        n_down = max(n_down, down, n)
        if over_target(ttft, s.ttft_target_s, n, fleet, joined):
            n, reason = fleet.current + 1, "OverTTFTTarget"
            n_down = max(n_down, n)
        return n, n_down, reason


def _named(groups: frozenset[str]) -> str:
    """Group indexes in numeric order, comma separated."""
    return ", ".join(sorted(groups, key=lambda g: (len(g), g)))


def _detail(obs: DecodeObservation, latency: float | None, ttft: float | None, s: LatencyPolicySettings, rec: int,
            why: str) -> str:
    """A decision's message: the quantile read (a lower bound when above the top bucket, F21a),
    the TTFT quantile with a TTFT target, the requests running and waiting, and the
    recommendation."""
    above = ">= " if obs.above_top_bucket(s.percentile) else ""
    detail = (f"p{int(s.percentile * 100)} {'ITL' if s.metric == 'interTokenLatency' else 'TPOT'} "
              f"{above}{latency * 1000:.2f} ms" + (" (above the histogram's top bucket)" if above else "")
              if latency is not None else "no latency samples")
    if s.ttft_target_s is not None:
        detail += f", p{int(s.ttft_percentile * 100)} TTFT " + (f"{ttft:.2f} s" if ttft is not None else "unmeasured")
    return detail + f", {obs.running:.0f} running, {obs.waiting:.0f} waiting, recommendation {rec} ({why})"
