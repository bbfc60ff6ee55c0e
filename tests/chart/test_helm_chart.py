"""The Helm chart with real helm against a real kube-apiserver: lint, strict server-side dry run,
values schema, install + a recipe reconciled by the operator under the chart's own ServiceAccount
token and RBAC, a namespace-scoped install, upgrade across a CRD change (F13), and uninstall."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from prometheus_client.metrics import MetricWrapperBase
from kubernetes.client.exceptions import ApiException

from kimik3.cli import CHART_CRD_DIR, CRD_FILE, POLICY_FILE
from kimik3.controller import metrics
from kimik3.controller.kube import ApiError, Forbidden, Kube
from kimik3.usage.rules import rule_groups
from kimik3_dev.devcluster import kueue
from kimik3_dev.devcluster.rbac import request_token, write_token_kubeconfig

from support.cluster import CR, apply, make_namespace, metric, metric_samples, reconciled
from support.grafana import metric_names, substitute, targets
from support.recipes import recipe
from support.rendering import launcher_name
from support.waiting import wait_for

from .conftest import (CHART, CRD_NAME, RELEASE, RELEASE_NAMESPACE, REPO, OperatorProcess, copy_chart, deployment_args,
                       uninstall_if_present)

VARIANTS = {
    "default": [],
    "namespaced": ["--set", "watchNamespaces={kimik3-wa,kimik3-wb}"],
    "no-dra-driver": ["--set", "computeDomains=false"],
    "everything-on": ["--set", "metrics.serviceMonitor.enabled=true", "--set", "metrics.prometheusRule.enabled=true",
                      "--set", "networkPolicy.enabled=true",
                      "--set", "networkPolicy.apiServerCIDRs={10.0.0.1/32}", "--set", "verbose=true",
                      "--set", "image.digest=sha256:" + "0" * 64],
    "no-crd-no-dashboard": ["--set", "crds.install=false", "--set", "grafanaDashboard.enabled=false",
                            "--set", "metrics.service.enabled=false"],
    "kueue": ["--set", "kueue.enabled=true",
              "--set-json", 'kueue.tenants=[{"namespace":"tenant-a","gpus":16,"priority":100},{"namespace":"tenant-b",'
                            '"gpus":64,"queueName":"endpoints"}]',
              "--set-json", 'kueue.priorityClasses=[{"name":"premium","value":1000}]', "--set", "kueue.cohort=tenants"],
}
FORBIDDEN = re.compile(r"forbidden|(?<![,.\d])403(?!\d)", re.IGNORECASE)
"""An authorization failure in the operator's log (not a 403 in a log line's milliseconds)."""


def assert_no_403(log: str) -> None:
    found = [line for line in log.splitlines() if FORBIDDEN.search(line)]
    assert not found, "authorization failures in the operator's log:\n" + "\n".join(found[:20])


def by_kind(docs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for d in docs:
        out.setdefault(d["kind"], []).append(d)
    return out


# ---------------------------------------------------------------- without a cluster -----------


def test_chart_ships_the_repository_crds_byte_for_byte():
    """One source of truth: the chart's files/crds/ is crds/ (`kimik3 crd` writes both)."""
    assert CHART_CRD_DIR == Path("charts/kimik3-operator/files/crds")
    repo = {p.name: p.read_bytes() for p in (REPO / "crds").glob("*.yaml")}
    chart = {p.name: p.read_bytes() for p in (REPO / CHART_CRD_DIR).glob("*.yaml")}
    assert sorted(chart) == sorted(repo) == sorted([CRD_FILE, POLICY_FILE])
    for name in repo:
        assert chart[name] == repo[name], f"the chart's copy of crds/{name} is stale: run `tools/kimik3 crd`"


def test_kimik3_crd_writes_the_chart_copy(tmp_path):
    from click.testing import CliRunner

    from kimik3.cli import main
    (tmp_path / CHART_CRD_DIR).mkdir(parents=True)
    result = CliRunner().invoke(main, ["crd", "-o", str(tmp_path / "crds")])
    assert result.exit_code == 0, result.output
    for name in (CRD_FILE, POLICY_FILE):
        written = (tmp_path / CHART_CRD_DIR / name).read_bytes()
        assert written == (tmp_path / "crds" / name).read_bytes() == (REPO / "crds" / name).read_bytes()


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_helm_lint_is_clean(helm_offline, variant):
    for strict in ([], ["--strict"]):
        out = helm_offline.run("lint", str(CHART), *strict, *VARIANTS[variant])
        text = out.stdout + out.stderr
        assert "1 chart(s) linted, 0 chart(s) failed" in text
        assert not re.search(r"\[(INFO|WARNING|ERROR)\]", text), text


