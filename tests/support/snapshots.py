"""Builders of what the reconcile's steps read, for tests that call them without a cluster: a
``controller.snapshot.Snapshot`` from a CR, its LeaderWorkerSets (as ``engine_sets`` made them)
and pods, and ``compute_status`` over it. Names and derivations come from the core itself."""

from __future__ import annotations

from typing import Any

from kimik3.admission import Admitted
from kimik3.api.v1alpha1 import KimiK3DeploymentStatus
from kimik3.controller.fleet import EngineSet
from kimik3.controller.snapshot import Snapshot, domains_of_groups
from kimik3.controller.status import Observed, compute_status
from kimik3.kube.groups import groups_of
from kimik3.render.meta import Owner
from kimik3.topology.capacity import Domain


def snapshot(obj: dict[str, Any], admitted: Admitted, sets: list[EngineSet], pods: list[dict[str, Any]],
             workloads: list[dict[str, Any]] | None = None, racks: dict[str, str] | None = None,
             free_block: Domain | None = None) -> Snapshot:
    """The snapshot of ``obj`` holding ``sets`` and ``pods`` (grouped as the reader groups them,
    with the trays' ``racks``: node name -> NVLink domain)."""
    racks = racks or {}
    return Snapshot(obj, Owner.from_object(obj), pods,
                    groups_of(pods, admitted.plan.nodes_per_group, domains_of_groups(admitted, racks)), sets,
                    workloads, racks, free_block=free_block)


def status(obj: dict[str, Any], admitted: Admitted, sets: list[EngineSet], target: EngineSet | None,
           pods: list[dict[str, Any]], desired: int, workloads: list[dict[str, Any]] | None = None,
           racks: dict[str, str] | None = None, free_block: Domain | None = None,
           **observed: Any) -> KimiK3DeploymentStatus:
    """``compute_status`` of that snapshot, with ``observed`` (``controller.status.Observed``'s fields)."""
    return compute_status(snapshot(obj, admitted, sets, pods, workloads, racks, free_block), admitted,
                          Observed(desired, target, **observed))
