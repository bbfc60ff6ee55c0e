"""The Kueue manager (sigs.k8s.io/kueue at ``KUEUE_VERSION``, kimik3_dev.versions) run out of
cluster, webhooks on loopback, and the cluster objects that make it place engine groups: a
Topology, one ResourceFlavor per accelerator profile, a ClusterQueue holding the cluster's GPUs, a
LocalQueue per tenant namespace.

In a cluster Kueue runs as a Deployment behind a webhook Service. Here the manager binary
(``tools/build-binaries.sh kueue``) runs as a local process, as the LWS manager does (``lws``):

- a ``config.kueue.x-k8s.io/v1beta2`` Configuration (fields from the module's
  ``apis/config/v1beta2/configuration_types.go``): leader election and internal certificate
  management off, the webhook server on ``127.0.0.1:<port>`` with a certificate from the dev CA,
  health probes on loopback, metrics off (``bindAddress: "0"``), the visibility server off (it
  would bind 0.0.0.0:8082), only the LeaderWorkerSet integration, topology-aware scheduling on;
- the module's 11 CRDs (``config/components/crd/bases``); the six its kustomize patches give a
  ``/convert`` webhook get one at ``https://127.0.0.1:<port>/convert``;
- the webhook configurations of ``config/components/webhook/manifests.yaml`` for the kinds that
  matter here (Workload, ClusterQueue, Cohort, ResourceFlavor, LeaderWorkerSet, Pod), each
  ``clientConfig`` rewritten to a URL with the CA bundle; the pod webhooks only see pods of a
  LeaderWorkerSet (``objectSelector``), so no other pod depends on Kueue.

With internal certificates off the manager always loads ``/etc/kueue/metrics/certs/tls.{crt,key}``
(a path hard-coded in its ``cmd/kueue/main.go``) and exits when they are missing, even with metrics
off. ``ensure_metrics_cert`` writes a dev-CA certificate there (the metrics server never starts, so
the certificate is never served).

How a LeaderWorkerSet is submitted (label, podset annotations) is the operator's business: see
``kimik3.render.leaderworkerset`` and ../shared/reference/kueue.md.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kimik3.kube.accelerators import AcceleratorProfile
from kimik3.kube.labels import CLIQUE_LABEL, GPU_RESOURCE, PRODUCT_LABEL
from kimik3_dev.devcluster import managers
from kimik3_dev.devcluster.certs import issue_serving_cert
from kimik3_dev.devcluster.controlplane import load_yaml_documents
from kimik3_dev.devcluster.dradriver import CHANNEL_CLASS
from kimik3_dev.devcluster.thirdparty import go_module_dir
from kimik3_dev.versions import KUEUE_VERSION

KUEUE_MODULE = "sigs.k8s.io/kueue"
"""At ``KUEUE_VERSION`` (kimik3_dev.versions); TAS for LWS groups needs >= v0.13."""
API_VERSION = "kueue.x-k8s.io/v1beta2"
WEBHOOK_PREFIX = "kueue-"
HOSTNAME_LABEL = "kubernetes.io/hostname"
TOPOLOGY_NAME = "nvl72"
"""The Topology of the dev cluster: NVLink clique, then node (kueue.md: hostname as the lowest level)."""
CLUSTER_QUEUE = "gpus"
"""The ClusterQueue ``dev up`` creates for every tenant that has no queue of its own."""
LOCAL_QUEUE = "default"
"""The LocalQueue ``dev apply`` creates in a tenant namespace (``spec.scheduling.placement.queueName``)."""
METRICS_CERT_DIR = Path("/etc/kueue/metrics/certs")
"""Hard-coded in the pinned Kueue's cmd/kueue/main.go when internal certificate management is off."""

