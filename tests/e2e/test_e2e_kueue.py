"""Kueue placement on ``kimik3 dev up`` with the real Kueue manager (``KUEUE_VERSION``): 2 NVL72 racks of 18
GB300 trays (144 GPUs), as a real GB300 NVL72 pair of racks looks to Kubernetes.

- Packing: 9 TP8 groups (2 trays each) fill rack 0 exactly, the 10th goes to rack 1 (best fit,
  not one rack per group as in exclusive placement); no group ever spans racks.
- Gang: Kueue admits a group whole; a group gated by quota has no pod bound, and an admitted one
  has all its pods bound within ``GANG_SKEW_S``.
- Sharing: 4 TP16 groups and another tenant's TP8 group fill one rack exactly.
- Quota: a tenant whose ClusterQueue holds 16 GPUs gets 2 TP8 groups of 3; raising the quota
  admits the third without an edit of the CR.
- Priority: ``dev up --tenant low=72:100 --tenant high=72:1000``; low fills both racks (borrowing
  high's idle quota through their Cohort); high's new group preempts one of low's groups (both CRs
  and their Events say so); the preempted group comes back once high's group is gone.
- Reserved and burst (``placement.burstPriorityClass``): low fills both racks with 9 reserved and
  9 burst groups (its 72 GPUs of quota and high's idle 72); high's reserved group preempts one of
  low's burst groups, never a reserved one (each Workload's priority written by the operator; the
  ClusterQueues reclaim ``LowerPriority`` only); both CRs, their Events and the operator's GPU series
  by capacity say so.
- Two modes on one pool: an exclusive deployment beside a kueue one is named on both CRs
  (``PlacementConflict``).
- No silent fallback: with Kueue's mutating webhooks unregistered, a deployment whose LocalQueue
  Kueue reports active creates no group and says ``KueueWebhookMissing``; once they are back, its
  groups are admitted and placed by Kueue.
- Failure case: the Kueue manager SIGKILLed while it admits a deployment's groups and started again
  loses no group and duplicates none.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator

import pytest
from devenv import DevEnv, dev_cluster

from kimik3.controller.kube import ApiError
from kimik3.kube import pods as kpods
from kimik3.kube.labels import KUEUE_WORKLOAD_INDEX_ANNOTATION
from kimik3.render.meta import engine_set_name
from kimik3_dev.devcluster import kueue
from kimik3_dev.devcluster.cluster import UpOptions
from kimik3_dev.devcluster.kueue import Tenant
from kimik3_dev.devcluster.racks import RackShape
from kimik3_dev.devcluster.rollout import Recorder
from support.cluster import metric, metric_samples
from support.waiting import wait_for

RACKS, TRAYS = 2, 18
WAIT_S = 150.0
TENANTS = (Tenant("low", 72, 100), Tenant("high", 72, 1000))
"""Half the cluster's 144 GPUs each, in one Cohort; high's groups outrank low's."""


@pytest.fixture(scope="module")
def kueue_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevEnv]:
    """``kimik3 dev up`` with Kueue, 2 racks x 18 GB300 trays, no simulator or Prometheus."""
    with dev_cluster(tmp_path_factory.mktemp("dev-kueue"),
                     UpOptions(shape=RackShape(profile="gb300", racks=RACKS, trays_per_rack=TRAYS), sim=False,
                               prometheus=False, die_with_parent=True, wait_timeout_s=180.0,
                               tenants=TENANTS)) as env:
        yield env


@pytest.fixture
def tenant(kueue_env: DevEnv) -> Iterator[str]:
    """A fresh namespace, its deployment's pods gone afterwards (``DevEnv.fresh_namespace``)."""
    with kueue_env.fresh_namespace("tenant", WAIT_S) as name:
        yield name


def packed(env: DevEnv, namespace: str, replicas: int, queue: str = kueue.LOCAL_QUEUE) -> dict:
    cr = env.deployment(namespace, replicas=replicas)
    cr["spec"]["scheduling"] = {"placement": {"mode": "kueue", "queueName": queue}}
    return cr


def admitted(workload: dict) -> bool:
    return any(c["type"] == "Admitted" and c["status"] == "True"
               for c in (workload.get("status") or {}).get("conditions", []))


