"""What the out-of-cluster controller-runtime managers of the dev cluster (LeaderWorkerSet and
Kueue, ``lws`` and ``kueue``) share: a configuration with the webhook server on loopback and a
dev-CA certificate, and the project's webhook configurations pointed at it by URL.

In a cluster each runs as a Deployment behind a webhook Service with certificates of its own;
here each is a local process, and the API server reaches its webhooks at
``https://127.0.0.1:<port><path>`` with the dev CA as ``caBundle``.
"""

from __future__ import annotations

import base64
import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kimik3.api.documents import dump_yaml
from kimik3.kube.labels import LWS_NAME_LABEL
from kimik3_dev.devcluster.certs import issue_serving_cert
from kimik3_dev.devcluster.controlplane import load_yaml_documents

WEBHOOK_TIMEOUT_S = 10
"""``timeoutSeconds`` of every webhook (the API server's maximum is 30)."""


def write_config(state_dir: Path, component: str, api_version: str, webhook_port: int, health_port: int,
                 **fields: Any) -> Path:
    """Issue ``<state>/<component>/certs/tls.crt|tls.key`` (127.0.0.1, the dev CA) and write
    ``<state>/<component>/config.yaml``: a ``Configuration`` of ``api_version`` with leader election
    and internal certificate management off, the webhook server and health probes on loopback,
    metrics off (``bindAddress: "0"``), plus ``fields``. Returns the config path."""
    base = state_dir / component
    certs = base / "certs"
    issue_serving_cert(state_dir / "pki", certs, f"{component}-webhook")
    config = {
        "apiVersion": api_version,
        "kind": "Configuration",
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(certs)},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "metrics": {"bindAddress": "0"},
        **fields,
    }
    path = base / "config.yaml"
    path.write_text(dump_yaml(config))
    return path


def loopback_webhooks(manifests: Path, prefix: str, webhook_port: int, ca_file: Path,
                      keep: Callable[[str], bool] = lambda path: True) -> list[dict[str, Any]]:
    """The Mutating/ValidatingWebhookConfigurations of ``manifests`` (a project's
    ``config/.../webhook/manifests.yaml``), renamed ``<prefix><name>``, each webhook whose service
    path ``keep`` accepts pointed at ``https://127.0.0.1:<webhook_port><path>``. Pod webhooks see
    only pods of a LeaderWorkerSet (an ``objectSelector``, as LWS's own kustomize patches do), so
    no other pod depends on a dev-cluster process."""
    ca_bundle = base64.b64encode(ca_file.read_bytes()).decode()
    out = []
    for doc in load_yaml_documents(manifests):
        doc = copy.deepcopy(doc)
        doc["metadata"] = {"name": prefix + doc["metadata"]["name"],
                           "labels": {"app.kubernetes.io/managed-by": "kimik3-devcluster"}}
        hooks = []
        for hook in doc["webhooks"]:
            path = hook["clientConfig"]["service"]["path"]
            if not keep(path):
                continue
            hook["clientConfig"] = {"url": f"https://127.0.0.1:{webhook_port}{path}", "caBundle": ca_bundle}
            hook["timeoutSeconds"] = WEBHOOK_TIMEOUT_S
            if any("pods" in rule.get("resources", []) for rule in hook.get("rules", [])):
                hook["objectSelector"] = {"matchExpressions": [{"key": LWS_NAME_LABEL, "operator": "Exists"}]}
            hooks.append(hook)
        doc["webhooks"] = hooks
        out.append(doc)
    return out
