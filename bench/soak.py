"""Soak benchmark: a seeded random schedule of faults on a whole dev cluster, one at a time.

    source tools/env.sh && python bench/soak.py [--minutes 20] [--seed 0] [--racks 4] [--deployments 2]
                                                [--placement exclusive|kueue] [--kinds tray-not-ready,...]

1. ``DevCluster.up``: ``--racks`` GB300 NVL72 racks x 4 trays (the operator asks for one engine
   group per rack; a TP8 group is 2 trays), ``die_with_parent`` (nothing outlives this process).
2. ``--deployments`` KimiK3Deployments from ``recipes/gb300-tp8-megakernel-dspark.yaml``
   (replicas 1, namespace ``soak-<i>``, name ``k3``; not-ready/unreachable NoExecute tolerations
   of ``TOLERATION_S`` s in ``spec.scheduling``; ``--placement kueue``: submitted to the LocalQueue
   ``default`` of the ClusterQueue holding every GPU, so Kueue admits each group whole and packs
   it), applied as ``kimik3 dev apply`` does, and the clock waits for them to converge.
3. For ``--minutes``: rounds of every fault kind in a seeded random order (each kind equally
   often), one fault at a time, each followed by a bounded wait (``--timeout``, 420 s) for
   convergence. A timeout is a failure, recorded, and the run goes on after a repair (the engine
   pods that are not Ready deleted, their groups recreated, convergence awaited again), so that
   one failure does not spill into the next faults; if even that does not converge, it stops.
   - ``scale``: the user's spec edited, ``replicas`` 1 <-> 2 (never more groups than racks);
   - ``delete-child``: the Service, the LeaderWorkerSet or the launcher ConfigMap deleted by hand;
   - ``delete-pod``: a worker pod of a group deleted;
   - ``crash-pod``: a group's leader crashes (kwok: containers exit 1, Failed);
   - ``tray-not-ready``: a tray holding an engine pod NotReady for ``TRAY_DOWN_S`` s (up to
     ``TRAY_MAX_DOWN_S`` while its groups are not yet back on healthy trays), then Ready;
   - ``operator-restart``: the operator SIGKILLed (``stop_component(kill=True)``),
     a CR scaled while it is down, started again;
   - ``lws-manager-down``: the LeaderWorkerSet manager (and its webhooks) down ``LWS_DOWN_S`` s,
     a CR scaled meanwhile, started again;
   - ``apiserver-restart``: a CR scaled, then kube-apiserver SIGKILLed before the operator has
     acted on it and started again on the same port, etcd and certificates
     (``DevCluster.restart_apiserver``);
   - ``kueue-manager-down`` (``--placement kueue`` only): the Kueue manager (and its webhooks)
     SIGKILLed, a CR scaled meanwhile, started again ``KUEUE_DOWN_S`` s later.
   Recovery is timed from the end of the fault (the injection for instant faults, the component
   started again for the stops, the API server ready again for its restart) until converged; for ``tray-not-ready`` from the tray going
   down until converged with its groups on healthy trays, while it is still down (a group still
   waiting for the tray when it returns is a failure). Converged: every CR has
   ``status.observedGeneration == metadata.generation``, Ready=True, Degraded not True,
   ``readyReplicas == spec.replicas``, its LeaderWorkerSet's ``spec.replicas == spec.replicas``,
   its Service and launcher ConfigMap, exactly groups ``0..replicas-1``, each with all its pods
   Ready inside one ``nvidia.com/gpu.clique``. Before the next fault every tray must be Ready and
   untainted again (not counted in the recovery).
4. A checker thread polls every ``CHECK_PERIOD_S`` s, and records as invariant violations: a CR
   with more than one LeaderWorkerSet; two live groups (different leader pods) with the same index
   for more than ``OVERLAP_GRACE_S`` s (the garbage collector removes an old group's workers a
   moment after its leader; every shorter overlap is listed under ``transient_overlaps``); the
   CR's spec or generation changed by anyone but this script; the operator's finalizer missing;
   and, after ``delete-pod`` / ``crash-pod``, a group other than the victim's recreated.
   Every ``SAMPLE_PERIOD_S`` s it samples the operator's RSS (``DevCluster.rss_bytes``) and its
   ``/metrics`` (``kimik3_reconciles_total`` by result, ``kimik3_apply_errors_total``,
   ``kimik3_ready_lost_total``; counters summed across operator restarts). The operator process
   gone or restarted by anything but the soak is an invariant violation too.

Prints a table per fault kind and writes ``bench/results/soak.json``: ``{date, commit (HEAD at the
start, ``+dirty`` when the work tree differed), minutes, seed, racks,
deployments, placement, kinds, faults: {kind: {count, recovery_s_p50, recovery_s_max, failures}},
invariant_violations, transient_overlaps, operator_rss_mb: {start, end, max}, reconciles,
apply_errors, apply_errors_by_kind, ready_lost, initial_converge_s, stopped_early, log}``; ``log``
has one entry per fault: time, kind, where the groups were (rack of each), target, recovery, and
for a failure the reason, the trace of reasons it was not converged, a snapshot of the CRs (whole
condition messages), pods and trays (a failed tray fault: also ``snapshot_while_down``, taken
before the tray comes back), and the repair. Exit status 1 on any failure or invariant violation.
``tests/e2e/test_soak_smoke.py`` runs the quick fault kinds once on the e2e dev cluster.
"""

from __future__ import annotations

import copy
import json
import random
import signal
import statistics
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
import urllib3
import yaml
from prometheus_client.parser import text_string_to_metric_families

