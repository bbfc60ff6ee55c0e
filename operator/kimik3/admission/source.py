"""Where the weights come from: exactly one source, and a hostPath only below the folders the
cluster allows (``AdmissionPolicy.allowed_host_paths``): a CR must not mount arbitrary node
paths into pods."""

from __future__ import annotations

import posixpath

from kimik3.admission.rules import Candidate, Rule, Table, example, refuse
from kimik3.api.errors import SpecError


def exactly_one_source(c: Candidate) -> list[SpecError]:
    src = c.spec.model.source
    return refuse(sum(x is not None for x in (src.pvc, src.host_path, src.hub)) != 1, "spec.model.source",
                  "set exactly one of pvc, hostPath, hub")


def host_path_inside_allowed_folders(c: Candidate) -> list[SpecError]:
    """Refuses a hostPath outside the allowed folders, or not in normal form (e.g. with ``..``)."""
    source = c.spec.model.source.host_path
    if source is None:
        return []
    path, allowed = source.path, c.policy.allowed_host_paths
    normal = posixpath.normpath(path)
    inside = any(normal == p or normal.startswith(p.rstrip("/") + "/") for p in allowed)
    if normal == path.rstrip("/") and inside:
        return []
    return [SpecError("spec.model.source.hostPath.path",
                      f"{path} is outside the node folders this cluster allows for weights "
                      f"({', '.join(allowed) or 'none (hostPath is disabled)'}): use a folder below one of them, "
                      "or a pvc source")]


SOURCE = Table("source", (
    Rule(exactly_one_source, example(model={"source": {"pvc": {"claimName": "weights"}, "hub": {}}}),
         cel=("model-source-exactly-one",)),
    Rule(host_path_inside_allowed_folders, example(model={"source": {"hostPath": {"path": "/etc/kubernetes"}}}),
         operator_only="the allowed folders are the operator's flag (kimik3 run --allowed-host-path), set per "
                       "cluster by the platform team: the CRD, the same on every cluster, cannot know them"),
))