def test_rendered_crd_is_the_repository_crd_with_keep_policy(helm_offline):
    (crd,) = by_kind(helm_offline.template())["CustomResourceDefinition"]
    repo = yaml.safe_load((REPO / "crds" / CRD_FILE).read_text())
    assert crd["spec"] == repo["spec"] and crd["metadata"]["name"] == repo["metadata"]["name"] == CRD_NAME
    assert crd["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    assert crd["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
    assert "CustomResourceDefinition" not in by_kind(helm_offline.template("--set", "crds.install=false"))
    # The admission policy of crds/ too (a CR may name only Secrets its author may read).
    kinds = by_kind(helm_offline.template())
    repo_docs = [d for d in yaml.safe_load_all((REPO / "crds" / POLICY_FILE).read_text()) if d]
    rendered = kinds["ValidatingAdmissionPolicy"] + kinds["ValidatingAdmissionPolicyBinding"]
    assert [d["spec"] for d in rendered] == [d["spec"] for d in repo_docs]
    assert all(d["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"} for d in rendered)
    assert "ValidatingAdmissionPolicy" not in by_kind(helm_offline.template("--set", "admissionPolicy.install=false"))
    assert not (CHART / "crds").exists(), "crds/ is installed once and never upgraded by Helm (F13)"


LEADER_ARGS = ["--leader-election-namespace=kimik3-system", "--leader-election-name=kimik3-operator",
               "--lease-duration=15", "--renew-deadline=10", "--retry-period=2"]
WAKE_ARGS = ["--wake-port=8081", "--wake-service=kimik3-system/kimik3-operator-wake:8081"]
"""The gateway wake (templates/wake.yaml): the activator's port and the Service in front of it."""


def test_deployment_is_two_restricted_replicas_electing_a_leader_with_health_probes(helm_offline):
    (dep,) = by_kind(helm_offline.template())["Deployment"]
    spec = dep["spec"]
    assert spec["replicas"] == 2
    assert spec["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    pod = spec["template"]["spec"]
    assert pod["serviceAccountName"] == "kimik3-operator"
    assert pod["securityContext"] == {"runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532,
                                      "fsGroup": 65532, "seccompProfile": {"type": "RuntimeDefault"}}
    (c,) = pod["containers"]
    assert c["securityContext"] == {"runAsNonRoot": True, "readOnlyRootFilesystem": True,
                                    "allowPrivilegeEscalation": False, "privileged": False,
                                    "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}
    assert c["args"] == ["run", "--health-port=8080", f"--stager-image={c['image']}", *LEADER_ARGS,  # Jobs: same image
                         *WAKE_ARGS]
    assert c["ports"] == [{"name": "http-metrics", "containerPort": 8080, "protocol": "TCP"},
                          {"name": "http-wake", "containerPort": 8081, "protocol": "TCP"}]
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http-metrics"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http-metrics"}
    assert c["resources"] == {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"cpu": "1", "memory": "512Mi"}}
    assert c["image"] == "kimik3/kimik3-operator:0.1.0"
    # The values that change the command line.
    (dep,) = by_kind(helm_offline.template("--set", "computeDomains=false", "--set", "watchNamespaces={a,b}",
                                           "--set", "image.digest=sha256:" + "a" * 64))["Deployment"]
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    assert c["args"] == ["run", "--health-port=8080", f"--stager-image={c['image']}", "--namespace=a", "--namespace=b",
                         "--no-compute-domains", *LEADER_ARGS, *WAKE_ARGS]
    assert c["image"] == "kimik3/kimik3-operator@sha256:" + "a" * 64


def test_rbac_has_no_wildcards_and_the_namespaced_install_no_cluster_scope(helm_offline):
    cluster = by_kind(helm_offline.template())
    (role,) = cluster["ClusterRole"]
    for rule in role["rules"]:
        assert "*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"], rule
        assert len(rule["resources"]) == 1
    (binding,) = cluster["ClusterRoleBinding"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "kimik3-operator", "namespace": RELEASE_NAMESPACE}]
    namespaced = by_kind(helm_offline.template("--set", "watchNamespaces={team-a,team-b}"))
    assert "ClusterRole" not in namespaced and "ClusterRoleBinding" not in namespaced
    own = ("kimik3-operator-leader-election", "kimik3-operator-wake")  # its Lease's and ReferenceGrants' Roles
    roles = {r["metadata"]["namespace"]: r["rules"] for r in namespaced["Role"] if r["metadata"]["name"] not in own}
    assert sorted(roles) == ["team-a", "team-b"]
    # The same rules as cluster-wide, less the node list (racks and free trays), the WorkloadPriorityClass
    # read (reserved and burst priorities) and the ResourceSlice list (trays without the DRA driver's
    # channel device): all cluster-scoped, so a namespace-scoped install goes without. Neither has any
    # rule on CRDs (controller/lateapis.py).
    cluster_only = [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]},
                    {"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloadpriorityclasses"], "verbs": ["get"]},
                    {"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"], "verbs": ["list"]}]
    assert not any("apiextensions.k8s.io" in r["apiGroups"] for r in role["rules"])
    assert roles["team-a"] == [r for r in role["rules"] if r not in cluster_only]
    assert all(r in role["rules"] for r in cluster_only)
    assert {b["metadata"]["namespace"] for b in namespaced["RoleBinding"]
            if b["metadata"]["name"] not in own} == {"team-a", "team-b"}


def test_service_monitor_keeps_the_namespace_of_the_operators_series(helm_offline):
    # kimik3_autoscaler_*{namespace, deployment} are about a deployment: without honorLabels the
    # Prometheus Operator's target label namespace (the release's) would replace theirs, and the
    # dashboard's $namespace would select nothing.
    (monitor,) = by_kind(helm_offline.template(*VARIANTS["everything-on"]))["ServiceMonitor"]
    (endpoint,) = monitor["spec"]["endpoints"]
    assert (endpoint["port"], endpoint["path"], endpoint["honorLabels"]) == ("http-metrics", "/metrics", True)