GANG_SKEW_S = 30.0
"""Longest a group may have some pods bound and others not. LWS creates the worker pods only
after the leader (startupPolicy LeaderCreated), so a worker may be created after Kueue admitted
the group and its leader was bound (measured here: up to 3.5 s on a loaded 2-core machine); Kueue
has reserved the whole group's quota and rack by then (``unadmitted_but_bound`` stays empty)."""


def group_binding(env: DevEnv, namespace: str) -> tuple[float, dict[int, int], frozenset[int]]:
    """(monotonic time, pods bound to a node per group index, groups with a pod bound whose
    Workload Kueue has not admitted)."""
    bound = {i: sum(1 for p in pods if p["spec"].get("nodeName")) for i, pods in env.groups(namespace).items()}
    workloads = env.rest.items(f"/apis/{kueue.API_VERSION}/namespaces/{namespace}/workloads")
    admitted_groups = {int(w["metadata"]["annotations"][KUEUE_WORKLOAD_INDEX_ANNOTATION]) for w in workloads
                       if admitted(w)}
    return time.monotonic(), bound, frozenset(g for g, n in bound.items() if n and g not in admitted_groups)


def gang_skews(samples: list[tuple[float, dict[int, int], frozenset[int]]], size: int) -> dict[int, float]:
    """Per group: seconds between its first pod bound and all ``size`` pods bound."""
    first: dict[int, float] = {}
    full: dict[int, float] = {}
    for at, bound, _ in samples:
        for group, n in bound.items():
            if n and group not in first:
                first[group] = at
            if n == size and group not in full:
                full[group] = at
    return {g: full.get(g, float("inf")) - first[g] for g in first}


def test_nine_tp8_groups_fill_rack_0_and_the_tenth_lands_in_rack_1(kueue_env: DevEnv, tenant: str) -> None:
    env = kueue_env
    with Recorder(lambda: group_binding(env, tenant), period_s=0.2) as binding:
        env.apply(packed(env, tenant, replicas=10))
        groups = wait_for(lambda: env.ready_groups(tenant, 2, 10), WAIT_S, "10 TP8 groups Ready")
    racks = {i: env.cliques(pods) for i, pods in groups.items()}
    assert all(len(r) == 1 for r in racks.values()), f"a group spans racks: {racks}"
    per_rack: dict[str | None, int] = {}
    for (rack,) in racks.values():
        per_rack[rack] = per_rack.get(rack, 0) + 1
    assert sorted(per_rack.values()) == [1, 9], per_rack  # best fit: one rack full, then the next
    full = next(r for r, n in per_rack.items() if n == 9)
    trays = {p["spec"]["nodeName"] for i, pods in groups.items() if racks[i] == {full} for p in pods}
    assert len(trays) == TRAYS  # all 18 trays of that rack, each tray held by one group
    skews = gang_skews(binding.values, 2)
    print(f"gang skew per group, s: {skews}")
    assert sorted(skews) == list(range(10)) and max(skews.values()) <= GANG_SKEW_S, skews
    assert [s[2] for s in binding.values if s[2]] == []  # no pod bound before its group was admitted
    for pods in groups.values():
        assert all(not p["spec"].get("schedulingGates") for p in pods)
    workloads = env.rest.items(f"/apis/{kueue.API_VERSION}/namespaces/{tenant}/workloads")
    assert len(workloads) == 10
    assert all(admitted(w) for w in workloads)
    # status.groups: each group once, its rack (from the node selector Kueue wrote) and trays as bound
    status = wait_for(lambda: (cr := env.get_cr(tenant)) and len((cr.get("status") or {}).get("groups") or []) == 10
                      and all(g["ready"] for g in cr["status"]["groups"]) and cr["status"], WAIT_S,
                      "status.groups with 10 ready groups")
    for g in status["groups"]:
        pods = sorted(groups[g["index"]], key=kpods.worker_index)
        assert (g["kueue"], g["rack"], g["trays"]) == ("Admitted", *racks[g["index"]], [p["spec"]["nodeName"] for p in pods])
    admitted_events = [e for e in env.events(tenant) if e["reason"] == "GroupAdmitted"]
    assert len(admitted_events) == 10, [e["message"] for e in admitted_events]