from kimik3.admission import admit
from kimik3.api.conditions import ConditionType
from kimik3.kube import nodes as knodes
from kimik3.kube import pods as kpods
from kimik3.kube.kinds import CONFIG_MAP, KIMIK3_DEPLOYMENT, LEADER_WORKER_SET, NODE, POD, SERVICE
from kimik3.kube.objects import condition, is_deleting
from kimik3.kube.times import rfc3339
from kimik3.render.configmap import configmap_name
from kimik3.render.meta import Owner, engine_set_name
from kimik3.controller.kube import ApiError
from kimik3.controller.reconcile import FINALIZER
from kimik3_dev.benchmark.provenance import checkout_commit
from kimik3_dev.devcluster import faults
from kimik3_dev.devcluster.cluster import DevCluster, UpOptions
from kimik3_dev.devcluster.kueue import LOCAL_QUEUE
from kimik3_dev.devcluster.racks import RackShape
from kimik3_dev.devcluster.rest import Rest
from kimik3_dev.devcluster.workloads import apply_deployment
from kimik3.kube.labels import CLIQUE_LABEL, LWS_NAME_LABEL

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "recipes" / "gb300-tp8-megakernel-dspark.yaml"
TRAYS_PER_RACK = 4
TOLERATION_S = 10
"""not-ready / unreachable NoExecute toleration of the engine pods, s."""
TRAY_DOWN_S = 20.0
TRAY_MAX_DOWN_S = 60.0
"""A tray stays NotReady TRAY_DOWN_S, or up to TRAY_MAX_DOWN_S while its groups are not yet
Ready on healthy trays (then the fault is a failure)."""
AFTER_FAILED_TRAY_S = 120.0
"""Bound on the wait for convergence after such a failed tray fault returns, s."""
LWS_DOWN_S = 30.0
KUEUE_DOWN_S = 30.0
CHECK_PERIOD_S = 1.0
SAMPLE_PERIOD_S = 5.0
POLL_S = 0.5
"""Convergence is polled this often, s (the resolution of the recovery times)."""
SETTLE_S = 3.0
"""Pause after each convergence before the next fault (the checker keeps watching)."""
OVERLAP_GRACE_S = 5.0
NODE_HEALTH_TIMEOUT_S = 120.0
KINDS = ("scale", "delete-child", "delete-pod", "crash-pod", "tray-not-ready", "operator-restart",
         "lws-manager-down", "apiserver-restart", "kueue-manager-down")
KUEUE_ONLY = ("kueue-manager-down",)
"""Kinds that only mean something under ``--placement kueue`` (left out of exclusive runs)."""
CHILD_KINDS = ("Service", "LeaderWorkerSet", "ConfigMap")


def _live(pod: dict[str, Any]) -> bool:
    return not kpods.is_terminating(pod) and kpods.phase(pod) not in ("Succeeded", "Failed")


class CounterTotals:
    """Prometheus counters summed across restarts of the process that serves them: a sample
    lower than the last one seen means a restart, and the last value is carried over."""

    def __init__(self) -> None:
        self._last: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        self._carried: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}

    def restarted(self) -> None:
        """The serving process was restarted: what it had counted is carried over."""
        for key, value in self._last.items():
            self._carried[key] = self._carried.get(key, 0.0) + value
        self._last = dict.fromkeys(self._last, 0.0)

    def update(self, text: str, names: tuple[str, ...]) -> None:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name not in names:
                    continue
                key = (sample.name, tuple(sorted(sample.labels.items())))
                last = self._last.get(key, 0.0)
                if sample.value < last:
                    self._carried[key] = self._carried.get(key, 0.0) + last
                self._last[key] = sample.value
        # series missing from this scrape (a restarted operator that has not counted them yet)
        # keep their last value until they come back lower

    def total(self, name: str, by: str | None = None) -> dict[str, float] | float:
        out: dict[str, float] = {}
        for key, value in self._last.items():
            if key[0] != name:
                continue
            label = dict(key[1]).get(by, "") if by else ""
            out[label] = out.get(label, 0.0) + value + self._carried.get(key, 0.0)
        return out if by else sum(out.values())


