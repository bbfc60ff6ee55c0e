"""One environment variable of a pod's container, read from the pod spec as a kubelet would.

The engine simulator stands in for the engine container, so it must see the environment that
container would see: the API key (``VLLM_API_KEY``) that ``render/leaderworkerset.py`` puts into
the API-serving pods as ``valueFrom.secretKeyRef``. The kubelet builds a container's environment
once, at container start (pkg/kubelet/kubelet_pods.go, ``makeEnvironmentVariables``); its rules
kept here:

- the entries of ``env`` are applied in order, so the last entry of a name wins;
- ``value`` is the value (``$(VAR)`` references are not expanded here: nothing we render uses them);
- ``valueFrom.secretKeyRef {name, key, optional}``: the Secret (in the pod's namespace)'s
  ``data[key]``, base64-decoded. A missing Secret or key fails the container start
  (``CreateContainerConfigError``: ``secret "NAME" not found`` / ``couldn't find key KEY in Secret
  NS/NAME``) unless ``optional: true``, which leaves the variable unset;
- other sources (``configMapKeyRef``, ``fieldRef``, ``resourceFieldRef``) are not read, and raise:
  a stand-in that guessed would serve without a key where the real engine wants one.
  ``envFrom`` is not read either (the operator renders none).

Values never appear in an exception message: only names and keys do.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from typing import Any


class EnvUnresolved(Exception):
    """The kubelet would not start the container: its env cannot be built (message names the
    Secret and key, never a value)."""


def env_entry(pod_spec: dict[str, Any], name: str, container: str) -> dict[str, Any] | None:
    """The entry that sets ``name`` in the container called ``container`` of ``pod_spec`` (the
    first container when none has that name), i.e. the last such entry; None when unset.
    ``pod_spec`` is camelCase (as the API server serves it, or as rendered)."""
    containers = pod_spec.get("containers") or []
    chosen = next((c for c in containers if c.get("name") == container), containers[0] if containers else None)
    found = None
    for entry in (chosen or {}).get("env") or []:
        if entry.get("name") == name:
            found = entry
    return found


def resolve(entry: dict[str, Any] | None, namespace: str,
            read_secret: Callable[[str], dict[str, Any] | None]) -> str | None:
    """The value the container gets for ``entry`` (from ``env_entry``); None when unset.

    ``read_secret(name)``: the Secret ``name`` of ``namespace`` as a dict with ``data`` (base64
    values, as the API server serves it), or None when it does not exist. Raises ``EnvUnresolved``
    where the kubelet would refuse to start the container."""
    if entry is None:
        return None
    source = entry.get("valueFrom")
    if source is None:
        return entry.get("value") or ""
    ref = source.get("secretKeyRef")
    if ref is None or set(source) - {"secretKeyRef"}:
        raise EnvUnresolved(f"env {entry.get('name')}: only value and valueFrom.secretKeyRef are read, "
                            f"not {', '.join(sorted(source))}")
    name, key, optional = ref.get("name", ""), ref.get("key", ""), bool(ref.get("optional"))
    secret = read_secret(name)
    if secret is None:
        if optional:
            return None
        raise EnvUnresolved(f'env {entry.get("name")}: secret "{name}" not found')
    data = secret.get("data") or {}
    if key not in data:
        if optional:
            return None
        raise EnvUnresolved(f"env {entry.get('name')}: couldn't find key {key} in Secret {namespace}/{name}")
    try:
        return base64.b64decode(data[key], validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        raise EnvUnresolved(f"env {entry.get('name')}: key {key} of Secret {namespace}/{name} is not "
                            "base64-encoded UTF-8 text") from None
