"""Children of a KimiK3Deployment (``kimik3.render.children.render`` of the admitted spec) for the shipped recipes.

Covers placement (ComputeDomain, clique, GPU product), the group shape of the LeaderWorkerSet,
probes (F12), the client Service, the group-aware PodDisruptionBudget (F3) and what must be
absent (F11: no ComputeDomain at zero groups).
"""

from __future__ import annotations

import json

import pytest

from kimik3.admission import admit
from kimik3.api.v1alpha1 import KimiK3DeploymentSpec
from kimik3.engine.args import rank_args
from kimik3.render.disruption import fleet_pods, over_fleet
from support.recipes import recipe
from support.rendering import by_kind, render_cr

TP8_RECIPE = "gb300-tp8-megakernel-dspark.yaml"
DEP16_RECIPE = "gb300-dep16-throughput.yaml"
UID = "7a1c2b9e-0000-4000-8000-000000000001"
"""The uid the API server would have given the CR (render writes it into ownerReferences)."""
CD = ("resource.nvidia.com/v1beta1", "ComputeDomain")
PDB = ("policy/v1", "PodDisruptionBudget")
POD_MONITOR = ("monitoring.coreos.com/v1", "PodMonitor")
LWS_NAME = "leaderworkerset.sigs.k8s.io/name"
DEPLOYMENT = "inference.kimik3.io/deployment"
WORKER_INDEX = "leaderworkerset.sigs.k8s.io/worker-index"


def absent(out) -> set[tuple[str, str]]:
    """(apiVersion, kind) of the children ``render`` says must not exist."""
    return {(a.kind.api_version, a.kind.kind) for a in out.absent}


def templates(lws: dict) -> tuple[dict, dict]:
    t = lws["spec"]["leaderWorkerTemplate"]
    return t["leaderTemplate"], t["workerTemplate"]


def container(template: dict) -> dict:
    (c,) = template["spec"]["containers"]
    return c


# ---------------------------------------------------------------- kinds and owners ---------

@pytest.mark.parametrize("name,replicas,kinds", [
    (TP8_RECIPE, 1, ["ComputeDomain", "ConfigMap", "LeaderWorkerSet", "Service", "PodMonitor"]),
    (DEP16_RECIPE, 1, ["ComputeDomain", "ConfigMap", "LeaderWorkerSet", "Service", "PodMonitor"]),
    (DEP16_RECIPE, 4, ["ComputeDomain", "ConfigMap", "LeaderWorkerSet", "Service", "PodDisruptionBudget",
                       "PodMonitor"]),
])
def test_kinds_in_apply_order(name, replicas, kinds):
    out = render_cr(recipe(name, uid=UID, replicas=replicas))
    assert [o["kind"] for o in out.objects] == kinds
    assert out.objects[0]["apiVersion"] == CD[0]


@pytest.mark.parametrize("name", [TP8_RECIPE, DEP16_RECIPE])
def test_every_child_has_a_controller_owner_reference_to_the_cr(name):
    obj = recipe(name, uid=UID, replicas=4)
    for child in render_cr(obj).objects:
        meta = child["metadata"]
        assert meta["namespace"] == "inference"
        assert meta["ownerReferences"] == [{
            "apiVersion": "inference.kimik3.io/v1alpha1", "kind": "KimiK3Deployment",
            "name": obj["metadata"]["name"], "uid": UID, "controller": True, "blockOwnerDeletion": True,
        }], child["kind"]


# ---------------------------------------------------------------- LeaderWorkerSet ----------

