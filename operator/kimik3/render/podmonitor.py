"""The PodMonitor (prometheus-operator) that scrapes the API-serving pods' /metrics.

Only API-server pods serve /metrics (group leaders); headless workers do not (kimi-k3-and-vllm.md).
Relabelings give every series the labels the autoscaler's PromQL selects on: ``deployment``,
``group``, ``role`` and ``revision`` (the LeaderWorkerSet revision a group runs: a canary's
series apart from the old groups'; prometheus-operator adds ``namespace`` and ``pod``). The dev
cluster's Prometheus runs what the real Prometheus Operator makes of it (``kimik3_dev.devcluster.promoperator``).
"""

from __future__ import annotations

from typing import Any

from kimik3.kube.kinds import POD_MONITOR
from kimik3.api.v1alpha1 import KimiK3DeploymentSpec
from kimik3.engine.args import API_PORT_NAME
from kimik3.kube.labels import DEPLOYMENT_LABEL, LWS_GROUP_INDEX_LABEL, LWS_REVISION_LABEL, ROLE_LABEL
from kimik3.render.meta import Owner

TARGET_LABELS = {"deployment": DEPLOYMENT_LABEL, "group": LWS_GROUP_INDEX_LABEL, "role": ROLE_LABEL,
                 "revision": LWS_REVISION_LABEL}
"""Series label -> pod label it is copied from."""


def _meta_label(pod_label: str) -> str:
    """Prometheus' service-discovery name of a pod label (non-alphanumerics become ``_``)."""
    return "__meta_kubernetes_pod_label_" + "".join(ch if ch.isalnum() else "_" for ch in pod_label)
from kimik3.render.service import leader_selector



def pod_monitor(owner: Owner, spec: KimiK3DeploymentSpec) -> dict[str, Any]:
    meta = owner.metadata(owner.name)
    meta["labels"] = {**meta["labels"], **spec.monitoring.labels}
    return {
        "apiVersion": POD_MONITOR.api_version,
        "kind": POD_MONITOR.kind,
        "metadata": meta,
        "spec": {
            "selector": {"matchLabels": leader_selector(owner)},
            "podMetricsEndpoints": [{
                "port": API_PORT_NAME, "path": "/metrics", "interval": spec.monitoring.interval,
                "relabelings": [{"sourceLabels": [_meta_label(pod_label)], "targetLabel": label, "action": "replace"}
                                for label, pod_label in TARGET_LABELS.items()],
            }],
        },
    }
