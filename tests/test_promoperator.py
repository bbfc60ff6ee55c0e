"""The kit's side of the Prometheus Operator (kimik3_dev.devcluster.promoperator): the Prometheus
object it applies, and the config-reloader's reading and writing of the operator's Secret. The
operator itself, generating from these, runs in tests/e2e/test_e2e_prometheus.py."""

from __future__ import annotations

import base64
import gzip
import re
from pathlib import Path

import pytest

from kimik3_dev.devcluster import promoperator
from kimik3_dev.devcluster.rest import Rest


def secret(config: str, version: str = "1") -> dict:
    """The Secret as the operator writes it: ``prometheus.yaml.gz`` gzipped, base64 in ``data``."""
    return {"metadata": {"resourceVersion": version},
            "data": {promoperator.CONFIG_KEY: base64.b64encode(gzip.compress(config.encode())).decode()}}


class FakeRest(Rest):
    """GET of the one Secret path and list of the rule-file ConfigMaps only; the answers are set by the test."""

    def __init__(self) -> None:
        self.answer: dict | None = None
        self.configmaps: list[dict] = []
        self.paths: list[str] = []

    def get(self, path: str) -> dict | None:
        self.paths.append(path)
        return self.answer

    def items(self, path: str, selector: str = "") -> list[dict]:
        assert (path, selector) == ("/api/v1/namespaces/monitoring/configmaps", "prometheus-name=kimik3-dev")
        return self.configmaps


def test_the_prometheus_object_names_the_dev_api_server_with_host_files_and_no_pod():
    obj = promoperator.prometheus_resource("https://127.0.0.1:6443", Path("/s/pki/ca.crt"), Path("/s/tok"), "2.42.0",
                                           "5s")
    spec = obj["spec"]
    assert spec["apiserverConfig"] == {"host": "https://127.0.0.1:6443", "tlsConfig": {"caFile": "/s/pki/ca.crt"},
                                       "authorization": {"type": "Bearer", "credentialsFile": "/s/tok"}}
    assert (spec["version"], spec["replicas"], spec["replicaExternalLabelName"]) == ("v2.42.0", 0, "")
    assert spec["serviceDiscoveryRole"] == "EndpointSlice"
    for selector in ("podMonitorSelector", "podMonitorNamespaceSelector", "serviceMonitorSelector",
                     "serviceMonitorNamespaceSelector", "ruleSelector", "ruleNamespaceSelector"):
        assert spec[selector] == {}  # every monitor and rule of every namespace
    (scrape_class,) = spec["scrapeClasses"]
    assert scrape_class["default"] is True
    assert scrape_class["metricRelabelings"] == [promoperator.VLLM_NAME_RELABEL]
    assert promoperator.object_path(obj) == \
        "/apis/monitoring.coreos.com/v1/namespaces/monitoring/prometheuses/kimik3-dev"


@pytest.mark.parametrize(("address", "kept"), [("127.12.0.5:8000", True), ("127.0.0.1:9000", True),
                                               ("10.244.0.5:8000", False), ("1127.0.0.1:80", False)])
def test_the_scrape_class_keeps_loopback_targets_only(address, kept):
    # Prometheus anchors a relabel regex at both ends
    assert bool(re.fullmatch(promoperator.LOOPBACK_ONLY["regex"], address)) is kept


def test_the_vllm_rename_is_the_one_of_the_hand_written_configs():
    from kimik3_dev.devcluster import prometheus
    rename = promoperator.VLLM_NAME_RELABEL
    assert (rename["sourceLabels"], rename["regex"], rename["replacement"]) == (
        prometheus.VLLM_NAME_RELABEL["source_labels"], "vllm_(.+)", "vllm:$1")


def test_read_config_is_none_until_the_operator_wrote_the_key():
    assert promoperator.read_config(None) is None
    assert promoperator.read_config({"data": {}}) is None
    assert promoperator.read_config(secret("global: {}\n")) == "global: {}\n"


def test_the_pods_environment_is_expanded_as_the_sidecar_does_and_an_unknown_name_refused():
    assert promoperator.expand("regex: $(SHARD);|.+;.+\nreplica: $(POD_NAME)\nreplacement: $1\n") == \
        "regex: 0;|.+;.+\nreplica: prometheus-kimik3-dev-0\nreplacement: $1\n"
    with pytest.raises(ValueError, match=r"\$\(NODE_NAME\)"):
        promoperator.expand("x: $(NODE_NAME)")