@pytest.mark.parametrize("name,size", [(TP8_RECIPE, 2), (DEP16_RECIPE, 4)])
def test_leader_worker_set_group_shape_and_placement(name, size):
    out = render_cr(recipe(name, uid=UID))
    lws = by_kind(out.objects, "LeaderWorkerSet")
    spec = lws["spec"]
    assert spec["replicas"] == 1
    assert spec["startupPolicy"] == "LeaderCreated"  # LeaderReady deadlocks a TP group (F1)
    assert spec["leaderWorkerTemplate"]["size"] == size
    assert spec["leaderWorkerTemplate"]["restartPolicy"] == "RecreateGroupOnPodRestart"
    assert lws["metadata"]["annotations"]["leaderworkerset.sigs.k8s.io/exclusive-topology"] == \
        "nvidia.com/gpu.clique"
    cd = by_kind(out.objects, "ComputeDomain")
    rct = cd["spec"]["channel"]["resourceClaimTemplate"]["name"]
    for template in templates(lws):
        pod = template["spec"]
        c = container(template)
        assert c["resources"]["limits"]["nvidia.com/gpu"] == 4
        assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-GB300", "kubernetes.io/arch": "arm64"}
        # The pod claims the ComputeDomain's IMEX channel and the container uses that claim.
        (claim,) = pod["resourceClaims"]
        assert claim["resourceClaimTemplateName"] == rct
        assert c["resources"]["claims"] == [{"name": claim["name"]}]
        volumes = {v["name"]: v for v in pod["volumes"]}
        mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
        assert volumes[mounts["/dev/shm"]["name"]]["emptyDir"]["medium"] == "Memory"
        model = volumes[mounts["/models"]["name"]]["persistentVolumeClaim"]
        assert model == {"claimName": "kimi-k3-weights", "readOnly": True}
        assert mounts["/models"]["readOnly"] is True


@pytest.mark.parametrize("name,priority", [(TP8_RECIPE, "high"), (DEP16_RECIPE, None)])
def test_kueue_placement_submits_whole_groups_to_the_queue(name, priority):
    """Kueue mode (kueue.md): the queue (and priority) label on the LeaderWorkerSet; both templates
    require one clique and share one podset group; no exclusive-topology annotation (Kueue ignores
    pod affinity, and the two together strand pods); everything else as in exclusive mode."""
    placement = {"mode": "kueue", "queueName": "tenant-a", **({"priorityClass": priority} if priority else {})}
    kueue = by_kind(render_cr(recipe(name, uid=UID, scheduling={"placement": placement})).objects, "LeaderWorkerSet")
    exclusive = by_kind(render_cr(recipe(name, uid=UID)).objects, "LeaderWorkerSet")
    labels = kueue["metadata"]["labels"]
    assert labels["kueue.x-k8s.io/queue-name"] == "tenant-a"
    assert labels.get("kueue.x-k8s.io/priority-class") == priority
    assert "leaderworkerset.sigs.k8s.io/exclusive-topology" not in kueue["metadata"]["annotations"]
    for template in templates(kueue):
        annotations = template["metadata"]["annotations"]
        assert annotations["kueue.x-k8s.io/podset-required-topology"] == "nvidia.com/gpu.clique"
        assert annotations["kueue.x-k8s.io/podset-group-name"] == "engine-group"
    for k, e in zip(templates(kueue), templates(exclusive)):
        assert k["spec"] == e["spec"]
    assert kueue["spec"]["leaderWorkerTemplate"]["size"] == exclusive["spec"]["leaderWorkerTemplate"]["size"]


def test_kueue_placement_of_a_single_node_group_needs_no_topology():
    """A B300 group is one 8-GPU node: Kueue admits it within quota, no clique to require."""
    lws = by_kind(render_cr(recipe("b300-tp8-single-node.yaml", uid=UID,
                                   scheduling={"placement": {"mode": "kueue", "queueName": "q"}})).objects,
                  "LeaderWorkerSet")
    assert lws["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "q"
    template = lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]
    assert "kueue.x-k8s.io/podset-required-topology" not in template["metadata"]["annotations"]


def test_compute_domain_spec():
    cd = by_kind(render_cr(recipe(TP8_RECIPE, uid=UID)).objects, "ComputeDomain")
    assert cd["spec"]["numNodes"] == 0
    assert cd["spec"]["channel"]["allocationMode"] == "Single"


@pytest.mark.parametrize("name", [TP8_RECIPE, DEP16_RECIPE])
def test_launcher_configmap_holds_every_rank_of_the_plan(name):
    admitted = admit(recipe(name, uid=UID)["spec"])
    out = render_cr(recipe(name, uid=UID))
    cm = by_kind(out.objects, "ConfigMap")
    doc = json.loads(cm["data"]["plan.json"])
    assert doc["ranks"] == [{"index": r, "args": rank_args(admitted.spec, admitted.plan, r)}
                            for r in range(admitted.plan.nodes_per_group)]
    assert doc["leaderAddressTimeoutSeconds"] == 1800  # probes.leaderAddressTimeout default 30m
    assert doc["command"] == ["vllm", "serve"]
    lws = by_kind(out.objects, "LeaderWorkerSet")
    for template in templates(lws):
        c = container(template)
        assert c["command"] == ["python3", "/etc/kimik3/launcher.py"]
        assert {"name": "KIMIK3_PLAN", "value": "/etc/kimik3/plan.json"} in c["env"]
        volumes = {v["name"]: v for v in template["spec"]["volumes"]}
        mount = next(m for m in c["volumeMounts"] if m["mountPath"] == "/etc/kimik3")
        assert volumes[mount["name"]]["configMap"]["name"] == cm["metadata"]["name"]


