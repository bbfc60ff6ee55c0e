"""The real Prometheus Operator out of cluster, and the kit as its Prometheus' kubelet and config-reloader.

On a cluster, the Prometheus Operator turns PodMonitors and ServiceMonitors (among others) into a
Prometheus configuration, stores it gzipped in the Secret ``prometheus-<name>`` (key
``prometheus.yaml.gz``) and runs Prometheus in a StatefulSet whose config-reloader sidecar writes
that Secret to a file and calls Prometheus' ``/-/reload``. In the dev cluster:

- ``argv``: the operator (``PROMETHEUS_OPERATOR_VERSION`` of ``kimik3_dev.versions``, built by
  ``tools/build-binaries.sh prometheus-operator`` from ``tools/prometheus-operator/go.mod``) runs on
  the host against the dev API server (``KUBECONFIG``: the admin kubeconfig), watching Prometheus
  objects in ``NAMESPACE`` only and monitors in every namespace; its web server on 127.0.0.1.
- ``crd_paths``: the CRDs it needs beyond PodMonitor/ServiceMonitor (``thirdparty``): Prometheus,
  PrometheusRule and Probe (it starts informers on all three), read from its Go module. Not
  ScrapeConfig (686 kB; the operator runs without it) nor Alertmanager, ThanosRuler, PrometheusAgent.
- ``prometheus_resource``: one ``Prometheus`` (``NAMESPACE``/``PROMETHEUS_NAME``) whose
  ``apiserverConfig`` names the dev API server by ``https://127.0.0.1:<port>`` with the CA file and a
  token file the dev cluster writes (``install_identity``): Kubernetes service discovery from
  outside the cluster. It selects every PodMonitor and ServiceMonitor of every namespace;
  ``spec.version`` is the Debian Prometheus' own version, so the
  operator only emits what that version accepts. ``spec.replicas`` is 0: the StatefulSet the
  operator creates has no pod (no kwok pod, no tray capacity taken); the Prometheus process on the
  host stands for its one replica. Its ``ruleSelector`` selects every PrometheusRule of every
  namespace; ``dev up`` applies the chart's (``usage_rule``: the recording rules of
  ``kimik3.usage.rules``), which the operator renders into ConfigMaps ``prometheus-<name>-rulefiles-<n>``.
- ``operator_job``: the kimik3 operator's own ``/metrics`` as a static target in the
  ``additionalScrapeConfigs`` Secret (``additional_scrape_configs``): it listens on 127.0.0.1, which
  the API server refuses in Endpoints/EndpointSlices, so the chart's ServiceMonitor cannot
  discover it here.
- ``ConfigReloader`` (``kimik3 dev config-reloader``, started by ``dev up``): polls the Secret,
  writes the decompressed configuration to ``config_file`` with the sidecar's one rewrite, its
  pod's environment expanded (``expand``: ``$(SHARD)`` -> ``0``, ``$(POD_NAME)``), and no path
  rewritten (every file it names -- CA, token -- is a host path given in ``apiserverConfig``;
  ``check_paths`` refuses one under the container's ``/etc/prometheus``) but the rule files': the
  rule-file ConfigMaps the StatefulSet would mount under ``/etc/prometheus/rules/<ConfigMap>/``
  are written to ``<state>/prometheus/rules/<ConfigMap>/`` (``sync_rules``, as the sidecar's
  watched rule directories) and the configuration's ``rule_files`` point there; then it POSTs
  ``/-/reload`` until Prometheus answers (again whenever the rule files change).

The Prometheus resource's default scrape class (applied to every monitor, the operator's rendered
PodMonitor unchanged) keeps only targets in 127.0.0.0/8 (``LOOPBACK_ONLY``) and renames vLLM's
samples, which reach Prometheus 2.42 as ``vllm_<x>`` (see ``prometheus``'s module docstring), back
to ``vllm:<x>`` (``VLLM_NAME_RELABEL``).
"""

from __future__ import annotations

import gzip
import logging
import os
import re
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from kimik3.api.documents import dump_yaml
from kimik3_dev.devcluster import prometheus
from kimik3_dev.devcluster.rest import Rest
from kimik3_dev.devcluster.thirdparty import PROMETHEUS_OPERATOR_MODULE, go_module_dir
from kimik3_dev.versions import PROMETHEUS_OPERATOR_VERSION

