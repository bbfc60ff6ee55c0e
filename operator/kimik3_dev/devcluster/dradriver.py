"""``kimik3 dev dra-driver``: NVIDIA's DRA driver for ComputeDomains, simulated, as the API sees it.

No GPU, no IMEX daemon and no kubelet plugin socket exist here, so this loop (every ``POLL_S``)
writes to the API server what NVIDIA's driver (github.com/NVIDIA/k8s-dra-driver-gpu, release
v25.12.0: its compute-domain controller, kubelet plugin and daemon, and its chart) writes there.
The allocation itself is the real kube-scheduler's (DRA GA in 1.35: the ``DynamicResources``
plugin) and the claims are made from the templates by the real resource-claim controller of
kube-controller-manager. What it does, by the driver part it stands in for:

- the chart: the DeviceClasses ``compute-domain-daemon.nvidia.com`` and
  ``compute-domain-default-channel.nvidia.com`` (CEL selectors on the driver, the device's
  ``type`` and, for the channel, ``id == 0``), the namespace ``NAMESPACE``;
- the kubelet plugin on each tray (a Node with the GPU product label): one ResourceSlice of
  driver ``compute-domain.nvidia.com``, pool = the node's name, with the devices ``channel-0``
  and ``daemon-0`` (attributes ``type``, ``id``; the plugin publishes channel 0 only). A slice
  deleted by hand is published again (the plugin's slice controller does the same), except
  while the tray carries ``PLUGIN_STOPPED_LABEL``: then the plugin is down, as after a crash,
  and the tray has no slice (the kubelet removes a gone plugin's slices);
- the kubelet plugin's ``NodePrepareResources`` of a channel claim (the scheduler allocated it
  on a tray and reserved it for a pod): the node label ``resource.nvidia.com/computeDomain:
  <domain uid>``, which places the domain's daemon there; the label goes once no reserved
  channel claim of that domain is left on the tray (``NodeUnprepareResources``). kwok (``KWOK_VERSION``)
  ignores a pod's claims and runs it once bound, where a kubelet would hold it in
  ContainerCreating until that tray's daemon is Ready;
- the controller, per ComputeDomain: its finalizer; the ResourceClaimTemplate named
  ``spec.channel.resourceClaimTemplate.name`` in the domain's namespace (a ``channel`` request
  of the default-channel class, the domain's uid in the opaque ``ComputeDomainChannelConfig``);
  in ``NAMESPACE`` the daemons' ResourceClaimTemplate and a DaemonSet selecting the labelled
  trays (so the real DaemonSet controller and scheduler run one daemon pod, holding that tray's
  ``daemon-0``, on each tray of the domain); on deletion all of it goes, then the finalizer;
- the daemons: ``status.nodes`` gets one entry per daemon pod that runs on a tray (``name``,
  ``ipAddress`` = the pod's IP, ``cliqueID`` = the tray's ``nvidia.com/gpu.clique``, ``index`` =
  the lowest free in its clique, ``status`` Ready once the pod is Ready), entries whose pod is
  gone are dropped; a tray labelled ``DAEMON_FAILED_LABEL`` has its daemon NotReady (its IMEX
  daemon fails its check), as when the fabric breaks;
- the controller's overall ``status.status`` (``calculateGlobalStatus``): NotReady while fewer
  nodes are listed than ``spec.numNodes`` or any listed node is NotReady, else Ready. So with
  ``numNodes: 0`` (what the operator renders) a domain is Ready as soon as it exists and while
  every listed daemon is Ready.

Faults: ``faults.dra_plugin_stopped`` / ``faults.imex_daemon_failed`` set the two labels.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any

from kimik3.controller.computedomains import DRIVER
from kimik3.controller.kube import ApiError, Conflict, NotFound
from kimik3.kube import nodes as knodes
from kimik3.kube import pods as kpods
from kimik3.kube.labels import CLIQUE_LABEL, PRODUCT_LABEL
from kimik3_dev.devcluster.rest import Rest

__all__ = ["CHANNEL_CLASS", "DAEMON_CLASS", "DAEMON_FAILED_LABEL", "DOMAIN_LABEL", "DRIVER", "NAMESPACE",
           "PLUGIN_STOPPED_LABEL", "DraDriver", "channel_template", "daemon_set", "device_classes", "node_entries",
           "overall_status", "resource_slice"]

NAMESPACE = "nvidia-dra-driver-gpu"
"""The namespace NVIDIA's chart is installed in by its docs (the daemons and their template live there)."""
DOMAIN_LABEL = "resource.nvidia.com/computeDomain"
"""Label (value: the domain's uid) on a tray that prepared a channel of the domain, on the
driver's templates and daemon pods; also the driver's finalizer name."""
TARGET_LABEL = "resource.nvidia.com/computeDomainTarget"
CHANNEL_CLASS = "compute-domain-default-channel.nvidia.com"
DAEMON_CLASS = "compute-domain-daemon.nvidia.com"
CONFIG_API_VERSION = "resource.nvidia.com/v1beta1"
IMAGE = "nvcr.io/nvidia/k8s-dra-driver-gpu:v25.12.0"
"""The daemon pods' image (never pulled: kwok runs no container)."""
PLUGIN_STOPPED_LABEL = "dra-plugin-stopped.kimik3.dev"
"""Fault label (value ``"true"``): the tray's kubelet plugin is down, its ResourceSlice gone."""
DAEMON_FAILED_LABEL = "imex-daemon-failed.kimik3.dev"
"""Fault label (value ``"true"``): the tray's IMEX daemon fails its check (node status NotReady)."""
READY, NOT_READY = "Ready", "NotReady"
POLL_S = 0.5
CD_PATH = "/apis/resource.nvidia.com/v1beta1"
RESOURCE_PATH = "/apis/resource.k8s.io/v1"

