"""The compile cache claim of a deployment (``spec.engine.compileCache``).

One PersistentVolumeClaim per namespace, engine image and group plan:
``kimik3-compile-<12 hex of sha256(image + the launcher's plan document)>``. What vLLM compiles
depends on both (its kernels and graphs on the image's vLLM, torch and CUDA; the shapes on every
rank's arguments: TP, batch limits, CUDA graph mode, the model), so a changed image or plan gets a
fresh claim and the old one stays for the groups still on it. Deployments of a namespace with the
same image and plan share it; no claim is ever shared across namespaces (vLLM once wrote
``VLLM_API_KEY`` into compile-cache metadata, vllm#53625). Like the model cache it carries no
owner reference: a re-created deployment finds its cache. Mounted read-write at
``kimik3.engine.args.COMPILE_CACHE_MOUNT`` in every engine pod.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from kimik3.admission import Admitted
from kimik3.kube.kinds import PERSISTENT_VOLUME_CLAIM
from kimik3.kube.labels import MANAGED_BY, MANAGED_BY_LABEL
from kimik3.render.configmap import group_plan_document


def claim_name(admitted: Admitted) -> str | None:
    """The claim's name, or None without ``spec.engine.compileCache``."""
    if admitted.spec.engine.compile_cache is None:
        return None
    key = json.dumps({"image": admitted.spec.engine.image, "plan": group_plan_document(admitted)}, sort_keys=True)
    return f"kimik3-compile-{hashlib.sha256(key.encode()).hexdigest()[:12]}"


def compile_cache_claim(admitted: Admitted, namespace: str) -> dict[str, Any] | None:
    cache, name = admitted.spec.engine.compile_cache, claim_name(admitted)
    if cache is None or name is None:
        return None
    spec: dict[str, Any] = {"accessModes": [cache.access_mode], "resources": {"requests": {"storage": cache.size}}}
    if cache.storage_class_name:
        spec["storageClassName"] = cache.storage_class_name
    return {"apiVersion": PERSISTENT_VOLUME_CLAIM.api_version, "kind": PERSISTENT_VOLUME_CLAIM.kind,
            "metadata": {"name": name, "namespace": namespace, "labels": {MANAGED_BY_LABEL: MANAGED_BY},
                         "annotations": {"inference.kimik3.io/engine-image": admitted.spec.engine.image}},
            "spec": spec}