def test_quota_of_16_gpus_admits_two_groups_and_a_raise_admits_the_third(kueue_env: DevEnv, tenant: str) -> None:
    env = kueue_env
    flavor = "gb300"
    queue = kueue.cluster_queue(f"{tenant}-cq", flavor, gpus=16, namespaces=[tenant])
    env.rest.apply(kueue.object_path(queue), queue)
    try:
        local = kueue.local_queue(tenant, queue["metadata"]["name"], "own")
        env.rest.apply(kueue.object_path(local), local)
        env.apply(packed(env, tenant, replicas=3, queue="own"))

        def two_running_one_gated() -> dict | None:
            groups = env.groups(tenant)
            if len(groups) != 3:
                return None
            running = [i for i, p in groups.items() if len(p) == 2 and all(kpods.is_ready(x) for x in p)]
            gated = [i for i, p in groups.items() if all(x["spec"].get("schedulingGates") for x in p)]
            return groups if len(running) == 2 and len(gated) == 1 else None
        wait_for(two_running_one_gated, WAIT_S, "2 groups admitted and 1 gated by quota")
        workloads = env.rest.items(f"/apis/{kueue.API_VERSION}/namespaces/{tenant}/workloads")
        pending = [w for w in workloads if not admitted(w)]
        (wl,) = pending
        reserved = next(c for c in wl["status"]["conditions"] if c["type"] == "QuotaReserved")
        assert reserved["status"] == "False"
        assert "insufficient unused quota for nvidia.com/gpu" in reserved["message"], reserved["message"]
        limited = wait_for(lambda: (c := env.condition(tenant, "ScalingLimited")) and c["reason"] == "QuotaExhausted"
                           and c, WAIT_S, "ScalingLimited=True QuotaExhausted on the CR")
        assert limited["status"] == "True"
        assert "not admitted by Kueue (LocalQueue own)" in limited["message"]
        assert "insufficient unused quota for nvidia.com/gpu" in limited["message"]
        assert any(e["reason"] == "QuotaExhausted" and e["type"] == "Warning" for e in env.events(tenant))
        gated = int(wl["metadata"]["annotations"][KUEUE_WORKLOAD_INDEX_ANNOTATION])
        (entry,) = [g for g in env.get_cr(tenant)["status"]["groups"] if g["index"] == gated]
        assert (entry["kueue"], entry["trays"], entry["message"]) == ("Pending", [], reserved["message"])
        assert any(e["reason"] == "GroupPending" and f"group {gated} waits for Kueue" in e["message"]
                   for e in env.events(tenant))

        raised = copy.deepcopy(queue)
        raised["spec"]["resourceGroups"][0]["flavors"][0]["resources"][2]["nominalQuota"] = 24
        env.rest.apply(kueue.object_path(raised), raised)
        wait_for(lambda: env.ready_groups(tenant, 2, 3), WAIT_S, "the third group admitted after the quota raise")
        wait_for(lambda: (env.condition(tenant, "ScalingLimited") or {}).get("status") == "False",
                 WAIT_S, "ScalingLimited=False once every group is admitted")
    finally:
        env.rest.delete(kueue.object_path(queue))


