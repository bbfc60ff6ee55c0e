"""The ComputeDomain (NVIDIA DRA driver) that gives a multi-tray group its IMEX channel.

``resource.nvidia.com/v1beta1`` ComputeDomain: ``spec.numNodes`` is deprecated (0); the driver
creates a ResourceClaimTemplate named ``spec.channel.resourceClaimTemplate.name`` that each pod
claims (see gb300-on-kubernetes.md). One ComputeDomain per deployment, as Dynamo's GB300
manifests do; its spec is immutable, so the name is stable.
"""

from __future__ import annotations

from typing import Any

from kimik3.kube.kinds import COMPUTE_DOMAIN
from kimik3.render.meta import Owner

CLAIM_NAME = "compute-domain-channel"


def channel_template_name(owner: Owner) -> str:
    return f"{owner.name}-channel"


def compute_domain(owner: Owner) -> dict[str, Any]:
    return {
        "apiVersion": COMPUTE_DOMAIN.api_version,
        "kind": COMPUTE_DOMAIN.kind,
        "metadata": owner.metadata(owner.name),
        "spec": {
            "numNodes": 0,
            "channel": {
                "resourceClaimTemplate": {"name": channel_template_name(owner)},
                "allocationMode": "Single",
            },
        },
    }
