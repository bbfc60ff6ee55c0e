"""The LeaderWorkerSet manager (sigs.k8s.io/lws at ``LWS_VERSION`` of ``kimik3_dev.versions``) run out of cluster, webhooks on loopback.

In a cluster LWS runs as a Deployment whose webhooks are reached through a Service, with
certificates from its internal cert manager. Here the manager binary
(``tools/build-binaries.sh lws``) runs as a local process with:

- a config file (``config.lws.x-k8s.io/v1alpha1`` Configuration, fields from the module's
  ``api/config/v1alpha1/configuration_types.go``): internal cert management off, leader
  election off, the webhook server on ``127.0.0.1:<port>`` with a certificate we issue from the
  dev CA (``certDir`` holding ``tls.crt``/``tls.key``), health probes on ``127.0.0.1:<port>``,
  metrics off (``bindAddress: "0"``);
- the Mutating/ValidatingWebhookConfigurations of the module's ``config/webhook/manifests.yaml``
  (plus the pod ``objectSelector`` its kustomize patches add), each ``clientConfig`` rewritten to
  ``url: https://127.0.0.1:<port><path>`` with the CA bundle;
- the CRDs of the module: LeaderWorkerSet and DisaggregatedSet (the manager also runs the
  DisaggregatedSet controller and does not start without its CRD).

The pod webhook is what gives group pods their labels and, with the
``leaderworkerset.sigs.k8s.io/exclusive-topology`` annotation, the affinity that keeps a group
inside one ``nvidia.com/gpu.clique`` (and alone there).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kimik3_dev.devcluster import managers
from kimik3_dev.devcluster.thirdparty import LWS_MODULE, go_module_dir
from kimik3_dev.versions import LWS_VERSION

__all__ = [
    "WEBHOOK_PREFIX",
    "argv",
    "crd_paths",
    "dry_run_probe",
    "webhook_configurations",
    "write_config",
]

WEBHOOK_PREFIX = "lws-"
"""Prefix of our webhook configuration names (``lws-mutating-webhook-configuration``, ...)."""


def module_dir() -> Path:
    """The LWS module in the Go module cache (downloaded on first use)."""
    return go_module_dir(LWS_MODULE, LWS_VERSION)


def crd_paths(root: Path | None = None) -> list[Path]:
    """The LeaderWorkerSet and DisaggregatedSet CRD files of the module."""
    base = (root or module_dir()) / "config" / "crd" / "bases"
    return [base / "leaderworkerset.x-k8s.io_leaderworkersets.yaml",
            base / "disaggregatedset.x-k8s.io_disaggregatedsets.yaml"]


def write_config(state_dir: Path, webhook_port: int, health_port: int) -> Path:
    """Issue the webhook certificate and write the manager's config (``config.lws.x-k8s.io/v1alpha1``);
    returns the config path. Files: ``<state>/lws/config.yaml``, ``<state>/lws/certs/tls.crt|tls.key``."""
    return managers.write_config(state_dir, "lws", "config.lws.x-k8s.io/v1alpha1", webhook_port, health_port)


def argv(binary: Path, kubeconfig: Path, config: Path) -> list[str]:
    """The manager's command line (``--leader-elect=false`` again: the flag wins over the file)."""
    return [str(binary), f"--kubeconfig={kubeconfig}", f"--config={config}", "--leader-elect=false",
            "--zap-devel=false", "--zap-log-level=info"]


def webhook_configurations(webhook_port: int, ca_file: Path, root: Path | None = None) -> list[dict[str, Any]]:
    """The module's webhook configurations, pointed at ``https://127.0.0.1:<webhook_port>``."""
    return managers.loopback_webhooks((root or module_dir()) / "config" / "webhook" / "manifests.yaml",
                                      WEBHOOK_PREFIX, webhook_port, ca_file)


def dry_run_probe() -> dict[str, Any]:
    """A minimal LeaderWorkerSet; a server-side dry-run create of it passes through both LWS
    webhooks, so its success means the webhooks answer the API server."""
    return {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": {"name": "kimik3-webhook-probe", "namespace": "default"},
        "spec": {"leaderWorkerTemplate": {"size": 2, "workerTemplate": {"spec": {
            "containers": [{"name": "probe", "image": "registry.invalid/probe:0"}]}}}},
    }
