"""What a deployment's ComputeDomain says, as a condition that never decides readiness (F19).

The NVIDIA DRA driver writes a ComputeDomain's ``status.status`` (``Ready`` / ``NotReady``) and
``status.nodes`` (``[{name, ipAddress, cliqueID, index, status}]``, one per node whose IMEX
daemon joined). After a tray replacement it was seen to list 1 of 2 nodes and stay ``NotReady``
for 20 minutes while the engine served (failure case F19 a), so:

- ``Ready`` comes from the groups (the LeaderWorkerSet's ready groups, i.e. the leaders'
  ``/health``), never from the ComputeDomain;
- ``ComputeDomainReady`` reports the domain: True ``AllNodesJoined`` when every node that runs a
  pod of the deployment is listed Ready; False ``NodesMissing`` naming the nodes seen and the
  nodes missing, with the driver's own status; Unknown ``NotReported`` before the driver wrote a
  status or while no pod is on a node;
- the operator never deletes and recreates a ComputeDomain that pods use (reconcile.py, F4).
"""

from __future__ import annotations

from typing import Any

from kimik3.api.conditions import Reason, Verdict

__all__ = ["compute_domain_verdict"]


def compute_domain_verdict(domain: dict[str, Any] | None, pods: list[dict[str, Any]]) -> Verdict | None:
    """The ``ComputeDomainReady`` verdict of ``domain`` (None when the deployment has none) for
    the deployment's ``pods``."""
    if domain is None:
        return None
    name = domain["metadata"]["name"]
    expected = sorted({n for p in pods if (n := (p.get("spec") or {}).get("nodeName"))})
    status = domain.get("status") or {}
    if not expected or not status:
        return Verdict("Unknown", Reason.NOT_REPORTED,
                       f"ComputeDomain {name}: " + ("no engine pod is on a node yet" if not expected else
                                                    "the DRA driver has not reported its status yet"))
    seen = sorted({n["name"] for n in status.get("nodes") or [] if n.get("name") and n.get("status", "Ready") == "Ready"})
    missing = [n for n in expected if n not in seen]
    overall = status.get("status") or "unknown"
    if not missing:
        return Verdict("True", Reason.ALL_NODES_JOINED,
                       f"ComputeDomain {name} ({overall}): {len(expected)}/{len(expected)} nodes of the engine pods joined")
    return Verdict("False", Reason.NODES_MISSING,
                   f"ComputeDomain {name} ({overall}) lists {len(expected) - len(missing)} of {len(expected)} nodes "
                   f"of the engine pods: seen {', '.join(seen) or 'none'}; missing {', '.join(missing)}. Readiness "
                   "still comes from the groups' /health; the ComputeDomain is not recreated while pods use it")