class Deployment:
    """One KimiK3Deployment of the soak and the spec this script last wrote to it."""

    def __init__(self, index: int, namespace: str | None = None, placement: str = "exclusive") -> None:
        self.namespace, self.name = namespace or f"soak-{index}", "k3"
        cr = next(d for d in yaml.safe_load_all(RECIPE.read_text()) if d)
        cr["metadata"] = {"name": self.name, "namespace": self.namespace}
        cr["spec"]["replicas"] = 1
        scheduling = cr["spec"].setdefault("scheduling", {})
        scheduling["tolerations"] = [
            {"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": TOLERATION_S}
            for key in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")]
        if placement == "kueue":
            scheduling["placement"] = {"mode": "kueue", "queueName": LOCAL_QUEUE}
        self.manifest = cr
        self.spec: dict[str, Any] = {}
        self.generation = 0
        self.uid = ""

    @property
    def replicas(self) -> int:
        return int(self.manifest["spec"]["replicas"])

    @property
    def path(self) -> str:
        return KIMIK3_DEPLOYMENT.path(self.namespace, self.name)

    @property
    def lws(self) -> str:
        return engine_set_name(self.name)

    def child_paths(self) -> dict[str, str]:
        ns = self.namespace
        return {SERVICE.kind: SERVICE.path(ns, self.name),
                LEADER_WORKER_SET.kind: LEADER_WORKER_SET.path(ns, self.lws),
                CONFIG_MAP.kind: CONFIG_MAP.path(ns, configmap_name(Owner(self.name, ns, self.uid),
                                                                    admit(self.manifest["spec"])))}

    def pods(self, rest: Rest) -> list[dict[str, Any]]:
        return rest.items(POD.path(self.namespace), f"{LWS_NAME_LABEL}={self.lws}")


def groups_of(pods: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    """Live pods by group index, each list sorted by worker index."""
    out: dict[int, list[dict[str, Any]]] = {}
    for pod in pods:
        if _live(pod):
            out.setdefault(int(kpods.group_index(pod) or 0), []).append(pod)
    for members in out.values():
        members.sort(key=lambda p: kpods.worker_index(p) or 0)
    return dict(sorted(out.items()))


class Stuck(Exception):
    """The cluster does not converge any more, even after a repair: the soak stops."""


@dataclass
class Fault:
    """What a fault hit (``target``), how long it lasted, and ``effect``: what has not happened
    yet (None once the fault has visibly happened). ``recovery_s`` / ``failure``: set by a fault
    that times its own recovery (tray-not-ready)."""

    target: str
    lasted_s: float = 0.0
    effect: Callable[[], str | None] | None = None
    recovery_s: float | None = None
    failure: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class Soak:
    """The faults, the convergence checks, the invariant checker and the samples of one run."""

    def __init__(self, cluster: DevCluster, state: dict[str, Any], rest: Rest, deployments: list[Deployment],
                 racks: int, seed: int, timeout_s: float, log: Callable[[str], None] = print) -> None:
        self.cluster, self.state, self.rest, self.deps = cluster, state, rest, deployments
        self.racks, self.timeout_s, self.log = racks, timeout_s, log
        self.rng = random.Random(seed)
        self.lock = threading.Lock()  # our own CR edits vs the checker's spec comparison
        self.t0 = time.monotonic()
        self.clique_of = {n["metadata"]["name"]: n["metadata"]["labels"].get(CLIQUE_LABEL)
                          for n in rest.items(NODE.path())}
        self.violations: list[dict[str, Any]] = []
        self._violation_keys: set[str] = set()
        self.overlaps: dict[tuple[str, int], float] = {}  # (deployment, group) -> first seen
        self.transient_overlaps: list[dict[str, Any]] = []
        self.counters = CounterTotals()
        self.rss: list[float] = []
        self.entries: list[dict[str, Any]] = []
        self.stuck: str | None = None  # why the soak stopped early
        self.trace: list[tuple[float, str]] = []  # (s, why not converged) of the fault under way
        self.victim: str | None = None  # "namespace/group index" hit by the last delete-pod / crash-pod
        self._sample_lock = threading.Lock()
        self._operator_pid: int | None = None
        self.operator_stopped = False  # set by the soak's own operator restart until a sample sees the new pid
        self._stop = threading.Event()
        self._checker: threading.Thread | None = None
        self._metrics_url = state["urls"]["operator"] + "/metrics"

    def now(self) -> float:
        return round(time.monotonic() - self.t0, 1)

    # -- the user's edits ------------------------------------------------------------------------
    def apply(self, dep: Deployment, replicas: int | None = None) -> None:
        with self.lock:
            if replicas is not None:
                dep.manifest["spec"]["replicas"] = replicas
            obj = apply_deployment(self.rest, copy.deepcopy(dep.manifest))
            dep.spec, dep.generation, dep.uid = obj["spec"], obj["metadata"]["generation"], obj["metadata"]["uid"]

    def scale_any(self) -> str:
        """Toggle one CR between 1 and 2 replicas, never asking for more groups than racks."""
        dep = self.rng.choice(self.deps)
        total = sum(d.replicas for d in self.deps)
        want = 2 if dep.replicas == 1 and total < self.racks else 1
        if want == dep.replicas:  # no room to scale this one up: scale down one that has 2
            dep = self.rng.choice([d for d in self.deps if d.replicas == 2])
            want = 1
        before = dep.replicas
        self.apply(dep, want)
        return f"{dep.namespace}/{dep.name} replicas {before} -> {want}"

    # -- convergence -----------------------------------------------------------------------------
    def not_converged(self, dep: Deployment, rest: Rest | None = None) -> str | None:
        """Why ``dep`` has not converged, or None."""
        rest = rest or self.rest
        cr = rest.get(dep.path)
        if cr is None:
            return "CR missing"
        status = cr.get("status") or {}
        want = cr["spec"]["replicas"]
        if status.get("observedGeneration") != cr["metadata"]["generation"]:
            return f"observedGeneration {status.get('observedGeneration')} != generation {cr['metadata']['generation']}"
        ready, degraded = condition(cr, ConditionType.READY), condition(cr, ConditionType.DEGRADED)
        if not ready or ready["status"] != "True":
            return f"Ready={ready and ready['status']} ({ready and ready.get('message', '')[:160]})"
        if degraded and degraded["status"] == "True":
            return f"Degraded=True {degraded.get('reason')}"
        if status.get("readyReplicas") != want:
            return f"readyReplicas {status.get('readyReplicas')} != {want}"
        children = {k: rest.get(p) for k, p in dep.child_paths().items()}
        for kind, child in children.items():
            if child is None or is_deleting(child):
                return f"{kind} missing"
        lws = children[LEADER_WORKER_SET.kind]
        if lws["spec"].get("replicas") != want:
            return f"LeaderWorkerSet replicas {lws['spec'].get('replicas')} != {want}"
        size = int(lws["spec"]["leaderWorkerTemplate"].get("size", 1))
        groups = groups_of(dep.pods(rest))
        if sorted(groups) != list(range(want)):
            return f"groups {sorted(groups)} != 0..{want - 1}"
        for index, members in groups.items():
            if len(members) != size or not all(kpods.is_ready(p) for p in members):
                return f"group {index}: {sum(map(kpods.is_ready, members))}/{size} pods Ready"
            cliques = {self.clique_of.get(p["spec"].get("nodeName")) for p in members}
            if len(cliques) != 1 or None in cliques:
                return f"group {index} spans cliques {sorted(map(str, cliques))}"
        return None

    def why_not_converged(self) -> str | None:
        for dep in self.deps:
            why = self.not_converged(dep)
            if why:
                return f"{dep.namespace}/{dep.name}: {why}"
        return None

    def wait_converged(self, timeout_s: float, effect: Callable[[], str | None] | None = None
                       ) -> tuple[float | None, str]:
        """Seconds until every CR converged (None on timeout) and the last reason it had not;
        with ``effect``, convergence only counts once ``effect()`` has returned None."""
        start, last, seen = time.monotonic(), "", effect is None
        while True:
            try:
                pending = None if seen else effect()
                seen = pending is None
                why = self.why_not_converged() if seen else f"the fault has not shown: {pending}"
            except ApiError as exc:  # a failed read is not convergence
                why = f"API error {exc.status} {exc.reason}"
            except (urllib3.exceptions.HTTPError, OSError) as exc:  # nor is a connection the API server dropped
                why = f"API unreachable: {type(exc).__name__}"
            if why is None:
                return time.monotonic() - start, ""
            if why != last:
                self.trace.append((round(time.monotonic() - start, 1), why))
            last = why
            if time.monotonic() - start > timeout_s:
                return None, last
            time.sleep(POLL_S)

    def snapshot(self) -> dict[str, Any]:
        """What the cluster looks like (for a failed fault's record): each CR's conditions, its
        LeaderWorkerSet and pods, and every tray that is not Ready or is tainted."""
        out: dict[str, Any] = {}
        for dep in self.deps:
            cr = self.rest.get(dep.path) or {}
            lws = self.rest.get(dep.child_paths()["LeaderWorkerSet"]) or {}
            out[f"{dep.namespace}/{dep.name}"] = {
                "generation": cr.get("metadata", {}).get("generation"),
                "status": {k: v for k, v in (cr.get("status") or {}).items() if k != "conditions"
                           and k in ("observedGeneration", "replicas", "readyReplicas")},
                "conditions": [f"{c['type']}={c['status']} {c.get('reason')}: {c.get('message', '')}"
                               for c in (cr.get("status") or {}).get("conditions", [])],
                "lws": {"uid": lws.get("metadata", {}).get("uid"), "replicas": lws.get("spec", {}).get("replicas"),
                        "status": {k: v for k, v in (lws.get("status") or {}).items() if k != "conditions"}},
                "pods": [{"name": p["metadata"]["name"], "uid": p["metadata"]["uid"][:8],
                          "node": p["spec"].get("nodeName"), "phase": (p.get("status") or {}).get("phase"),
                          "ready": kpods.is_ready(p), "deleting": p["metadata"].get("deletionTimestamp"),
                          "conditions": {c["type"]: c["status"] for c in (p.get("status") or {}).get("conditions", [])},
                          "created": p["metadata"].get("creationTimestamp")}
                         for p in dep.pods(self.rest)],
            }
        out["trays"] = {n["metadata"]["name"]: {
            "ready": (condition(n, knodes.READY) or {}).get("status"),
            "taints": [f"{t['key']}:{t['effect']}" for t in n["spec"].get("taints", [])]}
            for n in self.rest.items(NODE.path())
            if n["spec"].get("taints") or not knodes.is_ready(n)}
        return out

    def _safe_snapshot(self) -> dict[str, Any] | str:
        """``snapshot()``, or the error that prevented it."""
        try:
            return self.snapshot()
        except Exception as exc:  # noqa: BLE001 - a record of the failure, whatever the cluster does
            return f"{type(exc).__name__}: {exc}"

    def wait_trays_healthy(self) -> str | None:
        """Wait until every tray is Ready and untainted; the last problem on timeout."""
        deadline, last = time.monotonic() + NODE_HEALTH_TIMEOUT_S, ""
        while time.monotonic() < deadline:
            bad = []
            for node in self.rest.items(NODE.path()):
                ready = knodes.is_ready(node)
                taints = [t["key"] for t in node["spec"].get("taints", [])]
                if not ready or taints:
                    bad.append(f"{node['metadata']['name']} ready={ready} taints={taints}")
            if not bad:
                return None
            last = "; ".join(bad)
            time.sleep(POLL_S)
        return last

    # -- invariants and samples (a thread with its own API client) -------------------------------
    def violation(self, key: str, what: str) -> None:
        if key not in self._violation_keys:
            self._violation_keys.add(key)
            self.violations.append({"t": self.now(), "what": what})
            self.log(f"  !! invariant violation at {self.now()} s: {what}")

    def check(self, rest: Rest) -> None:
        for dep in self.deps:
            ns, name = dep.namespace, dep.name
            with self.lock:
                cr = rest.get(dep.path)
                if cr is None:
                    self.violation(f"gone/{ns}", f"{ns}/{name}: the CR is gone")
                    continue
                if cr["metadata"]["generation"] != dep.generation or cr["spec"] != dep.spec:
                    self.violation(f"spec/{ns}/{cr['metadata']['generation']}",
                                   f"{ns}/{name}: spec changed by someone else (generation "
                                   f"{cr['metadata']['generation']}, ours {dep.generation}; managers "
                                   f"{[m.get('manager') for m in cr['metadata'].get('managedFields', [])]})")
            if FINALIZER not in cr["metadata"].get("finalizers", []):
                self.violation(f"finalizer/{ns}", f"{ns}/{name}: finalizer {FINALIZER} missing "
                                                  f"({cr['metadata'].get('finalizers')})")
            lwss = [x for x in rest.items(LEADER_WORKER_SET.path(ns))
                    if any(o.get("uid") == cr["metadata"]["uid"] for o in x["metadata"].get("ownerReferences", []))]
            if len(lwss) > 1:
                self.violation(f"lws/{ns}/{len(lwss)}", f"{ns}/{name}: {len(lwss)} LeaderWorkerSets "
                                                        f"{[x['metadata']['name'] for x in lwss]}")
            # a group instance = its leader pod: a worker's StatefulSet is owned by its leader
            sts_owner = {s["metadata"]["uid"]: next((o["uid"] for o in s["metadata"].get("ownerReferences", [])
                                                     if o.get("kind") == POD.kind), None)
                         for s in rest.items(f"/apis/apps/v1/namespaces/{ns}/statefulsets")}
            leaders: dict[int, set[str]] = {}
            for pod in dep.pods(rest):
                if not _live(pod):
                    continue
                if kpods.is_leader(pod):
                    leader = pod["metadata"]["uid"]
                else:
                    sts = next((o["uid"] for o in pod["metadata"].get("ownerReferences", [])
                                if o.get("kind") == "StatefulSet"), None)
                    leader = sts_owner.get(sts) or f"sts:{sts}"
                leaders.setdefault(int(kpods.group_index(pod) or 0), set()).add(leader)
            now = time.monotonic()
            for index in set(leaders) | {g for (n, g) in self.overlaps if n == ns}:
                key = (ns, index)
                if len(leaders.get(index, ())) > 1:
                    first = self.overlaps.setdefault(key, now)
                    if now - first > OVERLAP_GRACE_S:
                        self.violation(f"overlap/{ns}/{index}/{first}",
                                       f"{ns}/{name}: two live groups with index {index} for "
                                       f"{now - first:.1f} s (leaders {sorted(leaders[index])})")
                elif key in self.overlaps:
                    first = self.overlaps.pop(key)
                    self.transient_overlaps.append({"t": round(first - self.t0, 1), "deployment": f"{ns}/{name}",
                                                    "group": index, "seconds": round(now - first, 1)})

    def sample(self) -> None:
        with self._sample_lock:  # the main thread samples too, right before stopping the operator
            record = next((r for r in self.cluster.components() if r.name == "operator" and r.alive), None)
            if record is None:
                if not self.operator_stopped:
                    self.violation("operator-gone", "the operator process is not running (not stopped by the soak)")
                return
            if self._operator_pid is not None and record.pid != self._operator_pid:
                if not self.operator_stopped:
                    self.violation(f"operator-pid/{record.pid}", f"the operator restarted by itself "
                                                                 f"(pid {self._operator_pid} -> {record.pid})")
                self.counters.restarted()  # its counters start from zero again
                self.operator_stopped = False  # our own restart, now accounted for
            self._operator_pid = record.pid
            rss = self.cluster.rss_bytes().get("operator")
            if rss:
                self.rss.append(rss / 2**20)
            try:
                with urllib.request.urlopen(self._metrics_url, timeout=5) as resp:
                    text = resp.read().decode()
            except OSError:
                return  # the operator is down (a fault) or busy: the next sample counts
            self.counters.update(text, ("kimik3_reconciles_total", "kimik3_apply_errors_total",
                                        "kimik3_ready_lost_total"))

    def _check_loop(self) -> None:
        with self.cluster.api_client() as api:
            rest = Rest(api)
            next_sample = 0.0
            while not self._stop.is_set():
                try:
                    self.check(rest)
                except Exception as exc:  # noqa: BLE001 - an unreadable cluster is a fault's doing
                    self.log(f"  (checker: {type(exc).__name__}: {str(exc)[:200]})")
                if time.monotonic() >= next_sample:
                    self.sample()
                    next_sample = time.monotonic() + SAMPLE_PERIOD_S
                self._stop.wait(CHECK_PERIOD_S)

    def start_checker(self) -> None:
        self._checker = threading.Thread(target=self._check_loop, name="soak-checker", daemon=True)
        self._checker.start()

    def stop_checker(self) -> None:
        self._stop.set()
        if self._checker:
            self._checker.join(30)

    # -- faults ----------------------------------------------------------------------------------
    # Each returns a Fault: what was hit, how long the fault lasted, and ``effect``: a check that
    # the fault has visibly happened (kwok applies a stage 1-2 s after the label; a group is only
    # replaced a moment after its pod goes), so that convergence is not counted before it.
    # start_component is called from this (main) thread: with die_with_parent a component dies
    # with the thread that started it.
    def _group_pods(self) -> list[tuple[Deployment, dict[str, Any]]]:
        return [(d, p) for d in self.deps for p in d.pods(self.rest) if _live(p)]

    def _leaders(self) -> dict[str, str]:
        return {f"{d.namespace}/{g}": members[0]["metadata"]["uid"]
                for d in self.deps for g, members in groups_of(d.pods(self.rest)).items()}

    def rack(self, node: str | None) -> str:
        """The rack of a tray: the suffix of its clique (``<cluster uuid>.<rack>``)."""
        return str(self.clique_of.get(node or "")).rsplit(".", 1)[-1]

    def placement(self) -> dict[str, str]:
        """Rack of each group before the fault, e.g. ``{"soak-0/0": "2"}``."""
        return {f"{d.namespace}/{g}": ",".join(sorted({self.rack(p["spec"].get("nodeName")) for p in members}))
                for d in self.deps for g, members in groups_of(d.pods(self.rest)).items()}

    def _replaced(self, dep: Deployment, old: dict[str, str]) -> Callable[[], str | None]:
        """None once none of the pods ``old`` (uid -> name) is live any more (their group was
        recreated); else which are."""
        def check() -> str | None:
            pods = {p["metadata"]["uid"]: p for p in dep.pods(self.rest) if _live(p)}
            left = sorted(f"{name} (uid {uid[:8]}, created {pods[uid]['metadata'].get('creationTimestamp')})"
                          for uid, name in old.items() if uid in pods)
            if not left:
                return None
            new = sorted(f"{p['metadata']['name']} (uid {u[:8]}, created {p['metadata'].get('creationTimestamp')})"
                         for u, p in pods.items() if u not in old)
            return f"{dep.namespace}: pods from before the fault still live: {left}; new pods: {new}"
        return check

    def fault_scale(self) -> Fault:
        return Fault(self.scale_any())

    def fault_delete_child(self) -> Fault:
        dep, kind = self.rng.choice(self.deps), self.rng.choice(CHILD_KINDS)
        path = dep.child_paths()[kind]
        old_uid = (self.rest.get(path) or {}).get("metadata", {}).get("uid")
        pods = {p["metadata"]["uid"]: p["metadata"]["name"] for p in dep.pods(self.rest) if _live(p)}
        self.rest.delete(path)

        def gone() -> str | None:
            same = (self.rest.get(path) or {}).get("metadata", {}).get("uid") == old_uid
            return f"{kind} uid {old_uid} still there" if same else None
        if kind == "LeaderWorkerSet":  # its groups go with it (owner references) and come back
            replaced = self._replaced(dep, pods)
            return Fault(f"{kind} {path.rsplit('/', 1)[1]} of {dep.namespace}/{dep.name}",
                         effect=lambda: gone() or replaced())
        return Fault(f"{kind} {path.rsplit('/', 1)[1]} of {dep.namespace}/{dep.name}", effect=gone)

    def _group_fault(self, dep: Deployment, pod: dict[str, Any]) -> Callable[[], str | None]:
        """The whole group of ``pod`` must be recreated (RecreateGroupOnPodRestart, F14)."""
        index = kpods.group_index(pod) or "0"
        self.victim = f"{dep.namespace}/{index}"
        group = groups_of(dep.pods(self.rest)).get(int(index), []) + [pod]
        return self._replaced(dep, {p["metadata"]["uid"]: p["metadata"]["name"] for p in group})

    def fault_delete_pod(self) -> Fault:
        dep, pod = self.rng.choice([(d, p) for d, p in self._group_pods()
                                    if not kpods.is_leader(p)])
        effect = self._group_fault(dep, pod)
        self.rest.delete(POD.path(dep.namespace, pod["metadata"]["name"]))
        return Fault(f"worker pod {dep.namespace}/{pod['metadata']['name']}", effect=effect)

    def fault_crash_pod(self) -> Fault:
        # A group's leader: a worker that turns Failed is sometimes replaced alone by LeaderWorkerSet
        # v0.9 (kubernetes-sigs/lws#998, docs/reliability.md, known limits), a bug of that version, not of ours.
        dep, pod = self.rng.choice([(d, p) for d, p in self._group_pods()
                                    if kpods.is_leader(p)])
        effect = self._group_fault(dep, pod)
        faults.fail_pod(self.rest, dep.namespace, pod["metadata"]["name"])
        return Fault(f"pod {dep.namespace}/{pod['metadata']['name']} crashed", effect=effect)

    def fault_tray_not_ready(self) -> Fault:
        dep, pod = self.rng.choice(self._group_pods())
        tray = pod["spec"]["nodeName"]
        on_tray = {p["metadata"]["uid"] for _, p in self._group_pods() if p["spec"].get("nodeName") == tray}
        faults.tray_not_ready(self.rest, tray)
        start = time.monotonic()
        not_ready = moved = None
        try:
            # down TRAY_DOWN_S; longer (up to TRAY_MAX_DOWN_S) while its groups are not yet back on
            # healthy trays, to tell a slow move from none
            while time.monotonic() - start < (TRAY_DOWN_S if moved is not None else TRAY_MAX_DOWN_S):
                try:
                    node = self.rest.get(NODE.path(None, tray)) or {}
                    if not_ready is None and (condition(node, knodes.READY) or {}).get("status") not in (None, "True"):
                        not_ready = time.monotonic() - start
                    if not_ready is not None and moved is None:
                        why = self.why_not_converged() or (
                            "engine pods still on the tray" if on_tray & {p["metadata"]["uid"]
                                                                          for _, p in self._group_pods()} else None)
                        if why is None:
                            moved = time.monotonic() - start
                        elif not self.trace or self.trace[-1][1] != why:
                            self.trace.append((round(time.monotonic() - start, 1), why))
                except ApiError:
                    pass
                time.sleep(POLL_S)
            # a failure: what the groups, the CRs and the trays look like while the tray is still down
            stuck = self._safe_snapshot() if moved is None else None
        finally:
            faults.tray_ready(self.rest, tray)
        lasted = time.monotonic() - start
        text = f"tray {tray} (rack {self.rack(tray)}, {len(on_tray)} engine pod(s) on it) down {lasted:.0f} s: " + (
            f"NotReady after {not_ready:.1f} s, " if not_ready is not None else "never seen NotReady, ") + (
            f"its groups converged on healthy trays {moved:.1f} s after the fault" if moved is not None
            else f"its groups NOT back on healthy trays within {TRAY_MAX_DOWN_S:.0f} s")
        return Fault(text, lasted, effect=lambda: None if not_ready is not None else f"tray {tray} never NotReady",
                     recovery_s=moved, failure=None if moved is not None else
                     f"the groups of tray {tray} not back on healthy trays within {TRAY_MAX_DOWN_S:.0f} s of it "
                     f"going NotReady (last: {self.trace[-1][1] if self.trace else '?'})",
                     extra={"not_ready_s": None if not_ready is None else round(not_ready, 1),
                            **({"snapshot_while_down": stuck} if stuck is not None else {})})

    def _component_down(self, component: str, down_s: float, kill: bool = False) -> Fault:
        """``component`` stopped (``kill``: SIGKILL), a CR scaled, started again ``down_s`` s after the stop."""
        if component == "operator":
            self.sample()  # the counters up to now (they restart from zero)
            self.operator_stopped = True
        start = time.monotonic()
        self.cluster.stop_component(component, kill=kill)
        stopped = time.monotonic() - start
        try:
            edit = self.scale_any()
            time.sleep(max(0.0, down_s - (time.monotonic() - start)))
        finally:
            self.cluster.start_component(component)
        return Fault(f"{component} stopped in {stopped:.1f} s, {edit} meanwhile", time.monotonic() - start)

    def fault_operator_restart(self) -> Fault:
        return self._component_down("operator", 0.0, kill=True)

    def fault_lws_manager_down(self) -> Fault:
        return self._component_down("lws-manager", LWS_DOWN_S)

    def fault_kueue_manager_down(self) -> Fault:
        return self._component_down("kueue-manager", KUEUE_DOWN_S, kill=True)

    def fault_apiserver_restart(self) -> Fault:
        edit = self.scale_any()
        down_s = self.cluster.restart_apiserver()
        return Fault(f"kube-apiserver SIGKILLed right after {edit}, ready again in {down_s:.1f} s", down_s)

    # -- the schedule ------------------------------------------------------------------------------
    def schedule(self) -> Any:
        while True:
            kinds = list(KINDS)
            self.rng.shuffle(kinds)
            yield from kinds

    def run(self, minutes: float, kinds: tuple[str, ...] | None = None) -> None:
        end = time.monotonic() + minutes * 60
        for kind in self.schedule():
            if time.monotonic() >= end:
                break
            if kinds and kind not in kinds:
                continue
            try:
                self.one(kind)
            except Stuck as exc:
                self.stuck = str(exc)
                self.log(f"STOPPED: {exc}")
                break

    def one(self, kind: str) -> dict[str, Any]:
        leaders = self._leaders()
        self.victim, self.trace = None, []
        entry: dict[str, Any] = {"t": self.now(), "kind": kind, "placement": self.placement()}
        self.log(f"[{entry['t']:7.1f} s] {kind} ...")
        try:
            fault: Fault = getattr(self, "fault_" + kind.replace("-", "_"))()
            entry.update(target=fault.target, fault_s=round(fault.lasted_s, 1), **fault.extra)
            # a tray fault already failed (its groups waited for it): a shorter look at the return
            bound = min(self.timeout_s, AFTER_FAILED_TRAY_S) if fault.failure else self.timeout_s
            recovery, why = self.wait_converged(bound, fault.effect)
            if kind == "tray-not-ready":  # timed from the tray going down, its groups elsewhere
                entry["after_return_s"] = None if recovery is None else round(recovery, 1)
                if recovery is not None:
                    recovery, why = fault.recovery_s, fault.failure or ""
        except ApiError as exc:
            recovery, why = None, f"fault not injected: API error {exc.status} {exc.reason}: {(exc.body or '')[:300]}"
        except Exception as exc:  # noqa: BLE001 - e.g. a component that did not start again: recorded
            recovery, why = None, f"fault failed: {type(exc).__name__}: {str(exc)[:300]}"
        entry["recovery_s"] = None if recovery is None else round(recovery, 1)
        entry["ok"] = recovery is not None
        if why:
            entry["reason"] = why
        if not entry["ok"] or kind == "tray-not-ready":
            entry["trace"] = self.trace  # tray faults: from the tray going down, then from its return
        if not entry["ok"]:
            entry["snapshot"] = self._safe_snapshot()
        if kind in ("delete-pod", "crash-pod") and recovery is not None:
            after = self._leaders()
            other = sorted(g for g, uid in leaders.items() if g != self.victim and after.get(g) != uid)
            entry["other_groups_recreated"] = other
            if other:
                self.violation(f"collateral/{entry['t']}",
                               f"{kind} in group {self.victim} recreated other groups too: {other}")
        self.log(f"           {entry.get('target', '')}: "
                 + (f"recovered in {entry['recovery_s']} s" if entry["ok"] else f"FAILED: {why}"))
        bad_trays = self.wait_trays_healthy()
        if bad_trays:
            entry["trays_unhealthy"] = bad_trays
            self.log(f"           trays still unhealthy after {NODE_HEALTH_TIMEOUT_S:.0f} s: {bad_trays}")
        self.entries.append(entry)
        if not entry["ok"]:
            entry["repair"] = "failed"
            entry["repair"] = self.repair()
            self.log(f"           repair: {entry['repair']}")
        time.sleep(SETTLE_S)
        return entry

    def repair(self) -> str:
        """After a failure, so that it does not carry over into the next faults: delete every
        engine pod that is not Ready (its group is recreated) and wait for convergence again.
        Raises ``Stuck`` when even that does not converge."""
        deleted = []
        for dep, pod in self._group_pods():
            if not kpods.is_ready(pod):
                self.rest.delete(POD.path(dep.namespace, pod["metadata"]["name"]))
                deleted.append(f"{dep.namespace}/{pod['metadata']['name']}")
        took, why = self.wait_converged(self.timeout_s)
        if took is None:
            raise Stuck(f"not converged even after deleting the pods that were not Ready ({deleted}): {why}")
        return f"deleted not-Ready pods {deleted}; converged {took:.1f} s later"

    # -- results -----------------------------------------------------------------------------------
    def summary(self, kinds: tuple[str, ...] = KINDS) -> dict[str, dict[str, Any]]:
        """Per kind of ``kinds``: count, recovery p50 and max (s, of the recovered faults), failures."""
        out = {}
        for kind in kinds:
            entries = [e for e in self.entries if e["kind"] == kind]
            times = [e["recovery_s"] for e in entries if e["ok"]]
            out[kind] = {"count": len(entries),
                         "recovery_s_p50": round(statistics.median(times), 1) if times else None,
                         "recovery_s_max": max(times) if times else None,
                         "failures": sum(1 for e in entries if not e["ok"])}
        return out


def table(summary: dict[str, dict[str, Any]]) -> str:
    rows = [("fault", "count", "recovery p50 s", "recovery max s", "failures")]
    rows += [(k, str(v["count"]), "-" if v["recovery_s_p50"] is None else f"{v['recovery_s_p50']:.1f}",
              "-" if v["recovery_s_max"] is None else f"{v['recovery_s_max']:.1f}", str(v["failures"]))
             for k, v in summary.items()]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
                     for r in rows)


def _terminate(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@click.command(help=__doc__.split("\n\n")[0])
@click.option("--minutes", type=float, default=20.0, show_default=True, help="How long faults are injected.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the fault schedule and targets.")
@click.option("--racks", type=click.IntRange(2), default=4, show_default=True, help="GB300 NVL72 racks (4 trays each).")
@click.option("--deployments", type=click.IntRange(1), default=2, show_default=True, help="KimiK3Deployments.")
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path), default=REPO / ".state" / "soak",
              show_default=True, help="Dev cluster state (logs stay there after the run).")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path),
              default=REPO / "bench" / "results" / "soak.json", show_default=True)