def test_four_tp16_groups_and_a_tp8_group_of_another_tenant_share_one_rack(kueue_env: DevEnv, tenant: str) -> None:
    """Best fit across deployments: 4 TP16 groups take 16 trays of one rack, and another tenant's
    TP8 group takes that rack's last 2 trays rather than opening the empty rack."""
    env = kueue_env
    cr = packed(env, tenant, replicas=4)
    cr["spec"]["topology"]["tensorParallelSize"] = 16
    env.apply(cr)
    groups = wait_for(lambda: env.ready_groups(tenant, 4, 4), WAIT_S, "4 TP16 groups Ready")
    (rack,) = {r for pods in groups.values() for r in env.cliques(pods)}
    # Kueue and ComputeDomains together (the TP16 recipe's pair): each pod's channel claim was
    # counted in quota through the DRA mapping and allocated on the pod's own tray.
    assert env.state["compute_domains"] is True
    for pods in groups.values():
        for pod in pods:
            claim = env.channel_claim(env.rest.get(f"/api/v1/namespaces/{tenant}/pods/{pod['metadata']['name']}"))
            assert [r["pool"] for r in claim["status"]["allocation"]["devices"]["results"]] == [pod["spec"]["nodeName"]]
    workloads = env.rest.get(f"/apis/kueue.x-k8s.io/v1beta2/namespaces/{tenant}/workloads")["items"]
    assert len(workloads) == 4
    for wl in workloads:
        usage = {ps["name"]: ps["resourceUsage"] for ps in wl["status"]["admission"]["podSetAssignments"]}
        assert usage["leader"][kueue.CHANNEL_RESOURCE] == "1" and usage["worker"][kueue.CHANNEL_RESOURCE] == "3", usage
    with env.namespace(f"{tenant}-b", WAIT_S) as other:
        env.apply(packed(env, other, replicas=1))
        (tp8,) = wait_for(lambda: env.ready_groups(other, 2, 1),
                          WAIT_S, "the other tenant's TP8 group Ready").values()
        assert env.cliques(tp8) == {rack}
        trays = {p["spec"]["nodeName"] for pods in [*groups.values(), tp8] for p in pods}
        assert len(trays) == TRAYS  # the rack is full: 4 x 4 + 2 trays, each tray held once


def test_a_group_size_edit_under_kueue_rolls_through_a_new_leaderworkerset(kueue_env: DevEnv, tenant: str) -> None:
    """F15: TP8 -> TP16 changes the group size 2 -> 4; in place, Kueue would leave the new pods
    gated with no Workload for ever. The new shape gets a new LeaderWorkerSet beside the old
    (``controller.fleet``): Kueue admits its groups for their own shape, the old groups serve
    until the new ones are Ready, then the old LeaderWorkerSet goes."""
    env = kueue_env
    env.apply(packed(env, tenant, replicas=2))
    wait_for(lambda: env.ready_groups(tenant, 2, 2), WAIT_S, "2 TP8 groups Ready")
    lwss = f"/apis/leaderworkerset.x-k8s.io/v1/namespaces/{tenant}/leaderworkersets"
    (before,) = env.rest.items(lwss)
    cr = packed(env, tenant, replicas=2)
    cr["spec"]["topology"]["tensorParallelSize"] = 16
    env.apply(cr)
    wait_for(lambda: len(env.rest.items(lwss)) == 2, WAIT_S, "a LeaderWorkerSet of the new shape beside the old")
    groups = wait_for(lambda: env.ready_groups(tenant, 4, 2), WAIT_S, "2 TP16 groups Ready, the old ones gone")
    (after,) = wait_for(lambda: (items := env.rest.items(lwss)) and len(items) == 1 and items, WAIT_S,
                        "the old LeaderWorkerSet deleted")
    assert after["metadata"]["name"].startswith("k3-engine-") and after["metadata"]["uid"] != before["metadata"]["uid"]
    assert after["spec"]["leaderWorkerTemplate"]["size"] == 4
    assert all(len(env.cliques(pods)) == 1 for pods in groups.values())
    wait_for(lambda: (env.condition(tenant, "Progressing") or {}).get("status")
             == "False", WAIT_S, "Progressing=False once rolled out")
    wait_for(lambda: "RolloutComplete" in [e["reason"] for e in env.events(tenant)], 10.0, "the RolloutComplete Event")