def test_a_path_inside_the_operators_pod_is_refused_naming_the_line():
    with pytest.raises(ValueError, match=r"rule_files: /etc/prometheus/rules/x.*host path"):
        promoperator.check_paths("global: {}\nrule_files: /etc/prometheus/rules/x/*.yaml\n")
    promoperator.check_paths("tls_config:\n  ca_file: /home/u/.state/dev/pki/ca.crt\n")


def test_the_reloader_writes_each_new_configuration_once_and_leaves_a_refused_one_unwritten(tmp_path):
    rest = FakeRest()
    reloader = promoperator.ConfigReloader(rest, tmp_path / "prometheus" / "prometheus.yml", "http://127.0.0.1:1")
    reloader.reload = lambda: False  # Prometheus not answering: the reload stays due
    reloader.poll()
    assert rest.paths == ["/api/v1/namespaces/monitoring/secrets/prometheus-kimik3-dev"]
    assert not reloader.path.exists() and reloader.written is None

    rest.answer = secret("scrape_configs: []\nregex: $(SHARD);\n", "7")
    reloader.poll()
    assert reloader.path.read_text() == "scrape_configs: []\nregex: 0;\n" and reloader.reloaded is False
    reloader.reloaded = True
    reloader.poll()  # same resourceVersion: nothing written, no reload due
    assert reloader.reloaded is True

    rest.answer = secret("tls_config: {ca_file: /etc/prometheus/certs/ca.crt}\n", "8")
    with pytest.raises(ValueError):
        reloader.poll()
    assert reloader.path.read_text() == "scrape_configs: []\nregex: 0;\n"
    assert not list(reloader.path.parent.glob("*.tmp"))


def test_rule_files_of_the_operators_configmaps_are_written_on_the_host_and_the_paths_point_there(tmp_path):
    """The sidecar's other half: the rule-file ConfigMaps the StatefulSet would mount under
    /etc/prometheus/rules/<ConfigMap>/ are written under <state>/prometheus/rules/<ConfigMap>/, the
    configuration's rule_files point there, and a changed or removed file makes a reload due."""
    rest = FakeRest()
    reloader = promoperator.ConfigReloader(rest, tmp_path / "prometheus" / "prometheus.yml", "http://127.0.0.1:1")
    reloader.reload = lambda: False
    rules = tmp_path / "prometheus" / "rules"
    cm = {"metadata": {"name": "prometheus-kimik3-dev-rulefiles-0"},
          "data": {"monitoring-kimik3-usage-uid.yaml": "groups: []\n"}}
    other = {"metadata": {"name": "unrelated"}, "data": {"x.yaml": "no"}}
    rest.configmaps = [cm, other]
    rest.answer = secret("rule_files:\n- /etc/prometheus/rules/prometheus-kimik3-dev-rulefiles-0/*.yaml\n")
    reloader.poll()
    assert reloader.path.read_text() == f"rule_files:\n- {rules}/prometheus-kimik3-dev-rulefiles-0/*.yaml\n"
    assert sorted(p.relative_to(rules).as_posix() for p in rules.rglob("*") if p.is_file()) == [
        "prometheus-kimik3-dev-rulefiles-0/monitoring-kimik3-usage-uid.yaml"]
    reloader.reloaded = True
    reloader.poll()  # nothing changed: no reload due
    assert reloader.reloaded is True
    cm["data"] = {"monitoring-kimik3-usage-uid.yaml": "groups: [{name: g, rules: []}]\n"}
    reloader.poll()
    assert reloader.reloaded is False
    assert (rules / "prometheus-kimik3-dev-rulefiles-0" / "monitoring-kimik3-usage-uid.yaml").read_text() == \
        "groups: [{name: g, rules: []}]\n"
    reloader.reloaded = True
    rest.configmaps = []
    reloader.poll()
    assert reloader.reloaded is False and not [p for p in rules.rglob("*") if p.is_file()]


def test_dev_up_applies_the_usage_rules_as_the_chart_ships_them():
    from kimik3.usage.rules import rule_groups
    rule = promoperator.usage_rule()
    assert rule["spec"] == rule_groups()
    assert promoperator.object_path(rule) == \
        "/apis/monitoring.coreos.com/v1/namespaces/monitoring/prometheusrules/kimik3-usage"
