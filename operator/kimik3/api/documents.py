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