# ---------------------------------------------------------------- probes (F12) -------------

@pytest.mark.parametrize("probes,budget_s", [
    ({}, 5400),  # recipe: 90m
    ({"loadTimeout": "60m"}, 3600),
    ({"loadTimeout": "60m", "periodSeconds": 7}, 3600),  # 3600 / 7 is not whole: round up
    ({"loadTimeout": "2h", "periodSeconds": 30}, 7200),
])
def test_leader_startup_probe_covers_the_load_timeout(probes, budget_s):
    out = render_cr(recipe(TP8_RECIPE, uid=UID, probes=probes))
    leader, _ = templates(by_kind(out.objects, "LeaderWorkerSet"))
    c = container(leader)
    probe = c["startupProbe"]
    assert probe["httpGet"]["path"] == "/health"
    assert probe["periodSeconds"] * probe["failureThreshold"] >= budget_s
    assert probe["periodSeconds"] * (probe["failureThreshold"] - 1) < budget_s  # not wildly more
    assert c["livenessProbe"]["httpGet"]["path"] == "/health"
    assert c["ports"] == [{"name": "http", "containerPort": 8000, "protocol": "TCP"}]


@pytest.mark.parametrize("name", [TP8_RECIPE, DEP16_RECIPE])
def test_workers_have_no_probes_and_no_ports(name):
    _, worker = templates(by_kind(render_cr(recipe(name, uid=UID)).objects, "LeaderWorkerSet"))
    c = container(worker)
    for key in ("startupProbe", "livenessProbe", "readinessProbe", "ports"):
        assert key not in c


# ---------------------------------------------------------------- drained exits ------------

@pytest.mark.parametrize("probes, deregister_s, drain_s", [
    ({}, 35, 180),  # periodSeconds 10 x 3 failed readiness probes + 5 s; drainTimeout 3m
    ({"periodSeconds": 5, "drainTimeout": "10m"}, 20, 600),
    ({"drainTimeout": "0s"}, 35, 0),  # no drain: vLLM aborts the requests in flight at SIGTERM
    ({"drainTimeout": "1.2s"}, 35, 2),  # whole seconds, rounded up
])
@pytest.mark.parametrize("name", [TP8_RECIPE, DEP16_RECIPE])
def test_a_pod_that_goes_drains_within_its_grace_period(name, probes, deregister_s, drain_s):
    """Leader and workers: the preStop hook is the launcher's drain with the deregistration and
    the drain bound; vLLM gets --shutdown-timeout on every rank; the grace period covers both and
    30 s for vLLM's teardown. The leader's readiness is the launcher's ready (vLLM's /health on
    its port until the drain begins), failing after 3 probes."""
    cr = recipe(name, uid=UID, probes=probes)
    out = render_cr(cr)
    admitted = admit(cr["spec"])
    lws = by_kind(out.objects, "LeaderWorkerSet")
    for template in templates(lws):
        assert template["spec"]["terminationGracePeriodSeconds"] == deregister_s + drain_s + 30
        assert container(template)["lifecycle"] == {"preStop": {"exec": {"command": [
            "python3", "/etc/kimik3/launcher.py", "drain", str(deregister_s), str(drain_s)]}}}
    for rank in range(admitted.plan.nodes_per_group):
        args = rank_args(admitted.spec, admitted.plan, rank)
        assert args[args.index("--shutdown-timeout") + 1] == str(drain_s)
    leader, _ = templates(lws)
    readiness = container(leader)["readinessProbe"]
    assert readiness == {"exec": {"command": ["python3", "/etc/kimik3/launcher.py", "ready", "8000"]},
                         "periodSeconds": probes.get("periodSeconds", 10), "timeoutSeconds": 5,
                         "failureThreshold": 3}


