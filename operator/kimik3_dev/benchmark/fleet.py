"""A simulated fleet of engine groups driven by an autoscaling ``Policy`` (issue 4, part 4).

The SAME policy code the operator runs (``kimik3.autoscaler.factory.latency_policy``, or any
``Policy``) is called every ``policy.interval_s`` with the ``DecodeObservation`` the operator's
own pod-scrape source (``kimik3.autoscaler.sources.PodScrapeSource``) makes of the groups' vLLM
``/metrics`` pages over ``policy.window_s``, and its ``Decision`` is applied to the fleet.

What is simulated
=================
- **Groups** of one shape (``EngineShape``, e.g. TP8 over 2 GB300 trays). A running group's
  decode follows the perf model (``autoscaler/perfmodel.py``): with ``n`` running requests an engine
  step takes ``step_time(n)`` seconds and emits ``AL`` tokens per request on average
  (``acceptance_length``), so each request gets a token every ``tpot(n) = step(n) / AL``
  seconds. Requests progress together (continuous batching: every running request advances one
  step per step), simulated exactly between events (arrivals, completions, admissions): the
  batch only changes at events, so the latency of every token is known.
- **Prefill** is chunked into the running batch, as vLLM does: admitting a request makes one
  step longer by ``prompt / prefill_rate`` (prompts of one step share it up to
  ``max_num_batched_tokens``; a longer prompt is cut into chunks of that many tokens, one step
  each, as vLLM's chunked prefill does); the running requests' tokens of those steps are slower,
  and the new request's first token comes at the end of its last chunk (TTFT). The decode
  tokens' share of the step's token budget is not counted against it; there is no prefix cache
  (``vllm:prefix_cache_hits`` stays 0).
- **Batch limit**: at most ``max_num_seqs`` running per group; more wait in the group's queue
  (``vllm:num_requests_waiting``) and are admitted as requests finish.
- **Routing**: each arrival goes to the ready group with the fewest running + waiting requests
  (ties: the oldest group). With no ready group it waits at the gateway.
- **Load time**: a new group holds its GPUs and serves nothing for ``load_time_s`` (default 900 s:
  ~1.5 TB of weights, see ``DEFAULT_LOAD_TIME_S``), then serves. The groups a run starts with
  were created one load time before it and serve from t = 0; ``FleetState.load_time_s`` is the
  serving groups' shortest creation-to-ready time, as the controller reads it from the pods.
- **Capacity**: ``racks x trays_per_rack`` trays, placed as the spec's placement asks
  (``FleetConfig.exclusive``): placement ``kueue`` as Kueue places them (the core's
  ``kimik3.topology.capacity.Pool``, the operator's capacity model: best fit per rack, a group's
  ``trays_per_group`` trays in ONE rack, the tenant's ClusterQueue quota ``quota_gpus``);
  placement ``exclusive`` (LeaderWorkerSet's exclusive topology) each group alone in a rack, its
  other trays left idle. Groups that do not fit stay pending (``FleetState.unplaceable``) and are
  placed, then load, when a group is removed.
- **Scale-down** removes the newest groups first (a LeaderWorkerSet deletes the highest indexes):
  pending ones go at once, loading ones release their GPUs at once, ready ones stop taking
  requests, hand their queue back to the router and drain their running requests (holding GPUs
  until the last one finishes).

What is measured
================
- Per minute: the P90 of the per-token latency over every token emitted in that minute (token
  weighted: each token counts once, with the ``tpot`` of the step that emitted it), P90 TTFT,
  demand (requests and output tokens asked for), groups ready / loading / pending at the end of
  the minute, GPU-hours (groups holding GPUs, loading and draining ones included, x GPUs per
  group, integrated over time).
- The observation: each serving group (ready or draining) exposes a vLLM 0.32 ``/metrics`` page
  (``kimik3_dev.sim.vllm_metrics.exposition``: vLLM's names, types, labels): its
  ``vllm:inter_token_latency_seconds``, observed once per running request per engine step with
  the step's duration (so under DSpark it is ~AL x the per-token latency), into ``itl_buckets``;
  ``vllm:spec_decode_num_drafts`` (one draft per request per step) and
  ``..._num_accepted_tokens`` (AL - 1 per draft) when the shape speculates;
  ``vllm:generation_tokens``; ``vllm:prompt_tokens`` (counted at admission) and
  ``vllm:prefix_cache_hits``; ``vllm:time_to_first_token_seconds`` (vLLM's buckets); the
  ``num_requests_running`` / ``_waiting`` gauges. Steps are
  integrated over time, so counts are fractional. At each decision the operator's
  ``PodScrapeSource`` reads every page (``parse_scrape``), differences each group's histograms
  and counters against its scrape that starts the window and merges them
  (``autoscaler/histogram.py``): a bug in that path moves the benchmark's figures. A group is
  first scraped at the first decision after it serves (at t = 0 for the initial ones), and
  counts in the windows after that, as a newly started pod does. The pages carry the families
  the fleet simulates and the autoscaler reads.

ITL buckets
===========
vLLM's default ITL buckets (0.01, 0.025, 0.05, ... s) put the whole operating range of this
recipe (steps of ~9-50 ms, ~21 ms at a 5 ms per-token target with AL 4.26) into two buckets, so
the interpolated P90 can be off by +-40%. ``FAST_DECODE_ITL_BUCKETS`` is what a fast-decode
recipe would set with vLLM's custom histogram buckets: 1 ms wide from 2 ms to 40 ms (+-2.5% at
the target step), then vLLM's own bounds. Set ``itl_buckets=INTER_TOKEN_LATENCY_BUCKETS`` to see
a policy on the default layout.
"""

