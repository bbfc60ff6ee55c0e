"""Failure case F19 (a) on the real API server: after a tray replacement the DRA driver's
ComputeDomain lists 1 of the group's 2 nodes and says NotReady while the engine serves. The CR
stays Ready (readiness comes from the groups, the leaders' /health), ComputeDomainReady=False
NodesMissing names the node seen and the one missing, a Warning Event says so, and the
ComputeDomain is neither deleted nor recreated; once the driver lists both, AllNodesJoined. Both
trays publish the driver's ResourceSlice (its kubelet plugin runs there: the daemon is what is
stale, not the tray)."""

from __future__ import annotations

from kubernetes import client

from kimik3.render.meta import engine_set_name
from chaos.helpers import apply_converged, operator_in, trays_publishing
from support.cluster import CR, LWS, condition
from support.waiting import wait_for

NAME = "k3-cd"
ENGINE = engine_set_name(NAME)
CD = ("resource.nvidia.com/v1beta1", "ComputeDomain")


def engine_pod(core: client.CoreV1Api, namespace: str, worker: int, node: str) -> None:
    core.create_namespaced_pod(namespace, {"metadata": {"name": f"{ENGINE}-0-{worker}", "labels": {
        "leaderworkerset.sigs.k8s.io/name": ENGINE, "leaderworkerset.sigs.k8s.io/group-index": "0",
        "leaderworkerset.sigs.k8s.io/worker-index": str(worker), "app.kubernetes.io/managed-by": "kimik3-operator",
        "inference.kimik3.io/deployment": NAME}},
        "spec": {"nodeName": node, "containers": [{"name": "engine", "image": "x"}]}})


def domain_lists(kube, namespace: str, *nodes: str, name: str = NAME) -> None:
    """The DRA driver's status of ComputeDomain ``name``: Ready with 2 nodes, else NotReady."""
    kube.patch_merge(*CD, namespace, name, {"status": {
        "status": "Ready" if len(nodes) == 2 else "NotReady",
        "nodes": [{"name": n, "ipAddress": f"10.0.0.{i + 1}", "cliqueID": "rack-1.0", "index": i, "status": "Ready"}
                  for i, n in enumerate(nodes)]}}, subresource="status")


def test_stale_compute_domain_is_reported_and_never_decides_readiness(kube, admin_api, namespace, operator_identity):
    core = client.CoreV1Api(admin_api)
    with trays_publishing(admin_api, "tray-a", "tray-b"), operator_in(operator_identity, namespace):
        apply_converged(kube, namespace, NAME)
        uid = kube.get(*CD, namespace, NAME)["metadata"]["uid"]
        engine_pod(core, namespace, 0, "tray-a")
        engine_pod(core, namespace, 1, "tray-b")
        domain_lists(kube, namespace, "tray-a")
        kube.patch_merge(*LWS, namespace, ENGINE, {"status": {"replicas": 1, "readyReplicas": 1}},
                         subresource="status")

        def nodes_missing():
            obj = kube.get(*CR, namespace, NAME)
            cd = condition(obj, "ComputeDomainReady")
            return obj if cd.get("reason") == "NodesMissing" and condition(obj, "Ready").get("status") == "True" \
                else None
        obj = wait_for(nodes_missing, 15, "Ready=True with ComputeDomainReady=False NodesMissing")
        message = condition(obj, "ComputeDomainReady")["message"]
        assert condition(obj, "ComputeDomainReady")["status"] == "False"
        assert f"ComputeDomain {NAME} (NotReady) lists 1 of 2 nodes" in message
        assert "seen tray-a; missing tray-b" in message
        wait_for(lambda: any(e.reason == "ComputeDomainNodesMissing" and "missing tray-b" in e.message
                             for e in core.list_namespaced_event(namespace).items), 10, "the Warning Event")

        domain_lists(kube, namespace, "tray-a", "tray-b")
        joined = wait_for(lambda: (lambda c: c if c.get("reason") == "AllNodesJoined" else None)(
            condition(kube.get(*CR, namespace, NAME), "ComputeDomainReady")), 15, "AllNodesJoined")
        assert joined["status"] == "True" and "2/2 nodes" in joined["message"]
        assert kube.get(*CD, namespace, NAME)["metadata"]["uid"] == uid  # never recreated