CONVERTED_CRDS = ("workloads", "clusterqueues", "localqueues", "cohorts", "multikueueclusters", "resourceflavors")
"""CRDs the module's kustomize patches (``config/components/crd/patches/webhook_in_*.yaml``)
give a conversion webhook (v1beta1 <-> v1beta2)."""
WEBHOOK_KINDS = ("workload", "clusterqueue", "cohort", "resourceflavor", "leaderworkerset", "-v1-pod")
"""Substrings of the webhook paths registered (``/mutate-kueue-x-k8s-io-v1beta2-workload``, ...):
Kueue's own kinds, the LWS integration, and the pod webhook that gates group pods."""


def module_dir() -> Path:
    """The Kueue module in the Go module cache (downloaded on first use)."""
    return go_module_dir(KUEUE_MODULE, KUEUE_VERSION)


def crd_documents(conversion: tuple[int, Path] | None, root: Path | None = None) -> list[dict[str, Any]]:
    """The module's CRDs; with ``conversion`` = (webhook port, CA file), those of ``CONVERTED_CRDS``
    get their conversion webhook on loopback (None: no conversion, for an API server without the
    manager, where only the stored version v1beta2 is used)."""
    base = (root or module_dir()) / "config" / "components" / "crd" / "bases"
    out = []
    for path in sorted(base.glob("kueue.x-k8s.io_*.yaml")):
        for doc in load_yaml_documents(path):
            if conversion is not None and doc["spec"]["names"]["plural"] in CONVERTED_CRDS:
                webhook_port, ca_file = conversion
                ca_bundle = base64.b64encode(ca_file.read_bytes()).decode()
                doc["spec"]["conversion"] = {"strategy": "Webhook", "webhook": {
                    "clientConfig": {"url": f"https://127.0.0.1:{webhook_port}/convert", "caBundle": ca_bundle},
                    "conversionReviewVersions": ["v1"]}}
            out.append(doc)
    return out


CHANNEL_RESOURCE = "compute-domain.nvidia.com/channel"
"""The logical resource Kueue counts ComputeDomain channel claims as. Kueue >= v0.18 accounts DRA
claims in quota (feature ``KueueDRAIntegration``, Beta, on by default) and refuses a Workload whose
claim template names a DeviceClass its Configuration does not map (``resources.deviceClassMappings``;
``pkg/dra/claims.go``: "DeviceClass ... is not mapped in DRA configuration for podset leader"), so
every engine pod's channel claim (``CHANNEL_CLASS``) must map to a resource the ClusterQueue covers.
A real cluster with Kueue and ComputeDomains needs the same two lines (docs/dev-cluster.md)."""


def write_config(state_dir: Path, webhook_port: int, health_port: int) -> Path:
    """Issue the webhook certificate and write the manager's configuration; returns its path.

    Files: ``<state>/kueue/config.yaml``, ``<state>/kueue/certs/tls.crt|tls.key``."""
    return managers.write_config(
        state_dir, "kueue", "config.kueue.x-k8s.io/v1beta2", webhook_port, health_port,
        manageJobsWithoutQueueName=False,
        integrations={"frameworks": ["leaderworkerset.x-k8s.io/leaderworkerset"]},
        featureGates={"TopologyAwareScheduling": True, "VisibilityOnDemand": False},
        resources={"deviceClassMappings": [{"name": CHANNEL_RESOURCE, "deviceClassNames": [CHANNEL_CLASS]}]})


class MetricsCertError(RuntimeError):
    """``/etc/kueue/metrics/certs`` cannot be written (not root)."""


def ensure_metrics_cert(state_dir: Path, target: Path = METRICS_CERT_DIR) -> None:
    """Put a dev-CA certificate where Kueue insists on finding one (see the module docstring).
    Leaves an existing pair alone. Raises MetricsCertError naming the path and the fix."""
    if (target / "tls.crt").is_file() and (target / "tls.key").is_file():
        return
    try:
        target.mkdir(parents=True, exist_ok=True)
        issue_serving_cert(state_dir / "pki", target, "kueue-metrics")
    except PermissionError:
        raise MetricsCertError(
            f"Kueue {KUEUE_VERSION} needs a certificate in {target} (hard-coded) and this user cannot write there: "
            f"run once `sudo mkdir -p {target} && sudo cp {state_dir}/kueue/certs/tls.* {target}/`, "
            "or start the dev cluster without Kueue (--placement exclusive)") from None