log = logging.getLogger("kimik3.dev.dradriver")


def _labels(obj: dict[str, Any]) -> dict[str, str]:
    return (obj.get("metadata") or {}).get("labels") or {}


# -- what the chart and the plugin publish ---------------------------------------------------------
def device_classes() -> list[dict[str, Any]]:
    """The two DeviceClasses NVIDIA's chart creates for ComputeDomains."""
    def klass(name: str, expression: str) -> dict[str, Any]:
        return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name},
                "spec": {"selectors": [{"cel": {"expression": expression}}]}}
    typed = f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == "
    return [klass(DAEMON_CLASS, typed + "'daemon'"),
            klass(CHANNEL_CLASS, typed + f"'channel' && device.attributes['{DRIVER}'].id == 0")]


def resource_slice(node: str) -> dict[str, Any]:
    """The ResourceSlice the kubelet plugin of tray ``node`` publishes: pool ``node``, devices
    ``channel-0`` and ``daemon-0``."""
    def device(kind: str) -> dict[str, Any]:
        return {"name": f"{kind}-0", "attributes": {"type": {"string": kind}, "id": {"int": 0}}}
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-{DRIVER}"},
            "spec": {"driver": DRIVER, "nodeName": node,
                     "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                     "devices": [device("channel"), device("daemon")]}}


# -- what the controller creates per ComputeDomain -------------------------------------------------
def _template(namespace: str, name: str, uid: str, target: str, request: str, klass: str,
              parameters: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"namespace": namespace, "name": name, "finalizers": [DOMAIN_LABEL],
                         "labels": {DOMAIN_LABEL: uid, TARGET_LABEL: target}},
            "spec": {"spec": {"devices": {
                "requests": [{"name": request, "exactly": {"deviceClassName": klass}}],
                "config": [{"requests": [request], "opaque": {"driver": DRIVER, "parameters": {
                    "apiVersion": CONFIG_API_VERSION, **parameters, "domainID": uid}}}]}}}}


def channel_template(cd: dict[str, Any]) -> dict[str, Any]:
    """The workload ResourceClaimTemplate of ComputeDomain ``cd`` (its namespace, the name its spec gives)."""
    meta, channel = cd["metadata"], cd["spec"]["channel"]
    return _template(meta["namespace"], channel["resourceClaimTemplate"]["name"], meta["uid"], "Workload", "channel",
                     CHANNEL_CLASS, {"kind": "ComputeDomainChannelConfig",
                                     "allocationMode": channel.get("allocationMode") or "Single"})


