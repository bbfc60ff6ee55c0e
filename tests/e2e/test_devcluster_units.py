"""The dev cluster's parts that need no cluster: rack shapes, kwok/LWS/Prometheus configuration,
background processes, failure messages, the status overview, and the operator's
``ScalingLimited`` status for groups the scheduler cannot place."""

from __future__ import annotations

import base64
import os
import sys
import time
from pathlib import Path

import pytest
import yaml

from kimik3.kube.groups import groups_of
from kimik3.controller.fleet import engine_sets
from kimik3.admission import admit
from kimik3.controller.status import scaling_limited_message, status_patch, unschedulable_groups
from kimik3_dev.devcluster import kwok, lws, podnet, processes, prometheus
from kimik3_dev.devcluster.overview import render
from kimik3_dev.devcluster.racks import KWOK_ANNOTATION, RACK_LABEL, RackShape, node_manifests
from kimik3_dev.devcluster.readiness import ComponentError, http_get, wait_for
from kimik3.kube.labels import CLIQUE_LABEL, GPU_RESOURCE, PRODUCT_LABEL
from support import snapshots
from support.recipes import recipe

pytestmark = pytest.mark.tier("unit")  # no cluster here, though in tests/e2e


# -- racks ---------------------------------------------------------------------------------------
def test_gb300_racks_are_nvl72_trays_with_one_clique_per_rack() -> None:
    shape = RackShape(racks=2, trays_per_rack=18, cluster_uuid="c0ffee")
    nodes = node_manifests(shape)
    assert len(nodes) == 36 and shape.gpus == 144
    first, last = nodes[0], nodes[-1]
    assert first["metadata"]["name"] == "gb300-r0-t00" and last["metadata"]["name"] == "gb300-r1-t17"
    labels = first["metadata"]["labels"]
    assert labels["kubernetes.io/arch"] == "arm64"
    assert labels[PRODUCT_LABEL] == "NVIDIA-GB300"
    assert labels["nvidia.com/gpu.count"] == "4"
    assert labels["nvidia.com/gpu.memory"] == str(288 * 10**9 // 2**20)
    assert first["status"]["capacity"] == first["status"]["allocatable"] == {
        "cpu": "144", "memory": "960G", "pods": "110", GPU_RESOURCE: "4"}
    assert first["metadata"]["annotations"] == {KWOK_ANNOTATION[0]: KWOK_ANNOTATION[1]}
    cliques = {n["metadata"]["labels"][CLIQUE_LABEL] for n in nodes}
    assert cliques == {"c0ffee.0", "c0ffee.1"}
    assert [n["metadata"]["labels"][CLIQUE_LABEL] for n in nodes[:18]] == ["c0ffee.0"] * 18
    assert {n["metadata"]["labels"][RACK_LABEL] for n in nodes[18:]} == {"rack-1"}


def test_h200_profile_is_8_gpu_amd64_nodes_without_clique() -> None:
    nodes = node_manifests(RackShape(profile="h200", racks=1, trays_per_rack=3))
    assert len(nodes) == 3
    for n in nodes:
        labels = n["metadata"]["labels"]
        assert (labels["kubernetes.io/arch"], labels[PRODUCT_LABEL], labels["nvidia.com/gpu.count"]) == \
            ("amd64", "NVIDIA-H200", "8")
        assert CLIQUE_LABEL not in labels
        assert n["status"]["allocatable"][GPU_RESOURCE] == "8"


def test_rack_shape_refuses_impossible_shapes() -> None:
    with pytest.raises(ValueError, match="at most 18 trays"):
        RackShape(trays_per_rack=19)
    with pytest.raises(ValueError, match="unknown profile"):
        RackShape(profile="tpu")
    with pytest.raises(ValueError, match=">= 1"):
        RackShape(racks=0)


# -- pod networks --------------------------------------------------------------------------------
def _live_cluster(state_dir: Path) -> Path:
    """A state dir with a pidfile of this (live) test process, as a running cluster has."""
    processes.write_record(state_dir, processes.ProcessRecord("etcd", os.getpid(), 0, ["etcd"], ""))
    return state_dir


def test_each_live_cluster_gets_its_own_loopback_16_and_a_dead_ones_is_reused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(podnet, "CLAIMS_DIR", tmp_path / "claims")
    a, b, c = (_live_cluster(tmp_path / n) for n in ("a", "b", "c"))
    assert str(podnet.claim(a)) == "127.1.0.0/16"
    assert str(podnet.claim(b)) == "127.2.0.0/16"
    assert str(podnet.claim(a)) == "127.1.0.0/16"  # its own claim again, not a new one
    podnet.release(a)
    assert str(podnet.claim(c)) == "127.1.0.0/16"
    # b's processes are gone (crashed, no `dev down`): its network is free
    (tmp_path / "b" / "pids" / "etcd.json").unlink()
    assert str(podnet.claim(tmp_path / "d")) == "127.2.0.0/16"
    monkeypatch.setattr(podnet, "SECOND_OCTETS", range(1, 2))
    with pytest.raises(podnet.NetworkExhausted, match="kimik3 dev down"):
        podnet.claim(a)


# -- kwok, LWS, Prometheus configuration ---------------------------------------------------------
@pytest.mark.tier("process")  # `go mod download` of the module
def test_kwok_config_uses_kwok_own_stages_with_a_graceful_pod_delete(tmp_path: Path) -> None:
    path = kwok.write_config(tmp_path, "127.3.0.0/16")
    docs = list(yaml.safe_load_all(path.read_text()))
    config, stages = docs[0], docs[1:]
    assert config["kind"] == "KwokConfiguration"
    assert config["options"]["cidr"] == "127.3.0.0/16"
    assert config["options"]["manageNodesWithAnnotationSelector"] == "kwok.x-k8s.io/node=fake"
    assert config["options"]["nodeLeaseParallelism"] == 4
    assert [s["metadata"]["name"] for s in stages] == [
        "node-initialize", "node-heartbeat-with-lease", "pod-ready", "pod-complete", "pod-delete",
        "node-not-ready", "pod-container-running-failed"]
    by_name = {s["metadata"]["name"]: s for s in stages}
    delete = by_name["pod-delete"]
    assert delete["spec"]["delay"] == {"durationMilliseconds": kwok.POD_DELETE_DELAY_MS}
    assert delete["spec"]["next"]["delete"] is True
    # the chaos stages are selected by the labels kimik3_dev.devcluster.faults sets
    for name, label in (("node-not-ready", kwok.NODE_NOT_READY_LABEL), ("pod-container-running-failed",
                                                                       kwok.POD_FAILED_LABEL)):
        keys = [e["key"] for e in by_name[name]["spec"]["selector"]["matchExpressions"]]
        assert f'.metadata.labels["{label}"]' in keys
    assert by_name["node-not-ready"]["spec"]["weight"] > 0 and "weight" not in by_name["node-initialize"]["spec"]
    assert kwok.argv(Path("/b/kwok"), Path("/k"), path, 1234)[-1] == "--server-address=127.0.0.1:1234"


@pytest.mark.tier("process")  # `go mod download` of the module
def test_lws_webhooks_point_at_loopback_with_our_ca(tmp_path: Path) -> None:
    ca = tmp_path / "ca.crt"
    ca.write_bytes(b"-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----\n")
    docs = lws.webhook_configurations(9443, ca)
    assert [(d["kind"], d["metadata"]["name"]) for d in docs] == [
        ("MutatingWebhookConfiguration", "lws-mutating-webhook-configuration"),
        ("ValidatingWebhookConfiguration", "lws-validating-webhook-configuration")]
    hooks = {h["name"]: h for d in docs for h in d["webhooks"]}
    assert hooks["mpod.kb.io"]["clientConfig"] == {
        "url": "https://127.0.0.1:9443/mutate--v1-pod", "caBundle": base64.b64encode(ca.read_bytes()).decode()}
    assert hooks["mleaderworkerset.kb.io"]["clientConfig"]["url"] == \
        "https://127.0.0.1:9443/mutate-leaderworkerset-x-k8s-io-v1-leaderworkerset"
    # only LWS pods go through the pod webhooks (as LWS's own kustomize patch does)
    for name in ("mpod.kb.io", "vpod.kb.io"):
        assert hooks[name]["objectSelector"] == {
            "matchExpressions": [{"key": "leaderworkerset.sigs.k8s.io/name", "operator": "Exists"}]}
    assert "objectSelector" not in hooks["vleaderworkerset.kb.io"]
    assert all("service" not in h["clientConfig"] for h in hooks.values())
    assert [p.name for p in lws.crd_paths()] == ["leaderworkerset.x-k8s.io_leaderworkersets.yaml",
                                                 "disaggregatedset.x-k8s.io_disaggregatedsets.yaml"]


def test_lws_config_turns_off_cert_management_and_leader_election(tmp_path: Path) -> None:
    from cryptography import x509
    from kimik3_dev.devcluster.controlplane import _write_pki
    _write_pki(tmp_path / "pki")
    path = lws.write_config(tmp_path, 9443, 9444)
    config = yaml.safe_load(path.read_text())
    assert config["leaderElection"] == {"leaderElect": False}
    assert config["internalCertManagement"] == {"enable": False}
    assert config["webhook"] == {"host": "127.0.0.1", "port": 9443, "certDir": str(tmp_path / "lws" / "certs")}
    assert config["health"] == {"healthProbeBindAddress": "127.0.0.1:9444"}
    assert config["metrics"] == {"bindAddress": "0"}
    cert = x509.load_pem_x509_certificate((tmp_path / "lws" / "certs" / "tls.crt").read_bytes())
    ca = x509.load_pem_x509_certificate((tmp_path / "pki" / "ca.crt").read_bytes())
    assert cert.issuer == ca.subject
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["127.0.0.1", "::1"]
    assert "--leader-elect=false" in lws.argv(Path("/b/lws"), Path("/k"), path)


def test_the_hand_written_prometheus_config_scrapes_static_targets_with_their_labels(tmp_path: Path) -> None:
    path = prometheus.write_config(tmp_path, [("127.0.0.1:8080", {"namespace": "ns", "group": "0"})])
    config = yaml.safe_load(path.read_text())
    assert config["global"]["scrape_interval"] == "5s"
    (engines,) = config["scrape_configs"]
    assert engines["static_configs"] == [{"targets": ["127.0.0.1:8080"], "labels": {"namespace": "ns", "group": "0"}}]
    # prometheus_client escapes ':' in OpenMetrics samples for Prometheus 2.42: renamed back
    assert engines["metric_relabel_configs"] == [{"source_labels": ["__name__"], "regex": "vllm_(.+)",
                                                  "target_label": "__name__", "replacement": "vllm:$1"}]
    argv = prometheus.argv(Path("/usr/bin/prometheus"), path, tmp_path, 9090)
    assert "--web.listen-address=127.0.0.1:9090" in argv
    assert f"--storage.tsdb.path={tmp_path / 'prometheus' / 'data'}" in argv


# -- processes, waits, failure messages ----------------------------------------------------------
@pytest.mark.tier("process")
def test_spawned_process_has_pidfile_rss_and_stops(tmp_path: Path) -> None:
    rec = processes.spawn(tmp_path, "sleeper", [sys.executable, "-c", "import time; print('hi', flush=True); time.sleep(60)"],
                          die_with_parent=True)
    try:
        assert rec.alive
        assert processes.read_record(tmp_path, "sleeper") == rec
        wait_for("sleeper", lambda: "hi" in Path(rec.log).read_text(), 10)
        assert processes.tree_rss_bytes(rec.pid) > 1 << 20  # a running Python interpreter
    finally:
        assert processes.stop(tmp_path, "sleeper", grace_s=5)
    assert not rec.alive
    assert processes.read_record(tmp_path, "sleeper") is None
    assert processes.stop(tmp_path, "sleeper") is False


def test_a_recycled_pid_is_not_ours(tmp_path: Path) -> None:
    rec = processes.ProcessRecord("x", 1, 12345, ["init"], "/dev/null")  # pid 1 started at another time
    assert not rec.alive


@pytest.mark.tier("process")
def test_failed_wait_names_component_log_and_retry(tmp_path: Path) -> None:
    rec = processes.spawn(tmp_path, "crasher", [sys.executable, "-c", "print('boom: port taken'); raise SystemExit(3)"])
    with pytest.raises(ComponentError) as info:
        wait_for("crasher", lambda: False, 30, process=rec, retry="kimik3 dev up")
    text = str(info.value)
    assert text.startswith("crasher: exited during start")
    assert f"log: {rec.log}" in text and "boom: port taken" in text and "retry: kimik3 dev up" in text
    with pytest.raises(ComponentError, match=r"not ready within 0 s \(last check: 3 of 4\)"):
        wait_for("slow", lambda: "3 of 4", 0.0)


def test_http_get_refuses_anything_but_loopback() -> None:
    with pytest.raises(ValueError, match="only talks to 127.0.0.1"):
        http_get("http://10.244.0.1:8000/health")


# -- ScalingLimited in the operator's status -----------------------------------------------------
def _pod(name: str, group: str, worker: str, scheduled: dict | None) -> dict:
    conditions = [scheduled] if scheduled else [{"type": "PodScheduled", "status": "True"}]
    return {"metadata": {"name": name, "labels": {"leaderworkerset.sigs.k8s.io/group-index": group,
                                                  "leaderworkerset.sigs.k8s.io/worker-index": worker}},
            "status": {"phase": "Pending" if scheduled else "Running", "conditions": conditions}}


UNSCHEDULABLE = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                 "message": "0/12 nodes are available: 4 node(s) didn't match pod anti-affinity rules."}