def test_a_high_priority_tenants_group_preempts_a_low_priority_group_that_comes_back(kueue_env: DevEnv) -> None:
    env = kueue_env
    low = packed(env, "low", replicas=RACKS * TRAYS // 2)
    low["spec"]["scheduling"]["placement"]["priorityClass"] = "low"
    env.apply(low)
    try:
        wait_for(lambda: env.ready_groups("low", 2, RACKS * TRAYS // 2), WAIT_S,
                 "18 low-priority TP8 groups Ready on every tray of both racks")
        high = packed(env, "high", replicas=1)
        high["spec"]["scheduling"]["placement"]["priorityClass"] = "high"
        env.apply(high)
        try:
            (group,) = wait_for(lambda: env.ready_groups("high", 2, 1), WAIT_S,
                                "the high-priority group Ready on the trays of a preempted group").values()
            limited = wait_for(lambda: (c := env.condition("low", "ScalingLimited")) and c["reason"] == "Preempted"
                               and c, WAIT_S, "ScalingLimited=True Preempted on the low-priority CR")
            assert "Preempted to accommodate a workload" in limited["message"], limited["message"]
            preempted = [g for g in env.get_cr("low")["status"]["groups"] if g["kueue"] == "Preempted"]
            assert len(preempted) == 1, preempted
            assert preempted[0]["trays"] == [] and "Preempted to accommodate" in preempted[0]["message"]
            assert [e for e in env.events("low") if e["reason"] == "GroupPreempted"
                    and e["message"].startswith(f"group {preempted[0]['index']} preempted by Kueue (was Admitted)")]
            assert any(e["reason"] == "Preempted" and e["type"] == "Warning" for e in env.events("low"))
            wait_for(lambda: [e for e in env.events("high") if e["reason"] == "GroupAdmitted"], WAIT_S,
                     "a GroupAdmitted Event on the high-priority CR")
            assert [g["kueue"] for g in env.get_cr("high")["status"]["groups"]] == ["Admitted"]
            assert len(env.cliques(group)) == 1
        finally:
            env.delete_deployment("high", WAIT_S)
        wait_for(lambda: env.ready_groups("low", 2, RACKS * TRAYS // 2), WAIT_S,
                 "the preempted low-priority group back once the high-priority group is gone")
        wait_for(lambda: (env.condition("low", "ScalingLimited") or {}).get("status") == "False", WAIT_S,
                 "ScalingLimited=False on the low-priority CR")
        assert any(e["reason"] == "GroupAdmitted" and e["message"].startswith(f"group {preempted[0]['index']} ")
                   for e in env.events("low"))
    finally:
        env.delete_deployment("low", WAIT_S)


NAME = "k3-capacity"
CAPACITY_CLASSES = (("reserved", 1000), ("burst", 100))
"""Every tenant's reserved groups at one value, burst groups below it (docs/billing.md)."""


def capacity_of_workloads(env: DevEnv, namespace: str) -> dict[int, tuple[int | None, bool]]:
    """Group index -> (its Workload's spec.priority, admitted) of deployment ``NAME`` in ``namespace``."""
    return {int(w["metadata"]["annotations"][KUEUE_WORKLOAD_INDEX_ANNOTATION]): (w["spec"].get("priority"), admitted(w))
            for w in env.rest.items(f"/apis/{kueue.API_VERSION}/namespaces/{namespace}/workloads")
            if not w["metadata"].get("deletionTimestamp")
            and any(o["name"] == engine_set_name(NAME) for o in w["metadata"].get("ownerReferences") or [])}


def test_a_tenants_reserved_group_preempts_a_burst_group_of_another_never_a_reserved_one(kueue_env: DevEnv) -> None:
    """Both racks full: low's 9 reserved and 9 burst groups (72 GPUs of its own quota, 72 borrowed from
    high); high's reserved group preempts a burst group of low, and no reserved group of low ever
    leaves Admitted. Deployments named ``NAME``, apart from the other tests' in these namespaces."""
    env, full = kueue_env, RACKS * TRAYS // 2  # TP8 groups (2 trays each) on every tray of both racks
    half = full // 2  # low's reserved groups: 72 GPUs, its nominal quota
    for name, value in CAPACITY_CLASSES:
        obj = kueue.workload_priority_class(name, value)
        env.rest.apply(kueue.object_path(obj), obj)
    placement = {"mode": "kueue", "queueName": kueue.LOCAL_QUEUE, "priorityClass": "reserved",
                 "burstPriorityClass": "burst"}
    low = env.deployment("low", NAME, replicas=full)
    low["spec"]["scheduling"] = {"placement": placement}
    low["spec"]["autoscaling"] = {"enabled": True, "minReplicas": half, "maxReplicas": full,
                                  "metricsSource": {"type": "podScrape"}}  # no engine answers: the groups held
    env.apply(low)
    try:
        wait_for(lambda: env.ready_groups("low", 2, full, NAME), WAIT_S,
                 "18 TP8 groups of low Ready on every tray of both racks (9 reserved, 9 burst)")
        expected = {i: (1000 if i < half else 100, True) for i in range(full)}
        wait_for(lambda: capacity_of_workloads(env, "low") == expected, 30.0,
                 "the operator raised low's 9 reserved groups' Workloads to 1000, the burst ones at 100")
        high = env.deployment("high", NAME, replicas=1)
        high["spec"]["scheduling"] = {"placement": placement}
        with Recorder(lambda: frozenset(i for i, (_, ok) in capacity_of_workloads(env, "low").items()
                                        if i < half and not ok), period_s=0.2) as unadmitted:
            env.apply(high)
            wait_for(lambda: env.ready_groups("high", 2, 1, NAME), WAIT_S,
                     "high's reserved group Ready on the trays of a preempted burst group")
            groups = wait_for(lambda: (g := env.get_cr("low", NAME)["status"]["groups"])
                              and any(x["kueue"] == "Preempted" for x in g) and g, WAIT_S,
                              "a Preempted group on low's CR")
            high_groups = wait_for(lambda: (g := env.get_cr("high", NAME)["status"]["groups"])
                                   and g[0].get("kueue") == "Admitted" and g, WAIT_S, "high's group Admitted")
        assert unadmitted.values == [frozenset()], f"a reserved group of low left Admitted: {unadmitted.values}"
        preempted = [g for g in groups if g["kueue"] == "Preempted"]
        assert [(g["capacity"], g["index"] >= half) for g in preempted] == [("burst", True)], preempted
        assert {g["index"]: (g["capacity"], g["kueue"]) for g in groups if g["index"] < half} == {
            i: ("reserved", "Admitted") for i in range(half)}
        assert "Preempted to accommodate a workload" in preempted[0]["message"]
        index = preempted[0]["index"]
        wait_for(lambda: [e for e in env.events("low", NAME) if e["reason"] == "GroupPreempted"
                          and e["message"].startswith(f"group {index} (burst) preempted by Kueue (was Admitted)")],
                 30.0, "low's GroupPreempted Event")
        assert [(g["index"], g["capacity"], g["kueue"]) for g in high_groups] == [(0, "reserved", "Admitted")]
        assert capacity_of_workloads(env, "high") == {0: (1000, True)}
        # once per Workload Kueue made for the group (the operator deletes one Kueue set aside before the
        # ComputeDomain's claim template existed, controller.readmit, and raises the fresh one too)
        raised = {e["message"] for e in env.events("high", NAME) if e["reason"] == "GroupCapacity"}
        assert raised == {f"group 0 of LeaderWorkerSet {engine_set_name(NAME)} is reserved capacity: its Workload's "
                          "priority set to 1000 (WorkloadPriorityClass reserved, was 100), never preempted for "
                          "another tenant's burst"}
        # the operator's GPU series (what the usage rules sum): low holds 9 reserved and 8 burst groups' GPUs
        operator = env.state["urls"]["operator"]

        def held(namespace: str, capacity: str) -> float:
            return metric(metric_samples(operator), "kimik3_gpus", namespace=namespace, state="held",
                          capacity=capacity)
        want = (8 * half, 8 * (half - 1), 8, 0)  # 8 GPUs a group: low's 9 reserved and 8 burst, high's one reserved
        wait_for(lambda: (held("low", "reserved"), held("low", "burst"), held("high", "reserved"),
                          held("high", "burst")) == want, 30.0, f"the GPUs held by capacity {want}")
    finally:
        env.delete_deployment("high", WAIT_S, NAME)
        env.delete_deployment("low", WAIT_S, NAME)


def test_an_exclusive_deployment_beside_a_kueue_one_is_named_on_both_crs(kueue_env: DevEnv, tenant: str) -> None:
    """Two placement modes on one node pool (controller/placementmix.py): the exclusive TP8
    deployment's group holds a rack, a kueue TP8 deployment is applied beside it; each CR's
    PlacementConflict names the other (the kueue one with the exclusive group's rack), with a
    Warning Event on each."""
    env = kueue_env
    with env.fresh_namespace("alone", WAIT_S) as alone:
        env.apply(env.deployment(alone, replicas=1))
        groups = wait_for(lambda: env.ready_groups(alone, 2, 1), WAIT_S, "the exclusive group Ready")
        (rack,) = env.cliques(groups[0])
        env.apply(packed(env, tenant, replicas=1))

        def names(namespace: str, other: str, mode: str) -> dict | None:
            said = env.condition(namespace, "PlacementConflict") or {}
            return said if said.get("status") == "True" and f"{other}/k3 (placement {mode})" in said["message"] \
                else None
        on_packed = wait_for(lambda: names(tenant, alone, "exclusive"), WAIT_S, "the kueue CR names the exclusive one")
        on_alone = wait_for(lambda: names(alone, tenant, "kueue"), WAIT_S, "the exclusive CR names the kueue one")
        assert on_packed["reason"] == on_alone["reason"] == "PlacementModesMixed"
        assert f"{alone}/k3 (placement exclusive) has groups in racks {rack}" in on_packed["message"]
        assert on_alone["message"].startswith("placement exclusive on the node pool ")
        for namespace, other in ((tenant, alone), (alone, tenant)):
            assert any(e["reason"] == "PlacementModesMixed" and e["type"] == "Warning" and f"{other}/k3" in e["message"]
                       for e in env.events(namespace))


KUEUE_MUTATING = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"


def test_without_kueues_webhooks_no_group_is_created_and_the_cr_says_why(kueue_env: DevEnv, tenant: str) -> None:
    """The fallback the issue saw: Kueue's API served and its manager running, but its webhooks not
    registered, so LeaderWorkerSet pods would be scheduled with no admission. The operator's dry run
    of the LeaderWorkerSet comes back without Kueue's mark: nothing is created until they are back."""
    env = kueue_env
    local = kueue.local_queue(tenant)
    env.rest.apply(kueue.object_path(local), local)
    wait_for(lambda: ((env.rest.get(kueue.object_path(local)) or {}).get("status") or {}).get("conditions"),
             WAIT_S, "Kueue reports the LocalQueue")  # active: the dry run is what tells the webhooks missing
    name = f"{kueue.WEBHOOK_PREFIX}mutating-webhook-configuration"
    saved = env.rest.get(f"{KUEUE_MUTATING}/{name}")
    assert saved is not None
    env.rest.delete(f"{KUEUE_MUTATING}/{name}")
    try:
        env.apply(packed(env, tenant, replicas=2))
        limited = wait_for(lambda: (c := env.condition(tenant, "ScalingLimited")) and c["reason"] == "KueueWebhookMissing"
                           and c, WAIT_S, "ScalingLimited=True KueueWebhookMissing")
        assert limited["status"] == "True" and "dry run of the LeaderWorkerSet came back without" in limited["message"]
        ready = env.condition(tenant, "Ready")
        assert ready is not None and (ready["status"], ready["reason"]) == ("False", "KueueWebhookMissing")
        assert env.rest.items(f"/apis/leaderworkerset.x-k8s.io/v1/namespaces/{tenant}/leaderworkersets") == []
        assert env.pods(tenant) == []
        assert any(e["reason"] == "KueueWebhookMissing" and e["type"] == "Warning" for e in env.events(tenant))
    finally:
        meta = saved["metadata"]
        env.rest.create(KUEUE_MUTATING, {**saved, "metadata": {"name": meta["name"], "labels": meta.get("labels", {})}})
    groups = wait_for(lambda: env.ready_groups(tenant, 2, 2), WAIT_S, "2 groups Ready once the webhooks are back")
    assert all(len(env.cliques(pods)) == 1 for pods in groups.values())
    wait_for(lambda: (env.condition(tenant, "ScalingLimited") or {}).get("reason") == "AllGroupsPlaced", WAIT_S,
             "ScalingLimited=False AllGroupsPlaced")
    workloads = env.rest.items(f"/apis/{kueue.API_VERSION}/namespaces/{tenant}/workloads")
    assert len(workloads) == 2 and all(admitted(w) for w in workloads)


KILLED_S = 3.0
"""How long the Kueue manager stays down, s (its webhooks too: LWS's pod creations fail meanwhile)."""


def test_a_kueue_manager_restarted_mid_admission_loses_no_group(kueue_env: DevEnv, tenant: str) -> None:
    """6 TP8 groups on a ClusterQueue of 24 GPUs (3 groups): Kueue's manager SIGKILLed as soon as it
    has admitted the first group (the others being admitted, pending on quota, or their Workloads
    not yet made), started again ``KILLED_S`` later, then the quota raised to 48 GPUs. Every group
    ends admitted by exactly one Workload, bound whole in one rack and listed once in
    ``status.groups``; at no time is a pod bound in a group Kueue had not admitted."""
    env = kueue_env
    replicas, per_group = 6, 8
    workloads = f"/apis/{kueue.API_VERSION}/namespaces/{tenant}/workloads"
    queue = kueue.cluster_queue(f"{tenant}-cq", "gb300", gpus=replicas // 2 * per_group, namespaces=[tenant])
    env.rest.apply(kueue.object_path(queue), queue)
    try:
        local = kueue.local_queue(tenant, queue["metadata"]["name"], "own")
        env.rest.apply(kueue.object_path(local), local)
        with Recorder(lambda: group_binding(env, tenant), period_s=0.2) as binding:
            env.apply(packed(env, tenant, replicas=replicas, queue="own"))
            wait_for(lambda: any(admitted(w) for w in env.rest.items(workloads)), WAIT_S,
                     "Kueue admits a first group", interval=0.05)
            env.cluster.stop_component("kueue-manager", kill=True)  # `kimik3 dev fault stop --kill`
            try:
                at_kill = env.rest.items(workloads)
                time.sleep(KILLED_S)
            finally:
                env.cluster.start_component("kueue-manager")
            print(f"at the kill: {len(at_kill)} Workloads, {sum(map(admitted, at_kill))} admitted, of {replicas} groups")
            assert 1 <= sum(map(admitted, at_kill)) <= replicas // 2  # mid-admission, within the quota
            raised = copy.deepcopy(queue)
            raised["spec"]["resourceGroups"][0]["flavors"][0]["resources"][2]["nominalQuota"] = replicas * per_group
            wait_for(lambda: env.rest.apply(kueue.object_path(raised), raised), WAIT_S,
                     "the quota raised (Kueue's webhooks back)", retry_on=(ApiError,))
            groups = wait_for(lambda: env.ready_groups(tenant, 2, replicas), WAIT_S,
                              f"{replicas} groups Ready after Kueue's restart and the quota raise")
        assert [s[2] for s in binding.values if s[2]] == []  # no pod bound before its group was admitted
        racks = {i: env.cliques(pods) for i, pods in groups.items()}
        assert all(len(r) == 1 and None not in r for r in racks.values()), f"a group spans racks: {racks}"
        pods = env.pods(tenant)
        assert len(pods) == 2 * replicas  # no group duplicated, no stray pod
        assert all(p["spec"].get("nodeName") and not p["spec"].get("schedulingGates") for p in pods)
        after = env.rest.items(workloads)
        indices = sorted(int(w["metadata"]["annotations"][KUEUE_WORKLOAD_INDEX_ANNOTATION]) for w in after)
        assert indices == list(range(replicas)) and all(admitted(w) for w in after), indices  # one per group
        status = wait_for(lambda: (cr := env.get_cr(tenant)) and len((cr.get("status") or {}).get("groups") or [])
                          == replicas and all(g["ready"] for g in cr["status"]["groups"]) and cr["status"], WAIT_S,
                          f"status.groups with {replicas} ready groups")
        assert sorted(g["index"] for g in status["groups"]) == list(range(replicas))
        for g in status["groups"]:
            members = sorted(groups[g["index"]], key=kpods.worker_index)
            assert (g["kueue"], g["rack"], g["trays"]) == ("Admitted", *racks[g["index"]],
                                                          [p["spec"]["nodeName"] for p in members])
        wait_for(lambda: (env.condition(tenant, "ScalingLimited") or {}).get("reason") == "AllGroupsPlaced", WAIT_S,
                 "ScalingLimited=False AllGroupsPlaced")
    finally:
        env.rest.delete(kueue.object_path(queue))
