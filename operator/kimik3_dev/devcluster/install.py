"""Install the APIs a cluster needs for the operator: third-party CRDs, our CRD and our
ValidatingAdmissionPolicy (``crds/``), as ``kubectl apply --server-side -f crds/`` would."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from kimik3.controller.kube import Kube
from kimik3_dev.devcluster.controlplane import ControlPlane
from kimik3_dev.devcluster.thirdparty import thirdparty_crd_paths

REPO_ROOT = Path(__file__).resolve().parents[3]
CRDS_DIR = REPO_ROOT / "crds"
FIELD_MANAGER = "kimik3-install"


def own_manifests() -> tuple[list[Path], list[dict[str, Any]]]:
    """(CRD files, other documents) of the repository's ``crds/`` folder."""
    crd_files, others = [], []
    for path in sorted(CRDS_DIR.glob("*.yaml")):
        docs = [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]
        if all(d.get("kind") == "CustomResourceDefinition" for d in docs):
            crd_files.append(path)
        else:
            others += docs
    return crd_files, others


def apply_admission_policies(api: client.ApiClient, docs: list[dict[str, Any]]) -> None:
    """Server-side apply ValidatingAdmissionPolicies and their bindings."""
    kube = Kube(api)
    for doc in docs:
        plural = {"ValidatingAdmissionPolicy": "validatingadmissionpolicies",
                  "ValidatingAdmissionPolicyBinding": "validatingadmissionpolicybindings"}[doc["kind"]]
        kube.request("PATCH", f"/apis/admissionregistration.k8s.io/v1/{plural}/{doc['metadata']['name']}", doc,
                     [("fieldManager", FIELD_MANAGER), ("force", "true")], "application/apply-patch+yaml")


def install_apis(cp: ControlPlane) -> list[str]:
    """Apply every CRD (third-party and ours) and our admission policies; returns the CRD names."""
    crd_files, others = own_manifests()
    names = cp.apply_crds([*thirdparty_crd_paths().values(), *crd_files])
    with cp.api_client("admin") as api:
        apply_admission_policies(api, others)
    return names