def test_the_default_drain_lets_32768_tokens_at_the_default_latency_target_finish():
    spec = KimiK3DeploymentSpec.model_validate({"model": {"source": {"pvc": {"claimName": "w"}}}})
    assert spec.probes.drain_timeout == "3m"  # 32,768 x 5 ms = 164 s, rounded up to whole minutes
    assert 32768 * 0.005 <= 180 < 32768 * 0.005 + 60


# ---------------------------------------------------------------- Service -----------------

def test_service_selects_the_group_leaders_of_every_leaderworkerset_of_the_deployment():
    out = render_cr(recipe(DEP16_RECIPE, uid=UID))
    lws = by_kind(out.objects, "LeaderWorkerSet")
    svc = by_kind(out.objects, "Service")
    leader = lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["metadata"]["labels"]
    assert svc["spec"]["selector"] == {DEPLOYMENT: "k3-throughput", WORKER_INDEX: "0"}
    assert leader[DEPLOYMENT] == "k3-throughput"  # LWS adds the worker index
    assert svc["spec"]["ports"] == [{"name": "http", "port": 8000, "targetPort": "http", "protocol": "TCP"}]
    pm = by_kind(out.objects, "PodMonitor")
    assert pm["spec"]["selector"]["matchLabels"] == svc["spec"]["selector"]


# ---------------------------------------------------------------- disruption budget (F3) ---

@pytest.mark.parametrize("name,spec,may_go", [
    pytest.param(DEP16_RECIPE, {}, 1, id="dep16-size4-75pct"),
    pytest.param(TP8_RECIPE, {"engine": {"decodeBackend": "stock"}, "topology": {"tensorParallelSize": 32}}, 1,
                 id="tp32-size8-75pct"),
    pytest.param(DEP16_RECIPE, {"disruptionBudget": {"minAvailable": 2}}, 2, id="dep16-two-groups"),
    pytest.param(DEP16_RECIPE, {"disruptionBudget": {"minAvailable": "50%"}}, 2, id="dep16-50pct"),
])
def test_budget_lets_at_most_the_groups_that_may_go_lose_a_pod(name, spec, may_go):
    """4 groups: every pod but one per group that may go must stay (each evicted pod downs one group)."""
    out = render_cr(recipe(name, uid=UID, replicas=4, **spec))
    pdb = by_kind(out.objects, "PodDisruptionBudget")
    lws = by_kind(out.objects, "LeaderWorkerSet")
    assert pdb["spec"]["minAvailable"] == 4 * lws["spec"]["leaderWorkerTemplate"]["size"] - may_go
    assert pdb["spec"]["selector"] == {"matchLabels": {DEPLOYMENT: lws["metadata"]["labels"][DEPLOYMENT]},
                                       "matchExpressions": [{"key": LWS_NAME, "operator": "Exists"}]}
    assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    assert PDB not in absent(out) and out.warnings == []


def _pod(terminating: bool = False) -> dict:
    return {"metadata": {"deletionTimestamp": "2026-12-04T00:00:00Z"} if terminating else {}}


@pytest.mark.parametrize("sets,live,pods", [
    pytest.param([(4, 2)], 8, 8, id="at-rest"),
    pytest.param([(4, 2)], 5, 8, id="group-recreating-counts-its-missing-pods"),
    pytest.param([(4, 2), (1, 2)], 8, 10, id="surge-counts-both-revisions"),
    pytest.param([(3, 2)], 8, 8, id="scale-down-counts-pods-still-running"),
])
def test_budget_counts_the_fleet(sets, live, pods):
    cr = recipe(TP8_RECIPE, uid=UID, replicas=4)
    out = render_cr(cr)
    engine_sets = [{"spec": {"replicas": r, "leaderWorkerTemplate": {"size": s}}} for r, s in sets]
    live_pods = [_pod() for _ in range(live)] + [_pod(terminating=True)] * 2
    assert fleet_pods(engine_sets, live_pods) == pods
    spec = KimiK3DeploymentSpec.model_validate(cr["spec"])
    budget = over_fleet(by_kind(out.objects, "PodDisruptionBudget"), spec, 4, pods)
    assert budget["spec"]["minAvailable"] == pods - 1  # 75% of 4 groups stay: 1 may go


