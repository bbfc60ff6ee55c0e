"""The reads of one reconcile, on a real kube-apiserver: a steady deployment's reconcile reads each
kind at most once before its applies and once after them (``controller.snapshot``), whether the
reads go to the API server (no watch cache) or through the cache, and nothing else lists the API
server itself. The LeaderWorkerSet's groups are made by the test (no LWS controller runs here):
two TP8 groups of two pods, Ready, on trays of one rack, under placement kueue with a
ComputeDomain, so every kind of the snapshot is read."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest

from kimik3.controller.cache import ObjectCache
from kimik3.controller.kube import Kube
from kimik3.controller.reconcile import Reconciler
from kimik3.kube.kinds import CHILD_KINDS, KINDS, LEADER_WORKER_SET, NODE, POD, Kind
from support.cluster import apply
from support.lws_pods import group_pods
from support.recipes import recipe

pytestmark = pytest.mark.usefixtures("pods_made", "kueue_queue")  # pods made by hand below; Kueue served

KUEUE = {"placement": {"mode": "kueue", "queueName": "default"}}
PLURALS = {k.plural: k.kind for k in (*KINDS, POD, NODE)}


class CountingKube(Kube):
    """``Kube`` that records each GET by kind, and whether it came before the reconcile's first apply."""

    def __init__(self, kube: Kube) -> None:
        super().__init__(kube.api)
        self.gets: Counter[tuple[str, str]] = Counter()
        self.applied = False

    def request(self, method: str, path: str, body: Any = None, query: Sequence[tuple[str, str]] = (),
                content_type: str = "application/json") -> Any:
        if content_type == "application/apply-patch+yaml":
            self.applied = True
        if method == "GET":
            plural = [p for p in path.split("/") if p in PLURALS]
            self.gets[("after" if self.applied else "before", PLURALS[plural[-1]] if plural else path)] += 1
        return super().request(method, path, body, query, content_type)


def steady(kube: Kube, namespace: str, cache: ObjectCache | None) -> Reconciler:
    """The recipe reconciled, its groups made Ready, and reconciled again until nothing changes."""
    rec = Reconciler(kube, cache=cache)
    apply(kube, recipe(replicas=2, scheduling=KUEUE), namespace)
    rec.reconcile(namespace, "k3-latency")
    lws = kube.get(*LEADER_WORKER_SET.type_meta, namespace, "k3-latency-engine")
    assert lws is not None
    for group in range(2):
        for pod in group_pods(lws, namespace, group):
            created = kube.apply({"apiVersion": "v1", "kind": "Pod", **pod})
            kube.patch_merge(*POD.type_meta, namespace, created["metadata"]["name"], {"status": {
                "phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}, subresource="status")
            if cache is not None:
                cache.update("ADDED", kube.get(*POD.type_meta, namespace, created["metadata"]["name"]) or {})
    for _ in range(2):
        rec.reconcile(namespace, "k3-latency")
    return rec


def read_kinds(counts: Counter[tuple[str, str]]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for (phase, kind), n in counts.items():
        out.setdefault(phase, {})[kind] = n
    return out


def test_each_kind_is_read_once_before_the_applies_and_once_after(kube: Kube, namespace: str) -> None:
    counting = CountingKube(kube)
    rec = steady(counting, namespace, None)
    counting.gets.clear()
    counting.applied = False
    rec.reconcile(namespace, "k3-latency")
    gets = read_kinds(counting.gets)
    # the CR itself is read once, at the start; every other kind at most once per phase
    assert gets["before"].pop("KimiK3Deployment") == 1
    assert all(n == 1 for phase in gets.values() for n in phase.values()), gets
    assert {"Pod", "LeaderWorkerSet", "Workload", "ConfigMap"} <= set(gets["before"]), gets
    assert {"Pod", "LeaderWorkerSet", "ComputeDomain"} <= set(gets["after"]), gets
    assert rec.last_reader is not None
    assert max(rec.last_reader.reads.values()) == 1, rec.last_reader.reads


def test_through_the_cache_a_steady_reconcile_reads_only_what_no_watch_keeps(kube: Kube, namespace: str) -> None:
    """With the watch cache, the pods, LeaderWorkerSets, ConfigMaps and the ComputeDomain come from
    it: the API server sees the CR's read and the Workloads' list (Workloads are not watched)."""
    counting, cache = CountingKube(kube), ObjectCache()
    rec = steady(counting, namespace, cache)
    for kind in CHILD_KINDS:
        feed(cache, counting, kind, namespace)
    counting.gets.clear()
    counting.applied = False
    rec.reconcile(namespace, "k3-latency")
    assert read_kinds(counting.gets) == {"before": {"KimiK3Deployment": 1, "Workload": 1}}
    assert rec.last_reader is not None
    assert max(rec.last_reader.reads.values()) == 1, rec.last_reader.reads


def feed(cache: ObjectCache, kube: Kube, kind: Kind, namespace: str) -> None:
    """What a watch of ``kind`` would have delivered to the cache."""
    for item in kube.list(*kind.type_meta, namespace, ""):
        cache.update("ADDED", {"apiVersion": kind.api_version, "kind": kind.kind, **item})