def test_unschedulable_groups_are_named_with_the_scheduler_message() -> None:
    pods = [_pod("k3-engine-0", "0", "0", None), _pod("k3-engine-3", "3", "0", UNSCHEDULABLE),
            _pod("k3-engine-10", "10", "0", UNSCHEDULABLE),
            _pod("k3-engine-2", "2", "0", {**UNSCHEDULABLE, "reason": "SchedulingGated"})]
    deleting = _pod("k3-engine-4", "4", "0", UNSCHEDULABLE)
    deleting["metadata"]["deletionTimestamp"] = "2026-11-29T00:00:00Z"
    unplaced = unschedulable_groups([*pods, deleting])
    assert unplaced == {"3": ("k3-engine-3", UNSCHEDULABLE["message"]), "10": ("k3-engine-10", UNSCHEDULABLE["message"])}
    assert scaling_limited_message({"3": unplaced["3"]}) == (
        "group 3 cannot be placed now (no rack or node has room); group 3: pod k3-engine-3 is Unschedulable: "
        "0/12 nodes are available: 4 node(s) didn't match pod anti-affinity rules.")
    assert scaling_limited_message(unplaced).startswith("groups 3, 10 cannot be placed now")


def _cr(status: dict | None = None) -> dict:
    cr = recipe(uid="u1")
    cr["metadata"]["generation"] = 2
    if status:
        cr["status"] = status
    return cr