@pytest.mark.parametrize("replicas,spec", [(1, {}), (0, {}), (2, {}), (4, {"disruptionBudget": {"minAvailable": 4}})])
def test_no_budget_that_blocks_every_drain(replicas, spec):
    out = render_cr(recipe(DEP16_RECIPE, uid=UID, replicas=replicas, **spec))
    assert "PodDisruptionBudget" not in [o["kind"] for o in out.objects]
    assert PDB in absent(out)
    assert len(out.warnings) == 1 and "PodDisruptionBudget" in out.warnings[0].message


def test_disabled_budget_is_absent_without_warning():
    out = render_cr(recipe(DEP16_RECIPE, uid=UID, replicas=4, disruptionBudget={"enabled": False}))
    assert PDB in absent(out) and out.warnings == []


# ---------------------------------------------------------------- scale to zero, absent ----

@pytest.mark.parametrize("how", ["spec", "override"])
def test_zero_groups_release_the_compute_domain(how):
    obj = recipe(TP8_RECIPE, uid=UID, replicas=0 if how == "spec" else 3)
    out = render_cr(obj) if how == "spec" else render_cr(obj, replicas=0)
    kinds = [o["kind"] for o in out.objects]
    assert "ComputeDomain" not in kinds
    assert CD in absent(out)
    assert by_kind(out.objects, "LeaderWorkerSet")["spec"]["replicas"] == 0


def test_autoscaler_replicas_override_the_spec():
    out = render_cr(recipe(DEP16_RECIPE, uid=UID, replicas=1), replicas=4)
    assert by_kind(out.objects, "LeaderWorkerSet")["spec"]["replicas"] == 4
    assert by_kind(out.objects, "PodDisruptionBudget")["spec"]["minAvailable"] == 4 * 4 - 1  # 16 pods, 1 group of 4 may go


def test_monitoring_disabled_means_no_pod_monitor():
    out = render_cr(recipe(TP8_RECIPE, uid=UID, monitoring={"enabled": False}))
    assert "PodMonitor" not in [o["kind"] for o in out.objects]
    assert POD_MONITOR in absent(out)


# ---------------------------------------------------------------- HGX nodes ----------------

H200_TP16 = {"engine": {"decodeBackend": "stock"}, "topology": {"accelerator": "h200", "tensorParallelSize": 16}}


def test_hgx_group_has_no_compute_domain_or_clique_placement():
    out = render_cr(recipe(TP8_RECIPE, uid=UID, **H200_TP16))
    assert "ComputeDomain" not in [o["kind"] for o in out.objects]
    lws = by_kind(out.objects, "LeaderWorkerSet")
    assert "leaderworkerset.sigs.k8s.io/exclusive-topology" not in lws["metadata"].get("annotations", {})
    assert lws["spec"]["leaderWorkerTemplate"]["size"] == 2
    for template in templates(lws):
        assert "resourceClaims" not in template["spec"]
        assert "claims" not in container(template)["resources"]
        assert container(template)["resources"]["limits"]["nvidia.com/gpu"] == 8
        assert template["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H200",
                                                    "kubernetes.io/arch": "amd64"}


def test_hgx_group_lists_a_leftover_compute_domain_as_absent():
    out = render_cr(recipe(TP8_RECIPE, uid=UID, **H200_TP16))
    assert CD in absent(out)


def test_without_a_dra_driver_no_compute_domain_or_claims_and_a_warning():
    out = render_cr(recipe(TP8_RECIPE, uid=UID), compute_domains=False)
    assert CD in absent(out)
    assert [o["kind"] for o in out.objects][0] == "ConfigMap"
    lws = next(o for o in out.objects if o["kind"] == "LeaderWorkerSet")
    for name in ("leaderTemplate", "workerTemplate"):
        pod = lws["spec"]["leaderWorkerTemplate"][name]["spec"]
        assert "resourceClaims" not in pod
        assert "claims" not in pod["containers"][0]["resources"]
    # Placement inside one NVL72 rack still holds without the driver.
    assert lws["metadata"]["annotations"]["leaderworkerset.sigs.k8s.io/exclusive-topology"] == "nvidia.com/gpu.clique"
    assert any("--no-compute-domains" in w.message for w in out.warnings)