from __future__ import annotations

import errno
import heapq
import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import requests

from kimik3.admission import Admitted
from kimik3.autoscaler.observation import (ACCEPTED, DRAFTS, GENERATION_TOKENS, ITL, PREFIX_CACHE_HITS,
                                           PROMPT_TOKENS, RUNNING, TTFT, DecodeObservation, MetricsUnavailable)
from kimik3.engine.metrics import WAITING
from kimik3.autoscaler.perfmodel import (DEFAULT_WORKLOAD, EngineShape, PerfParams, acceptance_length, decode_point,
                                         perf_params, ttft)
from kimik3.autoscaler.policy import Decision, FleetState, Policy
from kimik3.autoscaler.sources import PodScrapeSource, ScrapeTarget
from kimik3.autoscaler.window import Samples
from kimik3.topology.capacity import Pool
from kimik3_dev.benchmark.traces import Request
from kimik3_dev.sim.vllm_metrics import TIME_TO_FIRST_TOKEN_BUCKETS, HistogramTotals, exposition

DEFAULT_LOAD_TIME_S = 900.0
"""Seconds from creating a group to serving: ~1.5 TB of weights (kimi-k3-and-vllm.md) read from a
PVC at ~2 GB/s per tray (fastsafetensors over a shared filesystem, 2 trays: ~4 GB/s -> ~6.5 min),
plus the megakernel's CuTe DSL build, CUDA graph capture and the drafter: ~15 min. Recipes allow
far more (startup probe 60-120 min); a parameter of the simulation, not a measurement."""

FAST_DECODE_ITL_BUCKETS: tuple[float, ...] = tuple(
    [0.002 + 0.001 * i for i in range(39)]
    + [0.045, 0.05, 0.06, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0])
"""Seconds: 2-40 ms by 1 ms, then vLLM's default bounds from 45 ms up (module docstring)."""


TENANT = "fleet"
"""The simulated deployment's tenant in the capacity ``Pool``."""