def test_prometheus_rule_ships_the_usage_rules_of_kimik3_rules(helm_offline):
    assert "PrometheusRule" not in by_kind(helm_offline.template())
    (rule,) = by_kind(helm_offline.template(*VARIANTS["everything-on"], "--set",
                                            "metrics.prometheusRule.labels.release=prom"))["PrometheusRule"]
    assert rule["spec"] == rule_groups()
    assert (rule["metadata"]["name"], rule["metadata"]["labels"]["release"]) == (f"{RELEASE}-usage",
                                                                              "prom")


def test_network_policy_allows_only_probes_dns_api_server_and_metrics(helm_offline):
    assert "NetworkPolicy" not in by_kind(helm_offline.template())
    (policy,) = by_kind(helm_offline.template(*VARIANTS["everything-on"]))["NetworkPolicy"]
    spec = policy["spec"]
    assert spec["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "kimik3-operator",
                                                  "app.kubernetes.io/instance": RELEASE}
    assert spec["policyTypes"] == ["Ingress", "Egress"]
    assert spec["ingress"] == [{"ports": [{"port": 8080, "protocol": "TCP"}]},  # probes, metrics
                               {"ports": [{"port": 8081, "protocol": "TCP"}]}]  # the wake endpoint (gateways)
    ports = [sorted((p["port"], p["protocol"]) for p in rule["ports"]) for rule in spec["egress"]]
    assert ports == [[(53, "TCP"), (53, "UDP")], [(443, "TCP"), (6443, "TCP")], [(8000, "TCP"), (9090, "TCP")]]
    assert spec["egress"][1]["to"] == [{"ipBlock": {"cidr": "10.0.0.1/32"}}]


def test_dashboard_uses_real_metric_names(helm_offline):
    (cm,) = by_kind(helm_offline.template())["ConfigMap"]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(cm["data"]["kimik3.json"])
    anything = {"namespace": ".*", "deployment": ".*", "__rate_interval": "1m", "__range": "3h"}
    used = {m for t in targets(dashboard) for m in metric_names(substitute(t.expr, anything))}
    # vLLM's series (shared/reference/kimi-k3-and-vllm.md, "Prometheus metrics of the vLLM server").
    vllm = {"vllm:inter_token_latency_seconds_bucket", "vllm:request_time_per_output_token_seconds_bucket",
            "vllm:time_to_first_token_seconds_bucket", "vllm:num_requests_running", "vllm:num_requests_waiting",
            "vllm:kv_cache_usage_perc", "vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
            "vllm:spec_decode_num_accepted_tokens_total", "vllm:spec_decode_num_accepted_tokens_per_pos_total"}
    # The operator's own, as prometheus_client exposes the metrics of kimik3.controller.metrics.
    operator: set[str] = set()
    for wrapper in vars(metrics).values():
        if isinstance(wrapper, MetricWrapperBase):
            for family in wrapper.describe():
                operator |= {family.name, family.name + "_total", family.name + "_bucket"}
    operator |= {n for family in metrics.GPU_TIME.collect() for n in (family.name, family.name + "_total")}
    # The usage recording rules the chart ships (kimik3.usage.rules; loaded from the PrometheusRule).
    recorded = {r["record"] for g in rule_groups()["groups"] for r in g["rules"]}
    unknown = used - vllm - operator - recorded
    assert not unknown, f"dashboard queries series nobody exports: {sorted(unknown)}"
    titles = " | ".join(p["title"] for p in dashboard["panels"])
    for words in ("time per output token", "Tokens/s per user", "Acceptance length", "groups serving",
                  "Scale decisions", "Desired vs ready groups", "SLO attainment", "Reconciles", "Groups by revision",
                  "Canary checks", "Groups per rack", "Kueue state", "Tokens in the past hour", "by outcome",
                  "GPU-hours in the past hour: held vs serving", "reserved vs burst", "minutes within target",
                  "GPUs held and serving now"):
        assert words.lower() in titles.lower(), words
    assert {"vllm:inter_token_latency_seconds_bucket", "kimik3_reconciles_total", "kimik3_autoscaler_decisions_total",
            "kimik3_autoscaler_desired_groups", "kimik3_canary_checks_total", "kimik3_placement_groups",
            "kimik3_gpus"} | recorded <= used  # every recorded usage series has a panel


def test_leader_election_role_pdb_and_single_replica_fallback(helm_offline):
    kinds = by_kind(helm_offline.template())
    (role,) = [r for r in kinds["Role"] if r["metadata"]["name"] == "kimik3-operator-leader-election"]
    assert role["metadata"]["namespace"] == "kimik3-system"
    assert role["rules"] == [  # create cannot name an object; get and update only the release's Lease
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": ["kimik3-operator"],
         "verbs": ["get", "update"]}]
    (binding,) = [b for b in kinds["RoleBinding"] if b["metadata"]["name"] == "kimik3-operator-leader-election"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "kimik3-operator", "namespace": "kimik3-system"}]
    (pdb,) = kinds["PodDisruptionBudget"]
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == by_kind(helm_offline.template())["Deployment"][0]["spec"][
        "selector"]["matchLabels"]
    single = by_kind(helm_offline.template("--set", "leaderElection.enabled=false", "--set", "replicaCount=1"))
    (dep,) = single["Deployment"]
    assert dep["spec"]["strategy"] == {"type": "Recreate"} and dep["spec"]["replicas"] == 1
    assert not any(a.startswith("--leader-election") for a in dep["spec"]["template"]["spec"]["containers"][0]["args"])
    assert "PodDisruptionBudget" not in single
    assert not [r for r in single.get("Role", []) if r["metadata"]["name"].endswith("leader-election")]


