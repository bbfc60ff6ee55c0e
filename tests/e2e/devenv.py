"""Helpers the e2e tests share: the ``DevEnv`` handle on a running dev cluster (with each test's
fresh namespace) and the bound on its waits (``WAIT_S``); see conftest.py for the fixtures, the
kit's ``devcluster.rollout.Recorder`` for polling in the background and tests/support's
``wait_for`` for waiting."""

from __future__ import annotations

import contextlib
import copy
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kimik3.kube import pods as kpods
from kimik3.kube.kinds import GROUP, PLURAL, VERSION
from kimik3.kube.labels import CLIQUE_LABEL, DEPLOYMENT_LABEL, LWS_NAME_LABEL
from kimik3_dev.devcluster.cluster import DevCluster, UpOptions
from kimik3_dev.devcluster.rest import Rest
from kimik3_dev.devcluster.workloads import apply_deployment, ensure_namespace
from support.recipes import recipe
from support.waiting import wait_for

SHAPE = dict(profile="gb300", racks=3, trays_per_rack=4)
WAIT_S = 90.0
"""Bound on every wait for the cluster to converge, seconds (kwok makes pods Ready at once;
the slow parts on a shared 2-core machine are scheduling retries and garbage collection)."""


class DevEnv:
    """The running dev cluster plus the helpers the e2e tests share."""

    def __init__(self, cluster: DevCluster, state: dict[str, Any], rest: Rest) -> None:
        self.cluster, self.state, self.rest = cluster, state, rest
        nodes = rest.items("/api/v1/nodes")
        self.clique_of = {n["metadata"]["name"]: n["metadata"]["labels"].get(CLIQUE_LABEL) for n in nodes}

    # -- objects -------------------------------------------------------------------------------
    @staticmethod
    def deployment(namespace: str, name: str = "k3", replicas: int = 1, tensor_parallel: int = 8) -> dict[str, Any]:
        """The GB300 recipe (TP8 over 2 trays) in ``namespace``; ``tensor_parallel=16`` gives 4 trays."""
        return recipe(name=name, namespace=namespace, replicas=replicas,
                      topology={"tensorParallelSize": tensor_parallel})

    def apply(self, cr: dict[str, Any]) -> dict[str, Any]:
        return apply_deployment(self.rest, copy.deepcopy(cr))

    def cr_path(self, namespace: str, name: str = "k3") -> str:
        return f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}/{name}"

    def get_cr(self, namespace: str, name: str = "k3") -> dict[str, Any] | None:
        return self.rest.get(self.cr_path(namespace, name))

    def scale(self, namespace: str, replicas: int, name: str = "k3") -> None:
        self.rest.call("PATCH", self.cr_path(namespace, name), body={"spec": {"replicas": replicas}},
                       content_type="application/merge-patch+json")

    def condition(self, namespace: str, type_: str, name: str = "k3") -> dict[str, Any] | None:
        cr = self.get_cr(namespace, name) or {}
        return next((c for c in (cr.get("status") or {}).get("conditions", []) if c["type"] == type_), None)

    def pods(self, namespace: str, name: str = "k3") -> list[dict[str, Any]]:
        """The pods of every LeaderWorkerSet of deployment ``name`` (a rollout runs two)."""
        return self.rest.items(f"/api/v1/namespaces/{namespace}/pods", f"{DEPLOYMENT_LABEL}={name},{LWS_NAME_LABEL}")

    def groups(self, namespace: str, name: str = "k3") -> dict[int, list[dict[str, Any]]]:
        """Live (not terminating) pods by group index, each list sorted by worker index."""
        out: dict[int, list[dict[str, Any]]] = {}
        for pod in self.pods(namespace, name):
            if not kpods.is_terminating(pod):
                out.setdefault(int(kpods.group_index(pod) or 0), []).append(pod)
        for pods in out.values():
            pods.sort(key=lambda p: kpods.worker_index(p) or 0)
        return dict(sorted(out.items()))

    def ready_groups(self, namespace: str, size: int, count: int, name: str = "k3") -> dict[int, list[dict]] | None:
        """The groups when exactly groups 0..count-1 exist, each with ``size`` Ready pods; else None."""
        groups = self.groups(namespace, name)
        if sorted(groups) != list(range(count)):
            return None
        if all(len(p) == size and all(kpods.is_ready(x) for x in p) for p in groups.values()):
            return groups
        return None

    def cliques(self, pods: list[dict[str, Any]]) -> set[str | None]:
        return {self.clique_of.get(p["spec"].get("nodeName")) for p in pods}

    def channel_claim(self, pod: dict[str, Any]) -> dict[str, Any]:
        """The ResourceClaim the pod's ComputeDomain channel claim resolved to (its pod status names it)."""
        statuses = (pod.get("status") or {}).get("resourceClaimStatuses") or []
        assert statuses, f"pod {pod['metadata']['name']} has no resource claim"
        return self.rest.get(f"/apis/resource.k8s.io/v1/namespaces/{pod['metadata']['namespace']}"
                             f"/resourceclaims/{statuses[0]['resourceClaimName']}")

    def events(self, namespace: str, name: str = "k3") -> list[dict[str, Any]]:
        items = self.rest.items(f"/api/v1/namespaces/{namespace}/events")
        return [e for e in items if e.get("involvedObject", {}).get("kind") == "KimiK3Deployment"
                and e["involvedObject"].get("name") == name]

    # -- a test's namespace ------------------------------------------------------------------------
    def delete_deployment(self, namespace: str, wait_s: float = WAIT_S, name: str = "k3") -> None:
        """Delete KimiK3Deployment ``name`` (if there) and wait at most ``wait_s`` until the pods of
        ``namespace`` are gone: the next test finds every rack free."""
        self.rest.delete(self.cr_path(namespace, name))
        wait_for(lambda: not self.rest.items(f"/api/v1/namespaces/{namespace}/pods"), wait_s,
                 f"the pods of namespace {namespace} to be gone")

    @contextlib.contextmanager
    def namespace(self, name: str, wait_s: float = WAIT_S) -> Iterator[str]:
        """Namespace ``name`` for the block. Afterwards its KimiK3Deployment is deleted and its pods
        waited out (``delete_deployment``); the namespace itself is then deleted in the background
        (the namespace controller's retries take ~15 s more)."""
        ensure_namespace(self.rest, name)
        try:
            yield name
        finally:
            self.delete_deployment(name, wait_s)
            self.rest.delete(f"/api/v1/namespaces/{name}")

    def fresh_namespace(self, prefix: str, wait_s: float = WAIT_S) -> contextlib.AbstractContextManager[str]:
        """``namespace`` of a new name, ``<prefix>-<8 hex>``: a test's own (the ``ns`` fixtures)."""
        return self.namespace(f"{prefix}-{uuid.uuid4().hex[:8]}", wait_s)


@contextlib.contextmanager
def dev_cluster(state_dir: Path, options: UpOptions) -> Iterator[DevEnv]:
    """``kimik3 dev up`` in ``state_dir`` with ``options`` (processes die with the test run), a
    ``DevEnv`` on it, ``dev down`` at the end."""
    cluster = DevCluster(state_dir)
    state = cluster.up(options)
    try:
        with cluster.api_client() as api:
            yield DevEnv(cluster, state, Rest(api))
    finally:
        cluster.down()