__all__ = [
    "CONFIG_KEY",
    "CONFIG_SECRET",
    "NAMESPACE",
    "PROMETHEUS_NAME",
    "LOOPBACK_ONLY",
    "VLLM_NAME_RELABEL",
    "ConfigReloader",
    "argv",
    "check_paths",
    "expand",
    "config_file",
    "crd_paths",
    "install_identity",
    "prometheus_resource",
    "read_config",
    "rules_dir",
    "usage_rule",
    "additional_scrape_configs",
    "object_path",
    "operator_job",
]

log = logging.getLogger(__name__)

NAMESPACE = "monitoring"
PROMETHEUS_NAME = "kimik3-dev"
CONFIG_SECRET = f"prometheus-{PROMETHEUS_NAME}"
"""The Secret the operator writes the generated configuration into (``prometheus-<name>``)."""
CONFIG_KEY = "prometheus.yaml.gz"
SERVICE_ACCOUNT = "prometheus"
"""``NAMESPACE``/``prometheus``: the identity Prometheus' service discovery uses (``install_identity``)."""
DISCOVERY_ROLE = "kimik3-dev-prometheus"
"""ClusterRole (and binding) of ``SERVICE_ACCOUNT``: read what Kubernetes service discovery lists."""
ADDITIONAL_SECRET = "additional-scrape-configs"
OPERATOR_JOB = "kimik3-operator"
"""``job`` label of the kimik3 operator's own /metrics (``operator_job``)."""
POD_ENVIRONMENT = {"SHARD": "0", "POD_NAME": f"prometheus-{PROMETHEUS_NAME}-0"}
"""What the config-reloader sidecar of the StatefulSet's first pod expands in the configuration
(``$(SHARD)`` in the sharding relabeling, ``$(POD_NAME)``): the one shard, the one replica."""
CONTAINER_CONFIG_DIR = "/etc/prometheus/"
CONTAINER_RULES_DIR = "/etc/prometheus/rules/"
"""Where the StatefulSet mounts each rule-file ConfigMap (``/etc/prometheus/rules/<ConfigMap>/``)."""
RULE_CONFIGMAPS = f"prometheus-{PROMETHEUS_NAME}-rulefiles-"
"""Name prefix of the ConfigMaps the operator renders the selected PrometheusRules into."""
USAGE_RULE = "kimik3-usage"
"""Name of the PrometheusRule ``dev up`` applies in ``NAMESPACE`` (``usage_rule``)."""
"""Where the operator's own pods mount files; a path under it in the configuration means a file
only a pod would have (``check_paths``)."""
_CRD_DIR = "example/prometheus-operator-crd"
_CRDS = ("prometheuses", "prometheusrules", "probes")

VLLM_NAME_RELABEL = {"sourceLabels": prometheus.VLLM_NAME_RELABEL["source_labels"],
                     "regex": prometheus.VLLM_NAME_RELABEL["regex"], "targetLabel": "__name__",
                     "replacement": prometheus.VLLM_NAME_RELABEL["replacement"], "action": "replace"}
"""``prometheus.VLLM_NAME_RELABEL`` as a metricRelabelings entry (the Prometheus Operator's
RelabelConfig): ``vllm_<x>`` -> ``vllm:<x>``."""
LOOPBACK_ONLY = {"sourceLabels": ["__address__"], "regex": r"127\.\d+\.\d+\.\d+(:\d+)?", "action": "keep"}
"""A relabelings entry: keep only targets at a 127.0.0.0/8 address. This machine may contact no
other; a pod IP outside it (a kwok without the loopback pod CIDR) is dropped, not scraped."""


def crd_paths() -> list[Path]:
    """Prometheus, PrometheusRule and Probe CRD files of the operator's Go module."""
    directory = go_module_dir(PROMETHEUS_OPERATOR_MODULE, PROMETHEUS_OPERATOR_VERSION) / _CRD_DIR
    return [directory / f"monitoring.coreos.com_{plural}.yaml" for plural in _CRDS]