def _status(cr: dict, admitted, lws_status: dict, pods: list[dict], desired: int):
    """``compute_status`` for the deployment's one LeaderWorkerSet with ``lws_status``."""
    sets = engine_sets([{"metadata": {"name": "k3-latency-engine", "uid": "u"}, "spec": {"replicas": desired},
                         "status": lws_status}], groups_of(pods, admitted.plan.nodes_per_group))
    return snapshots.status(cr, admitted, sets, sets[0], pods, desired)


def test_compute_status_sets_and_clears_scaling_limited() -> None:
    cr = _cr()
    admitted = admit(cr["spec"])
    lws_obj = {"status": {"replicas": 4, "readyReplicas": 3}}
    pods = [_pod("k3-latency-engine-3", "3", "0", UNSCHEDULABLE)]
    status = _status(cr, admitted, lws_obj["status"], pods, 4)
    limited = status.condition("ScalingLimited")
    assert limited is not None
    assert (limited.status, limited.reason, limited.observed_generation) == ("True", "Unschedulable", 2)
    assert limited.message.startswith("group 3 cannot be placed now")
    ready = status.condition("Ready")
    assert ready is not None and (ready.status, ready.reason) == ("False", "GroupsNotReady")

    time.sleep(1.1)  # a new transition gets a new lastTransitionTime (RFC 3339 seconds)
    # every pod of the 3 groups bound to a tray: placed (no pods, or a pod on no tray, is no evidence)
    bound = [{**p, "spec": {"nodeName": f"tray-{g}-{w}"}} for g in range(3) for w in range(2)
             for p in [_pod(f"k3-latency-engine-{g}-{w}", str(g), str(w), None)]]
    for p in bound:
        p["metadata"]["labels"]["leaderworkerset.sigs.k8s.io/name"] = "k3-latency-engine"
    cleared = _status(_cr(status_patch(status)), admitted, {"replicas": 3, "readyReplicas": 3}, bound, 3)
    limited2 = cleared.condition("ScalingLimited")
    assert limited2 is not None and (limited2.status, limited2.reason) == ("False", "AllGroupsPlaced")
    assert limited2.message == "every pod of the 3 group(s) is bound to a tray, each group inside one rack"
    assert limited2.last_transition_time != limited.last_transition_time