def test_wake_service_and_its_role(helm_offline):
    kinds = by_kind(helm_offline.template())
    (service,) = [s for s in kinds["Service"] if s["metadata"]["name"] == "kimik3-operator-wake"]
    (dep,) = kinds["Deployment"]
    (container,) = dep["spec"]["template"]["spec"]["containers"]
    assert service["metadata"]["namespace"] == "kimik3-system"  # the namespace of --wake-service (WAKE_ARGS)
    assert service["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]  # every replica answers
    assert service["spec"]["ports"] == [{"name": "http-wake", "port": 8081, "targetPort": "http-wake", "protocol": "TCP"}]
    assert {"name": "http-wake", "containerPort": 8081, "protocol": "TCP"} in container["ports"]
    (role,) = [r for r in kinds["Role"] if r["metadata"]["name"] == "kimik3-operator-wake"]
    assert (role["metadata"]["namespace"], role["rules"]) == ("kimik3-system", [  # server-side apply of the grants
        {"apiGroups": ["gateway.networking.k8s.io"], "resources": ["referencegrants"],
         "verbs": ["list", "create", "patch", "delete"]}])
    (binding,) = [b for b in kinds["RoleBinding"] if b["metadata"]["name"] == "kimik3-operator-wake"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "kimik3-operator", "namespace": "kimik3-system"}]
    namespaces = {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get"]}  # a tenant namespace gone
    assert namespaces in kinds["ClusterRole"][0]["rules"]
    off = by_kind(helm_offline.template("--set", "wake.enabled=false"))
    assert namespaces not in off["ClusterRole"][0]["rules"]
    assert not [o for k in ("Service", "Role", "RoleBinding") for o in off.get(k, [])
                if o["metadata"]["name"] == "kimik3-operator-wake"]
    assert not any(a.startswith("--wake") for a in off["Deployment"][0]["spec"]["template"]["spec"]["containers"][0]["args"])


def test_notes_name_the_release(helm):
    out = helm.run("install", RELEASE, str(CHART), "--dry-run=server", "--namespace", RELEASE_NAMESPACE).stdout
    notes = out.split("NOTES:", 1)[1]
    assert "rollout status deployment/kimik3-operator" in notes
    assert "recipes/gb300-tp8-megakernel-dspark.yaml" in notes and "resource-policy: keep" in notes


@pytest.mark.parametrize("args,words", [
    (["--set", "replicaCount=-1"], ["at '/replicaCount'", "minimum: got -1, want 0"]),
    (["--set", "leaderElection.enabled=false", "--set", "replicaCount=2"], ["at '/replicaCount'",
                                                                             "maximum: got 2, want 1"]),
    (["--set", "bogusKey=1"], ["additional properties 'bogusKey' not allowed"]),
    (["--set", "metrics.serviceMonitor.intervall=30s"], ["at '/metrics/serviceMonitor'",
                                                        "additional properties 'intervall' not allowed"]),
    (["--set", "healthPort=80"], ["at '/healthPort'", "minimum: got 80, want 1,024"]),
    (["--set", "watchNamespaces={Bad_NS}"], ["at '/watchNamespaces/0'"]),
], ids=["negative-replicas", "two-replicas", "unknown-key", "unknown-nested-key", "privileged-port", "bad-namespace"])
def test_bad_values_fail_helm_install_naming_the_value(helm, args, words):
    out = helm.run("install", RELEASE, str(CHART), "--namespace", RELEASE_NAMESPACE, *args, check=False)
    assert out.returncode != 0
    assert "values don't meet the specifications of the schema(s)" in out.stderr, out.stderr
    for w in words:
        assert w in out.stderr, out.stderr
    listed = json.loads(helm.run("list", "-n", RELEASE_NAMESPACE, "-a", "-o", "json").stdout)
    assert listed == [], "a refused install must leave no release"


# ---------------------------------------------------------------- against the API server -------


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_template_is_accepted_by_the_api_server_with_strict_validation(helm, kube, admin_api, variant):
    for ns in ("kimik3-wa", "kimik3-wb", "tenant-a", "tenant-b"):
        make_namespace(admin_api, ns)
    docs = helm.template(*VARIANTS[variant])
    assert docs
    for doc in docs:
        meta = doc["metadata"]
        api_version, kind = doc["apiVersion"], doc["kind"]
        group_version = f"/apis/{api_version}" if "/" in api_version else f"/api/{api_version}"
        plural = {"ServiceAccount": "serviceaccounts", "ConfigMap": "configmaps", "Service": "services",
                  "Deployment": "deployments", "ClusterRole": "clusterroles", "ClusterRoleBinding": "clusterrolebindings",
                  "Role": "roles", "RoleBinding": "rolebindings", "CustomResourceDefinition": "customresourcedefinitions",
                  "PodDisruptionBudget": "poddisruptionbudgets",
                  "ServiceMonitor": "servicemonitors", "NetworkPolicy": "networkpolicies",
                  "PrometheusRule": "prometheusrules", "ValidatingAdmissionPolicy": "validatingadmissionpolicies",
                  "ValidatingAdmissionPolicyBinding": "validatingadmissionpolicybindings",
                  "Topology": "topologies", "ResourceFlavor": "resourceflavors", "ClusterQueue": "clusterqueues",
                  "LocalQueue": "localqueues", "WorkloadPriorityClass": "workloadpriorityclasses"}[kind]
        scoped = f"/namespaces/{meta['namespace']}" if meta.get("namespace") else ""
        url = f"{group_version}{scoped}/{plural}/{meta['name']}"
        query = [("fieldManager", "helm-dry-run"), ("fieldValidation", "Strict"), ("dryRun", "All"), ("force", "true")]
        kube.request("PATCH", url, body=doc, query=query, content_type="application/apply-patch+yaml")
    kinds = {d["kind"] for d in docs}
    expected = {kind: kinds | {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",  # and leader election:
                               "Role", "RoleBinding", "PodDisruptionBudget"} for kind, kinds in {
        "default": {"ServiceAccount", "ConfigMap", "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding",
                    "Service", "Deployment"},
        "namespaced": {"ServiceAccount", "ConfigMap", "CustomResourceDefinition", "Role", "RoleBinding", "Service",
                       "Deployment"},
        "no-dra-driver": {"ServiceAccount", "ConfigMap", "CustomResourceDefinition", "ClusterRole",
                          "ClusterRoleBinding", "Service", "Deployment"},
        "everything-on": {"ServiceAccount", "ConfigMap", "CustomResourceDefinition", "ClusterRole",
                          "ClusterRoleBinding", "Service", "Deployment", "ServiceMonitor", "NetworkPolicy",
                          "PrometheusRule"},
        "no-crd-no-dashboard": {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Service", "Deployment"},
        "kueue": {"ServiceAccount", "ConfigMap", "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding",
                  "Service", "Deployment", "Topology", "ResourceFlavor", "WorkloadPriorityClass", "ClusterQueue",
                  "LocalQueue"},
    }.items()}[variant]
    assert kinds == expected
    if variant == "kueue":
        queues = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ClusterQueue"}
        gpus = {n: q["spec"]["resourceGroups"][0]["flavors"][0]["resources"][2] for n, q in queues.items()}
        assert gpus == {"tenant-a": {"name": "nvidia.com/gpu", "nominalQuota": 16},
                        "tenant-b": {"name": "nvidia.com/gpu", "nominalQuota": 64}}
        local = {(d["metadata"]["namespace"], d["metadata"]["name"]): d["spec"]["clusterQueue"]
                 for d in docs if d["kind"] == "LocalQueue"}
        assert local == {("tenant-a", "inference"): "tenant-a", ("tenant-b", "endpoints"): "tenant-b"}
        assert {q["spec"]["cohortName"] for q in queues.values()} == {"tenants"}  # idle quota lent among tenants
        assert queues["tenant-a"]["spec"]["preemption"] == kueue.TENANT_PREEMPTION  # as `dev up --tenant`
        priorities = {d["metadata"]["name"]: d["value"] for d in docs if d["kind"] == "WorkloadPriorityClass"}
        assert priorities == {"premium": 1000, "tenant-a": 100}


def test_an_unknown_field_in_a_template_would_be_refused(kube):
    """The dry run above is strict: the same call refuses a misspelled field (the check has teeth)."""
    doc = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "x", "namespace": RELEASE_NAMESPACE},
           "automountServiceAccountTokn": True}
    with pytest.raises(ApiError) as err:
        kube.request("PATCH", f"/api/v1/namespaces/{RELEASE_NAMESPACE}/serviceaccounts/x", body=doc,
                     query=[("fieldManager", "t"), ("fieldValidation", "Strict"), ("dryRun", "All")],
                     content_type="application/apply-patch+yaml")
    assert ".automountServiceAccountTokn: field not declared in schema" in err.value.body