def argv(binary: Path, kubeconfig: Path, config: Path) -> list[str]:
    """The manager's command line."""
    return [str(binary), f"--kubeconfig={kubeconfig}", f"--config={config}", "--zap-devel=false",
            "--zap-log-level=2"]


def webhook_configurations(webhook_port: int, ca_file: Path, root: Path | None = None) -> list[dict[str, Any]]:
    """The module's webhook configurations, limited to ``WEBHOOK_KINDS``, pointed at loopback."""
    return managers.loopback_webhooks(
        (root or module_dir()) / "config" / "components" / "webhook" / "manifests.yaml", WEBHOOK_PREFIX,
        webhook_port, ca_file, keep=lambda path: any(path.endswith(kind) for kind in WEBHOOK_KINDS))


def topology() -> dict[str, Any]:
    """The Topology: NVLink clique (``nvidia.com/gpu.clique``), then node."""
    return {"apiVersion": API_VERSION, "kind": "Topology", "metadata": {"name": TOPOLOGY_NAME},
            "spec": {"levels": [{"nodeLabel": CLIQUE_LABEL}, {"nodeLabel": HOSTNAME_LABEL}]}}


def resource_flavor(profile: AcceleratorProfile) -> dict[str, Any]:
    """One ResourceFlavor per accelerator profile, on the nodes GFD labels with its product."""
    return {"apiVersion": API_VERSION, "kind": "ResourceFlavor", "metadata": {"name": profile.name},
            "spec": {"nodeLabels": {PRODUCT_LABEL: profile.product_label}, "topologyName": TOPOLOGY_NAME}}


COHORT = "kimik3-tenants"
"""The Cohort every ``--tenant`` ClusterQueue of ``dev up`` joins: idle quota is lent among them."""
TENANT_PREEMPTION = {"reclaimWithinCohort": "LowerPriority", "borrowWithinCohort": {"policy": "LowerPriority"},
                     "withinClusterQueue": "LowerPriority"}
"""How a tenant's ClusterQueue gets room (``spec.preemption``, Kueue v1beta2): its nominal quota
back from tenants borrowing it, and beyond that room from tenants that borrow too or from its own
queue, each time by preempting lower-priority Workloads only. ``LowerPriority`` rather than ``Any``
for the reclaim: with reserved and burst capacity (``placement.burstPriorityClass``,
``kimik3.controller.capacity``) a tenant's reserved group then preempts another tenant's burst group,
never its reserved ones, even while that tenant borrows (with ``Any`` every Workload of a borrowing
ClusterQueue is a candidate, whatever its priority)."""


def cluster_queue(name: str, flavor: str, gpus: int, cpu: str = "100000", memory: str = "1000Ti",
                  namespaces: list[str] | None = None, cohort: str | None = None) -> dict[str, Any]:
    """A ClusterQueue with ``gpus`` nominal ``nvidia.com/gpu`` of ``flavor`` (cpu and memory are
    covered generously: every resource a pod requests must be covered; so are ComputeDomain channels,
    ``CHANNEL_RESOURCE``, one per pod and so at most one per GPU: never the limit). ``namespaces`` limits
    which namespaces may use it (default: all); ``cohort`` makes it a member of that Cohort, with
    ``TENANT_PREEMPTION``."""
    selector: dict[str, Any] = {}
    if namespaces is not None:
        selector = {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In",
                                          "values": namespaces}]}
    shared: dict[str, Any] = {"cohortName": cohort, "preemption": TENANT_PREEMPTION} if cohort else {}
    return {"apiVersion": API_VERSION, "kind": "ClusterQueue", "metadata": {"name": name},
            "spec": {**shared, "namespaceSelector": selector,
                     "resourceGroups": [{"coveredResources": ["cpu", "memory", GPU_RESOURCE, CHANNEL_RESOURCE],
                                         "flavors": [{"name": flavor, "resources": [
                                             {"name": "cpu", "nominalQuota": cpu},
                                             {"name": "memory", "nominalQuota": memory},
                                             {"name": GPU_RESOURCE, "nominalQuota": gpus},
                                             {"name": CHANNEL_RESOURCE, "nominalQuota": gpus}]}]}]}}