def daemon_template(cd: dict[str, Any]) -> dict[str, Any]:
    uid = cd["metadata"]["uid"]
    return _template(NAMESPACE, f"computedomain-daemon-{uid}", uid, "Daemon", "daemon", DAEMON_CLASS,
                     {"kind": "ComputeDomainDaemonConfig"})


def daemon_set(cd: dict[str, Any]) -> dict[str, Any]:
    """The DaemonSet of ``cd``'s daemons: one pod on every tray labelled with the domain's uid,
    each claiming that tray's ``daemon-0``, tolerating every taint."""
    uid = cd["metadata"]["uid"]
    labels = {DOMAIN_LABEL: uid}
    return {"apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"namespace": NAMESPACE, "name": f"computedomain-daemon-{uid}", "labels": labels},
            "spec": {"selector": {"matchLabels": labels}, "template": {
                "metadata": {"labels": labels},
                "spec": {"nodeSelector": labels,
                         "containers": [{"name": "compute-domain-daemon", "image": IMAGE,
                                         "command": ["compute-domain-daemon", "run"],
                                         "resources": {"claims": [{"name": "compute-domain-daemon"}]}}],
                         "tolerations": [{"operator": "Exists", "effect": e}
                                         for e in ("NoSchedule", "NoExecute", "PreferNoSchedule")],
                         "resourceClaims": [{"name": "compute-domain-daemon",
                                             "resourceClaimTemplateName": daemon_template(cd)["metadata"]["name"]}]}}}}


