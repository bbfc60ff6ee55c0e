"""Names, labels, selectors and owner references shared by every child."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kimik3.kube.kinds import KIMIK3_DEPLOYMENT
from kimik3.kube.labels import DEPLOYMENT_LABEL, MANAGED_BY, MANAGED_BY_LABEL


def engine_set_name(deployment: str) -> str:
    """``<deployment>-engine``: the deployment's LeaderWorkerSet (a rollout's new one beside it
    takes a hash suffix, ``controller.fleet``), and so the prefix of its pods' names
    (``<set>-<group>``, ``<set>-<group>-<worker>``)."""
    return f"{deployment}-engine"


@dataclass(frozen=True)
class Owner:
    """The KimiK3Deployment the children belong to."""

    name: str
    namespace: str
    uid: str

    @classmethod
    def from_object(cls, obj: dict[str, Any]) -> Owner:
        meta = obj["metadata"]
        return cls(meta["name"], meta.get("namespace", "default"), meta.get("uid", ""))

    def labels(self) -> dict[str, str]:
        """Labels on every child and pod."""
        return {
            "app.kubernetes.io/name": "kimi-k3",
            "app.kubernetes.io/instance": self.name,
            MANAGED_BY_LABEL: MANAGED_BY,
            DEPLOYMENT_LABEL: self.name,
        }

    def metadata(self, name: str, **extra: Any) -> dict[str, Any]:
        """Child metadata with labels and a controller owner reference (garbage collection)."""
        meta: dict[str, Any] = {
            "name": name,
            "namespace": self.namespace,
            "labels": self.labels(),
            "ownerReferences": [{
                "apiVersion": KIMIK3_DEPLOYMENT.api_version,
                "kind": KIMIK3_DEPLOYMENT.kind,
                "name": self.name,
                "uid": self.uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }],
        }
        meta.update(extra)
        return meta


def selector_string(labels: dict[str, str]) -> str:
    """A label selector in the string form of ``status.selector`` (sorted, comma-separated)."""
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
