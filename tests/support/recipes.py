"""The shipped recipes (``recipes/*.yaml``) as the tests use them: fresh dicts, overrides merged."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from kimik3.kube.kinds import KIND

REPO = Path(__file__).resolve().parents[2]
RECIPES_DIR = REPO / "recipes"
RECIPE_FILES = sorted(RECIPES_DIR.glob("*.yaml"))
LATENCY = "gb300-tp8-megakernel-dspark.yaml"
"""The GB300 latency recipe (TP8 over 2 trays, megakernel decode, DSpark): most tests' CR."""


def documents(file: str | Path) -> list[dict[str, Any]]:
    """Every non-empty YAML document of ``recipes/<file>`` (or of the path ``file``), in order."""
    path = file if isinstance(file, Path) else RECIPES_DIR / file
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]


def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``base`` deep-merged with ``over`` (a copy): dicts merge key by key, anything else replaces."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        out[key] = merge(out.get(key) or {}, value) if isinstance(value, dict) else copy.deepcopy(value)
    return out


def recipe(file: str | Path = LATENCY, *, name: str | None = None, namespace: str | None = None,
           uid: str | None = None, **spec: Any) -> dict[str, Any]:
    """The one KimiK3Deployment of ``recipes/<file>`` as a fresh dict.

    ``name``, ``namespace`` and ``uid`` replace those of its metadata when given (``uid`` is what
    the API server would have set; render needs one); ``spec`` keyword arguments (camelCase, as in
    the YAML) are deep-merged into its spec (``merge``), e.g. ``recipe(replicas=3,
    topology={"tensorParallelSize": 16})``. AssertionError when the file has not exactly one."""
    (cr,) = [d for d in documents(file) if d.get("kind") == KIND]
    meta = cr.setdefault("metadata", {})
    for key, value in (("name", name), ("namespace", namespace), ("uid", uid)):
        if value is not None:
            meta[key] = value
    cr["spec"] = merge(cr.get("spec") or {}, spec)
    return cr
