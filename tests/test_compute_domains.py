"""``kimik3.controller.computedomains``: ``prepare_failures`` on the Event shapes the API serves (F19 b):
the kubelet's aggregated core/v1 Event (firstTimestamp, lastTimestamp, count) and an
events.k8s.io one read through core/v1 (eventTime, series.lastObservedTime); the bound per pod;
the ComputeDomainReady verdict on the status as NVIDIA's driver writes it, and the simulated
driver's rules (``kimik3_dev.devcluster.dradriver``)."""

from __future__ import annotations

import datetime as dt

from kimik3.controller.computedomains import PREPARE_POLL_S, compute_domain_verdict, prepare_bound_s, prepare_failures
from kimik3_dev.devcluster.dradriver import node_entries, overall_status, prepared_trays
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


# -- the verdict as NVIDIA's driver writes the status, and the simulated driver's rules -------------


def domain(*nodes: tuple[str, str], overall: str = "Ready") -> dict:
    return {"metadata": {"name": "k3"}, "status": {"status": overall, "nodes": [
        {"name": n, "ipAddress": "10.0.0.1", "cliqueID": "c.0", "index": i, "status": s}
        for i, (n, s) in enumerate(nodes)]}}


def test_verdict_names_a_not_ready_daemon_and_a_tray_without_slice():
    pods = [pod("a", "1", 0, node="tray-a", phase="Running"), pod("b", "2", 1, node="tray-b", phase="Running")]
    healthy = compute_domain_verdict(domain(("tray-a", "Ready"), ("tray-b", "Ready")), pods, [], {"tray-a", "tray-b"})
    assert (healthy.status, healthy.reason) == ("True", "AllNodesJoined") and "NotReady" not in healthy.message
    sick = compute_domain_verdict(domain(("tray-a", "Ready"), ("tray-b", "NotReady"), overall="NotReady"), pods, [])
    assert (sick.status, sick.reason) == ("False", "NodesNotReady")
    assert "NotReady on tray-b" in sick.message and "tray-a" not in sick.message
    unsliced = compute_domain_verdict(domain(("tray-a", "Ready"), ("tray-b", "Ready")), pods, [], {"tray-b"})
    assert (unsliced.status, unsliced.reason) == ("False", "ResourceSliceMissing")
    assert "on tray-a," in unsliced.message and "tray-b" not in unsliced.message


def test_driver_overall_status_follows_num_nodes_and_every_listed_daemon():
    assert overall_status(0, []) == "Ready"  # numNodes 0 (as rendered): Ready with no node listed
    assert overall_status(0, [{"status": "Ready"}, {"status": "NotReady"}]) == "NotReady"
    assert overall_status(2, [{"status": "Ready"}]) == "NotReady"
    assert overall_status(2, [{"status": "Ready"}, {"status": "Ready"}]) == "Ready"


def test_driver_lists_running_daemons_with_stable_indices_per_clique():
    def daemon(node: str, ip: str, ready: bool = True) -> dict:
        return {"metadata": {"name": f"d-{node}"}, "spec": {"nodeName": node}, "status": {
            "podIP": ip, "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}
    trays = {n: {"metadata": {"name": n, "labels": {"nvidia.com/gpu.clique": "u.0"}}} for n in ("t0", "t1", "t2")}
    trays["t2"]["metadata"]["labels"]["imex-daemon-failed.kimik3.dev"] = "true"
    previous = [{"name": "t1", "cliqueID": "u.0", "index": 0}]
    entries = node_entries(previous, [daemon("t0", "10.0.0.1"), daemon("t1", "10.0.0.2"), daemon("t2", "10.0.0.3"),
                                      {"metadata": {"name": "pending"}, "spec": {}, "status": {}}], trays)
    assert [(e["name"], e["index"], e["status"]) for e in entries] == [
        ("t0", 1, "Ready"), ("t1", 0, "Ready"), ("t2", 2, "NotReady")]


def test_driver_prepares_trays_of_reserved_channel_claims_only():
    def claim(node: str, reserved: bool, kind: str = "ComputeDomainChannelConfig") -> dict:
        return {"spec": {"devices": {"config": [{"opaque": {"driver": "compute-domain.nvidia.com", "parameters": {
            "kind": kind, "domainID": "uid-1"}}}]}},
                "status": {"allocation": {"nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": [node]}]}]}},
                    "reservedFor": [{"name": "p"}] if reserved else []}}
    assert prepared_trays([claim("t0", True), claim("t1", False), claim("t2", True, "ComputeDomainDaemonConfig")]) \
        == {"t0": "uid-1"}
