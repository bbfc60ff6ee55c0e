"""Group replacement and garbage collection on the dev cluster.

F14 (failure-cases.md): replicas=3, group size 4; a worker of group 1 is deleted (its
StatefulSet brings a same-named pod back at once) -> group 1 is recreated once
(RecreateGroupOnPodRestart), groups 0 and 2 keep their pods, and the CR's status follows
without flapping. Deleting the CR removes every child through owner references.
"""

from __future__ import annotations

import time

from devenv import WAIT_S, DevEnv

from kimik3_dev.devcluster.rollout import Recorder
from kimik3.kube.labels import LWS_GROUP_INDEX_LABEL
from support.waiting import wait_for

TRAYS_TP16 = 4
TRAYS_TP8 = 2
SETTLE_S = 3.0
"""Seconds the status is still watched after recovery, to catch late flapping."""


def _uids(groups: dict[int, list[dict]]) -> dict[int, list[str]]:
    return {g: [p["metadata"]["uid"] for p in pods] for g, pods in groups.items()}


def _ready_and_count(env: DevEnv, ns: str) -> tuple[str, int] | None:
    cr = env.get_cr(ns)
    status = (cr or {}).get("status") or {}
    ready = next((c["status"] for c in status.get("conditions", []) if c["type"] == "Ready"), None)
    return (ready, status.get("readyReplicas")) if ready else None


def _replace_worker_and_check(env: DevEnv, ns: str, size: int, count: int, victim_group: int) -> None:
    before = _uids(wait_for(lambda: env.ready_groups(ns, size, count), WAIT_S, f"{count} ready groups of {size}"))
    wait_for(lambda: _ready_and_count(env, ns) == ("True", count), WAIT_S, "status Ready with all groups")
    leader = f"k3-engine-{victim_group}"
    victim = f"{leader}-{size - 1}"  # the last worker of the group

    def leader_uid() -> str | None:
        pod = env.rest.get(f"/api/v1/namespaces/{ns}/pods/{leader}")
        return pod["metadata"]["uid"] if pod else None

    with Recorder(lambda: _ready_and_count(env, ns)) as status, Recorder(leader_uid) as leaders:
        env.rest.delete(f"/api/v1/namespaces/{ns}/pods/{victim}")

        def recreated() -> dict | None:
            groups = env.ready_groups(ns, size, count)
            if groups and not set(_uids(groups)[victim_group]) & set(before[victim_group]):
                return groups
            return None
        after = _uids(wait_for(recreated, WAIT_S, f"group {victim_group} recreated with new pods"))
        wait_for(lambda: _ready_and_count(env, ns) == ("True", count), WAIT_S, "status Ready again")
        time.sleep(SETTLE_S)

    for g in range(count):
        if g != victim_group:
            assert after[g] == before[g], f"group {g} was touched"
    assert len(after[victim_group]) == size
    # recreated exactly once: the old leader, then one new leader
    uids = [u for u in leaders.values if u]
    assert uids[0] == before[victim_group][0]
    assert len(set(uids)) == 2, f"group {victim_group} leader UIDs seen: {uids}"
    # no flapping: Ready went True -> (False ->) True once, never fewer than count-1 ready groups
    readiness = [r for r, _ in status.values]
    compressed = [r for i, r in enumerate(readiness) if i == 0 or readiness[i - 1] != r]
    assert compressed in (["True"], ["True", "False", "True"]), status.values
    assert min(n for _, n in status.values) >= count - 1, status.values
    assert status.values[-1] == ("True", count)


def test_f14_worker_of_group_1_deleted_recreates_only_group_1(dev_env: DevEnv, ns: str) -> None:
    dev_env.apply(dev_env.deployment(ns, replicas=3, tensor_parallel=16))  # TP16: 4 trays per group
    _replace_worker_and_check(dev_env, ns, TRAYS_TP16, 3, victim_group=1)
    groups = dev_env.groups(ns)
    for index, pods in groups.items():
        assert len(dev_env.cliques(pods)) == 1, f"group {index} left its rack"


def test_deleted_worker_pod_recreates_only_its_group(dev_env: DevEnv, ns: str) -> None:
    dev_env.apply(dev_env.deployment(ns, replicas=2))
    _replace_worker_and_check(dev_env, ns, TRAYS_TP8, 2, victim_group=0)


CHILD_LISTS = {
    "LeaderWorkerSet": "/apis/leaderworkerset.x-k8s.io/v1/namespaces/{ns}/leaderworkersets",
    "StatefulSet": "/apis/apps/v1/namespaces/{ns}/statefulsets",
    "ControllerRevision": "/apis/apps/v1/namespaces/{ns}/controllerrevisions",
    "Pod": "/api/v1/namespaces/{ns}/pods",
    "Service": "/api/v1/namespaces/{ns}/services",
    "ConfigMap": "/api/v1/namespaces/{ns}/configmaps",
    "PodDisruptionBudget": "/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets",
    "PodMonitor": "/apis/monitoring.coreos.com/v1/namespaces/{ns}/podmonitors",
}


def _children(env: DevEnv, ns: str) -> dict[str, list[str]]:
    out = {}
    for kind, path in CHILD_LISTS.items():
        names = [o["metadata"]["name"] for o in env.rest.items(path.format(ns=ns))]
        out[kind] = [n for n in names if n != "kube-root-ca.crt"]  # published into every namespace
    return out


def test_deleting_the_cr_removes_everything(dev_env: DevEnv, ns: str) -> None:
    dev_env.apply(dev_env.deployment(ns, replicas=2))
    groups = wait_for(lambda: dev_env.ready_groups(ns, TRAYS_TP8, 2), WAIT_S, "2 ready groups")
    assert {int(p["metadata"]["labels"][LWS_GROUP_INDEX_LABEL]) for g in groups.values() for p in g} == {0, 1}
    present = _children(dev_env, ns)
    assert present["LeaderWorkerSet"] == ["k3-engine"]
    assert sorted(present["StatefulSet"]) == ["k3-engine", "k3-engine-0", "k3-engine-1"]
    assert len(present["Pod"]) == 4
    assert "k3" in present["Service"] and any(c.startswith("k3-launcher-") for c in present["ConfigMap"]) and present["PodMonitor"] == ["k3"]

    dev_env.rest.delete(dev_env.cr_path(ns))
    wait_for(lambda: dev_env.get_cr(ns) is None, WAIT_S, "the CR to be gone (operator finalizer released)")
    left: dict[str, list[str]] = {}

    def all_gone() -> bool:
        left.clear()
        left.update({kind: names for kind, names in _children(dev_env, ns).items() if names})
        return not left
    try:
        wait_for(all_gone, WAIT_S, "every child to be garbage-collected")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; still there: {left}") from None
    assert _children(dev_env, ns) == {kind: [] for kind in CHILD_LISTS}
