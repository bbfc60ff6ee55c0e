"""The client Service: the OpenAI-compatible API of every group leader."""

from __future__ import annotations

from typing import Any

from kimik3.kube.kinds import SERVICE
from kimik3.api.v1alpha1 import KimiK3DeploymentSpec
from kimik3.engine.args import API_PORT_NAME
from kimik3.kube.labels import DEPLOYMENT_LABEL, LEADER_WORKER_INDEX, LWS_WORKER_INDEX_LABEL
from kimik3.render.meta import Owner


def endpoint(owner: Owner, spec: KimiK3DeploymentSpec) -> str:
    """In-cluster base URL of the API (``http://<name>.<namespace>.svc:<port>/v1``)."""
    return f"http://{owner.name}.{owner.namespace}.svc:{spec.service.port}/v1"


def leader_selector(owner: Owner) -> dict[str, str]:
    """Group leaders (worker index 0) of every one of this deployment's LeaderWorkerSets (a rollout
    runs two side by side: ``controller.fleet``)."""
    return {DEPLOYMENT_LABEL: owner.name, LWS_WORKER_INDEX_LABEL: LEADER_WORKER_INDEX}


def client_service(owner: Owner, spec: KimiK3DeploymentSpec) -> dict[str, Any]:
    meta = owner.metadata(owner.name)
    if spec.service.annotations:
        meta["annotations"] = dict(spec.service.annotations)
    return {
        "apiVersion": SERVICE.api_version,
        "kind": SERVICE.kind,
        "metadata": meta,
        "spec": {
            "type": spec.service.type,
            "selector": leader_selector(owner),
            "ports": [{"name": API_PORT_NAME, "port": spec.service.port, "targetPort": API_PORT_NAME,
                       "protocol": "TCP"}],
        },
    }