# -- what the daemons and the controller write to the status ---------------------------------------
def node_entries(previous: Iterable[dict[str, Any]], daemons: Iterable[dict[str, Any]],
                 nodes: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """``status.nodes`` for the daemon pods ``daemons`` (one per tray) given the trays ``nodes``
    by name: a running daemon (node and pod IP set) is listed, Ready when its pod is Ready and its
    tray has no ``DAEMON_FAILED_LABEL``; an entry keeps its ``index``, a new one takes the lowest
    free index of its clique. Sorted by name."""
    kept = {e["name"]: e for e in previous}
    out: dict[str, dict[str, Any]] = {}
    for pod in daemons:
        node, ip = kpods.node_name(pod), (pod.get("status") or {}).get("podIP")
        if not node or not ip or kpods.is_terminating(pod):
            continue
        labels = _labels(nodes.get(node) or {})
        ready = kpods.is_ready(pod) and labels.get(DAEMON_FAILED_LABEL) != "true"
        out[node] = {"name": node, "ipAddress": ip, "cliqueID": labels.get(CLIQUE_LABEL, ""),
                     "status": READY if ready else NOT_READY}
    taken: dict[str, set[int]] = {}
    for name, entry in out.items():
        if name in kept and kept[name].get("cliqueID") == entry["cliqueID"] and "index" in kept[name]:
            entry["index"] = kept[name]["index"]
            taken.setdefault(entry["cliqueID"], set()).add(entry["index"])
    for name in sorted(out):
        entry = out[name]
        if "index" not in entry:
            used = taken.setdefault(entry["cliqueID"], set())
            entry["index"] = next(i for i in range(len(used) + 1) if i not in used)
            used.add(entry["index"])
    return [out[n] for n in sorted(out)]


def overall_status(num_nodes: int, entries: list[dict[str, Any]]) -> str:
    """The controller's ``status.status``: NotReady while fewer than ``num_nodes`` nodes are
    listed or any is NotReady, else Ready (``numNodes: 0`` and no node: Ready)."""
    if len(entries) < num_nodes or any(e.get("status") != READY for e in entries):
        return NOT_READY
    return READY


def _domain_of(claim: dict[str, Any]) -> str | None:
    """The domain uid in a channel claim's opaque config (None: not a ComputeDomain channel claim)."""
    for config in ((claim.get("spec") or {}).get("devices") or {}).get("config") or []:
        opaque = config.get("opaque") or {}
        params = opaque.get("parameters") or {}
        if opaque.get("driver") == DRIVER and params.get("kind") == "ComputeDomainChannelConfig":
            return params.get("domainID")
    return None


def prepared_trays(claims: Iterable[dict[str, Any]]) -> dict[str, str]:
    """Tray -> domain uid for every channel claim allocated on a tray and reserved for a pod
    (what the kubelet plugin has prepared there)."""
    out: dict[str, str] = {}
    for claim in claims:
        uid, status = _domain_of(claim), claim.get("status") or {}
        allocation = status.get("allocation") or {}
        if not uid or not allocation or not status.get("reservedFor"):
            continue
        for term in (allocation.get("nodeSelector") or {}).get("nodeSelectorTerms") or []:
            for field in term.get("matchFields") or []:
                if field.get("key") == "metadata.name" and field.get("operator") == "In":
                    for node in field.get("values") or []:
                        out[node] = uid
    return out


class DraDriver:
    """The simulated driver on the cluster behind ``rest`` (see the module docstring)."""

    def __init__(self, rest: Rest) -> None:
        self.rest = rest

    def install(self) -> None:
        """The chart's part: the driver's namespace and DeviceClasses."""
        ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
        self.rest.apply(f"/api/v1/namespaces/{NAMESPACE}", ns)
        for klass in device_classes():
            self.rest.apply(f"{RESOURCE_PATH}/deviceclasses/{klass['metadata']['name']}", klass)

    def run_forever(self) -> None:
        self.install()
        while True:
            try:
                self.step()
            except ApiError as exc:
                log.warning("pass failed: %s", exc)
            time.sleep(POLL_S)

    def step(self) -> None:
        """One pass: slices, node labels, each ComputeDomain's objects and status."""
        trays = {knodes.name(n): n for n in self.rest.items("/api/v1/nodes") if _labels(n).get(PRODUCT_LABEL)}
        self.publish_slices(trays)
        self.label_trays(trays)
        daemons = self.rest.items(f"/api/v1/namespaces/{NAMESPACE}/pods", DOMAIN_LABEL)
        for cd in self.rest.items(f"{CD_PATH}/computedomains"):
            if cd["metadata"].get("deletionTimestamp"):
                self.tear_down(cd, trays)
                continue
            self.reconcile(cd)
            uid = cd["metadata"]["uid"]
            self.write_status(cd, [p for p in daemons if p["metadata"]["labels"].get(DOMAIN_LABEL) == uid], trays)
        self.release_templates()

    # -- the kubelet plugins -------------------------------------------------------------------------
    def publish_slices(self, trays: dict[str, dict[str, Any]]) -> None:
        slices = {s["spec"].get("nodeName"): s for s in self.rest.items(f"{RESOURCE_PATH}/resourceslices")
                  if s["spec"].get("driver") == DRIVER}
        for name, node in trays.items():
            stopped = _labels(node).get(PLUGIN_STOPPED_LABEL) == "true"
            if stopped and name in slices:
                self.rest.delete(f"{RESOURCE_PATH}/resourceslices/{slices[name]['metadata']['name']}")
                log.info("tray %s: kubelet plugin stopped, ResourceSlice deleted", name)
            elif not stopped and name not in slices:
                self._create(f"{RESOURCE_PATH}/resourceslices", resource_slice(name))
                log.info("tray %s: ResourceSlice published", name)

    def label_trays(self, trays: dict[str, dict[str, Any]]) -> None:
        prepared = prepared_trays(self.rest.items(f"{RESOURCE_PATH}/resourceclaims"))
        for name, node in trays.items():
            have, want = _labels(node).get(DOMAIN_LABEL), prepared.get(name)
            if have != want and not (have and want):  # a tray serves one domain at a time
                self.rest.call("PATCH", f"/api/v1/nodes/{name}", body={"metadata": {"labels": {DOMAIN_LABEL: want}}},
                               content_type="application/merge-patch+json")
                log.info("tray %s: %s", name, f"channel of domain {want} prepared" if want else "channels unprepared")

    # -- the controller ------------------------------------------------------------------------------
    def reconcile(self, cd: dict[str, Any]) -> None:
        meta = cd["metadata"]
        if DOMAIN_LABEL not in (meta.get("finalizers") or []):
            self._merge(f"{CD_PATH}/namespaces/{meta['namespace']}/computedomains/{meta['name']}",
                        {"metadata": {"finalizers": [*(meta.get("finalizers") or []), DOMAIN_LABEL],
                                      "resourceVersion": meta["resourceVersion"]}})
        for obj in (channel_template(cd), daemon_template(cd)):
            path = f"{RESOURCE_PATH}/namespaces/{obj['metadata']['namespace']}/resourceclaimtemplates/{obj['metadata']['name']}"
            if self.rest.get(path) is None:
                # Server-side apply, not create: the API server then stores the opaque parameters
                # re-encoded, so the later finalizer update passes the spec's immutability check
                # (a create keeps the client's bytes, and the update's re-encoding differs).
                self.rest.apply(path, obj)
        self._create(f"/apis/apps/v1/namespaces/{NAMESPACE}/daemonsets", daemon_set(cd))

    def write_status(self, cd: dict[str, Any], daemons: list[dict[str, Any]], trays: dict[str, dict[str, Any]]) -> None:
        status = cd.get("status") or {}
        entries = node_entries(status.get("nodes") or [], daemons, trays)
        overall = overall_status(int(cd["spec"].get("numNodes") or 0), entries)
        if status.get("status") == overall and sorted(status.get("nodes") or [], key=lambda e: e["name"]) == entries:
            return
        meta = cd["metadata"]
        self._merge(f"{CD_PATH}/namespaces/{meta['namespace']}/computedomains/{meta['name']}/status",
                    {"status": {"status": overall, "nodes": entries}})
        log.info("ComputeDomain %s/%s: %s, nodes %s", meta["namespace"], meta["name"], overall,
                 ", ".join(f"{e['name']}={e['status']}" for e in entries) or "none")

    def tear_down(self, cd: dict[str, Any], trays: dict[str, dict[str, Any]]) -> None:
        """A deleted ComputeDomain: its templates and DaemonSet, the trays' labels, then its finalizer."""
        meta, uid = cd["metadata"], cd["metadata"]["uid"]
        for obj in (channel_template(cd), daemon_template(cd)):
            path = f"{RESOURCE_PATH}/namespaces/{obj['metadata']['namespace']}/resourceclaimtemplates/{obj['metadata']['name']}"
            self._drop_finalizer(path)
            self.rest.delete(path)
        self.rest.delete(f"/apis/apps/v1/namespaces/{NAMESPACE}/daemonsets/{daemon_set(cd)['metadata']['name']}")
        for name, node in trays.items():
            if _labels(node).get(DOMAIN_LABEL) == uid:
                self.rest.call("PATCH", f"/api/v1/nodes/{name}", body={"metadata": {"labels": {DOMAIN_LABEL: None}}},
                               content_type="application/merge-patch+json")
        self._drop_finalizer(f"{CD_PATH}/namespaces/{meta['namespace']}/computedomains/{meta['name']}")
        log.info("ComputeDomain %s/%s deleted: templates, daemons and labels removed", meta["namespace"], meta["name"])

    def release_templates(self) -> None:
        """Templates being deleted (e.g. with their namespace) whose domain is gone: their finalizer."""
        domains = {cd["metadata"]["uid"] for cd in self.rest.items(f"{CD_PATH}/computedomains")
                   if not cd["metadata"].get("deletionTimestamp")}
        for rct in self.rest.items(f"{RESOURCE_PATH}/resourceclaimtemplates", DOMAIN_LABEL):
            meta = rct["metadata"]
            if meta.get("deletionTimestamp") and meta["labels"][DOMAIN_LABEL] not in domains:
                self._drop_finalizer(f"{RESOURCE_PATH}/namespaces/{meta['namespace']}/resourceclaimtemplates/{meta['name']}")

    # -- calls ---------------------------------------------------------------------------------------
    def _create(self, path: str, obj: dict[str, Any]) -> None:
        try:
            self.rest.create(path, obj)
        except Conflict:  # AlreadyExists
            pass

    def _merge(self, path: str, patch: dict[str, Any]) -> None:
        try:
            self.rest.call("PATCH", path, body=patch, content_type="application/merge-patch+json")
        except (Conflict, NotFound):  # changed meanwhile: the next pass sees it
            pass

    def _drop_finalizer(self, path: str) -> None:
        obj = self.rest.get(path)
        if obj is None or DOMAIN_LABEL not in (obj["metadata"].get("finalizers") or []):
            return
        self._merge(path, {"metadata": {"finalizers": [f for f in obj["metadata"]["finalizers"] if f != DOMAIN_LABEL],
                                        "resourceVersion": obj["metadata"]["resourceVersion"]}})