def local_queue(namespace: str, cluster_queue_name: str = CLUSTER_QUEUE, name: str = LOCAL_QUEUE) -> dict[str, Any]:
    """A tenant namespace's LocalQueue pointing at its ClusterQueue."""
    return {"apiVersion": API_VERSION, "kind": "LocalQueue", "metadata": {"name": name, "namespace": namespace},
            "spec": {"clusterQueue": cluster_queue_name}}


PLURALS = {"Topology": "topologies", "ResourceFlavor": "resourceflavors", "ClusterQueue": "clusterqueues",
           "LocalQueue": "localqueues", "WorkloadPriorityClass": "workloadpriorityclasses", "Workload": "workloads"}
NAMESPACED = ("LocalQueue", "Workload")


def object_path(obj: dict[str, Any]) -> str:
    """The REST path of one of these Kueue objects (LocalQueue and Workload are namespaced)."""
    kind, meta = obj["kind"], obj["metadata"]
    base = f"/apis/{API_VERSION}"
    if kind in NAMESPACED:
        base += f"/namespaces/{meta['namespace']}"
    return f"{base}/{PLURALS[kind]}/{meta['name']}"


def workload_priority_class(name: str, value: int, description: str = "") -> dict[str, Any]:
    """A WorkloadPriorityClass: ``value`` orders admission and preemption (higher wins)."""
    return {"apiVersion": API_VERSION, "kind": "WorkloadPriorityClass", "metadata": {"name": name},
            "value": value, "description": description or f"kimik3 dev: priority {value}"}


@dataclass(frozen=True)
class Tenant:
    """A tenant of ``dev up --tenant NAME=GPUS[:PRIORITY]``: namespace ``name`` with its own
    ClusterQueue ``name`` (``gpus`` nominal, in ``COHORT``), LocalQueue ``LOCAL_QUEUE`` there, and,
    with a priority, the WorkloadPriorityClass ``name`` of that value (its deployments set
    ``spec.scheduling.placement.priorityClass: <name>``)."""

    name: str
    gpus: int
    priority: int | None = None

    @classmethod
    def parse(cls, text: str) -> Tenant:
        """``NAME=GPUS[:PRIORITY]``, e.g. ``batch=72:100``; ValueError naming what is wrong."""
        name, sep, rest = text.partition("=")
        gpus, _, priority = rest.partition(":")
        if not sep or not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", name):
            raise ValueError(f"--tenant {text!r}: NAME=GPUS[:PRIORITY] with NAME a namespace name (DNS label), "
                             "e.g. batch=72:100")
        if not gpus.isdigit():
            raise ValueError(f"--tenant {text!r}: GPUS must be a whole number of GPUs, e.g. {name}=72")
        if priority and not re.fullmatch(r"-?[0-9]+", priority):
            raise ValueError(f"--tenant {text!r}: PRIORITY must be an integer (higher preempts lower), "
                             f"e.g. {name}={gpus}:1000")
        return cls(name, int(gpus), int(priority) if priority else None)

    def objects(self, flavor: str) -> list[dict[str, Any]]:
        """Its ClusterQueue, LocalQueue and (with a priority) WorkloadPriorityClass."""
        out = [cluster_queue(self.name, flavor, self.gpus, namespaces=[self.name], cohort=COHORT),
               local_queue(self.name, self.name)]
        if self.priority is not None:
            out.append(workload_priority_class(self.name, self.priority, f"kimik3 dev tenant {self.name}"))
        return out
