"""YAML manifests in and out: KimiK3Deployments read from files (recipes) as ``kubectl apply -f``
would, and objects written for people and tools as ``helm template`` would (``dump_yaml``)."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable
from typing import Any

import yaml

from kimik3.kube.kinds import KIND


YAML_WIDTH = 120
"""Line width of written YAML, characters (long strings fold past it)."""


class ManifestDumper(yaml.SafeDumper):
    """PyYAML's SafeDumper that writes every object out in full where it occurs, never as an anchor
    and aliases (``&id001`` ... ``*id001``). PyYAML emits those when one Python object is reached
    twice (two probes sharing one ``httpGet`` dict); kubectl would read them, but nobody reading
    ``helm template`` or ``kubectl get -o yaml`` output expects them."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


GO_YAML_NUMBER = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?")
"""A plain scalar the YAML reader of kubectl and the API server (go-yaml, YAML 1.1) takes for a
number: PyYAML's own resolver wants a dot in a float, so it writes a hash such as ``123e4567``
unquoted, and kubectl then refuses the manifest ("cannot unmarshal number into ... string")."""


def _represent_str(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    """A string, single-quoted where go-yaml would read it as a number."""
    return dumper.represent_scalar("tag:yaml.org,2002:str", data,
                                   style="'" if GO_YAML_NUMBER.fullmatch(data) else None)


ManifestDumper.add_representer(str, _represent_str)


def dump_yaml(obj: Any) -> str:
    """One YAML document (no ``---``), keys in insertion order, no anchors (``ManifestDumper``)."""
    return yaml.dump(obj, Dumper=ManifestDumper, sort_keys=False, width=YAML_WIDTH)


def dump_yaml_all(docs: Iterable[Any]) -> str:
    """A YAML stream of ``docs`` separated by ``---``, as ``dump_yaml`` writes each."""
    return yaml.dump_all(docs, Dumper=ManifestDumper, sort_keys=False, width=YAML_WIDTH)


class BadManifest(ValueError):
    """The file cannot be read as Kubernetes manifests: missing, unreadable, not YAML, or a
    document that is not a mapping (an object). The message names the file and what to fix."""


class NoDeployment(BadManifest):
    """The file holds no KimiK3Deployment document."""


def load_documents(path: str) -> list[dict[str, Any]]:
    """Every non-empty YAML document of ``path`` (``-`` reads stdin). Raises BadManifest when the
    file cannot be read, is not YAML, or holds a document that is not a mapping."""
    try:
        with open(path, encoding="utf-8") if path != "-" else sys.stdin as fh:
            docs = [d for d in yaml.safe_load_all(fh) if d]
    except OSError as exc:
        raise BadManifest(f"{path}: cannot read it: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise BadManifest(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except yaml.YAMLError as exc:
        raise BadManifest(f"{path}: not valid YAML: {' '.join(str(exc).split())}") from None
    for i, doc in enumerate(docs):
        if not isinstance(doc, dict):
            raise BadManifest(f"{path}: document {i + 1} is not a Kubernetes object (a mapping with apiVersion, "
                              f"kind, metadata and spec) but {str(doc)[:60]!r}")
    return docs


def load_deployments(path: str) -> list[dict[str, Any]]:
    """The KimiK3Deployment documents of ``path``, each with ``metadata.namespace`` (default
    ``default``) and ``metadata.uid`` (``""``: not yet created) filled in. Raises BadManifest
    (NoDeployment when the file holds none)."""
    docs = [d for d in load_documents(path) if d.get("kind") == KIND]
    if not docs:
        raise NoDeployment(f"{path}: no {KIND} document found")
    for d in docs:
        d.setdefault("metadata", {}).setdefault("namespace", "default")
        d["metadata"].setdefault("uid", "")
    return docs