def test_a_worker_that_cannot_follow_its_bound_leader_names_the_leader_and_placement_kueue() -> None:
    """Placement exclusive, no gang scheduling: group 1's leader is bound in a rack with no free tray
    for its worker. The message says why, which pod to delete, and placement kueue as the fix; with
    the old group's pod still terminating on its tray (what ties the group to that rack, as the
    soak saw after a tray failure), that pod and the wait for the tray instead; nothing of it while
    the leader is unbound too (no rack had room for the group at all)."""
    cr = _cr()
    admitted = admit(cr["spec"])
    assert admitted.spec.scheduling.placement.mode == "exclusive" and admitted.plan.clique_placement
    leader = _pod("k3-latency-engine-1", "1", "0", None)
    leader["spec"] = {"nodeName": "gb300-r0-t01"}
    worker = _pod("k3-latency-engine-1-1", "1", "1", UNSCHEDULABLE)
    for p in (leader, worker):
        p["metadata"]["labels"]["leaderworkerset.sigs.k8s.io/name"] = "k3-latency-engine"
    limited = _status(cr, admitted, {"replicas": 2, "readyReplicas": 1}, [leader, worker], 2).condition("ScalingLimited")
    assert limited is not None and (limited.status, limited.reason) == ("True", "Unschedulable")
    assert limited.message == (
        "group 1 cannot be placed now (no rack or node has room); group 1: pod k3-latency-engine-1-1 is "
        f"Unschedulable: {UNSCHEDULABLE['message']}; placement exclusive has no gang scheduling: the leader "
        "k3-latency-engine-1 was bound first and its workers may only join it in its rack, which has no free tray "
        "for them, so the group waits there even while another rack has room for it. Deleting pod "
        "k3-latency-engine-1 recreates the whole group (its new leader may land in a rack with room); placement "
        "kueue admits each group whole into a rack with room")
    # the old group's worker still terminating on its failed tray pins the recreated group to that rack
    old = _pod("k3-latency-engine-1-1", "1", "1", None)
    old["metadata"].update(deletionTimestamp="2026-12-05T04:41:20Z", uid="old")
    old["metadata"]["labels"]["leaderworkerset.sigs.k8s.io/name"] = "k3-latency-engine"
    old["spec"] = {"nodeName": "gb300-r0-t02"}
    limited = _status(cr, admitted, {"replicas": 2, "readyReplicas": 1}, [leader, worker, old], 2
                      ).condition("ScalingLimited")
    assert limited is not None and limited.message.endswith(
        "; placement exclusive has no gang scheduling, and LeaderWorkerSet's exclusive affinity ties a recreated "
        "group to the rack of its old pods (the group keeps its key): k3-latency-engine-1-1 on gb300-r0-t02 still "
        "terminating (a tray that does not answer keeps its pods until it is back, or until its node is tainted "
        "node.kubernetes.io/out-of-service or deleted), so the leader k3-latency-engine-1 was bound in that rack and "
        "its workers find no free tray there, even while another rack has room for the group: it waits for the "
        "tray. Placement kueue admits each group whole into a rack with room"), limited.message
    unbound = {**leader, "spec": {}, "status": {**leader["status"], "conditions": [UNSCHEDULABLE]}}
    limited = _status(cr, admitted, {"replicas": 2, "readyReplicas": 1}, [unbound, worker], 2).condition("ScalingLimited")
    assert limited is not None and limited.reason == "Unschedulable" and "placement kueue" not in limited.message