def argv(binary: Path, port: int) -> list[str]:
    """The operator's command line (``KUBECONFIG`` in its environment names the cluster): Prometheus
    objects and their Secrets/StatefulSets watched in ``NAMESPACE`` only, /metrics and /healthz on
    ``127.0.0.1:<port>``."""
    return [str(binary), f"--prometheus-instance-namespaces={NAMESPACE}", f"--web.listen-address=127.0.0.1:{port}",
            "--log-level=info"]


def install_identity(rest: Rest, token_file: Path, lifetime_s: int) -> None:
    """Create ``NAMESPACE``, ServiceAccount ``SERVICE_ACCOUNT`` and its read-only discovery RBAC
    (pods, services, endpoints, EndpointSlices: get/list/watch), and write a TokenRequest token of
    it (valid ``lifetime_s`` seconds) to ``token_file`` (mode 0600) for ``apiserverConfig``."""
    from kimik3_dev.devcluster.rbac import request_token

    rest.apply(f"/api/v1/namespaces/{NAMESPACE}", {"apiVersion": "v1", "kind": "Namespace",
                                                   "metadata": {"name": NAMESPACE}})
    rest.apply(f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/{SERVICE_ACCOUNT}",
               {"apiVersion": "v1", "kind": "ServiceAccount",
                "metadata": {"name": SERVICE_ACCOUNT, "namespace": NAMESPACE}})
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    rest.apply(f"{rbac}/clusterroles/{DISCOVERY_ROLE}", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": DISCOVERY_ROLE},
        "rules": [{"apiGroups": [""], "resources": ["pods", "services", "endpoints"],
                   "verbs": ["get", "list", "watch"]},
                  {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
                   "verbs": ["get", "list", "watch"]}]})
    rest.apply(f"{rbac}/clusterrolebindings/{DISCOVERY_ROLE}", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": DISCOVERY_ROLE},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": DISCOVERY_ROLE},
        "subjects": [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": NAMESPACE}]})
    token, _ = request_token(rest.kube.api, NAMESPACE, SERVICE_ACCOUNT, lifetime_s)
    token_file.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(token)


def prometheus_resource(server: str, ca_file: Path, token_file: Path, version: str,
                        scrape_interval: str) -> dict[str, Any]:
    """The ``Prometheus`` object (see the module docstring). ``server``: ``https://127.0.0.1:<port>``;
    ``version``: the Prometheus binary's, e.g. ``2.42.0``; ``scrape_interval``: Go duration, also the
    rule-evaluation interval (a monitor's own interval wins). Its ``additionalScrapeConfigs`` is
    the Secret ``additional_scrape_configs`` writes."""
    return {
        "apiVersion": "monitoring.coreos.com/v1", "kind": "Prometheus",
        "metadata": {"name": PROMETHEUS_NAME, "namespace": NAMESPACE},
        "spec": {
            "version": f"v{version.removeprefix('v')}",
            "replicas": 0,
            "scrapeInterval": scrape_interval,
            "evaluationInterval": scrape_interval,
            "replicaExternalLabelName": "",  # else $(POD_NAME), which a pod's environment would expand
            "apiserverConfig": {"host": server, "tlsConfig": {"caFile": str(ca_file)},
                                "authorization": {"type": "Bearer", "credentialsFile": str(token_file)}},
            "serviceDiscoveryRole": "EndpointSlice",  # not the Endpoints API, deprecated since Kubernetes 1.33
            "podMonitorSelector": {}, "podMonitorNamespaceSelector": {},
            "serviceMonitorSelector": {}, "serviceMonitorNamespaceSelector": {},
            "ruleSelector": {}, "ruleNamespaceSelector": {},
            "additionalScrapeConfigs": {"name": ADDITIONAL_SECRET, "key": "scrape-configs.yaml"},
            "scrapeClasses": [{"name": "dev-loopback", "default": True, "relabelings": [LOOPBACK_ONLY],
                               "metricRelabelings": [VLLM_NAME_RELABEL]}],
        },
    }


def usage_rule() -> dict[str, Any]:
    """The PrometheusRule of the usage recording rules (``kimik3.usage.rules``), as the chart
    ships it, in ``NAMESPACE``."""
    from kimik3.usage.rules import prometheus_rule

    return prometheus_rule(USAGE_RULE, NAMESPACE)


OPERATOR_SCRAPE_INTERVAL = "1s"
"""How often the dev Prometheus scrapes the kimik3 operator. ``increase()`` extrapolates the end of
a range from its last sample at the range's average rate, so GPU-seconds recorded at an
evaluation carry up to one interval of (average - current) GPUs: a check over minutes
(``usagecheck``) needs it short; a provider's ServiceMonitor interval matters only at hour edges."""


def operator_job(target: str) -> dict[str, Any]:
    """The scrape job (Prometheus' own format) of the kimik3 operator's /metrics at ``target``
    (``127.0.0.1:<port>``), job ``OPERATOR_JOB``, every ``OPERATOR_SCRAPE_INTERVAL``."""
    return {"job_name": OPERATOR_JOB, "metrics_path": "/metrics", "scrape_interval": OPERATOR_SCRAPE_INTERVAL,
            "static_configs": [{"targets": [target]}]}


def additional_scrape_configs(jobs: list[dict[str, Any]]) -> dict[str, Any]:
    """The Secret of ``additionalScrapeConfigs``: scrape jobs (Prometheus' own format) the operator
    appends as they are (``operator_job``)."""
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": ADDITIONAL_SECRET, "namespace": NAMESPACE},
            "stringData": {"scrape-configs.yaml": dump_yaml(jobs)}}


