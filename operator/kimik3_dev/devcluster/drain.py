"""Drain trays as ``kubectl drain`` does, several at once, and watch the groups meanwhile.

``drain(rest, node, namespace)`` cordons tray ``node`` and asks the Eviction API (a policy/v1
``Eviction`` posted to the pod's ``eviction`` subresource) to evict each pod of ``namespace``
on it; a refusal (HTTP 429: a PodDisruptionBudget would be violated) is retried every
``retry_s`` (kubectl drain: 5 s) until granted, then the pod is waited out, as kubectl does.
``measure_drains`` runs one drain per tray in threads started together and samples the
deployment's groups (``rollout.sample``) all along. Used by tests/e2e/test_e2e_eviction.py and
bench/drain.py.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from kimik3.controller.kube import ApiError, NotFound
from kimik3_dev.devcluster.rest import Rest
from kimik3_dev.devcluster.rollout import Recorder, Sample, sample, wait

__all__ = ["Attempt", "Drain", "cordon", "drain", "evict", "measure_drains"]

KUBECTL_RETRY_S = 5.0
"""kubectl drain's wait between two evictions of a pod refused by a disruption budget, s."""
_MERGE = "application/merge-patch+json"


@dataclass(frozen=True)
class Attempt:
    """One eviction call: sent ``at`` and ``answered`` seconds after the drains started, the HTTP
    ``status`` (201 granted, 429 refused by a disruption budget) and the API server's ``message``."""

    pod: str
    at: float
    answered: float
    status: int
    message: str


@dataclass
class Drain:
    """The eviction calls of one tray's drain, in order; ``gone_at``: when its last pod was gone, s."""

    node: str
    attempts: list[Attempt] = field(default_factory=list)
    gone_at: float | None = None


def cordon(rest: Rest, node: str, unschedulable: bool = True) -> None:
    """Mark tray ``node`` unschedulable (``kubectl cordon``), or schedulable again."""
    rest.call("PATCH", f"/api/v1/nodes/{node}", body={"spec": {"unschedulable": unschedulable or None}},
              content_type=_MERGE)


def evict(rest: Rest, namespace: str, pod: str) -> tuple[int, str]:
    """POST a policy/v1 Eviction of ``pod``: (201, "") when granted, else (HTTP status, the
    Status' message and its causes', e.g. which budget and how many healthy pods it needs); 404
    when the pod is already gone."""
    body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod, "namespace": namespace}}
    try:
        rest.call("POST", f"/api/v1/namespaces/{namespace}/pods/{pod}/eviction", body=body)
    except ApiError as e:
        causes = [c.get("message", "") for c in ((e.payload or {}).get("details") or {}).get("causes", [])]
        return e.status, " ".join([e.message, *causes])
    return 201, ""


def drain(rest: Rest, node: str, namespace: str, clock: Callable[[], float], timeout_s: float,
          retry_s: float = KUBECTL_RETRY_S) -> Drain:
    """Cordon ``node`` and evict every pod of ``namespace`` bound to it, each retried every
    ``retry_s`` while refused, then waited out; ``clock()``: seconds since the drains started.
    TimeoutError after ``timeout_s`` seconds."""
    out = Drain(node)
    cordon(rest, node)
    deadline = time.monotonic() + timeout_s
    pods = rest.call("GET", f"/api/v1/namespaces/{namespace}/pods",
                     query=[("fieldSelector", f"spec.nodeName={node}")])["items"]
    for pod in pods:
        name, uid = pod["metadata"]["name"], pod["metadata"]["uid"]
        while True:
            at = round(clock(), 2)
            status, message = evict(rest, namespace, name)
            out.attempts.append(Attempt(name, at, round(clock(), 2), status, message))
            if status in (201, 404):
                break
            if time.monotonic() + retry_s > deadline:
                raise TimeoutError(f"eviction of {namespace}/{name} on {node} still refused after {timeout_s:.0f} s: "
                                   f"{message}")
            time.sleep(retry_s)
        wait(lambda: _gone(rest, namespace, name, uid), max(1.0, deadline - time.monotonic()),
             f"evicted pod {namespace}/{name} to be gone")
    out.gone_at = round(clock(), 2)
    return out


def _gone(rest: Rest, namespace: str, name: str, uid: str) -> bool:
    try:
        pod = rest.call("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")
    except NotFound:
        return True
    return bool(pod["metadata"]["uid"] != uid)  # the StatefulSet made a new pod of that name


def measure_drains(rest: Rest, namespace: str, name: str, size: int, nodes: list[str], timeout_s: float,
                   retry_s: float = KUBECTL_RETRY_S) -> tuple[list[Drain], list[tuple[float, Sample]]]:
    """Drain ``nodes`` at once (one thread each, their first evictions released together) while
    sampling the groups of deployment ``name`` (``size`` pods each) every 0.05 s; the drains, and
    the distinct samples, each with the second its read had ended by when it was first seen."""
    start = time.monotonic()
    clock = lambda: time.monotonic() - start  # noqa: E731
    together = threading.Barrier(len(nodes))

    def one(node: str) -> Drain:
        together.wait()
        return drain(rest, node, namespace, clock, timeout_s, retry_s)

    def seen_now() -> tuple[float, Sample]:
        groups = sample(rest, namespace, name, size)
        return round(clock(), 2), groups  # the time once read: the state held at or before it

    with Recorder(seen_now) as seen:
        with ThreadPoolExecutor(len(nodes)) as pool:
            drains = list(pool.map(one, nodes))
    distinct: list[tuple[float, Sample]] = []
    for at, s in seen.values:
        if not distinct or distinct[-1][1] != s:
            distinct.append((at, s))
    return drains, distinct