def test_ready_message_names_a_crashed_engine_a_terminating_pod_or_a_missing_group() -> None:
    cr = _cr()
    admitted = admit(cr["spec"])
    assert admitted.plan.nodes_per_group == 2
    lws_obj = {"status": {"replicas": 2, "readyReplicas": 1}}
    ready = {"type": "Ready", "status": "True"}
    group0 = [_pod("k3-latency-engine-0", "0", "0", None), _pod("k3-latency-engine-0-1", "0", "1", None)]
    for pod in group0:
        pod["status"]["conditions"].append(ready)
    crashed = _pod("k3-latency-engine-1-1", "1", "1", None)
    crashed["status"].update(phase="Failed", containerStatuses=[{"name": "engine", "state": {"terminated": {
        "exitCode": 1, "reason": "containerFailed"}}}])
    leader1 = _pod("k3-latency-engine-1", "1", "0", None)
    leader1["status"]["conditions"].append(ready)

    def message(pods: list[dict]) -> str:
        ready = _status(cr, admitted, lws_obj["status"], pods, 2).condition("Ready")
        assert ready is not None
        return ready.message
    assert message([*group0, leader1, crashed]) == (
        "1/2 groups ready; group 1: worker pod k3-latency-engine-1-1 is Failed: container engine exited 1 "
        "(containerFailed)")
    leader1["metadata"]["deletionTimestamp"] = "2026-11-29T00:00:00Z"
    assert message([*group0, leader1]).startswith("1/2 groups ready; group 1: leader pod k3-latency-engine-1 "
                                                  "is Terminating")
    assert message(group0) == ("1/2 groups ready; group 1: 0/2 pods exist; the LeaderWorkerSet is (re)creating them")