@click.option("--timeout", "timeout_s", type=float, default=420.0, show_default=True,
              help="Bound on each wait for convergence, s (a timeout is a failure).")
@click.option("--kinds", help=f"Fault kinds to inject (comma-separated) [default: all of {', '.join(KINDS)}; "
              f"{', '.join(KUEUE_ONLY)} only with --placement kueue].")
@click.option("--placement", type=click.Choice(["exclusive", "kueue"]), default="exclusive", show_default=True,
              help="spec.scheduling.placement.mode of the deployments.")
def main(minutes: float, seed: int, racks: int, deployments: int, state_dir: Path, out: Path, timeout_s: float,
         kinds: str | None, placement: str) -> None:
    allowed = KINDS if placement == "kueue" else tuple(k for k in KINDS if k not in KUEUE_ONLY)
    wanted = allowed if kinds is None else tuple(k.strip() for k in kinds.split(",") if k.strip())
    unknown = set(wanted) - set(allowed)
    if unknown:
        raise click.BadParameter(f"unknown kinds {sorted(unknown)} for --placement {placement}; known: "
                                 f"{', '.join(allowed)}", param_hint="--kinds")
    if deployments >= racks:
        raise click.BadParameter(f"{deployments} deployments need at least {deployments + 1} racks "
                                 "(one group per rack, and a free rack to scale into)", param_hint="--racks")
    signal.signal(signal.SIGTERM, _terminate)
    started = {"date": rfc3339(), "commit": checkout_commit(REPO)}
    cluster = DevCluster(state_dir)
    t_up = time.monotonic()
    print(f"dev up: {racks} GB300 racks x {TRAYS_PER_RACK} trays in {cluster.state_dir}", flush=True)
    state = cluster.up(UpOptions(shape=RackShape(profile="gb300", racks=racks, trays_per_rack=TRAYS_PER_RACK),
                                 die_with_parent=True, wait_timeout_s=180.0))
    soak = None
    try:
        print(f"  up in {time.monotonic() - t_up:.1f} s", flush=True)
        with cluster.api_client() as api:
            rest = Rest(api)
            deps = [Deployment(i, placement=placement) for i in range(deployments)]
            soak = Soak(cluster, state, rest, deps, racks, seed, timeout_s,
                        log=lambda line: print(line, flush=True))
            for dep in deps:
                soak.apply(dep)
            initial, why = soak.wait_converged(timeout_s)
            if initial is None:
                raise SystemExit(f"the {deployments} deployments did not converge within {timeout_s:.0f} s: {why}")
            print(f"{deployments} deployments converged in {initial:.1f} s; faults for {minutes} min, seed {seed}",
                  flush=True)
            soak.t0 = time.monotonic()
            soak.sample()
            rss_start = soak.rss[-1] if soak.rss else None
            soak.start_checker()
            try:
                soak.run(minutes, wanted)
            except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the results so far are still written
                soak.stuck = "interrupted"
                print("interrupted: writing the results so far", flush=True)
            soak.stop_checker()
            soak.sample()
            soak.check(rest)
            for key, first in list(soak.overlaps.items()):  # still open at the end
                soak.transient_overlaps.append({"t": round(first - soak.t0, 1), "deployment": f"{key[0]}/k3",
                                                "group": key[1], "seconds": None})
    finally:
        if soak:
            soak.stop_checker()
        cluster.down()
    summary = soak.summary(wanted)
    result = {
        **started,
        "minutes": minutes, "seed": seed, "racks": racks, "deployments": deployments, "placement": placement,
        "kinds": list(wanted),
        "faults": summary,
        "invariant_violations": soak.violations,
        "transient_overlaps": soak.transient_overlaps,
        "operator_rss_mb": {"start": round(rss_start, 1) if rss_start else None,
                            "end": round(soak.rss[-1], 1) if soak.rss else None,
                            "max": round(max(soak.rss), 1) if soak.rss else None},
        "reconciles": {k: int(v) for k, v in sorted(soak.counters.total("kimik3_reconciles_total", "result").items())},
        "apply_errors": int(soak.counters.total("kimik3_apply_errors_total")),
        "apply_errors_by_kind": {k: int(v) for k, v in
                                 sorted(soak.counters.total("kimik3_apply_errors_total", "kind").items())},
        "ready_lost": int(soak.counters.total("kimik3_ready_lost_total")),
        "initial_converge_s": round(initial, 1),
        "stopped_early": soak.stuck,  # None, "interrupted", or why the cluster stopped converging
        "log": soak.entries,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print()
    print(table(summary))
    print(f"invariant violations: {len(soak.violations)}; transient group overlaps: {len(soak.transient_overlaps)}")
    print(f"operator RSS MB: {result['operator_rss_mb']}; reconciles: {result['reconciles']}; "
          f"apply errors: {result['apply_errors']}; Ready lost: {result['ready_lost']}")
    print(f"wrote {out}")
    if soak.stuck:
        print(f"stopped early: {soak.stuck}")
    failures = sum(v["failures"] for v in summary.values())
    sys.exit(1 if failures or soak.violations or soak.stuck else 0)


if __name__ == "__main__":
    main()