@dataclass(frozen=True)
class FleetConfig:
    """One deployment's groups and the cluster they run in."""

    shape: EngineShape
    max_num_seqs: int = 64
    """--max-num-seqs: running requests per group (the latency recipe sets 64)."""
    max_num_batched_tokens: int = 8192
    """--max-num-batched-tokens: prompt tokens that share one step's prefill."""
    trays_per_group: int = 2
    """Nodes of one group (TP8 over 4-GPU GB300 trays: 2)."""
    racks: int = 2
    trays_per_rack: int = 18
    """GB300 NVL72: 18 compute trays of 4 GPUs per rack."""
    quota_gpus: int | None = None
    """The deployment's ClusterQueue nominal nvidia.com/gpu quota (None: the racks are the limit)."""
    exclusive: bool = False
    """Placement ``exclusive`` (each group takes a whole rack), else ``kueue`` (groups packed)."""
    load_time_s: float = DEFAULT_LOAD_TIME_S
    load_timeout_s: float = 5400.0
    """probes.loadTimeout of the recipe (90 min): a group loading longer is not counted as coming."""
    workload: str | float = DEFAULT_WORKLOAD
    """Speculative acceptance workload (perfmodel.AL_DSPARK key or an acceptance length at 7 drafts)."""
    itl_buckets: tuple[float, ...] = FAST_DECODE_ITL_BUCKETS
    served_model_name: str = "kimi-k3"
    """--served-model-name: the ``model_name`` label of the groups' series."""

    @property
    def gpus_per_group(self) -> int:
        return self.shape.gpus

    def pool(self) -> Pool:
        """The empty racks and the quota, as Kueue sees them (``kimik3.topology.capacity``)."""
        return Pool.of_racks(self.racks, self.trays_per_rack, {TENANT: self.quota_gpus} if self.quota_gpus else {})

    @property
    def trays_taken(self) -> int:
        """Trays of its rack one group keeps from other groups: its own, or the whole rack when exclusive."""
        return self.trays_per_rack if self.exclusive else self.trays_per_group

    @property
    def capacity_groups(self) -> int:
        """Groups that fit the empty racks within the quota (a group never spans racks)."""
        return self.pool().groups_that_fit(TENANT, self.trays_taken, self.gpus_per_group)

    @classmethod
    def from_admitted(cls, admitted: Admitted, **overrides: Any) -> FleetConfig:
        """Config for the groups of an admitted spec (``kimik3.admission.admit``)."""
        spec, plan = admitted.spec, admitted.plan
        return cls(shape=EngineShape.from_spec(spec, plan), max_num_seqs=spec.engine.max_num_seqs,
                   max_num_batched_tokens=spec.engine.max_num_batched_tokens,
                   trays_per_group=plan.nodes_per_group, served_model_name=spec.model.served_model_name,
                   exclusive=spec.scheduling.placement.mode == "exclusive", **overrides)


class GroupModel:
    """Per-batch figures of one group, precomputed from the perf model."""

    def __init__(self, cfg: FleetConfig):
        params: PerfParams = perf_params(cfg.shape)
        if params.units != 1:
            raise ValueError("the fleet simulator models groups that step as one unit (TP, or DEP)")
        self.params = params
        self.al = acceptance_length(cfg.shape.spec_method, cfg.shape.k, cfg.workload)
        n_max = cfg.max_num_seqs
        self.step_s = [decode_point(params, n, cfg.workload).step_s if n else 0.0 for n in range(n_max + 1)]
        """Seconds per engine step with n running requests."""
        self.rate = [self.al / s if s else 0.0 for s in self.step_s]
        """Tokens/s of each running request with n running."""
        self.tpot_s = [s / self.al for s in self.step_s]

    def prefill_step_s(self, prompt_tokens: int, decoders: int) -> float:
        """Seconds of a step that prefills ``prompt_tokens`` next to ``decoders`` running requests
        (perfmodel.ttft: the step's decode work plus the prompt's)."""
        return ttft(self.params, prompt_tokens, decoders)


# ------------------------------------------------------------------ the fleet --------------

PENDING, LOADING, READY, DRAINING, GONE = "pending", "loading", "ready", "draining", "gone"


