"""What engine groups wait for, in words (failure case F1: the status says what it waits for).

``waiting_for(pods, admitted, desired_groups)`` names the first pod that is not Ready and why
(its container's waiting reason such as ``ImagePullBackOff`` or ``ContainerCreating``, a crashed
container's exit code, the scheduler's or Kueue's hold, or the leader still loading within
``probes.loadTimeout``), else the first group short of pods. The Ready condition quotes it
(``controller.status``), and so does a release rolled back at its progress deadline
(``controller.rollout``). Pure functions over the pods as read.
"""

from __future__ import annotations

from typing import Any

from kimik3.admission import Admitted
from kimik3.kube.pods import (group_index, is_leader, is_ready, is_terminating, phase, role, scheduling_gates,
                              scheduling_problem)

KUEUE_GATE_PREFIX = "kueue.x-k8s.io/"
"""Kueue's scheduling gates (``admission``, ``topology``) on the pods of a group it has not admitted."""


def pod_wait_reason(pod: dict[str, Any]) -> str:
    """Why ``pod`` is not Ready, in a word or a phrase: Terminating, its container's waiting
    reason (``ImagePullBackOff``, ``ContainerCreating``...), a crashed container's exit, the
    scheduler's problem, else its phase."""
    if is_terminating(pod):
        return "Terminating"
    status = pod.get("status") or {}
    for cs in status.get("containerStatuses", []) or []:
        state = cs.get("state", {})
        if state.get("waiting"):
            return str(state["waiting"].get("reason", "Waiting"))
        terminated = state.get("terminated")
        if terminated:  # an engine that crashed: say which container, with what code and reason
            reason = terminated.get("reason") or "Error"
            return (f"{status.get('phase', 'Failed')}: container {cs.get('name')} exited "
                    f"{terminated.get('exitCode', '?')} ({reason})")
    return scheduling_problem(pod) or phase(pod) or "Pending"


def waiting_for(pods: list[dict[str, Any]], admitted: Admitted, desired_groups: int) -> str:
    """What the groups wait for, in words (failure case F1: the status says what it waits for):
    the first pod that is not Ready (``kube.pods.is_ready``: terminating pods are not; leaders
    first), else the first group of ``0..desired_groups-1`` with fewer than
    ``plan.nodes_per_group`` pods; "" when neither."""
    spec, plan = admitted.spec, admitted.plan
    not_ready = [p for p in pods if not is_ready(p)]
    if not not_ready:
        present: dict[str, int] = {}
        for pod in pods:
            group = group_index(pod) or "?"
            present[group] = present.get(group, 0) + 1
        short = [g for g in range(desired_groups) if present.get(str(g), 0) < plan.nodes_per_group]
        if not short:
            return ""
        text = (f"group {short[0]}: {present.get(str(short[0]), 0)}/{plan.nodes_per_group} pods exist; "
                "the LeaderWorkerSet is (re)creating them")
        return text + (f" ({len(short)} groups short of pods)" if len(short) > 1 else "")
    leaders = [p for p in not_ready if is_leader(p)]
    pod = (leaders or not_ready)[0]
    gates = scheduling_gates(pod)
    if any(g.startswith(KUEUE_GATE_PREFIX) for g in gates):
        text = (f"group {group_index(pod) or '?'}: {role(pod)} pod {pod['metadata']['name']} is gated until "
                "Kueue admits its group (ScalingLimited says why)")
    else:
        text = (f"group {group_index(pod) or '?'}: {role(pod)} pod {pod['metadata']['name']} is "
                f"{pod_wait_reason(pod)}")
    if is_leader(pod) and plan.multi_node and not gates:
        text += (f"; its workers wait for the leader address up to {spec.probes.leader_address_timeout} "
                 f"(probes.leaderAddressTimeout), and the leader has {spec.probes.load_timeout} to load "
                 "(probes.loadTimeout)")
    if len(not_ready) > 1:
        text += f" ({len(not_ready)} pods not ready)"
    return text
