"""The operator's own Prometheus metrics (served on /metrics of the health server)."""

import threading
import time
from collections.abc import Callable, Iterator

from prometheus_client import REGISTRY, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from kimik3.kube.kinds import CHILD_KINDS

RECONCILES = Counter("kimik3_reconciles", "Reconciles of KimiK3Deployments by result "
                     "(applied, apply-failed, invalid, tearing-down, deleted, gone, error)", ["result"])
RECONCILE_SECONDS = Histogram("kimik3_reconcile_duration_seconds", "Wall time of one reconcile, seconds",
                              buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
CHILDREN_APPLIED = Counter("kimik3_children_applied", "Server-side applies of child objects by kind", ["kind"])
APPLIES_SKIPPED = Counter("kimik3_applies_skipped", "Child applies skipped: the watched object is what was applied")
APPLY_ERRORS = Counter("kimik3_apply_errors", "Failed applies of child objects by kind", ["kind"])
for _child in CHILD_KINDS:  # each kind's series from the start (0): no failure is not no data
    APPLY_ERRORS.labels(kind=_child.kind)
GROUPS = Gauge("kimik3_groups", "Engine groups of each KimiK3Deployment: desired (the LeaderWorkerSet's "
               "replicas) and ready", ["namespace", "deployment", "state"])
PLACED_GROUPS = Gauge("kimik3_placement_groups", "Engine groups of each KimiK3Deployment (status.groups) by rack "
                      "(the NVLink domain of the group's trays; empty while unbound) and Kueue Workload state "
                      "(Admitted, Pending, Preempted, Evicted; empty outside placement kueue)",
                      ["namespace", "deployment", "rack", "kueue"])
READY_LOST = Counter("kimik3_ready_lost", "Times a KimiK3Deployment's Ready condition went True -> False "
                     "(a pod, tray or engine of a group failed)", ["namespace", "deployment"])
ENGINE_FAILURES = Counter("kimik3_engine_failures", "Engine container exits with a non-zero code seen on the "
                          "pod watch, by termination reason", ["namespace", "deployment", "reason"])
ENGINE_DISRUPTIONS = Counter("kimik3_engine_disruptions", "Engine pods Kubernetes marked DisruptionTarget before "
                             "deleting them (taint eviction, drain, preemption), by reason",
                             ["namespace", "deployment", "reason"])
QUEUE_DEPTH = Gauge("kimik3_workqueue_depth", "KimiK3Deployments waiting to be reconciled")
WATCH_EVENTS = Counter("kimik3_watch_events", "Watch events received by resource", ["resource"])
CANARY_CHECKS = Counter("kimik3_canary_checks", "Canary analysis checks of a new revision by result (Passed, "
                        "Failed, NoTraffic, NoReading, SourceUnreadable; status.rollout.canary.history)",
                        ["namespace", "deployment", "result"])
CANARY_PROBE_REQUESTS = Counter("kimik3_canary_probe_requests", "Requests the canary analysis sent to engine groups "
                                "itself, by purpose (traffic: probes filling a canary's windows without traffic, at "
                                "most analysis.probeRequests per check; parity: the golden prompts to a canary and an "
                                "old group) and result (ok, failed)",
                                ["namespace", "deployment", "purpose", "result"])
DESIRED_GROUPS = Gauge("kimik3_autoscaler_desired_groups", "Groups the autoscaler wants", ["namespace", "deployment"])
CURRENT_GROUPS = Gauge("kimik3_autoscaler_ready_groups", "Groups serving at the last decision",
                       ["namespace", "deployment"])
OBSERVED_LATENCY = Gauge("kimik3_autoscaler_observed_latency_seconds",
                         "Decode latency the autoscaler holds under its target, over the last window, seconds: "
                         "spec.autoscaling.target.metric (label metric: timePerOutputToken or interTokenLatency) "
                         "at target.percentile (label percentile); status.decode.latencySeconds",
                         ["namespace", "deployment", "metric", "percentile"])
SLO_ATTAINMENT = Gauge("kimik3_autoscaler_slo_attainment",
                       "Share of decision windows of the past hour with latency <= target (0..1)",
                       ["namespace", "deployment"])
DECISIONS = Counter("kimik3_autoscaler_decisions", "Autoscaler decisions by reason", ["reason"])
LEADER = Gauge("kimik3_operator_leader", "1 while this replica holds the operator's Lease (reconciles and writes), "
               "else 0 (a standby)")
LEADER_TRANSITIONS = Counter("kimik3_operator_leader_transitions", "Times this replica became the leader")


GpuKey = tuple[str, str, str, str, str]
"""(namespace, deployment, revision, state, capacity): one series of ``kimik3_gpus`` and ``kimik3_gpu_seconds_total``."""


class GpuTime:
    """``kimik3_gpus`` (gauge) and ``kimik3_gpu_seconds_total`` (counter): the GPUs of each
    deployment's pods by revision (the pods' ``leaderworkerset.sigs.k8s.io/template-revision-hash``),
    state (``held``: bound to a node and not finished, loading and terminating included;
    ``serving``: of a Ready group, ``kube.groups.gpus_by_revision``) and capacity (``reserved``, or
    ``burst``: a group above autoscaling.minReplicas with placement.burstPriorityClass,
    ``controller.capacity``), and their integral over time in GPU-seconds.

    The counter is what billing reads (recording rules of ``kimik3.usage.rules``): the operator
    adds ``GPUs x seconds`` since the last change or scrape each time a value is set and each time
    /metrics is collected, so a Prometheus scrape gap loses nothing (``increase()`` spans it). A
    series removed (the deployment or revision gone) keeps its final count for ``RETAIN_S`` so
    the scrapes after its removal read it, then is dropped (Prometheus marks it stale)."""

    RETAIN_S = 600.0
    """Seconds a removed series' counter stays exported (several scrape intervals)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self._lock = threading.Lock()
        self._gpus: dict[GpuKey, int] = {}
        self._seconds: dict[GpuKey, float] = {}
        self._since: dict[GpuKey, float] = {}
        self._removed: dict[GpuKey, float] = {}

    def _accrue(self, now: float) -> None:
        for key, gpus in self._gpus.items():
            self._seconds[key] = self._seconds.get(key, 0.0) + gpus * (now - self._since[key])
            self._since[key] = now

    def set(self, namespace: str, deployment: str, counts: dict[tuple[str, str, str], int]) -> None:
        """The deployment's GPUs now: (revision, state, capacity) -> GPUs. Keys set before and absent
        from ``counts`` are removed (``remove``)."""
        with self._lock:
            now = self.clock()
            self._accrue(now)
            for key in [k for k in self._gpus if k[:2] == (namespace, deployment) and k[2:] not in counts]:
                del self._gpus[key], self._since[key]
                self._removed[key] = now
            for (revision, state, capacity), gpus in counts.items():
                key = (namespace, deployment, revision, state, capacity)
                self._gpus[key], self._since[key] = gpus, now
                self._removed.pop(key, None)

    def remove(self, namespace: str, deployment: str) -> None:
        """The deployment is gone: its gauges go, its counters stay ``RETAIN_S`` more."""
        self.set(namespace, deployment, {})

    def clear(self) -> None:
        """This replica stopped leading: every gauge goes, as by ``remove`` (the new leader
        exports them from its first reconcile; a stale count here would bill twice)."""
        with self._lock:
            deployments = {k[:2] for k in self._gpus}
        for namespace, deployment in deployments:
            self.remove(namespace, deployment)

    def collect(self) -> Iterator[Metric]:
        labels = ["namespace", "deployment", "revision", "state", "capacity"]
        gauge = GaugeMetricFamily("kimik3_gpus", "GPUs of each KimiK3Deployment's pods by revision, state (held: "
                                  "bound to a node, not finished: loading and terminating included; serving: of a "
                                  "Ready group) and capacity (reserved; burst: a group above minReplicas with "
                                  "placement.burstPriorityClass)", labels=labels)
        counter = CounterMetricFamily("kimik3_gpu_seconds", "Integral of kimik3_gpus over time, GPU-seconds "
                                      "(billing: GPU-hours held and serving, reserved and burst)", labels=labels)
        with self._lock:
            now = self.clock()
            self._accrue(now)
            for key in [k for k, at in self._removed.items() if now - at > self.RETAIN_S]:
                del self._removed[key], self._seconds[key]
            for key, gpus in sorted(self._gpus.items()):
                gauge.add_metric(list(key), gpus)
            for key, seconds in sorted(self._seconds.items()):
                counter.add_metric(list(key), seconds)
        yield gauge
        yield counter


GPU_TIME = GpuTime()
REGISTRY.register(GPU_TIME)
LATENCY_WITHIN_TARGET = Gauge(
    "kimik3_latency_within_target", "1 when the autoscaler's last window with traffic met the target (label "
    "target: latency = spec.autoscaling.target at its percentile, per-token; ttft = spec.autoscaling.ttftTarget), "
    "else 0; absent while no window with traffic was measured (billing: SLO minutes)",
    ["namespace", "deployment", "target"])
