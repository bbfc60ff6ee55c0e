"""What the controller renders for a KimiK3Deployment as stored: its spec admitted once, then
rendered for its owner (``kimik3.controller.reconcile`` does the same, with the autoscaler's
replicas). Raises ``SpecErrors`` for a spec admission refuses."""

from __future__ import annotations

from typing import Any

from kimik3.admission import AdmissionPolicy, admit
from kimik3.render.children import Rendered, render
from kimik3.render.configmap import configmap_name
from kimik3.render.meta import Owner


def by_kind(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    """The one object of ``kind`` among ``objects`` (AssertionError naming the kinds there are)."""
    found = [o for o in objects if o["kind"] == kind]
    assert len(found) == 1, f"{len(found)} {kind} in {[o['kind'] for o in objects]}"
    return found[0]


def render_cr(obj: dict[str, Any], policy: AdmissionPolicy = AdmissionPolicy(), **options: Any) -> Rendered:
    """Children of ``obj`` (metadata + spec); ``options`` go to ``render`` (replicas, compute_domains)."""
    return render(admit(obj.get("spec") or {}, policy), Owner.from_object(obj), **options)


def launcher_name(obj: dict[str, Any], policy: AdmissionPolicy = AdmissionPolicy()) -> str:
    """The launcher ConfigMap ``obj``'s spec renders (``<name>-launcher-<plan hash>``)."""
    return configmap_name(Owner.from_object(obj), admit(obj.get("spec") or {}, policy))