def test_operator_pod_passes_restricted_pod_security(helm, admin_api):
    """The API server's PodSecurity admission, enforcing "restricted", admits the chart's pod."""
    ns = make_namespace(admin_api, "kimik3-restricted", {"pod-security.kubernetes.io/enforce": "restricted",
                                                     "pod-security.kubernetes.io/enforce-version": "latest"})
    (dep,) = by_kind(helm.template())["Deployment"]
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "operator-pod", "namespace": ns},
           "spec": dep["spec"]["template"]["spec"]}
    client.CoreV1Api(admin_api).create_namespaced_pod(ns, pod, dry_run="All")
    bad = json.loads(json.dumps(pod))
    bad["spec"]["containers"][0]["securityContext"]["allowPrivilegeEscalation"] = True
    with pytest.raises(ApiException) as err:  # the check has teeth
        client.CoreV1Api(admin_api).create_namespaced_pod(ns, bad, dry_run="All")
    assert err.value.status == 403 and "allowPrivilegeEscalation != false" in err.value.body


# ---------------------------------------------------------------- install, run, uninstall -------


def _operator_objects(admin_api: client.ApiClient, kube: Kube) -> list[str]:
    """Every object of the release still present (by the chart's instance label)."""
    sel = f"app.kubernetes.io/instance={RELEASE}"
    found = []
    for api_version, kind in [("v1", "ServiceAccount"), ("v1", "ConfigMap"), ("v1", "Service"),
                              ("apps/v1", "Deployment"), ("rbac.authorization.k8s.io/v1", "Role"),
                              ("rbac.authorization.k8s.io/v1", "RoleBinding"),
                              ("networking.k8s.io/v1", "NetworkPolicy"), ("monitoring.coreos.com/v1", "ServiceMonitor")]:
        group = f"/apis/{api_version}" if "/" in api_version else f"/api/{api_version}"
        plural = {"ServiceAccount": "serviceaccounts", "ConfigMap": "configmaps", "Service": "services",
                  "Deployment": "deployments", "Role": "roles", "RoleBinding": "rolebindings",
                  "NetworkPolicy": "networkpolicies", "ServiceMonitor": "servicemonitors"}[kind]
        items = kube.request("GET", f"{group}/{plural}", query=[("labelSelector", sel)])["items"]
        found += [f"{kind} {i['metadata'].get('namespace', '')}/{i['metadata']['name']}" for i in items]
    for plural, kind in [("clusterroles", "ClusterRole"), ("clusterrolebindings", "ClusterRoleBinding")]:
        items = kube.request("GET", f"/apis/rbac.authorization.k8s.io/v1/{plural}", query=[("labelSelector", sel)])["items"]
        found += [f"{kind} {i['metadata']['name']}" for i in items]
    secrets = client.CoreV1Api(admin_api).list_namespaced_secret(RELEASE_NAMESPACE,
                                                              label_selector=f"owner=helm,name={RELEASE}")
    found += [f"Secret {s.metadata.name}" for s in secrets.items]
    return found


