"""Engine crashes and disruptions, reported before the evidence goes.

With ``RecreateGroupOnPodRestart`` the LeaderWorkerSet deletes a whole group as soon as one of
its pods fails or goes, so the pod, its exit code and its node are gone within seconds and
``kubectl describe`` shows nothing. The operator sees every pod update on its pod watch:

- each container termination with a non-zero exit code (``state.terminated`` or, after a
  restart, ``lastState.terminated``) becomes one Warning Event ``EngineFailed`` on the
  KimiK3Deployment and one count of ``kimik3_engine_failures_total{namespace, deployment, reason}``;
- each ``DisruptionTarget=True`` pod condition (Kubernetes sets it before it deletes a pod for a
  NoExecute taint such as a NotReady tray, ``DeletionByTaintManager``; an eviction or drain,
  ``EvictionByEvictionAPI``; preemption, ``PreemptionByScheduler``; pod GC, ``DeletionByPodGC``)
  becomes one Warning Event ``EngineDisrupted`` and one count of
  ``kimik3_engine_disruptions_total{namespace, deployment, reason}``.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from kimik3.api.conditions import Event, EventReason
from kimik3.controller import metrics
from kimik3.controller.kube import Kube
from kimik3.controller.recreation import GroupFailures
from kimik3.kube import pods
from kimik3.kube.kinds import KIMIK3_DEPLOYMENT
from kimik3.kube.labels import LWS_NAME_LABEL

__all__ = ["CrashReporter", "container_failures", "disruptions"]

REMEMBERED = 4096
"""Failures remembered to report each once (oldest forgotten first)."""


def container_failures(pod: dict[str, Any]) -> list[tuple[str, str, str]]:
    """Non-zero container exits of ``pod``: ``[(token, reason, description)]``. ``token`` is unique
    per termination (pod uid, container, restart count, finish time)."""
    return [(token, reason, text) for token, reason, text, _, _ in _terminations(pod)]


def _terminations(pod: dict[str, Any]) -> list[tuple[str, str, str, int, str]]:
    """``container_failures`` plus each one's exit code and a key without the restart count (the
    same termination is ``state`` before the restart and ``lastState`` after it)."""
    out = []
    uid = pod["metadata"].get("uid", "")
    for cs in (pod.get("status") or {}).get("containerStatuses", []) or []:
        for state in (cs.get("state") or {}, cs.get("lastState") or {}):
            term = state.get("terminated")
            if not term or not term.get("exitCode"):
                continue
            reason = term.get("reason") or "Error"
            token = f"{uid}/{cs.get('name')}/{cs.get('restartCount', 0)}/{term.get('finishedAt', '')}"
            text = f"container {cs.get('name')} exited {term['exitCode']} ({reason}"
            text += f": {term['message'][:200]})" if term.get("message") else ")"
            out.append((token, reason, text, int(term["exitCode"]), f"{uid}/{cs.get('name')}/{term.get('finishedAt', '')}"))
    return out


def disruptions(pod: dict[str, Any]) -> list[tuple[str, str, str]]:
    """``DisruptionTarget=True`` conditions of ``pod``: ``[(token, reason, description)]``."""
    uid = pod["metadata"].get("uid", "")
    c = pods.condition(pod, pods.DISRUPTION_TARGET)
    if c is None or c.get("status") != "True":
        return []
    return [(f"{uid}/{pods.DISRUPTION_TARGET}/{c.get('lastTransitionTime', '')}", c.get("reason") or "Unknown",
             f"{c.get('reason') or 'disrupted'}: {(c.get('message') or '')[:200]}")]


class CrashReporter:
    """Posts one ``EngineFailed`` Event per container failure and one ``EngineDisrupted`` Event per
    disruption seen on the pod watch."""

    def __init__(self, kube: Kube, failures: GroupFailures | None = None) -> None:
        self.kube = kube
        self.failures = failures
        """Where each engine failure is also counted for bounded recreation (recreation.py)."""
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.Lock()  # kopf runs sync handlers on several threads

    def pod_seen(self, pod: dict[str, Any], deployment: str) -> int:
        """Report the new failures of ``pod`` (of KimiK3Deployment ``deployment`` in the pod's
        namespace); returns how many were new (none on a replica that does not lead)."""
        if self.kube.fence is not None and not self.kube.fence.leading():
            return 0  # the leader reports (and counts) each failure once
        meta = pod["metadata"]
        new = 0
        if self.failures is not None and not meta.get("deletionTimestamp"):
            for _, reason, _, code, key in _terminations(pod):
                self.failures.record(meta["namespace"], deployment, key, pods.labels(pod).get(LWS_NAME_LABEL, "?"),
                                     pods.group_index(pod) or "?", code, reason)
        incidents = [(EventReason.ENGINE_FAILED, metrics.ENGINE_FAILURES, *f) for f in container_failures(pod)]
        incidents += [(EventReason.ENGINE_DISRUPTED, metrics.ENGINE_DISRUPTIONS, *d) for d in disruptions(pod)]
        for event_reason, counter, token, reason, text in incidents:
            with self._lock:
                if token in self._seen:
                    continue
                self._seen[token] = None
                if len(self._seen) > REMEMBERED:
                    self._seen.popitem(last=False)
            new += 1
            group = pods.group_index(pod) or "?"
            node = (pod.get("spec") or {}).get("nodeName") or "no node"
            counter.labels(meta["namespace"], deployment, reason).inc()
            owner = {"apiVersion": KIMIK3_DEPLOYMENT.api_version, "kind": KIMIK3_DEPLOYMENT.kind,
                     "metadata": {"namespace": meta["namespace"], "name": deployment}}
            self.kube.event(owner, Event("Warning", event_reason, f"group {group}: {pods.role(pod)} pod {meta['name']} "
                                         f"on {node}: {text}; the LeaderWorkerSet recreates group {group} "
                                         "(RecreateGroupOnPodRestart)"))
        return new
