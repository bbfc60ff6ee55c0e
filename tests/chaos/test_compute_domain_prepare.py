"""Failure case F19 (b) on the real API server: a group recreated while its ComputeDomain is
NotReady, whose worker the kubelet cannot start (it plays the kubelet: the pod Pending on its
node, the Warning Event ``FailedPrepareDynamicResources`` "... already allocated" repeated, as the
kubelet's recorder aggregates it). The predecessor pod of the same name left such an Event an
hour ago: it is not this pod's (matched by uid). After the bound (the pod's grace period + 15 s
of kubelet retry) and not before, ComputeDomainReady=False PrepareFailed names the pod, its
node and the kubelet's message, status.groups says it for the group, a Warning Event is posted;
nothing is recreated and the failure is no crash (Degraded stays AsExpected). Both trays publish
the driver's ResourceSlice (its kubelet plugin runs: the channel is held, not missing)."""

from __future__ import annotations

import datetime as dt
import time

from kubernetes import client

from kimik3.controller.computedomains import KUBELET_RETRY_S, PREPARE_POLL_S
from kimik3.render.meta import engine_set_name
from kimik3.kube.times import rfc3339
from chaos.helpers import apply_converged, operator_in, trays_publishing
from chaos.test_compute_domain_status import CD, domain_lists
from support.cluster import CR, LWS, condition
from support.waiting import wait_for

NAME = "k3-prep"
ENGINE = engine_set_name(NAME)
GRACE_S = 1
"""The test pods' terminationGracePeriodSeconds: the bound is GRACE_S + KUBELET_RETRY_S = 16 s."""
MESSAGE = ('Failed to prepare dynamic resources: prepare dynamic resources: NodePrepareResources failed for '
           'ResourceClaim k3-prep-engine-0-1-channel-x7k2q: error preparing devices for claim: channel 0 is '
           'already allocated')


def pending_pod(core: client.CoreV1Api, namespace: str, worker: int, node: str) -> client.V1Pod:
    pod = core.create_namespaced_pod(namespace, {"metadata": {"name": f"{ENGINE}-0-{worker}" if worker
                                                              else f"{ENGINE}-0", "labels": {
        "leaderworkerset.sigs.k8s.io/name": ENGINE, "leaderworkerset.sigs.k8s.io/group-index": "0",
        "leaderworkerset.sigs.k8s.io/worker-index": str(worker), "app.kubernetes.io/managed-by": "kimik3-operator",
        "inference.kimik3.io/deployment": NAME}},
        "spec": {"nodeName": node, "terminationGracePeriodSeconds": GRACE_S,
                 "containers": [{"name": "engine", "image": "x"}]}})
    core.patch_namespaced_pod_status(pod.metadata.name, namespace, {"status": {"phase": "Pending", "containerStatuses": [{
        "name": "engine", "image": "x", "imageID": "", "ready": False, "restartCount": 0,
        "state": {"waiting": {"reason": "ContainerCreating"}}}]}})
    return pod


def kubelet_event(core: client.CoreV1Api, namespace: str, pod_name: str, uid: str, node: str, first: dt.datetime,
                  count: int, name: str) -> None:
    """The kubelet's Event (its recorder aggregates repeats: count, firstTimestamp, lastTimestamp)."""
    body = {"metadata": {"name": name, "namespace": namespace},
            "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": pod_name, "namespace": namespace, "uid": uid},
            "type": "Warning", "reason": "FailedPrepareDynamicResources", "message": MESSAGE,
            "source": {"component": "kubelet", "host": node}, "reportingComponent": "kubelet",
            "reportingInstance": node, "firstTimestamp": rfc3339(first),
            "lastTimestamp": rfc3339(first + dt.timedelta(seconds=10 * (count - 1))), "count": count}
    try:
        core.replace_namespaced_event(name, namespace, {**body, "metadata": {
            **body["metadata"], "resourceVersion": core.read_namespaced_event(name, namespace).metadata.resource_version}})
    except client.ApiException as exc:
        if exc.status != 404:
            raise
        core.create_namespaced_event(namespace, body)


def test_pod_failing_to_prepare_its_claim_is_named_after_the_bound(kube, admin_api, namespace, operator_identity):
    core = client.CoreV1Api(admin_api)
    with trays_publishing(admin_api, "tray-a", "tray-b"), operator_in(operator_identity, namespace):
        apply_converged(kube, namespace, NAME)
        cd_uid = kube.get(*CD, namespace, NAME)["metadata"]["uid"]
        lws_generation = kube.get(*LWS, namespace, ENGINE)["metadata"]["generation"]
        domain_lists(kube, namespace, "tray-a", name=NAME)  # NotReady, 1 of 2 nodes
        leader = pending_pod(core, namespace, 0, "tray-a")
        worker = pending_pod(core, namespace, 1, "tray-b")
        worker_name, worker_uid = worker.metadata.name, worker.metadata.uid
        now = dt.datetime.now(dt.timezone.utc)
        # the previous group's worker (same name, another uid) failed an hour ago: not this pod's
        kubelet_event(core, namespace, worker_name, "0b1d-old-pod", "tray-b", now - dt.timedelta(hours=1), 30, "old")
        first = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
        kubelet_event(core, namespace, worker_name, worker_uid, "tray-b", first, 1, "prep")
        bound = GRACE_S + KUBELET_RETRY_S
        time.sleep(3)
        before = condition(kube.get(*CR, namespace, NAME), "ComputeDomainReady")
        assert before.get("reason") == "NodesMissing", before  # the Event is younger than the bound
        kubelet_event(core, namespace, worker_name, worker_uid, "tray-b", first, 2, "prep")

        def reported():
            obj = kube.get(*CR, namespace, NAME)
            return obj if condition(obj, "ComputeDomainReady").get("reason") == "PrepareFailed" else None
        while (dt.datetime.now(dt.timezone.utc) - first).total_seconds() < bound - 1.5:
            assert reported() is None, "reported before its bound"
            time.sleep(0.5)
        obj = wait_for(reported, bound + PREPARE_POLL_S, "ComputeDomainReady=False PrepareFailed")
        after = (dt.datetime.now(dt.timezone.utc) - first).total_seconds()
        print(f"\nF19 b: reported {after:.1f} s after the first FailedPrepareDynamicResources (bound {bound:g} s)")
        assert after <= bound + 3
        cd = condition(obj, "ComputeDomainReady")
        assert cd["status"] == "False"
        assert cd["message"].startswith(f"group 0: pod {worker_name} on tray-b has not started since {rfc3339(first)}: "
                                        f"FailedPrepareDynamicResources: {MESSAGE}")
        assert f"ComputeDomain {NAME} is NotReady" in cd["message"]
        group = obj["status"]["groups"][0]
        assert group["index"] == 0 and worker_name in group["message"] and "already allocated" in group["message"]
        assert f"pod {leader.metadata.name} on" not in cd["message"]  # no Event of its own: not named
        wait_for(lambda: any(e.reason == "ComputeDomainPrepareFailed" and worker_name in e.message
                             for e in core.list_namespaced_event(namespace).items), 10, "the Warning Event")
        # no recreate loop: the operator deleted nothing, changed nothing, counted no crash
        assert condition(obj, "Degraded")["reason"] == "AsExpected"
        assert {p.metadata.uid for p in core.list_namespaced_pod(namespace).items} == {leader.metadata.uid, worker_uid}
        assert kube.get(*LWS, namespace, ENGINE)["metadata"]["generation"] == lws_generation
        assert kube.get(*CD, namespace, NAME)["metadata"]["uid"] == cd_uid
