"""Two placement modes on one node pool: an exclusive deployment repels every group Kueue places.

Placement ``exclusive`` renders LeaderWorkerSet's exclusive topology (multi-tray NVL72 groups:
``plan.clique_placement``): its pod webhook gives each pod an anti-affinity, on the topology key,
against the pods of *every* other LeaderWorkerSet group. Placement ``kueue`` lets Kueue pick a rack
for a whole group, and Kueue does not read pod (anti-)affinity: it admits a group into a rack
where an exclusive group runs (or will run), and its pods then stay Unschedulable there. The
scheduler keeps the two apart both ways (anti-affinity is symmetric), so the harm is groups that
wait while Kueue holds their quota in a rack they cannot enter, not two groups in one rack.

So each reconcile compares the deployment with the other KimiK3Deployments the operator sees
(``snapshot.Reader.deployments``: the watch cache, else a cluster-wide list): a ``kueue`` one and an
``exclusive`` one that repels clash when their node pools overlap (``render.leaderworkerset.
node_selector``: GPU product, architecture and ``spec.scheduling.nodeSelector``, no key with two
values). The Kueue side's ClusterQueue may narrow its nodes further (its ResourceFlavor's
nodeLabels); the operator does not read it and counts the pools as overlapping. Condition
``PlacementConflict`` (True ``PlacementModesMixed``) names each other deployment, its mode, the
racks of its groups in its status and the racks both hold now, and the fix; a Warning Event says
it once per generation. Each deployment of the pair says it at its own reconcile: a reconcile
that finds its clashes differ from what another CR's condition says of it (``names``) has that
deployment reconciled too (``reconcile.Result.wake``), so both CRs say it within seconds, and a
clash that ends (a mode changed) is taken back from both. A deleted deployment's partner learns
it at its next reconcile (its resync, ``steps.RESYNC_READY_S``, at the latest).

``Placements`` derives each deployment's ``Placement`` once per generation (admission runs on its
spec); the rest are pure functions.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kimik3.admission import AdmissionPolicy, Admitted, admit
from kimik3.api.conditions import ConditionType, Reason, Verdict
from kimik3.api.errors import SpecErrors
from kimik3.api.v1alpha1 import GroupStatus
from kimik3.render.leaderworkerset import node_selector


@dataclass(frozen=True)
class Placement:
    """How one deployment's groups take racks."""

    namespace: str
    name: str
    mode: str
    """``spec.scheduling.placement.mode``: exclusive or kueue."""
    repels: bool
    """Placement exclusive with LeaderWorkerSet's exclusive topology (``plan.clique_placement``):
    its groups repel every other group from their racks."""
    pool: Mapping[str, str]
    """The node labels its engine pods require (``render.leaderworkerset.node_selector``)."""
    topology_key: str
    racks: frozenset[str] = frozenset()
    """The racks its groups are in now (values of ``topology_key``)."""

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"


def placement(namespace: str, name: str, admitted: Admitted, racks: Iterable[str] = ()) -> Placement:
    """The ``Placement`` of deployment ``namespace/name`` whose spec admitted to ``admitted``."""
    spec = admitted.spec.scheduling
    return Placement(namespace, name, spec.placement.mode,
                     spec.placement.mode == "exclusive" and admitted.plan.clique_placement,
                     node_selector(admitted), spec.topology_key, frozenset(racks))


def status_racks(obj: dict[str, Any]) -> frozenset[str]:
    """The racks the groups of CR ``obj`` are in, as its status says (``status.groups[].racks``)."""
    groups = [GroupStatus.model_validate(g) for g in (obj.get("status") or {}).get("groups") or []]
    return frozenset(r for g in groups for r in (g.racks or ([g.rack] if g.rack else [])))


def overlap(a: Mapping[str, str], b: Mapping[str, str]) -> bool:
    """Nodes can match both node selectors: no label is required with two different values."""
    return all(a[k] == b[k] for k in a.keys() & b.keys())