def test_scaling_limited_set_by_someone_else_is_left_alone() -> None:
    cr = _cr({"conditions": [{"type": "ScalingLimited", "status": "True", "reason": "AtMaxReplicas",
                              "message": "autoscaler at maxReplicas 4", "lastTransitionTime": "2026-11-29T00:00:00Z"}]})
    admitted = admit(cr["spec"])
    status = _status(cr, admitted, {"replicas": 1, "readyReplicas": 1}, [], 1)
    limited = status.condition("ScalingLimited")
    assert limited is not None and (limited.status, limited.reason) == ("True", "AtMaxReplicas")
    assert limited.last_transition_time == "2026-11-29T00:00:00Z"


# -- dev status text -----------------------------------------------------------------------------
def test_overview_render_names_racks_trays_and_split_groups() -> None:
    data = {
        "racks": [{"name": "rack-0", "clique": "u.0", "nodes": 4, "ready": 4, "gpus": 16, "gpus_used": 8, "gpus_free": 8}],
        "groups": [
            {"namespace": "ns", "deployment": "k3", "lws": "k3-engine", "group": 0, "racks": ["rack-0"],
             "trays": ["gb300-r0-t00", "gb300-r0-t01"], "ready": 2, "size": 2,
             "pods": [{"name": "k3-engine-0", "waiting": "", "terminating": False}]},
            {"namespace": "ns", "deployment": "k3", "lws": "k3-engine", "group": 1, "racks": ["rack-0", "rack-1"],
             "trays": ["a", "b"], "ready": 2, "size": 2, "pods": []},
            {"namespace": "ns", "deployment": "k3", "lws": "k3-engine", "group": 2, "racks": [], "trays": [],
             "ready": 0, "size": 1, "pods": [{"name": "k3-engine-2", "waiting": "Unschedulable: 0/4 nodes",
                                              "terminating": False}]},
        ],
        "deployments": [{"namespace": "ns", "name": "k3", "replicas": 3, "groups": 3, "ready": 2,
                         "endpoint": "http://k3.ns.svc:8000/v1", "sim_endpoint": "http://127.0.0.1:4000",
                         "conditions": [{"type": "Ready", "status": "False", "reason": "GroupsNotReady", "message": "2/3"}]}],
    }
    text = render(data).splitlines()
    assert "  rack-0     clique u.0" in text[1] and text[1].endswith("4/4 trays Ready   GPUs 8 used / 8 free of 16")
    assert "  ns/k3 group 0: rack rack-0 (trays gb300-r0-t00, gb300-r0-t01)  2/2 pods ready" in text
    assert "  ns/k3 group 1: SPLIT over racks rack-0, rack-1 (trays a, b)  2/2 pods ready" in text
    assert "  ns/k3 group 2: not placed  0/1 pods ready" in text
    assert "      pod k3-engine-2: Unschedulable: 0/4 nodes" in text
    assert "      endpoint http://k3.ns.svc:8000/v1   simulator http://127.0.0.1:4000" in text
    assert "      Ready=False (GroupsNotReady): 2/3" in text


