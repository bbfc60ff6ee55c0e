"""``kimik3.controller.computedomains.prepare_failures`` on the Event shapes the API serves (F19 b):
the kubelet's aggregated core/v1 Event (firstTimestamp, lastTimestamp, count) and an
events.k8s.io one read through core/v1 (eventTime, series.lastObservedTime); the bound per pod."""

from __future__ import annotations

import datetime as dt

from kimik3.controller.computedomains import PREPARE_POLL_S, prepare_bound_s, prepare_failures
from kimik3.kube.times import rfc3339

NOW = dt.datetime(2026, 12, 1, 12, 0, 0, tzinfo=dt.timezone.utc)


def pod(name: str, uid: str, worker: int, grace: int | None = 60, phase: str = "Pending", node: str = "tray-a") -> dict:
    spec = {"nodeName": node} | ({} if grace is None else {"terminationGracePeriodSeconds": grace})
    return {"metadata": {"name": name, "uid": uid, "labels": {
        "leaderworkerset.sigs.k8s.io/group-index": "0", "leaderworkerset.sigs.k8s.io/worker-index": str(worker)}},
        "spec": spec, "status": {"phase": phase}}


def ago(seconds: float) -> str:
    return rfc3339(NOW - dt.timedelta(seconds=seconds))


def event(uid: str, message: str, **times: object) -> dict:
    return {"involvedObject": {"kind": "Pod", "uid": uid}, "reason": "FailedPrepareDynamicResources",
            "message": message, **times}


def test_bound_is_the_grace_period_plus_one_kubelet_retry():
    assert prepare_bound_s(pod("p", "u", 0)) == 75.0
    assert prepare_bound_s(pod("p", "u", 0, grace=None)) == 45.0  # the API server's default grace, 30 s


def test_pods_past_their_bound_are_named_leaders_first_with_the_latest_message():
    pods = [pod("k3-engine-0-1", "w", 1), pod("k3-engine-0", "l", 0, node="tray-b"),
            pod("k3-engine-1", "young", 0), pod("k3-engine-2", "running", 0, phase="Running")]
    events = [event("w", "old text", firstTimestamp=ago(90), lastTimestamp=ago(40), count=6),
              event("w", "new text", firstTimestamp=ago(30), lastTimestamp=ago(5), count=3),
              event("l", "already allocated", eventTime=ago(80), series={"lastObservedTime": ago(2)}),
              event("young", "already allocated", firstTimestamp=ago(70), lastTimestamp=ago(1)),
              event("running", "x", firstTimestamp=ago(300)),
              event("someone-else", "x", firstTimestamp=ago(300))]
    failures, again = prepare_failures(pods, events, NOW)
    assert [(f.pod, f.node, f.since, f.message) for f in failures] == [
        ("k3-engine-0", "tray-b", ago(80), "already allocated"),
        ("k3-engine-0-1", "tray-a", ago(90), "new text")]
    assert again == 5.0  # the young pod qualifies 75 s after its first Event


def test_a_pending_pod_without_events_is_looked_at_again_at_the_kubelets_pace():
    assert prepare_failures([pod("p", "u", 0)], [], NOW) == ([], PREPARE_POLL_S)
    assert prepare_failures([pod("p", "u", 0, phase="Running")], [], NOW) == ([], None)