def _can(operator_api: client.ApiClient, verb: str, resource: str, namespace: str | None, group: str = "",
         subresource: str = "") -> bool:
    review = client.AuthorizationV1Api(operator_api).create_self_subject_access_review(
        {"spec": {"resourceAttributes": {"verb": verb, "resource": resource, "group": group,
                                         "namespace": namespace, "subresource": subresource}}})
    return bool(review.status.allowed)


def _delete_cr_and_wait(kube: Kube, namespace: str, name: str) -> None:
    kube.delete(*CR, namespace, name)
    wait_for(lambda: kube.get(*CR, namespace, name) is None, 30, f"teardown of {namespace}/{name}")


def test_install_then_operator_under_chart_rbac_reconciles_a_recipe_then_uninstall(
        helm, kube, admin_api, chart_cp, tmp_path):
    uninstall_if_present(helm)
    ns = make_namespace(admin_api, "k3-chart-install")
    helm.run("install", RELEASE, str(CHART), "--namespace", RELEASE_NAMESPACE,
             "--set", "metrics.serviceMonitor.enabled=true", "--set", "networkPolicy.enabled=true")
    try:
        crd = client.ApiextensionsV1Api(admin_api).read_custom_resource_definition(CRD_NAME)
        assert crd.metadata.annotations["helm.sh/resource-policy"] == "keep"
        wait_for(lambda: any(c.type == "Established" and c.status == "True"
                             for c in client.ApiextensionsV1Api(admin_api).read_custom_resource_definition(CRD_NAME)
                             .status.conditions or []), what="CRD Established")
        args = deployment_args(admin_api)
        assert args[:2] == ["run", "--health-port=8080"] and args[2].startswith("--stager-image=kimik3/kimik3-operator")
        assert args[3:] == [*LEADER_ARGS, *WAKE_ARGS]
        with chart_cp.api_client("operator") as operator_api:
            # What the chart grants, seen by the operator's own token.
            assert _can(operator_api, "patch", "leaderworkersets", ns, "leaderworkerset.x-k8s.io")
            assert _can(operator_api, "patch", "kimik3deployments", ns, "inference.kimik3.io", "status")
            assert not _can(operator_api, "update", "kimik3deployments", ns, "inference.kimik3.io", "status")
            assert not _can(operator_api, "get", "secrets", ns), "the operator never reads Secrets"
            assert not _can(operator_api, "create", "pods", ns)
            assert not _can(operator_api, "update", "leaderworkersets", ns, "leaderworkerset.x-k8s.io")
            assert not _can(operator_api, "update", "services", ns)  # applied, never updated (delete: the picker's)
            assert not _can(operator_api, "create", "gateways", ns, "gateway.networking.k8s.io"), "Gateways are only read"
        with OperatorProcess(args, chart_cp.operator_kubeconfig, tmp_path / "operator.log") as op:
            body = recipe("gb300-tp8-megakernel-dspark.yaml")
            uid = apply(kube, body, ns)["metadata"]["uid"]
            obj = reconciled(kube, ns, "k3-latency")
            for (api_version, kind), name in [(("resource.nvidia.com/v1beta1", "ComputeDomain"), "k3-latency"),
                                              (("v1", "ConfigMap"), launcher_name(body)),
                                              (("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet"), "k3-latency-engine"),
                                              (("v1", "Service"), "k3-latency"),
                                              (("monitoring.coreos.com/v1", "PodMonitor"), "k3-latency")]:
                child = kube.get(api_version, kind, ns, name)
                assert child is not None, f"{kind} {name} missing"
                assert child["metadata"]["ownerReferences"][0]["uid"] == uid
            assert obj["metadata"]["finalizers"] == ["inference.kimik3.io/teardown"]
            assert obj["status"]["plan"] == {"gpusPerNode": 4, "nodesPerGroup": 2, "gpusPerGroup": 8,
                                             "computeDomain": True}
            assert obj["status"]["endpoint"] == f"http://k3-latency.{ns}.svc:8000/v1"
            events = client.CoreV1Api(admin_api).list_namespaced_event(ns).items
            assert {"Applied", "DisruptionBudgetSkipped"} <= {e.reason for e in events}
            _delete_cr_and_wait(kube, ns, "k3-latency")  # teardown under the chart's RBAC (F4 order)
            assert kube.get("resource.nvidia.com/v1beta1", "ComputeDomain", ns, "k3-latency") is None
            assert metric(metric_samples(op.url), "kimik3_reconciles_total", result="applied") >= 1
        log = op.log()
        assert "reconcile of" not in log, log[-3000:]
        assert_no_403(log)
    finally:
        uninstall_if_present(helm)
    left = _operator_objects(admin_api, kube)
    assert left == [], f"helm uninstall left operator objects behind: {left}"
    # Kept on purpose (helm.sh/resource-policy: keep): the CRD, and so every KimiK3Deployment, and
    # the admission policy that guards the Secrets those may name.
    assert client.ApiextensionsV1Api(admin_api).read_custom_resource_definition(CRD_NAME).metadata.name == CRD_NAME
    policy = client.AdmissionregistrationV1Api(admin_api).read_validating_admission_policy("kimik3-secret-references")
    assert policy.metadata.annotations["helm.sh/resource-policy"] == "keep"