@dataclass(eq=False)
class _Group:
    gid: int
    created_s: float
    state: str = PENDING
    placed_s: float | None = None
    rack: str | None = None
    running: list = field(default_factory=list)
    """Heap of (finish_progress, seq, request)."""
    waiting: deque = field(default_factory=deque)
    progress: float = 0.0
    """Tokens emitted so far by a request running since the group started (shared by all running)."""
    last_t: float = 0.0
    stall_start: float = 0.0
    stall_end: float = -1.0
    stall_steps: int = 0
    stall_decoders: int = 0
    stall_prompt_tokens: int = 0
    version: int = 0
    itl: HistogramTotals = field(default_factory=lambda: HistogramTotals(()))
    """vllm:inter_token_latency_seconds of the group's engine (bounds: ``FleetConfig.itl_buckets``)."""
    drafts: float = 0.0
    accepted: float = 0.0
    tokens: float = 0.0
    """vllm:spec_decode_num_drafts, ..._num_accepted_tokens, vllm:generation_tokens."""
    prompt: float = 0.0
    """vllm:prompt_tokens."""
    ttft: HistogramTotals = field(default_factory=lambda: HistogramTotals(TIME_TO_FIRST_TOKEN_BUCKETS))
    """vllm:time_to_first_token_seconds."""

    @property
    def url(self) -> str:
        """Where the fleet serves this group's /metrics page (no socket: ``FleetSim.page``)."""
        return f"fleet://group-{self.gid}/metrics"


@dataclass
class Minute:
    """One minute of a run (times in seconds from the start)."""

    start_s: float
    p90_tpot_s: float | None
    """P90 of the per-token latency over the tokens emitted in the minute (None: no token)."""
    p90_ttft_s: float | None
    tokens: float
    arrivals: int
    demand_tokens_per_s: float
    """Output tokens/s asked for by the minute's arrivals."""
    ready: int
    loading: int
    pending: int
    desired: int
    waiting: int
    gpu_hours: float
    """GPU-hours held during the minute (loading and draining groups included)."""


@dataclass
class RunResult:
    policy: str
    trace: str
    minutes: list[Minute]
    decisions: list[tuple[float, Decision]]
    scale_events: int
    gpu_hours: float
    groups: list[tuple[int, float, float | None, float | None]]
    """(id, created, ready at, gone at) of every group."""

    def p90s(self) -> list[float | None]:
        return [m.p90_tpot_s for m in self.minutes]


@dataclass(frozen=True)
class GatewayReading:
    """What the deployment's gateway counts (not vLLM series): the requests it received over the
    policy's window and their output tokens (Dynamo's planner reads its frontend's), and the
    requests in flight at the serving groups now, running or queued (the concurrency Knative's
    queue-proxies report to its KPA)."""

    window_s: float
    requests: float
    output_tokens: float
    in_flight: float
    prompt_tokens: float = 0.0
    """The requests' prompt tokens (Dynamo's ISL)."""


Frontend = Callable[[GatewayReading], None]
"""Told the gateway's reading before each decision of a policy that reads it."""


