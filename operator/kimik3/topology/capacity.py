"""Where Kueue can put an engine group: free trays per NVLink domain, best fit, the tenant's quota.

The one capacity model of placement ``kueue`` (issue 15): the operator's status reads it (the
largest free block of trays when Kueue says no rack fits), and the kit's fleet simulator and
autoscaler benchmark place groups with it instead of arithmetic of their own. Pure functions and
values, no API calls.

What it follows, read in Kueue v0.17.0 and again in v0.19.2 (``pkg/cache/scheduler/tas_flavor_snapshot.go``) for a
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
from dataclasses import dataclass, field
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
def best_fit(free: Mapping[str, int], needed: int) -> str | None:
    """The domain Kueue picks for a group of ``needed`` pods given ``free`` slots per domain: the
    fewest free slots that still hold the group, the first by name among equals; None when no
    domain holds it."""
    fitting = [(n, name) for name, n in free.items() if n >= needed]
    return min(fitting)[1] if fitting else None


@dataclass
class Pool:
    """NVLink domains with free trays and tenants with GPU quota, as one ClusterQueue per tenant
    over one ResourceFlavor sees them: ``admit`` places a group as Kueue would or refuses it,
    ``release`` frees it. A tenant without a quota entry is unlimited."""

    free: dict[str, int]
    """Free trays per domain."""
    quota: dict[str, int] = field(default_factory=dict)
    """GPUs per tenant (the ClusterQueue's nominal ``nvidia.com/gpu``)."""
    used: dict[str, int] = field(default_factory=dict)
    """GPUs admitted per tenant."""

    @classmethod
    def of_racks(cls, racks: int, trays_per_rack: int, quota: Mapping[str, int] | None = None) -> Pool:
        """``racks`` empty domains of ``trays_per_rack`` trays (named ``rack-0``, ``rack-1``, ...)."""
        return cls({f"rack-{i}": trays_per_rack for i in range(racks)}, dict(quota or {}))

    def why_not(self, tenant: str, trays: int, gpus: int) -> str | None:
        """Why a group of ``trays`` trays and ``gpus`` GPUs would wait ("quota" or "topology", in
        Kueue's order), None when it would be admitted now."""
        if tenant in self.quota and self.used.get(tenant, 0) + gpus > self.quota[tenant]:
            return "quota"
        return None if best_fit(self.free, trays) is not None else "topology"

    def admit(self, tenant: str, trays: int, gpus: int) -> str | None:
        """Place one group; the domain it went to, or None (nothing changes) when it waits."""
        if self.why_not(tenant, trays, gpus) is not None:
            return None
        domain = best_fit(self.free, trays)
        assert domain is not None
        self.free[domain] -= trays
        self.used[tenant] = self.used.get(tenant, 0) + gpus
        return domain

    def release(self, tenant: str, domain: str, trays: int, gpus: int) -> None:
        """Free a group ``admit`` placed in ``domain``."""
        self.free[domain] += trays
        self.used[tenant] = self.used.get(tenant, 0) - gpus

    def groups_that_fit(self, tenant: str, trays: int, gpus: int) -> int:
        """How many more such groups Kueue would admit now, one after the other (nothing changes)."""
        trial = Pool(dict(self.free), dict(self.quota), dict(self.used))
        count = 0
        while trial.admit(tenant, trays, gpus) is not None:
            count += 1
        return count
