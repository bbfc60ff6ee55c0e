"""The PodMonitor (prometheus-operator) that scrapes the API-serving pods' /metrics.

Only API-server pods serve /metrics (group leaders); headless workers do not (kimi-k3-and-vllm.md).
Target labels carry the deployment and group index so queries can sum per deployment.
"""

from __future__ import annotations

from typing import Any

from kimik3.api.v1alpha1 import KimiK3DeploymentSpec
from kimik3.engine.args import API_PORT_NAME
from kimik3.render.meta import DEPLOYMENT_LABEL, LWS_GROUP_INDEX_LABEL, ROLE_LABEL, Owner
from kimik3.render.service import leader_selector

API_VERSION = "monitoring.coreos.com/v1"


def pod_monitor(owner: Owner, spec: KimiK3DeploymentSpec) -> dict[str, Any]:
    meta = owner.metadata(owner.name)
    meta["labels"] = {**meta["labels"], **spec.monitoring.labels}
    return {
        "apiVersion": API_VERSION,
        "kind": "PodMonitor",
        "metadata": meta,
        "spec": {
            "selector": {"matchLabels": leader_selector(owner)},
            "podMetricsEndpoints": [{"port": API_PORT_NAME, "path": "/metrics",
                                     "interval": spec.monitoring.interval}],
            "podTargetLabels": [DEPLOYMENT_LABEL, LWS_GROUP_INDEX_LABEL, ROLE_LABEL],
        },
    }