def test_namespace_scoped_install_needs_no_cluster_rbac(helm, kube, admin_api, chart_cp, tmp_path):
    uninstall_if_present(helm)
    watched, other = make_namespace(admin_api, "k3-tenant-watched"), make_namespace(admin_api, "k3-tenant-other")
    helm.run("install", RELEASE, str(CHART), "--namespace", RELEASE_NAMESPACE,
             "--set", f"watchNamespaces={{{watched}}}", "--set", "computeDomains=false")
    try:
        args = deployment_args(admin_api)
        assert args[:2] == ["run", "--health-port=8080"] and args[2].startswith("--stager-image=kimik3/kimik3-operator")
        assert args[3:] == [f"--namespace={watched}", "--no-compute-domains", *LEADER_ARGS, *WAKE_ARGS]
        with chart_cp.api_client("operator") as operator_api:
            assert _can(operator_api, "list", "kimik3deployments", watched, "inference.kimik3.io")
            assert not _can(operator_api, "list", "kimik3deployments", other, "inference.kimik3.io")
            assert not _can(operator_api, "list", "customresourcedefinitions", None, "apiextensions.k8s.io")
        with OperatorProcess(args, chart_cp.operator_kubeconfig, tmp_path / "operator.log") as op:
            body = recipe("b300-tp8-single-node.yaml")
            apply(kube, body, watched)
            apply(kube, body, other)
            obj = reconciled(kube, watched, "k3-b300")
            assert obj["status"]["plan"] == {"gpusPerNode": 8, "nodesPerGroup": 1, "gpusPerGroup": 8,
                                             "computeDomain": False}
            lws = kube.get("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", watched, "k3-b300-engine")
            assert lws["spec"]["leaderWorkerTemplate"]["size"] == 1
            # The other namespace is not the operator's: untouched.
            assert "status" not in kube.get(*CR, other, "k3-b300")
            assert kube.get("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", other, "k3-b300-engine") is None
            _delete_cr_and_wait(kube, watched, "k3-b300")
        log = op.log()
        assert_no_403(log)
        assert "Not enough permissions" not in log, "namespaced mode must not observe cluster-scoped kinds"
    finally:
        uninstall_if_present(helm)
        kube.delete(*CR, other, "k3-b300")  # never reconciled: no finalizer
    assert _operator_objects(admin_api, kube) == []


def _chart_v1(tmp_path: Path) -> Path:
    """The chart as released before spec.service.apiKeySecret/httpRoute existed: version 0.0.9,
    its CRD without those two fields (everything else the current chart)."""
    chart = copy_chart(tmp_path)
    crd_path = chart / "files" / "crds" / CRD_FILE
    crd = yaml.safe_load(crd_path.read_text())
    service = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["service"]
    del service["properties"]["apiKeySecret"], service["properties"]["httpRoute"]
    crd_path.write_text(yaml.safe_dump(crd, sort_keys=False))
    meta = yaml.safe_load((chart / "Chart.yaml").read_text())
    meta["version"] = "0.0.9"
    (chart / "Chart.yaml").write_text(yaml.safe_dump(meta, sort_keys=False))
    return chart