def object_path(obj: dict[str, Any]) -> str:
    """REST path of the objects above (``Prometheus``, ``Secret``, ``PrometheusRule``)."""
    plural = {"Prometheus": "prometheuses", "Secret": "secrets", "PrometheusRule": "prometheusrules"}[obj["kind"]]
    meta = obj["metadata"]
    group = "/api" if obj["apiVersion"] == "v1" else "/apis"
    return f"{group}/{obj['apiVersion']}/namespaces/{meta['namespace']}/{plural}/{meta['name']}"


def config_file(state_dir: Path) -> Path:
    """``<state>/prometheus/prometheus.yml``: the file Prometheus runs (written by ``ConfigReloader``)."""
    return state_dir / "prometheus" / "prometheus.yml"


def rules_dir(config: Path) -> Path:
    """The host folder standing for ``CONTAINER_RULES_DIR`` beside the configuration file ``config``."""
    return config.parent / "rules"


def read_config(secret: dict[str, Any] | None) -> str | None:
    """The configuration in the operator's Secret (a ``V1Secret`` as a dict, ``data`` base64), or
    None while the Secret or its key is missing."""
    import base64

    data = (secret or {}).get("data") or {}
    if CONFIG_KEY not in data:
        return None
    return gzip.decompress(base64.b64decode(data[CONFIG_KEY])).decode()


def expand(config: str) -> str:
    """``config`` with ``$(NAME)`` replaced by ``POD_ENVIRONMENT[NAME]``, as the config-reloader
    sidecar expands its pod's environment; ``ValueError`` naming a ``$(NAME)`` not in it."""
    def value(match: re.Match[str]) -> str:
        if match[1] not in POD_ENVIRONMENT:
            raise ValueError(f"the generated configuration refers to $({match[1]}), which the dev cluster does "
                             f"not define (it plays a pod with {sorted(POD_ENVIRONMENT)})")
        return POD_ENVIRONMENT[match[1]]
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", value, config)


def check_paths(config: str) -> None:
    """Raise ``ValueError`` when ``config`` names a file under ``CONTAINER_CONFIG_DIR``: a file a pod
    of the operator's StatefulSet would mount, absent on this host (e.g. a CA given as a Secret
    reference instead of ``caFile``; rules from a ``ruleSelector``)."""
    for line in config.splitlines():
        if CONTAINER_CONFIG_DIR in line:
            raise ValueError(f"the generated configuration names a file inside the operator's pod: {line.strip()!r}; "
                             f"give it as a host path in the Prometheus resource (e.g. tlsConfig.caFile)")