# -- tenants (dev up --tenant) -------------------------------------------------------------------
def test_a_tenant_gets_a_cluster_queue_in_the_cohort_a_local_queue_and_a_priority_class() -> None:
    from kimik3_dev.devcluster.kueue import COHORT, TENANT_PREEMPTION, Tenant
    tenant = Tenant.parse("batch=72:100")
    assert tenant == Tenant("batch", 72, 100) and Tenant.parse("web=16") == Tenant("web", 16, None)
    queue, local, priority = tenant.objects("gb300")
    assert (queue["kind"], queue["metadata"]["name"], queue["spec"]["cohortName"]) == ("ClusterQueue", "batch", COHORT)
    assert queue["spec"]["preemption"] == TENANT_PREEMPTION
    assert queue["spec"]["namespaceSelector"]["matchExpressions"][0]["values"] == ["batch"]
    assert queue["spec"]["resourceGroups"][0]["flavors"][0]["resources"][2] == {"name": GPU_RESOURCE, "nominalQuota": 72}
    assert (local["metadata"]["namespace"], local["metadata"]["name"], local["spec"]["clusterQueue"]) == (
        "batch", "default", "batch")
    assert (priority["kind"], priority["metadata"]["name"], priority["value"]) == ("WorkloadPriorityClass", "batch", 100)
    assert len(Tenant.parse("web=16").objects("gb300")) == 2
    for bad, words in (("batch", "NAME=GPUS[:PRIORITY]"), ("Batch=8", "DNS label"), ("b=eight", "whole number"),
                       ("b=8:high", "PRIORITY must be an integer")):
        with pytest.raises(ValueError, match=words.replace("[", r"\[").replace("]", r"\]")):
            Tenant.parse(bad)


