"""What a kubelet gives a pod's container: one environment variable, one file of a ConfigMap volume.

The engine simulator stands in for the engine container, so it must see the environment and the
files that container would see: the API key (``VLLM_API_KEY``) that ``render/leaderworkerset.py``
puts into the API-serving pods as ``valueFrom.secretKeyRef``, the variables the in-pod launcher
reads (``LWS_*`` from LeaderWorkerSet, ``KIMIK3_PLAN``) and the launch plan it reads from the
launcher ConfigMap. The kubelet builds a container's environment once, at container start
(pkg/kubelet/kubelet_pods.go, ``makeEnvironmentVariables``); its rules kept here:

- the entries of ``env`` are applied in order, so the last entry of a name wins;
- ``value`` is the value (``$(VAR)`` references are not expanded here: nothing we render uses them);
- ``valueFrom.secretKeyRef {name, key, optional}``: the Secret (in the pod's namespace)'s
  ``data[key]``, base64-decoded. A missing Secret or key fails the container start
  (``CreateContainerConfigError``: ``secret "NAME" not found`` / ``couldn't find key KEY in Secret
  NS/NAME``) unless ``optional: true``, which leaves the variable unset;
- ``valueFrom.fieldRef`` (the downward API) on ``metadata.name``, ``metadata.namespace``,
  ``metadata.uid``, ``metadata.labels['KEY']`` and ``metadata.annotations['KEY']`` (a missing
  label or annotation gives the empty string, as the kubelet's);
- other sources (``configMapKeyRef``, other ``fieldRef`` paths, ``resourceFieldRef``) are not
  read, and raise: a stand-in that guessed would serve without a key where the real engine wants
  one. ``envFrom`` is not read either (the operator renders none).

Files (``mounted_configmap_key``): a path inside the container is the file of the volume mounted
at the longest ``mountPath`` that holds it; of a ``configMap`` volume, the key named by the rest
of the path (``items`` remapping is not read: the operator renders none).

Values never appear in an exception message: only names and keys do.
"""

from __future__ import annotations

import base64
import binascii
import posixpath
import re
from collections.abc import Callable
from typing import Any

_FIELD_PATH = re.compile(r"metadata\.(labels|annotations)\['([^']*)'\]")


class EnvUnresolved(Exception):
    """The kubelet would not start the container: its env cannot be built (message names the
    Secret and key, never a value)."""


def container(pod_spec: dict[str, Any], name: str) -> dict[str, Any]:
    """The container called ``name`` of ``pod_spec`` (the first container when none has that
    name; an empty one when there is none). ``pod_spec`` is camelCase (as the API server serves
    it, or as rendered)."""
    containers = pod_spec.get("containers") or []
    return next((c for c in containers if c.get("name") == name), containers[0] if containers else {})


def env_entry(pod_spec: dict[str, Any], name: str, container_name: str) -> dict[str, Any] | None:
    """The entry that sets ``name`` in the container called ``container_name`` of ``pod_spec``
    (``container``), i.e. the last such entry; None when unset."""
    found = None
    for entry in container(pod_spec, container_name).get("env") or []:
        if entry.get("name") == name:
            found = entry
    return found


def resolve(entry: dict[str, Any] | None, namespace: str,
            read_secret: Callable[[str], dict[str, Any] | None],
            metadata: dict[str, Any] | None = None) -> str | None:
    """The value the container gets for ``entry`` (from ``env_entry``); None when unset.

    ``read_secret(name)``: the Secret ``name`` of ``namespace`` as a dict with ``data`` (base64
    values, as the API server serves it), or None when it does not exist. ``metadata``: the pod's
    (for ``fieldRef``). Raises ``EnvUnresolved`` where the kubelet would refuse to start the
    container."""
    if entry is None:
        return None
    source = entry.get("valueFrom")
    if source is None:
        return entry.get("value") or ""
    if set(source) == {"fieldRef"}:
        return _field(entry.get("name"), (source["fieldRef"] or {}).get("fieldPath", ""), metadata or {})
    ref = source.get("secretKeyRef")
    if ref is None or set(source) - {"secretKeyRef"}:
        raise EnvUnresolved(f"env {entry.get('name')}: only value, valueFrom.secretKeyRef and metadata "
                            f"fieldRefs are read, not {', '.join(sorted(source))}")
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


def _field(name: Any, path: str, metadata: dict[str, Any]) -> str:
    """The downward API's value of ``path`` for a pod with ``metadata`` (module docstring)."""
    if path in ("metadata.name", "metadata.namespace", "metadata.uid"):
        return str(metadata.get(path.split(".", 1)[1]) or "")
    match = _FIELD_PATH.fullmatch(path)
    if match is None:
        raise EnvUnresolved(f"env {name}: fieldRef {path} is not read (metadata name, namespace, uid, "
                            "labels and annotations are)")
    return str((metadata.get(match.group(1)) or {}).get(match.group(2), ""))


def mounted_configmap_key(pod_spec: dict[str, Any], container_name: str, path: str) -> tuple[str, str]:
    """(ConfigMap name, key) whose content the container reads at ``path``. Raises
    ``EnvUnresolved`` when no volume mount holds the path or it is not a ConfigMap volume's."""
    mounts = container(pod_spec, container_name).get("volumeMounts") or []
    holding = [m for m in mounts
               if posixpath.commonpath([m.get("mountPath", ""), path]) == m.get("mountPath", "").rstrip("/")]
    if not holding:
        raise EnvUnresolved(f"{path}: no volume of container {container_name} is mounted there")
    mount = max(holding, key=lambda m: len(m.get("mountPath", "")))
    volume = next((v for v in pod_spec.get("volumes") or [] if v.get("name") == mount.get("name")), None)
    if volume is None or "configMap" not in volume:
        raise EnvUnresolved(f"{path}: mounted from volume {mount.get('name')}, which is not a ConfigMap volume")
    key = posixpath.relpath(path, mount["mountPath"])
    return volume["configMap"].get("name", ""), key