class ConfigReloader:
    """Poll the operator's Secret, write its configuration to ``path``, reload Prometheus at
    ``prometheus_url`` (``http://127.0.0.1:<port>``).

    ``run_forever``: every ``POLL_S`` one GET of the Secret (an API error is logged and retried; a
    configuration ``check_paths`` refuses is logged and not written);
    a new ``resourceVersion`` whose configuration differs from the file's is written atomically
    (temporary file, rename), then ``/-/reload`` is POSTed each round until Prometheus answers
    (it may not run yet: it then reads the file when it starts).
    """

    POLL_S = 1.0
    RELOAD_TIMEOUT_S = 10.0

    def __init__(self, rest: Rest, path: Path, prometheus_url: str) -> None:
        self.rest = rest
        self.path = path
        self.prometheus_url = prometheus_url
        self.written: str | None = None
        self.reloaded = False
        self._version = ""
        self.rules_dir = rules_dir(path)
        self._rules: dict[tuple[str, str], str] | None = None
        """(ConfigMap, file) -> rule file written last (None: not synced yet)."""

    def poll(self) -> None:
        """One round: sync the rule files, read the Secret, write a changed configuration, reload if
        one is due."""
        self.sync_rules()
        secret = self.rest.get(f"/api/v1/namespaces/{NAMESPACE}/secrets/{CONFIG_SECRET}")
        version = (secret or {}).get("metadata", {}).get("resourceVersion", "")
        if version != self._version:
            self._version = version  # a refused configuration is not retried before the next one
            config = read_config(secret)
            if config is not None:
                self.apply(config)
        self.reload()

    def apply(self, config: str) -> None:
        """Write ``config``, expanded (``expand``), when it differs from the file's, and mark a reload
        due. ``ValueError`` from ``expand`` or ``check_paths``."""
        config = expand(config).replace(CONTAINER_RULES_DIR, f"{self.rules_dir}/")
        if config == self.written:
            return
        check_paths(config)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(config)
        tmp.replace(self.path)
        self.written, self.reloaded = config, False
        log.info("wrote %s (%d bytes) from Secret %s/%s", self.path, len(config), NAMESPACE, CONFIG_SECRET)

    def sync_rules(self) -> None:
        """Write the files of the rule-file ConfigMaps (``RULE_CONFIGMAPS*`` in ``NAMESPACE``) to
        ``rules_dir/<ConfigMap>/<file>``, remove those no longer there, and mark a reload due when
        anything changed."""
        maps = self.rest.items(f"/api/v1/namespaces/{NAMESPACE}/configmaps", f"prometheus-name={PROMETHEUS_NAME}")
        files = {(cm["metadata"]["name"], key): text for cm in maps
                 if cm["metadata"]["name"].startswith(RULE_CONFIGMAPS) for key, text in (cm.get("data") or {}).items()}
        if files == self._rules:
            return
        for stale in set(self._rules or {}) - set(files):
            (self.rules_dir / stale[0] / stale[1]).unlink(missing_ok=True)
        for (name, key), text in files.items():
            target = self.rules_dir / name / key
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_suffix(".tmp")
            tmp.write_text(text)
            tmp.replace(target)
        if self._rules is not None or files:
            self.reloaded = False
            log.info("wrote %d rule file(s) to %s", len(files), self.rules_dir)
        self._rules = files

    def reload(self) -> bool:
        """POST ``/-/reload`` when a written configuration awaits it; True once Prometheus answered
        (200: loaded; 500: refused, logged with Prometheus' reason and not retried until the next
        configuration)."""
        if self.written is None or self.reloaded:
            return self.reloaded
        request = urllib.request.Request(self.prometheus_url + "/-/reload", method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.RELOAD_TIMEOUT_S):
                log.info("Prometheus reloaded %s", self.path)
            self.reloaded = True
        except urllib.error.HTTPError as exc:
            log.error("Prometheus refused %s: %s", self.path, exc.read()[:500].decode(errors="replace"))
            self.reloaded = True
        except (urllib.error.URLError, OSError) as exc:
            log.debug("reload not answered yet: %s", exc)
        return self.reloaded

    def run_forever(self) -> None:
        from kimik3.controller.kube import ApiError

        while True:
            try:
                self.poll()
            except (ApiError, OSError) as exc:
                log.warning("Secret %s/%s: %s", NAMESPACE, CONFIG_SECRET, exc)
            except ValueError as exc:  # check_paths: the file keeps the previous configuration
                log.error("Secret %s/%s not written: %s", NAMESPACE, CONFIG_SECRET, exc)
            time.sleep(self.POLL_S)
