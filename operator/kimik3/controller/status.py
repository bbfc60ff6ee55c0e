"""The CR's status from what exists: the LeaderWorkerSet, its pods, and spec problems.

Pure functions (no API calls). Conditions follow the Kubernetes API conventions: a map-list
keyed by type, ``lastTransitionTime`` changed only when ``status`` changes, ``observedGeneration``
on each. Reasons:
- Ready: AllGroupsReady | ScaledToZero | GroupsNotReady | InvalidSpec
- Progressing: Reconciling | GroupsStarting | Stable | InvalidSpec | ApplyFailed
- Degraded: AsExpected | InvalidSpec | ApplyFailed
- ScalingLimited: Unschedulable (True: a group's pod has PodScheduled=False reason Unschedulable,
  i.e. no rack/node can hold it; the message names the group and quotes the scheduler) |
  AllGroupsPlaced (False). Other writers' reasons for ScalingLimited are left alone.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from kimik3.api.v1alpha1 import KimiK3DeploymentSpec, PlanStatus
from kimik3.render.leaderworkerset import lws_name
from kimik3.kube.labels import LWS_GROUP_INDEX_LABEL, LWS_WORKER_INDEX_LABEL
from kimik3.render.meta import Owner, selector_string
from kimik3.render.service import endpoint, leader_selector
from kimik3.topology.plan import GroupPlan


def now_rfc3339() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def set_condition(conditions: list[dict[str, Any]], type_: str, status: str, reason: str, message: str,
                  generation: int | None) -> list[dict[str, Any]]:
    """A copy of ``conditions`` with ``type_`` set; the transition time moves only on a status change."""
    out = [dict(c) for c in conditions if c.get("type") != type_]
    previous = next((c for c in conditions if c.get("type") == type_), None)
    since = previous["lastTransitionTime"] if previous and previous.get("status") == status else now_rfc3339()
    entry = {"type": type_, "status": status, "reason": reason, "message": message[:4096],
             "lastTransitionTime": since}
    if generation is not None:
        entry["observedGeneration"] = generation
    out.append(entry)
    return sorted(out, key=lambda c: c["type"])


def _pod_ready(pod: dict[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in pod.get("status", {}).get("conditions", []))


def _pod_wait_reason(pod: dict[str, Any]) -> str:
    status = pod.get("status", {})
    if pod["metadata"].get("deletionTimestamp"):
        return "Terminating"
    for cs in status.get("containerStatuses", []) or []:
        state = cs.get("state", {})
        if state.get("waiting"):
            return state["waiting"].get("reason", "Waiting")
        terminated = state.get("terminated")
        if terminated:  # an engine that crashed: say which container, with what code and reason
            reason = terminated.get("reason") or "Error"
            return (f"{status.get('phase', 'Failed')}: container {cs.get('name')} exited "
                    f"{terminated.get('exitCode', '?')} ({reason})")
    for cond in status.get("conditions", []) or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            return f"Unschedulable: {cond.get('message', '')}".strip()
    return status.get("phase", "Pending")


def unschedulable_groups(pods: list[dict[str, Any]]) -> dict[str, tuple[str, str]]:
    """Groups the scheduler cannot place: ``{group index: (pod name, scheduler message)}``.

    A group counts when any of its pods (not being deleted) has the condition
    ``PodScheduled=False`` with reason ``Unschedulable`` (set by kube-scheduler when no node
    fits, e.g. no NVL72 rack has room for the group). The first such pod by name is quoted.
    """
    out: dict[str, tuple[str, str]] = {}
    for pod in sorted(pods, key=lambda p: p["metadata"]["name"]):
        if pod["metadata"].get("deletionTimestamp"):
            continue
        for cond in pod.get("status", {}).get("conditions", []) or []:
            if cond.get("type") == "PodScheduled" and cond.get("status") == "False" \
                    and cond.get("reason") == "Unschedulable":
                group = pod["metadata"].get("labels", {}).get(LWS_GROUP_INDEX_LABEL, "?")
                out.setdefault(group, (pod["metadata"]["name"], cond.get("message", "").strip()))
    return dict(sorted(out.items(), key=lambda kv: int(kv[0]) if kv[0].isdigit() else 1 << 30))


def scaling_limited_message(unplaced: dict[str, tuple[str, str]]) -> str:
    """``ScalingLimited`` message for ``unschedulable_groups(...)`` (non-empty)."""
    groups = ", ".join(unplaced)
    parts = [f"group {g}: pod {pod} is Unschedulable: {msg or '(no scheduler message)'}"
             for g, (pod, msg) in unplaced.items()]
    noun = "group" if len(unplaced) == 1 else "groups"
    return f"{noun} {groups} cannot be placed now (no rack or node has room); " + "; ".join(parts)


def waiting_for(pods: list[dict[str, Any]], spec: KimiK3DeploymentSpec, plan: GroupPlan,
                desired_groups: int) -> str:
    """What the groups wait for, in words (failure case F1: the status says what it waits for):
    the first pod that is not Ready or is terminating (leaders first), else the first group of
    ``0..desired_groups-1`` with fewer than ``plan.nodes_per_group`` pods; "" when neither."""
    not_ready = [p for p in pods if p["metadata"].get("deletionTimestamp") or not _pod_ready(p)]
    if not not_ready:
        present: dict[str, int] = {}
        for pod in pods:
            group = pod["metadata"].get("labels", {}).get(LWS_GROUP_INDEX_LABEL, "?")
            present[group] = present.get(group, 0) + 1
        short = [g for g in range(desired_groups) if present.get(str(g), 0) < plan.nodes_per_group]
        if not short:
            return ""
        text = (f"group {short[0]}: {present.get(str(short[0]), 0)}/{plan.nodes_per_group} pods exist; "
                "the LeaderWorkerSet is (re)creating them")
        return text + (f" ({len(short)} groups short of pods)" if len(short) > 1 else "")
    leaders = [p for p in not_ready if p["metadata"].get("labels", {}).get(LWS_WORKER_INDEX_LABEL) == "0"]
    pod = (leaders or not_ready)[0]
    labels = pod["metadata"].get("labels", {})
    group = labels.get(LWS_GROUP_INDEX_LABEL, "?")
    role = "leader" if labels.get(LWS_WORKER_INDEX_LABEL) == "0" else "worker"
    text = f"group {group}: {role} pod {pod['metadata']['name']} is {_pod_wait_reason(pod)}"
    if role == "leader" and plan.multi_node:
        text += (f"; its workers wait for the leader address up to {spec.probes.leader_address_timeout} "
                 f"(probes.leaderAddressTimeout), and the leader has {spec.probes.load_timeout} to load "
                 "(probes.loadTimeout)")
    if len(not_ready) > 1:
        text += f" ({len(not_ready)} pods not ready)"
    return text


def compute_status(obj: dict[str, Any], spec: KimiK3DeploymentSpec, plan: GroupPlan,
                   lws: dict[str, Any] | None, pods: list[dict[str, Any]], desired_groups: int,
                   apply_error: str | None = None, compute_domain_note: str | None = None) -> dict[str, Any]:
    """Status of a reconciled CR (spec valid). ``desired_groups`` is the LWS's spec.replicas."""
    owner = Owner.from_object(obj)
    previous = obj.get("status") or {}
    gen = obj["metadata"].get("generation")
    lws_status = (lws or {}).get("status") or {}
    groups = int(lws_status.get("replicas", 0) or 0)
    ready = int(lws_status.get("readyReplicas", 0) or 0)
    conditions = previous.get("conditions", [])
    if desired_groups == 0:
        ready_c = ("True", "ScaledToZero", "replicas is 0: no groups run and no GPUs are held")
    elif ready >= desired_groups:
        ready_c = ("True", "AllGroupsReady", f"{ready}/{desired_groups} groups ready")
    else:
        detail = waiting_for(pods, spec, plan, desired_groups)
        if not detail:
            detail = ("every pod is Ready; waiting for the LeaderWorkerSet to count the groups ready" if pods
                      else "waiting for the LeaderWorkerSet to create the groups")
        msg = f"{ready}/{desired_groups} groups ready; {detail}"
        ready_c = ("False", "GroupsNotReady", msg)
    conditions = set_condition(conditions, "Ready", *ready_c, gen)
    settled = ready_c[0] == "True" and groups == desired_groups
    if apply_error:
        conditions = set_condition(conditions, "Progressing", "True", "ApplyFailed",
                                   f"children not applied yet (retrying with back-off): {apply_error}", gen)
    else:
        conditions = set_condition(conditions, "Progressing", "False" if settled else "True",
                                   "Stable" if settled else "GroupsStarting",
                                   "children applied; all groups as desired" if settled else ready_c[2], gen)
    unplaced = unschedulable_groups(pods)
    previous_limit = next((c for c in conditions if c.get("type") == "ScalingLimited"), None)
    if unplaced:
        conditions = set_condition(conditions, "ScalingLimited", "True", "Unschedulable",
                                   scaling_limited_message(unplaced), gen)
    elif previous_limit is None or previous_limit.get("reason") in ("Unschedulable", "AllGroupsPlaced"):
        conditions = set_condition(conditions, "ScalingLimited", "False", "AllGroupsPlaced",
                                   "the scheduler has placed every pod of every group", gen)
    if apply_error:
        conditions = set_condition(conditions, "Degraded", "True", "ApplyFailed", apply_error, gen)
    else:
        conditions = set_condition(conditions, "Degraded", "False", "AsExpected", "children applied", gen)
    status = {
        "observedGeneration": gen,
        "conditions": conditions,
        "replicas": groups,
        "readyReplicas": ready,
        "selector": selector_string(leader_selector(owner)),
        "endpoint": endpoint(owner, spec),
        "plan": PlanStatus(gpus_per_node=plan.gpus_per_node, nodes_per_group=plan.nodes_per_group,
                           gpus_per_group=plan.gpus_per_group,
                           compute_domain=plan.needs_compute_domain and not compute_domain_note,
                           compute_domain_note=compute_domain_note if plan.needs_compute_domain else None,
                           ).model_dump(by_alias=True, exclude_none=True),
    }
    return status


def invalid_status(obj: dict[str, Any], problems: str) -> dict[str, Any]:
    """Status of a CR whose spec the operator refuses: nothing was changed, every problem named."""
    previous = obj.get("status") or {}
    gen = obj["metadata"].get("generation")
    conditions = previous.get("conditions", [])
    for type_, status in (("Ready", "False"), ("Progressing", "False"), ("Degraded", "True")):
        conditions = set_condition(conditions, type_, status, "InvalidSpec", problems, gen)
    return {"observedGeneration": gen, "conditions": conditions}


def lws_selector(owner: Owner) -> str:
    """Selector of every pod of the deployment's LeaderWorkerSet."""
    return f"leaderworkerset.sigs.k8s.io/name={lws_name(owner)}"
