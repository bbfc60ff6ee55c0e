"""Where the weights and the drafter come from: exactly one source; a hostPath only below the
folders the cluster allows (``AdmissionPolicy.allowed_host_paths``): a CR must not mount
arbitrary node paths into pods; a model cache either staged from the hub or declared ready; and
a drafter an offline engine can load (failure case F23)."""

from __future__ import annotations

import posixpath

from kimik3.admission.rules import Candidate, Rule, Table, example, refuse
from kimik3.api.errors import SpecError
from kimik3.engine.weights import MODEL_MOUNT, is_local_path, offline


def exactly_one_source(c: Candidate) -> list[SpecError]:
    src = c.spec.model.source
    return refuse(sum(x is not None for x in (src.pvc, src.host_path, src.hub, src.cache)) != 1, "spec.model.source",
                  "set exactly one of pvc, hostPath, hub, cache")


def cache_hub_or_declared_ready(c: Candidate) -> list[SpecError]:
    cache = c.spec.model.source.cache
    return refuse(cache is not None and (cache.hub is None) == (not cache.declared_ready), "spec.model.source.cache",
                  "set exactly one of hub (the operator stages the cache) or declaredReady: true (the volume "
                  "already holds the layout <repo id>/<revision>/)")


def drafter_local_when_offline(c: Candidate) -> list[SpecError]:
    """F23: engines of a pvc or hostPath source run with HF_HUB_OFFLINE=1, and vLLM turns a hub
    id into a local path offline only for the target and its tokenizer (vllm#29706): a drafter
    named by hub id would stop the engine at start with "Invalid repository ID or local
    directory specified". A cache source stages the drafter (its hub id is fine there)."""
    spec = c.spec
    sd, src = spec.speculative_decoding, spec.model.source
    if sd.method == "none" or not sd.draft_model or not offline(spec) or src.cache is not None:
        return []
    used = "pvc" if src.pvc is not None else "hostPath"
    return refuse(not is_local_path(sd.draft_model), "spec.speculativeDecoding.draftModel",
                  f"{sd.draft_model} is a hub id, but the engines run offline (HF_HUB_OFFLINE=1, weights from "
                  f"spec.model.source.{used}) and vLLM resolves no drafter by hub id offline, so the engine would "
                  f"exit at start with \"Invalid repository ID or local directory specified\" (F23): use "
                  f"spec.model.source.cache, which stages {sd.draft_model} beside the target, or give draftModel "
                  f"as the drafter's folder in the weights volume (below {MODEL_MOUNT}/, e.g. "
                  f"{MODEL_MOUNT}/{sd.draft_model.rsplit('/', 1)[-1]})")


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
    Rule(cache_hub_or_declared_ready, example(model={"source": {"cache": {"claimName": "kimi-k3-cache"}}}),
         cel=("model-cache-hub-or-declared-ready",)),
    Rule(drafter_local_when_offline,
         example(speculativeDecoding={"method": "dspark", "draftModel": "Inferact/Kimi-K3-DSpark",
                                      "numSpeculativeTokens": 7}),
         cel=("drafter-local-when-offline",)),
    Rule(host_path_inside_allowed_folders, example(model={"source": {"hostPath": {"path": "/etc/kubernetes"}}}),
         operator_only="the allowed folders are the operator's flag (kimik3 run --allowed-host-path), set per "
                       "cluster by the platform team: the CRD, the same on every cluster, cannot know them"),
))