def test_upgrade_to_a_chart_whose_crd_adds_a_field_serves_it(helm, kube, admin_api, chart_cp, tmp_path):
    """F13: install v1, upgrade to v2 whose CRD adds spec.service.apiKeySecret and httpRoute,
    apply a CR using them: accepted, stored, reconciled."""
    uninstall_if_present(helm)
    ns = make_namespace(admin_api, "tenant-acme-f13")
    body = recipe("dedicated-endpoint.yaml")
    # Tests reach only 127.0.0.1: the autoscaler's Prometheus is a closed loopback port here.
    body["spec"]["autoscaling"]["metricsSource"]["prometheusUrl"] = "http://127.0.0.1:9"
    client.CoreV1Api(admin_api).create_namespaced_secret(ns, {"metadata": {"name": "k3-api-key"},
                                                          "stringData": {"api-key": "test-key"}})
    helm.run("install", RELEASE, str(_chart_v1(tmp_path)), "--namespace", RELEASE_NAMESPACE)
    try:
        with pytest.raises(ApiError) as err:  # v1's schema: the field does not exist yet
            apply(kube, body, ns)
        assert re.search(r"\.spec\.service\.(apiKeySecret|httpRoute): field not declared in schema", err.value.body)
        helm.run("upgrade", RELEASE, str(CHART), "--namespace", RELEASE_NAMESPACE)
        history = json.loads(helm.run("history", RELEASE, "-n", RELEASE_NAMESPACE, "-o", "json").stdout)
        assert [(h["chart"], h["status"]) for h in history] == [("kimik3-operator-0.0.9", "superseded"),
                                                                ("kimik3-operator-0.1.0", "deployed")]
        schema = client.ApiextensionsV1Api(admin_api).read_custom_resource_definition(CRD_NAME).spec.versions[0].schema
        assert "apiKeySecret" in schema.open_apiv3_schema.properties["spec"].properties["service"].properties
        stored = apply(kube, body, ns)
        assert stored["spec"]["service"]["apiKeySecret"] == {"name": "k3-api-key", "key": "api-key"}
        with OperatorProcess(deployment_args(admin_api), chart_cp.operator_kubeconfig, tmp_path / "operator.log") as op:
            obj = reconciled(kube, ns, "k3-acme")
            assert obj["status"]["conditions"]
            route = kube.get("gateway.networking.k8s.io/v1", "HTTPRoute", ns, "k3-acme")
            assert route["spec"]["parentRefs"][0]["name"] == "inference-gateway"
            assert route["spec"]["rules"][0]["backendRefs"][0]["name"] == "k3-acme"
            lws = kube.get("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", ns, "k3-acme-engine")
            leader_env = lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]["env"]
            assert {"name": "VLLM_API_KEY", "valueFrom": {"secretKeyRef": {"name": "k3-api-key", "key": "api-key"}}} \
                in leader_env
            _delete_cr_and_wait(kube, ns, "k3-acme")
        assert_no_403(op.log())
    finally:
        uninstall_if_present(helm)
    assert _operator_objects(admin_api, kube) == []


def test_admission_policy_checks_who_adds_a_secret_reference_not_who_keeps_it(helm, kube, admin_api, chart_cp,
                                                                              tmp_path):
    """The chart's ValidatingAdmissionPolicy: a tenant who may edit KimiK3Deployments but not read a
    Secret can neither add nor change a reference to it; an update that keeps the reference (what
    the operator's finalizer patch does, under RBAC without `get secrets`) passes."""
    uninstall_if_present(helm)
    ns = make_namespace(admin_api, "k3-tenant-policy")
    helm.run("install", RELEASE, str(CHART), "--namespace", RELEASE_NAMESPACE)
    core, rbac = client.CoreV1Api(admin_api), client.RbacAuthorizationV1Api(admin_api)
    try:
        core.create_namespaced_service_account(ns, {"metadata": {"name": "tenant"}})
        rbac.create_namespaced_role(ns, {"metadata": {"name": "k3-editor"}, "rules": [
            {"apiGroups": ["inference.kimik3.io"], "resources": ["kimik3deployments"],
             "verbs": ["get", "list", "create", "update", "patch"]}]})
        rbac.create_namespaced_role_binding(ns, {
            "metadata": {"name": "tenant-k3-editor"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "k3-editor"},
            "subjects": [{"kind": "ServiceAccount", "name": "tenant", "namespace": ns}]})
        token, _ = request_token(admin_api, ns, "tenant", lifetime_s=3600)
        kubeconfig = write_token_kubeconfig(tmp_path / "tenant.kubeconfig", chart_cp.server, chart_cp.ca_file, "t",
                                            token)
        from kubernetes import config
        with config.new_client_from_config(config_file=str(kubeconfig)) as tenant_api:
            tenant = Kube(tenant_api)
            body = recipe("b300-tp8-single-node.yaml", name="k3-tenant", namespace=ns)
            tenant.apply(body, force=False)
            key = {"apiKeySecret": {"name": "k3-api-key", "key": "api-key"}}

            def enforced() -> bool:  # the API server compiles a new policy within moments
                probe = {**body, "metadata": {"name": "k3-probe", "namespace": ns},
                         "spec": {**body["spec"], "service": key}}
                try:
                    tenant.request("POST", f"/apis/inference.kimik3.io/v1alpha1/namespaces/{ns}/kimik3deployments",
                                   body=probe, query=[("dryRun", "All")])
                    return False
                except ApiError as exc:
                    return exc.status == 403
            wait_for(enforced, 30, "the admission policy in force")
            with pytest.raises(Forbidden) as err:  # adding a reference to a Secret it may not read
                tenant.patch_merge(*CR, ns, "k3-tenant", {"spec": {"service": key}})
            assert err.value.status == 403
            assert "spec.service.apiKeySecret: you may not get Secret k3-api-key" in err.value.body
            kube.patch_merge(*CR, ns, "k3-tenant", {"spec": {"service": key}})  # the Secret's owner may
            kept = tenant.patch_merge(*CR, ns, "k3-tenant", {"spec": {"replicas": 2}})  # reference kept
            assert kept["spec"]["replicas"] == 2 and kept["spec"]["service"]["apiKeySecret"]["name"] == "k3-api-key"
            with pytest.raises(Forbidden) as err:  # pointing it at another Secret is a new reference
                tenant.patch_merge(*CR, ns, "k3-tenant", {"spec": {"service": {
                    "apiKeySecret": {"name": "someone-elses", "key": "api-key"}}}})
            assert err.value.status == 403 and "you may not get Secret someone-elses" in err.value.body
        kube.delete(*CR, ns, "k3-tenant")  # never reconciled here: no finalizer
    finally:
        uninstall_if_present(helm)