@pytest.mark.tier("process")  # `go mod download` of the module
def test_kwok_leaves_probed_pods_unready_only_with_readiness_probes(tmp_path: Path) -> None:
    def pod_ready(readiness_probes: bool) -> str:
        (stage,) = [s for s in kwok.stages(readiness_probes=readiness_probes) if s["metadata"]["name"] == "pod-ready"]
        return stage["spec"]["next"]["statusTemplate"]
    plain, probed = pod_ready(False), pod_ready(True)
    assert "$probed" not in plain and plain.count('status: "True"') == 4  # Initialized, Ready, ContainersReady, gates
    assert probed.count('status: {{ if $probed }}"False"{{ else }}"True"{{ end }}') == 2
    assert "ready: {{ if $probed }}false{{ else }}true{{ end }}" in probed
    assert probed.replace(kwok._PROBED + "\n", "").count('status: "True"') == 2  # Initialized and readiness gates


def test_pod_history_integrates_the_gpus_held_between_the_changes_seen():
    from kimik3_dev.devcluster.usagecheck import PodHistory, checks, error_pct, failures
    history = PodHistory(None, "t", "k3")  # not entered: no watch, changes given by hand
    history.changes = [(100.0, "a", 8), (100.0, "b", 8), (130.0, "a", 0),  # a crashes at 130 s
                       (135.0, "c", 8), (160.0, "b", 0), (170.0, "a", 0)]   # c replaces it; b deleted
    assert history.held_gpu_seconds(100.0) == 0.0
    assert history.held_gpu_seconds(120.0) == 16 * 20
    # a: 30 s, b: 60 s, c: 35 s up to 170 s, each 8 GPUs
    assert history.held_gpu_seconds(170.0) == 8 * (30 + 60 + 35)
    assert history.held_gpu_seconds(200.0) == 8 * (30 + 60 + 65)
    assert (error_pct(101.0, 100.0), error_pct(0.0, 0.0)) == (1.0, None)
    row = {"prompt_tokens": 2020, "generation_tokens": 1000, "cached_prompt_tokens": 0, "requests": 10,
           "gpu_hours_held": 0.347}
    counts = {"vllm:prompt_tokens_total": 2000.0, "vllm:generation_tokens_total": 1000.0,
              'vllm:request_success_total{finished_reason="length"}': 9.0,
              'vllm:request_success_total{finished_reason="abort"}': 1.0, "vllm:prefix_cache_queries_total": 2000.0}
    assert checks(row, counts, history.held_gpu_seconds(200.0)) == {
        "prompt_tokens": {"report": 2020, "truth": 2000, "error_pct": 1.0},
        "generation_tokens": {"report": 1000, "truth": 1000, "error_pct": 0.0},
        "cached_prompt_tokens": {"report": 0, "truth": 0, "error_pct": None},
        "requests": {"report": 10, "truth": 10, "error_pct": 0.0},
        "gpu_hours_held": {"report": 0.347, "truth": 0.3444, "error_pct": 0.742}}  # 1240 GPU-s
    result = {"checks": {"generation_tokens": {"report": 1012, "truth": 1000, "error_pct": 1.2},
                         "requests": {"report": 99, "truth": 100, "error_pct": -1.0},
                         "cached_prompt_tokens": {"report": 3, "truth": 0, "error_pct": None}}}
    assert failures(result) == ["generation_tokens: report 1012 vs truth 1000 (1.2 %)",
                                "cached_prompt_tokens: report 3 vs truth 0 (None %)"]


def test_a_rollout_and_a_release_tally_the_requests_their_users_saw() -> None:
    from kimik3_dev.devcluster.rollout import Release, Rollout
    from kimik3_dev.sim.load import RequestResult

    results = [RequestResult("during", True, 0.0, ttft=0.1, e2e=0.2, output_tokens=3),
               RequestResult("during", False, 0.1, error="HTTP 503"),
               RequestResult("after", True, 0.2, ttft=0.1, e2e=0.2, output_tokens=3)]
    rollout = Rollout(seconds=12.0, old_revision="old", results=results)
    release = Release(window_s=60.0, rollback_s=None, took_over_s=None, rolled_back=None, canary=None,
                      served_by_new=0, results=results)
    assert (rollout.requests, rollout.failed) == (release.requests, release.failed) == (3, 1)
    quiet = Rollout(seconds=1.0, old_revision="old")
    assert (quiet.requests, quiet.failed) == (0, 0)
