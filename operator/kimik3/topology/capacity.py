"""Where Kueue can put an engine group: free trays per NVLink domain, best fit, the tenant's quota.

The one capacity model of placement ``kueue`` (issue 15): the operator's status reads it (the
largest free block of trays when Kueue says no rack fits), and the kit's fleet simulator and
autoscaler benchmark place groups with it instead of arithmetic of their own. Pure functions and
values, no API calls.

What it follows, read in Kueue v0.17.0 (``pkg/cache/scheduler/tas_flavor_snapshot.go``) for a
group whose leader and workers must share one domain of the topology key:

- a node counts when it is Ready and schedulable and carries the topology key; its room is its
  allocatable ``nvidia.com/gpu`` minus the requests of the unfinished pods bound to it, so a tray
  holds one more engine pod when that room is at least the pod's GPUs (a tray of an NVL72 rack
  holds one pod: 4 GPUs);
- the ClusterQueue's quota must admit the group's GPUs first (``insufficient unused quota``);
- then the group goes to the domain with the fewest free slots that still holds all its pods
  (``findBestFitDomainBy``: domains sorted most free first, then by name; the first with the lowest
  free count >= needed), so 9 TP8 groups fill one rack of 18 trays before the next rack is opened;
- no domain has enough: the Workload stays pending (``doesn't allow to fit any of N pod(s)``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kimik3.kube import nodes as knodes
from kimik3.kube import pods as kpods


@dataclass(frozen=True)
class Domain:
    """One NVLink domain (a value of the topology key, e.g. an NVL72 rack's clique)."""

    name: str
    trays: int
    """Nodes of the domain Kueue counts (Ready, schedulable)."""
    free: tuple[str, ...]
    """Names of the trays with room for one more engine pod, sorted."""


def domains(nodes: Iterable[Any], pods: Iterable[Any], topology_key: str, gpus_per_pod: int,
            node_labels: Mapping[str, str] | None = None) -> list[Domain]:
    """The domains of ``nodes`` (those carrying ``topology_key`` and every label of
    ``node_labels``, e.g. the ResourceFlavor's GPU product), with the trays where a pod of
    ``gpus_per_pod`` GPUs still fits given the unfinished ``pods`` bound to them; sorted by name."""
    used: dict[str, int] = {}
    for pod in pods:
        if kpods.holds_node(pod):
            used[kpods.node_name(pod)] = used.get(kpods.node_name(pod), 0) + kpods.gpu_request(pod)
    trays: dict[str, list[str]] = {}
    free: dict[str, list[str]] = {}
    for node in nodes:
        labels = knodes.labels(node)
        value = labels.get(topology_key)
        if not value or not knodes.is_schedulable(node) or any(labels.get(k) != v for k, v in (node_labels or {}).items()):
            continue
        name = knodes.name(node)
        trays.setdefault(value, []).append(name)
        if knodes.allocatable_gpus(node) - used.get(name, 0) >= gpus_per_pod:
            free.setdefault(value, []).append(name)
    return [Domain(d, len(trays[d]), tuple(sorted(free.get(d, [])))) for d in sorted(trays)]


def largest_free_block(found: Iterable[Domain]) -> Domain | None:
    """The domain with the most free trays (the first by name among equals); None without domains."""
    best: Domain | None = None
    for d in found:
        if best is None or len(d.free) > len(best.free):
            best = d
    return best