def clashes(me: Placement, others: Iterable[Placement]) -> list[Placement]:
    """The ``others`` whose groups and ``me``'s cannot share racks but may be given the same:
    one side placement kueue, the other exclusive with its exclusive topology, node pools that
    overlap. Sorted by namespace/name."""
    def clash(other: Placement) -> bool:
        if (other.namespace, other.name) == (me.namespace, me.name) or not overlap(me.pool, other.pool):
            return False
        return (me.mode == "kueue" and other.repels) or (me.repels and other.mode == "kueue")
    return sorted((o for o in others if clash(o)), key=lambda o: o.ref)


def verdict(me: Placement, found: list[Placement]) -> Verdict:
    """``PlacementConflict``: True ``PlacementModesMixed`` naming each of ``found`` (``clashes``),
    its mode, its racks and those ``me`` holds too, with the fix; else False ``OnePlacementMode``."""
    if not found:
        return Verdict("False", Reason.ONE_PLACEMENT_MODE,
                       "no deployment of the other placement mode shares this deployment's node pool")
    parts = []
    for other in found:
        text = f"{other.ref} (placement {other.mode})"
        if other.racks:
            text += f" has groups in racks {', '.join(sorted(other.racks))}"
            shared = sorted(me.racks & other.racks) if other.topology_key == me.topology_key else []
            if shared:
                text += f" ({', '.join(shared)} also holding this deployment's)"
        parts.append(text)
    kueue_side = "this deployment's" if me.mode == "kueue" else "their"
    return Verdict("True", Reason.PLACEMENT_MODES_MIXED, (
        f"placement {me.mode} on the node pool {', '.join(f'{k}={v}' for k, v in sorted(me.pool.items()))} shared "
        f"with {'; '.join(parts)}: an exclusive group repels every other group from its rack and Kueue does not see "
        f"it, so Kueue may admit {kueue_side} groups into racks they cannot enter (they wait Unschedulable with "
        "their quota held). Use placement kueue for every deployment of this node pool, or give the two modes "
        "disjoint node pools (spec.scheduling.nodeSelector on a label that splits the racks)"))


def names(obj: dict[str, Any], other: Placement) -> bool:
    """CR ``obj``'s stored PlacementConflict is True and names deployment ``other``."""
    said: dict[str, Any] = next((c for c in (obj.get("status") or {}).get("conditions") or []
                                 if c.get("type") == ConditionType.PLACEMENT_CONFLICT), {})
    return said.get("status") == "True" and f"{other.ref} (placement " in (said.get("message") or "")


def event_message(me: Placement, found: list[Placement]) -> str:
    """The Warning Event of a clash (stable while the same deployments clash: no racks in it)."""
    return (f"placement {me.mode} shares its node pool with "
            f"{', '.join(f'{o.ref} (placement {o.mode})' for o in found)}: an exclusive group repels Kueue's groups "
            "from its racks; use one placement mode per node pool (the PlacementConflict condition says more)")


class Placements:
    """Each KimiK3Deployment's ``Placement`` (without racks), derived once per generation and
    kept by uid (thread-safe); a spec admission refuses has none."""

    def __init__(self, policy: AdmissionPolicy = AdmissionPolicy()):
        self.policy = policy
        self._seen: dict[str, tuple[int | None, Placement | None]] = {}
        self._lock = threading.Lock()

    def of(self, obj: dict[str, Any]) -> Placement | None:
        """The ``Placement`` of CR ``obj``, its racks read from its status (``status_racks``)."""
        meta = obj.get("metadata") or {}
        uid, generation = meta.get("uid", ""), meta.get("generation")
        with self._lock:
            kept = self._seen.get(uid)
        if kept is None or kept[0] != generation:
            try:
                found: Placement | None = placement(meta.get("namespace", ""), meta.get("name", ""),
                                                    admit(obj.get("spec") or {}, self.policy))
            except SpecErrors:
                found = None
            kept = (generation, found)
            with self._lock:
                self._seen[uid] = kept
        return None if kept[1] is None else dataclasses.replace(kept[1], racks=status_racks(obj))

    def forget(self, live: Iterable[dict[str, Any]]) -> None:
        """Drop what is kept of deployments not in ``live`` (the CRs seen now)."""
        uids = {(o.get("metadata") or {}).get("uid", "") for o in live}
        with self._lock:
            for uid in [u for u in self._seen if u not in uids]:
                del self._seen[uid]
