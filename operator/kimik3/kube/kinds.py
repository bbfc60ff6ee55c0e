"""Every kind kimik3 reads or writes (the operator; the dev kit also reads Nodes): API group, version,
kind and plural in one place.

``Kind.api_version`` is the ``apiVersion`` of an object; ``Kind.path(namespace, name)`` its REST path;
``kind_of(api_version, kind)`` finds the ``Kind`` of an object.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Kind:
    """One Kubernetes resource type (namespaced unless said otherwise)."""

    group: str
    """API group; "" for the core group (``v1``)."""
    version: str
    kind: str
    plural: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def type_meta(self) -> tuple[str, str]:
        """``(apiVersion, kind)``: how an object names its type (Kubernetes' TypeMeta), and how
        ``controller.kube.Kube`` calls are addressed."""
        return self.api_version, self.kind

    def path(self, namespace: str | None = None, name: str | None = None) -> str:
        """REST path of the collection in ``namespace`` (across namespaces when None), or of one
        object when ``name`` is given too: ``/apis/<group>/<version>[/namespaces/<ns>]/<plural>[/<name>]``
        (``/api/v1/...`` for the core group)."""
        base = f"/apis/{self.api_version}" if self.group else f"/api/{self.version}"
        path = f"{base}/namespaces/{namespace}/{self.plural}" if namespace else f"{base}/{self.plural}"
        return f"{path}/{name}" if name else path


GROUP = "inference.kimik3.io"
VERSION = "v1alpha1"
KIMIK3_DEPLOYMENT = Kind(GROUP, VERSION, "KimiK3Deployment", "kimik3deployments")
KIND = KIMIK3_DEPLOYMENT.kind
PLURAL = KIMIK3_DEPLOYMENT.plural

LEADER_WORKER_SET = Kind("leaderworkerset.x-k8s.io", "v1", "LeaderWorkerSet", "leaderworkersets")
COMPUTE_DOMAIN = Kind("resource.nvidia.com", "v1beta1", "ComputeDomain", "computedomains")
"""NVIDIA DRA driver for GPUs: multi-node NVLink (IMEX channels) for the trays of one group."""
POD_MONITOR = Kind("monitoring.coreos.com", "v1", "PodMonitor", "podmonitors")
HTTP_ROUTE = Kind("gateway.networking.k8s.io", "v1", "HTTPRoute", "httproutes")
POD_DISRUPTION_BUDGET = Kind("policy", "v1", "PodDisruptionBudget", "poddisruptionbudgets")
GATEWAY = Kind("gateway.networking.k8s.io", "v1", "Gateway", "gateways")
"""The Gateway an HTTPRoute names (read, never written: ``controller.routing`` checks it admits the route)."""
REFERENCE_GRANT = Kind("gateway.networking.k8s.io", "v1beta1", "ReferenceGrant", "referencegrants")
"""Lets the HTTPRoutes of a tenant's namespace name the operator's wake Service in its own namespace
(``render.wake``; v1beta1: served by every Gateway API release since v0.6, v1 only since v1.5)."""
INFERENCE_POOL = Kind("inference.networking.k8s.io", "v1", "InferencePool", "inferencepools")
"""Gateway API Inference Extension: the group leaders as one backend, scored by an endpoint picker."""
INFERENCE_OBJECTIVE = Kind("inference.networking.x-k8s.io", "v1alpha2", "InferenceObjective", "inferenceobjectives")
"""Gateway API Inference Extension: read by the endpoint picker (its Role grants it); the operator only asks
discovery whether it is served (the picker v1.2.1 cannot start without it)."""
DEPLOYMENT = Kind("apps", "v1", "Deployment", "deployments")
"""The endpoint picker (``render.routing``)."""
WORKLOAD = Kind("kueue.x-k8s.io", "v1beta2", "Workload", "workloads")
"""Kueue: one per group of a LeaderWorkerSet it manages (placement ``kueue``); read, deleted to
re-admit a group (``controller.readmit``), its ``spec.priority`` patched for reserved and burst
capacity (``controller.capacity``)."""
WORKLOAD_PRIORITY_CLASS = Kind("kueue.x-k8s.io", "v1beta2", "WorkloadPriorityClass", "workloadpriorityclasses")
"""Kueue, cluster-scoped: the values of ``placement.priorityClass`` and ``burstPriorityClass``, read (``controller.capacity``)."""
LOCAL_QUEUE = Kind("kueue.x-k8s.io", "v1beta2", "LocalQueue", "localqueues")
"""Kueue: the queue a ``kueue`` deployment submits its groups to (``queueName``); read before a group is created."""
CONFIG_MAP = Kind("", "v1", "ConfigMap", "configmaps")
SERVICE = Kind("", "v1", "Service", "services")
POD = Kind("", "v1", "Pod", "pods")
EVENT = Kind("", "v1", "Event", "events")
JOB = Kind("batch", "v1", "Job", "jobs")
"""A staging Job (``kimik3.render.staging``)."""
PERSISTENT_VOLUME_CLAIM = Kind("", "v1", "PersistentVolumeClaim", "persistentvolumeclaims")
SERVICE_ACCOUNT = Kind("", "v1", "ServiceAccount", "serviceaccounts")
ROLE = Kind("rbac.authorization.k8s.io", "v1", "Role", "roles")
ROLE_BINDING = Kind("rbac.authorization.k8s.io", "v1", "RoleBinding", "rolebindings")
LEASE = Kind("coordination.k8s.io", "v1", "Lease", "leases")
"""The operator's leader election (kimik3.controller.leadership), in the operator's own namespace."""
RESOURCE_SLICE = Kind("resource.k8s.io", "v1", "ResourceSlice", "resourceslices")
"""Cluster-scoped; the ComputeDomain driver's devices on each tray (``controller.computedomains``)."""
NODE = Kind("", "v1", "Node", "nodes")
"""Cluster-scoped (``path()`` with no namespace); read by the dev kit's views, not by the operator."""
NAMESPACE = Kind("", "v1", "Namespace", "namespaces")
"""Cluster-scoped; a tenant namespace gone or terminating releases its wake ReferenceGrant (``controller.grants``)."""

KINDS: tuple[Kind, ...] = (KIMIK3_DEPLOYMENT, LEADER_WORKER_SET, COMPUTE_DOMAIN, POD_MONITOR, HTTP_ROUTE, GATEWAY,
                           REFERENCE_GRANT, INFERENCE_POOL, DEPLOYMENT,
                           POD_DISRUPTION_BUDGET, CONFIG_MAP, SERVICE, POD, EVENT, LEASE, NODE, RESOURCE_SLICE, WORKLOAD,
                           WORKLOAD_PRIORITY_CLASS, LOCAL_QUEUE, NAMESPACE,
                           JOB, PERSISTENT_VOLUME_CLAIM, SERVICE_ACCOUNT, ROLE, ROLE_BINDING)

CHILD_KINDS: tuple[Kind, ...] = (COMPUTE_DOMAIN, CONFIG_MAP, LEADER_WORKER_SET, SERVICE, POD_DISRUPTION_BUDGET,
                                 POD_MONITOR, SERVICE_ACCOUNT, ROLE, ROLE_BINDING, DEPLOYMENT, INFERENCE_POOL,
                                 HTTP_ROUTE)
"""What one KimiK3Deployment owns, in apply order (the ComputeDomain before the pods that claim it)."""
CHILD_NEEDS: dict[Kind, tuple[Kind, ...]] = {LEADER_WORKER_SET: (COMPUTE_DOMAIN, CONFIG_MAP)}
"""Children applied only once the children they need were: the LeaderWorkerSet's pods claim the
ComputeDomain's IMEX channel and mount the launcher ConfigMap, so without either they would sit in
ContainerCreating. Every other child is independent: one that cannot be applied (e.g. its CRD is
not installed) stops no other."""
SERVED_BY: dict[Kind, str] = {
    LEADER_WORKER_SET: "the LeaderWorkerSet controller (its CRDs and lws-controller-manager)",
    COMPUTE_DOMAIN: "NVIDIA's DRA driver for GPUs (its ComputeDomain CRD)",
    POD_MONITOR: "the Prometheus Operator (its PodMonitor CRD)",
    HTTP_ROUTE: "the Gateway API (its standard-channel CRDs)",
    INFERENCE_POOL: "the Gateway API Inference Extension (its InferencePool CRD, v1.2.1)",
    WORKLOAD: "Kueue",
}
"""Who installs each kind a cluster may lack: said when the API server does not serve it."""

_BY_API_VERSION = {(k.api_version, k.kind): k for k in KINDS}


def kind_of(api_version: str, kind: str) -> Kind:
    """The ``Kind`` of an object's ``apiVersion`` and ``kind``. Raises KeyError for a kind the
    operator does not handle."""
    return _BY_API_VERSION[(api_version, kind)]
