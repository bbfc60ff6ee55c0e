"""Reading KimiK3Deployment manifests from YAML files (recipes), as ``kubectl apply -f`` would."""

from __future__ import annotations

import sys
from typing import Any

import yaml

from kimik3.kube.kinds import KIND


class NoDeployment(ValueError):
    """The file holds no KimiK3Deployment document."""


def load_documents(path: str) -> list[dict[str, Any]]:
    """Every non-empty YAML document of ``path`` (``-`` reads stdin). Raises OSError when the file
    cannot be read and yaml.YAMLError on bad YAML."""
    with open(path, encoding="utf-8") if path != "-" else sys.stdin as fh:
        return [d for d in yaml.safe_load_all(fh) if d]


def load_deployments(path: str) -> list[dict[str, Any]]:
    """The KimiK3Deployment documents of ``path``, each with ``metadata.namespace`` (default
    ``default``) and ``metadata.uid`` (``""``: not yet created) filled in. Raises NoDeployment."""
    docs = [d for d in load_documents(path) if d.get("kind") == KIND]
    if not docs:
        raise NoDeployment(f"{path}: no {KIND} document found")
    for d in docs:
        d.setdefault("metadata", {}).setdefault("namespace", "default")
        d["metadata"].setdefault("uid", "")
    return docs
