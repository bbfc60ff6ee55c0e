"""``kimik3 dev status`` names the rack (and trays) each group landed on, and the cluster's
processes, racks and CR status; the dev cluster's processes are the real ones, and its operator
runs as the chart's ServiceAccount under the chart's RBAC."""

from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner
from devenv import SHAPE, WAIT_S, DevEnv
from kubernetes import config

from kimik3.cli import main
from kimik3.controller.kube import Forbidden
from kimik3_dev.devcluster.controlplane import OPERATOR_USER
from kimik3_dev.devcluster.racks import RACK_LABEL
from kimik3_dev.devcluster.rbac import RELEASE, RELEASE_NAMESPACE, chart_rbac, whoami
from kimik3_dev.devcluster.rest import Rest
from kimik3_dev.versions import KUEUE_VERSION, KWOK_VERSION, LWS_VERSION, PROMETHEUS_VERSION
from support.waiting import wait_for

TRAYS_TP8 = 2
GPUS_PER_TRAY = 4


def test_dev_status_names_the_rack_of_each_group(dev_env: DevEnv, ns: str) -> None:
    dev_env.apply(dev_env.deployment(ns, replicas=2))
    groups = wait_for(lambda: dev_env.ready_groups(ns, TRAYS_TP8, 2), WAIT_S, "2 ready groups")
    wait_for(lambda: (dev_env.get_cr(ns) or {}).get("status", {}).get("readyReplicas") == 2, WAIT_S,
             "status readyReplicas 2")
    nodes = {n["metadata"]["name"]: n for n in dev_env.rest.items("/api/v1/nodes")}
    state_dir = str(dev_env.cluster.state_dir)

    result = CliRunner().invoke(main, ["dev", "status", "--state-dir", state_dir])
    assert result.exit_code == 0, result.output
    text = result.output
    used_racks = set()
    for index, pods in groups.items():
        trays = [p["spec"]["nodeName"] for p in pods]
        rack = nodes[trays[0]]["metadata"]["labels"][RACK_LABEL]
        used_racks.add(rack)
        assert f"{ns}/k3 group {index}: rack {rack} (trays {', '.join(trays)})  2/2 pods ready" in text, text
    for rack in used_racks:  # each used rack: 2 trays x 4 GPUs busy, 2 trays free
        busy = TRAYS_TP8 * GPUS_PER_TRAY
        free = SHAPE["trays_per_rack"] * GPUS_PER_TRAY - busy
        assert any(line.strip().startswith(rack) and f"GPUs {busy} used / {free} free" in line
                   for line in text.splitlines()), text
    assert f"{ns}/k3: replicas 2, groups 2, ready 2" in text
    assert f"endpoint http://k3.{ns}.svc:8000/v1" in text
    assert "Ready=True (AllGroupsReady)" in text

    as_json = CliRunner().invoke(main, ["dev", "status", "--state-dir", state_dir, "--json"])
    assert as_json.exit_code == 0, as_json.output
    data = json.loads(as_json.output)
    mine = [g for g in data["groups"] if g["namespace"] == ns]
    assert [(g["group"], len(g["racks"]), g["ready"]) for g in mine] == [(0, 1, 2), (1, 1, 2)]
    assert len({g["racks"][0] for g in mine}) == 2  # exclusive: one rack each


def test_dev_up_started_real_processes_on_loopback(dev_env: DevEnv) -> None:
    running = {r.name: r for r in dev_env.cluster.running()}
    assert set(running) >= {"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "lws-manager",
                            "kueue-manager", "kwok", "operator", "prometheus"}
    assert running["kwok"].argv[0].endswith(f"kwok-{KWOK_VERSION}")
    assert running["lws-manager"].argv[0].endswith(f"lws-manager-{LWS_VERSION}")
    assert running["kueue-manager"].argv[0].endswith(f"kueue-manager-{KUEUE_VERSION}")
    # the build with Kubernetes service discovery (tools/prometheus), not Debian's package
    assert running["prometheus"].argv[0].endswith(f"prometheus-{PROMETHEUS_VERSION}")
    for name, url in dev_env.state["urls"].items():
        if url.startswith("http"):
            assert url.split("//", 1)[1].startswith("127.0.0.1:"), (name, url)
    rss = dev_env.cluster.rss_bytes()
    assert all(v > 1 << 20 for v in rss.values()), rss  # every process holds > 1 MiB resident
    for r in running.values():
        assert os.path.exists(r.log)
    webhooks = dev_env.rest.items("/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations")
    by_manager: dict[str, list[str]] = {}
    for w in webhooks:  # lws-... and kueue-...: each manager's webhooks point at its own loopback server
        manager = w["metadata"]["name"].split("-", 1)[0]
        by_manager.setdefault(manager, []).extend(h["clientConfig"]["url"] for h in w["webhooks"])
    assert sorted(by_manager) == ["kueue", "lws"], sorted(by_manager)
    for manager, urls in by_manager.items():
        base = dev_env.state["urls"][f"{manager}-webhooks"] + "/"
        assert urls and all(u.startswith(base) for u in urls), (manager, urls)


def test_dev_up_runs_the_operator_as_the_chart_service_account(dev_env: DevEnv) -> None:
    identity = dev_env.state["operator_identity"]
    assert identity == json.loads(dev_env.cluster.state_file.read_text())["operator_identity"]
    assert identity["user"] == OPERATOR_USER == "system:serviceaccount:kimik3-system:kimik3-operator"
    assert identity["rbac"] == ["ServiceAccount/kimik3-system/kimik3-operator", "ClusterRole/kimik3-operator",
                                "ClusterRoleBinding/kimik3-operator",
                                "Role/kimik3-system/kimik3-operator-leader-election",
                                "Role/kimik3-system/kimik3-operator-wake",
                                "RoleBinding/kimik3-system/kimik3-operator-leader-election",
                                "RoleBinding/kimik3-system/kimik3-operator-wake"]
    # The running operator process uses that kubeconfig, not the admin one.
    (operator,) = [r for r in dev_env.cluster.running() if r.name == "operator"]
    assert operator.argv[operator.argv.index("--kubeconfig") + 1] == identity["kubeconfig"]
    assert identity["kubeconfig"] != str(dev_env.cluster.kubeconfig)
    assert "--no-compute-domains" not in operator.argv  # GB300: the simulated DRA driver runs
    # The cluster's RBAC is what the chart renders; the token is the ServiceAccount's own.
    rendered = {d["kind"]: d for d in chart_rbac()}
    role = dev_env.rest.get(f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{RELEASE}")
    assert role is not None and role["rules"] == rendered["ClusterRole"]["rules"]
    sa = dev_env.rest.get(f"/api/v1/namespaces/{RELEASE_NAMESPACE}/serviceaccounts/{RELEASE}")
    assert sa is not None and sa["metadata"]["uid"] == identity["uid"]
    with config.new_client_from_config(config_file=identity["kubeconfig"]) as api:
        me = whoami(api)
        assert (me["username"], me["uid"]) == (OPERATOR_USER, identity["uid"])
        with pytest.raises(Forbidden) as refused:  # the chart grants no Secrets
            Rest(api).items(f"/api/v1/namespaces/{RELEASE_NAMESPACE}/secrets")
        assert refused.value.status == 403