class FleetSim:
    """One policy on one trace. ``run()`` returns a ``RunResult``.

    Decisions come every ``policy.interval_s``; each reads ``policy.window_s`` of the groups'
    metrics through ``PodScrapeSource`` (module docstring), or nothing when the policy reads
    none (``window_s`` None: it is given None). ``frontend``, when given, is called before each
    decision with the gateway's reading (over the window, or the interval for a policy that reads
    no engine metrics)."""

    def __init__(self, cfg: FleetConfig, policy: Policy, requests: Sequence[Request], duration_s: float,
                 initial_groups: int, name: str = "", trace_name: str = "", model: GroupModel | None = None,
                 frontend: Frontend | None = None):
        self.cfg = cfg
        self.policy = policy
        self.requests = requests
        self.duration_s = float(duration_s)
        self.name = name
        self.trace_name = trace_name
        self.frontend = frontend
        self.m = model or GroupModel(cfg)
        self.groups: list[_Group] = []
        self.gateway: deque = deque()
        self._heap: list = []
        self._seq = 0
        self._now = 0.0
        self._pool = cfg.pool()
        self._pages: dict[str, _Group] = {}
        self.source = PodScrapeSource(self._targets, fetch=self.page, clock=lambda: self._now)
        """The operator's pod-scrape source, reading the serving groups' pages."""
        self._arrivals = 0.0
        self._arrival_tokens = 0.0
        """Requests received at the gateway and their output tokens (for ``frontend``)."""
        self._arrival_prompt = 0.0
        self._gateway: Samples[tuple[float, float, float]] = Samples()
        self._gateway.add(0.0, (0.0, 0.0, 0.0))
        self._gpu_s = 0.0
        self._gpu_mark = 0.0
        self._minute_tokens: dict[float, float] = {}
        self._minute_ttft: list[float] = []
        self._minute_arrivals = 0
        self._minute_demand = 0.0
        self._minute_gpu_s = 0.0
        self.minutes: list[Minute] = []
        self.decisions: list[tuple[float, Decision]] = []
        self.scale_events = 0
        self.desired = initial_groups
        self._ready_at: dict[int, float] = {}
        self._gone_at: dict[int, float] = {}
        for _ in range(initial_groups):
            # The deployment's first groups were created a load time before the trace and serve
            # at its start, as the groups a policy finds on a cluster have loaded (their pods say
            # how long it took: ``FleetState.load_time_s``).
            g = self._new_group(0.0)
            if g.state == LOADING:
                g.created_s = -cfg.load_time_s
                g.state = READY
                self._ready_at[g.gid] = 0.0
            else:
                self.desired = len([x for x in self.groups if x.state != GONE])
        if policy.window_s is not None:
            # The groups served before the trace: their first scrape (no window yet) is at t = 0.
            self.observe(0.0)

    # ---------------------------------------------------------------- bookkeeping --------
    def _account(self, now: float) -> None:
        """Integrate GPU-seconds held up to ``now``."""
        held = sum(1 for g in self.groups if g.state in (LOADING, READY, DRAINING))
        dt = now - self._gpu_mark
        if dt > 0:
            gs = held * self.cfg.gpus_per_group * dt
            self._gpu_s += gs
            self._minute_gpu_s += gs
            self._gpu_mark = now

    def _record_tokens(self, latency: float, tokens: float) -> None:
        key = round(latency, 6)
        self._minute_tokens[key] = self._minute_tokens.get(key, 0.0) + tokens

    def _push(self, t: float, kind: int, payload: Any) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, kind, self._seq, payload))

    # ---------------------------------------------------------------- groups -------------
    def _new_group(self, now: float) -> _Group:
        g = _Group(gid=len(self.groups), created_s=now, last_t=now, itl=HistogramTotals(self.cfg.itl_buckets))
        self.groups.append(g)
        self._pages[g.url] = g
        self._place(g, now)
        return g

    def _place(self, g: _Group, now: float) -> None:
        rack = self._pool.admit(TENANT, self.cfg.trays_taken, self.cfg.gpus_per_group)
        if rack is None:
            g.state = PENDING
            return
        g.rack, g.state, g.placed_s = rack, LOADING, now
        self._push(now + self.cfg.load_time_s, 1, (g.gid, "ready"))

    def _release(self, g: _Group, now: float) -> None:
        self._account(now)
        if g.rack is not None:
            self._pool.release(TENANT, g.rack, self.cfg.trays_taken, self.cfg.gpus_per_group)
            g.rack = None
        g.state = GONE
        self._gone_at[g.gid] = now
        for p in self.groups:  # the scheduler places pending groups, oldest first
            if p.state == PENDING:
                self._place(p, now)
                if p.state != LOADING:
                    break

    def _advance(self, g: _Group, t1: float) -> None:
        """Run group ``g`` from ``g.last_t`` to ``t1`` (no event in between)."""
        m = self.m
        t = g.last_t
        if t1 <= t:
            return
        if g.stall_end > t:
            if t1 < g.stall_end:
                g.last_t = t1
                return
            # The prefill step(s) end: decoders get AL tokens per step, at the stretched step time.
            stalled = g.stall_steps
            dur = (g.stall_end - g.stall_start) / stalled
            g.progress += m.al * stalled
            if g.stall_decoders:
                emitted = g.stall_decoders * m.al * stalled
                self._record_tokens(dur / m.al, emitted)
                g.itl.observe(dur, g.stall_decoders * stalled)
                g.drafts += g.stall_decoders * stalled
                g.accepted += g.stall_decoders * stalled * (m.al - 1)
                g.tokens += emitted
            t = g.stall_end
            g.stall_steps = g.stall_decoders = g.stall_prompt_tokens = 0
        n = len(g.running)
        if n and t1 > t:
            dt = t1 - t
            steps = dt / m.step_s[n]
            tokens = n * steps * m.al
            g.progress += steps * m.al
            self._record_tokens(m.tpot_s[n], tokens)
            g.itl.observe(m.step_s[n], n * steps)
            g.drafts += n * steps
            g.accepted += n * steps * (m.al - 1)
            g.tokens += tokens
        g.last_t = t1

    def _schedule(self, g: _Group) -> None:
        """Push the group's next completion."""
        g.version += 1
        if not g.running:
            return
        finish = g.running[0][0]
        m = self.m
        n = len(g.running)
        if g.stall_end > g.last_t:
            after = g.progress + m.al * g.stall_steps
            t = g.stall_end if finish <= after + 1e-9 else g.stall_end + (finish - after) / m.rate[n]
        else:
            t = g.last_t + max(0.0, finish - g.progress) / m.rate[n]
        self._push(t, 2, (g.gid, g.version))

    def _admit(self, g: _Group, req: Request, now: float) -> None:
        """Start ``req`` on ``g`` (a slot is free): its prefill joins (or extends) a prefill step,
        in chunks of at most ``max_num_batched_tokens`` (one step each)."""
        m = self.m
        budget = self.cfg.max_num_batched_tokens
        left = req.prompt_tokens
        while True:
            chunk = min(left, budget)
            left -= chunk
            if g.stall_end > now and g.stall_prompt_tokens + chunk <= budget:
                # Same step: the step prefills both prompts (chunked prefill shares a step's token budget).
                prev = m.prefill_step_s(g.stall_prompt_tokens, g.stall_decoders)
                g.stall_prompt_tokens += chunk
                g.stall_end += m.prefill_step_s(g.stall_prompt_tokens, g.stall_decoders) - prev
            elif g.stall_end > now:  # another prefill step after the current one
                g.stall_steps += 1
                g.stall_prompt_tokens = chunk
                g.stall_end += m.prefill_step_s(chunk, g.stall_decoders)
            else:
                g.stall_start = now
                g.stall_decoders = len(g.running)
                g.stall_steps = 1
                g.stall_prompt_tokens = chunk
                g.stall_end = now + m.prefill_step_s(chunk, g.stall_decoders)
            if left <= 0:
                break
        ttft = g.stall_end - req.arrival_s
        self._minute_ttft.append(ttft)
        g.ttft.observe(ttft)
        g.prompt += req.prompt_tokens
        g.tokens += 1  # the first token, emitted by the prefill step
        finish = g.progress + m.al * g.stall_steps + max(0, req.output_tokens - 1)
        self._seq += 1
        heapq.heappush(g.running, (finish, self._seq, req))

    def _route(self, req: Request, now: float) -> None:
        best = None
        for g in self.groups:
            if g.state == READY and (best is None or len(g.running) + len(g.waiting) < len(best.running) + len(best.waiting)):
                best = g
        if best is None:
            self.gateway.append(req)
            return
        self._advance(best, now)
        if len(best.running) < self.cfg.max_num_seqs:
            self._admit(best, req, now)
            self._schedule(best)
        else:
            best.waiting.append(req)

    def _complete(self, g: _Group, now: float) -> None:
        self._advance(g, now)
        while g.running and g.running[0][0] <= g.progress + 1e-6:
            heapq.heappop(g.running)
        while g.waiting and len(g.running) < self.cfg.max_num_seqs:
            self._admit(g, g.waiting.popleft(), now)
        if g.state == DRAINING and not g.running:
            self._release(g, now)
            return
        self._schedule(g)

    # ---------------------------------------------------------------- decisions ----------
    def fleet_state(self, now: float) -> FleetState:
        alive = [g for g in self.groups if g.state in (PENDING, LOADING, READY)]
        loading = sum(1 for g in alive if g.state == LOADING and now - g.created_s < self.cfg.load_timeout_s)
        ready = [g for g in alive if g.state == READY]
        return FleetState(current=len(alive), ready=len(ready),
                          loading=loading, unplaceable=sum(1 for g in alive if g.state == PENDING),
                          serving=frozenset(str(g.gid) for g in ready),
                          load_time_s=min((self._ready_at[g.gid] - g.created_s for g in ready), default=None))

    def _serving(self) -> list[_Group]:
        return [g for g in self.groups if g.state in (READY, DRAINING)]

    def _targets(self, namespace: str, deployment: str) -> list[ScrapeTarget]:
        """The leaders to scrape: every group whose pods run (loading, ready or draining), as the
        controller lists the Running leader pods."""
        return [ScrapeTarget(f"group-{g.gid}", str(g.gid), g.url) for g in self.groups
                if g.state in (LOADING, READY, DRAINING)]

    def page(self, url: str) -> str:
        """The /metrics page of the group at ``url`` now: vLLM 0.32's text exposition. A group
        still loading refuses the connection (vLLM listens once the weights are loaded)."""
        g = self._pages[url]
        if g.state == LOADING:
            raise requests.ConnectionError(ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused"))
        values: dict[str, float | HistogramTotals] = {
            RUNNING: float(len(g.running)), WAITING: float(len(g.waiting)), GENERATION_TOKENS: g.tokens, ITL: g.itl,
            PROMPT_TOKENS: g.prompt, PREFIX_CACHE_HITS: 0.0, TTFT: g.ttft}
        if self.cfg.shape.k:
            values |= {DRAFTS: g.drafts, ACCEPTED: g.accepted}
        return exposition(self.cfg.served_model_name, values)

    def observe(self, now: float) -> DecodeObservation | None:
        """The operator's reading of the window ending at ``now`` (``policy.window_s``), or None
        when it has none (no group serves, or every one is scraped for the first time)."""
        assert self.policy.window_s is not None
        for g in self._serving():
            self._advance(g, now)
        try:
            return self.source.observe("", self.name, self.policy.window_s)
        except MetricsUnavailable:
            return None

    def _tell_frontend(self, now: float, window_s: float) -> None:
        """The gateway's reading: counters over the window (from the newest count at or before
        its start), requests in flight at the serving groups now."""
        assert self.frontend is not None
        base = self._gateway.base(now - window_s)
        assert base is not None
        start, (requests, tokens, prompt) = base
        serving = self._serving()
        for g in serving:
            self._advance(g, now)
        self.frontend(GatewayReading(now - start, self._arrivals - requests, self._arrival_tokens - tokens,
                                     float(sum(len(g.running) + len(g.waiting) for g in serving)),
                                     self._arrival_prompt - prompt))
        self._gateway.add(now, (self._arrivals, self._arrival_tokens, self._arrival_prompt))
        self._gateway.forget_before(start)

    def _decide(self, now: float) -> None:
        window_s = self.policy.window_s
        obs = None if window_s is None else self.observe(now)
        if self.frontend is not None:
            self._tell_frontend(now, window_s or self.policy.interval_s)
        fleet = self.fleet_state(now)
        decision = self.policy.decide(now, obs, fleet)
        self.decisions.append((now, decision))
        if decision.desired != fleet.current:
            self.scale_events += 1
            self._apply(decision.desired, now)
        self.desired = decision.desired

    def _apply(self, desired: int, now: float) -> None:
        self._account(now)
        alive = [g for g in self.groups if g.state in (PENDING, LOADING, READY)]
        for _ in range(desired - len(alive)):
            self._new_group(now)
        for g in sorted(alive, key=lambda x: -x.gid)[:max(0, len(alive) - desired)]:
            if g.state in (PENDING, LOADING):
                self._release(g, now)
            else:
                self._advance(g, now)
                g.state = DRAINING
                queued, g.waiting = list(g.waiting), deque()
                if not g.running:
                    self._release(g, now)
                for req in queued:
                    self._route(req, now)

    def _ready(self, gid: int, now: float) -> None:
        g = self.groups[gid]
        if g.state != LOADING:
            return
        self._account(now)
        g.state = READY
        g.last_t = now
        self._ready_at[gid] = now
        while self.gateway:
            self._route(self.gateway.popleft(), now)

    # ---------------------------------------------------------------- minutes ------------
    def _close_minute(self, start: float, now: float) -> None:
        for g in self.groups:
            if g.state in (READY, DRAINING):
                self._advance(g, now)
        self._account(now)
        alive = [g for g in self.groups if g.state in (PENDING, LOADING, READY)]
        self.minutes.append(Minute(
            start_s=start, p90_tpot_s=weighted_quantile(self._minute_tokens, 0.9),
            p90_ttft_s=_quantile(self._minute_ttft, 0.9),
            tokens=sum(self._minute_tokens.values()), arrivals=self._minute_arrivals,
            demand_tokens_per_s=self._minute_demand / 60.0,
            ready=sum(1 for g in alive if g.state == READY), loading=sum(1 for g in alive if g.state == LOADING),
            pending=sum(1 for g in alive if g.state == PENDING), desired=self.desired,
            waiting=sum(len(g.waiting) for g in self.groups) + len(self.gateway),
            gpu_hours=self._minute_gpu_s / 3600.0))
        self._minute_tokens, self._minute_ttft = {}, []
        self._minute_arrivals, self._minute_demand, self._minute_gpu_s = 0, 0.0, 0.0

    # ---------------------------------------------------------------- the loop -----------
    def run(self) -> RunResult:
        # Event kinds by priority at equal times: 0 decision, 1 group ready, 2 completion, 3 minute.
        interval = self.policy.interval_s
        t = interval
        while t <= self.duration_s:
            self._push(t, 0, None)
            t += interval
        minute = 60.0
        while minute <= self.duration_s + 1e-9:
            self._push(minute, 3, minute - 60.0)
            minute += 60.0
        reqs = self.requests
        i, n_req = 0, len(reqs)
        heap = self._heap
        while heap or i < n_req:
            if i < n_req and (not heap or reqs[i].arrival_s < heap[0][0]):
                req = reqs[i]
                i += 1
                if req.arrival_s >= self.duration_s:
                    continue
                self._now = req.arrival_s
                self._minute_arrivals += 1
                self._minute_demand += req.output_tokens
                self._arrivals += 1
                self._arrival_tokens += req.output_tokens
                self._arrival_prompt += req.prompt_tokens
                self._route(req, req.arrival_s)
                continue
            now, kind, _, payload = heapq.heappop(heap)
            if now > self.duration_s + 1e-9:
                break
            self._now = now
            if kind == 0:
                self._decide(now)
            elif kind == 1:
                self._ready(payload[0], now)
            elif kind == 2:
                gid, version = payload
                g = self.groups[gid]
                if g.version == version and g.state in (READY, DRAINING):
                    self._complete(g, now)
            else:
                self._close_minute(payload, now)
        self._account(self.duration_s)
        groups = [(g.gid, g.created_s, self._ready_at.get(g.gid), self._gone_at.get(g.gid)) for g in self.groups]
        return RunResult(self.name, self.trace_name, self.minutes, self.decisions, self.scale_events,
                         self._gpu_s / 3600.0, groups)


def weighted_quantile(weights: dict[float, float], q: float) -> float | None:
    """The ``q`` quantile of values weighted by ``weights`` (value -> weight), None if empty."""
    total = sum(weights.values())
    if total <= 0:
        return None
    rank = q * total
    acc = 0.0
    for value in sorted(weights):
        acc += weights[value]
        if acc >= rank:
            return value
    return max(weights)


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, int(math.ceil(q * len(s))) - 1)]
