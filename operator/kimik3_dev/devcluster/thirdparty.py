"""Locate the real third-party CRD manifests the operator works with.

The CRDs come from the Go modules their projects publish: ``go mod download -json
<module>@<version>`` puts the module in the Go module cache (``go env GOMODCACHE``, kept
between runs, so only the first call on a machine downloads) and names its directory; the
manifests are files inside it. Nothing is copied into the repository. Where the publishing
module is not served by the Go module proxy the project's machines reach (ComputeDomain), a
stand-in written by this project is used instead (see ``COMPUTE_DOMAIN_CRD``).
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from kimik3_dev.versions import (GATEWAY_API_VERSION, INFERENCE_EXTENSION_VERSION, LWS_VERSION,
                                 PROMETHEUS_OPERATOR_VERSION)

__all__ = [
    "COMPUTE_DOMAIN_CRD",
    "GATEWAY_API_MODULE",
    "INFERENCE_EXTENSION_MODULE",
    "LWS_MODULE",
    "PROMETHEUS_OPERATOR_MODULE",
    "ThirdPartyCRDError",
    "go_module_dir",
    "thirdparty_crd_paths",
]

# The modules, at the versions of kimik3_dev.versions (the reasons for each pin are noted there).
LWS_MODULE = "sigs.k8s.io/lws"
"""LeaderWorkerSet (leaderworkerset.x-k8s.io/v1)."""
PROMETHEUS_OPERATOR_MODULE = "github.com/prometheus-operator/prometheus-operator"
"""Prometheus Operator (monitoring.coreos.com/v1), root module."""
GATEWAY_API_MODULE = "sigs.k8s.io/gateway-api"
"""Gateway API (gateway.networking.k8s.io/v1), standard channel."""
INFERENCE_EXTENSION_MODULE = "sigs.k8s.io/gateway-api-inference-extension"
"""Gateway API Inference Extension (InferencePool, inference.networking.k8s.io/v1); its ``cmd/epp`` is the
dev cluster's endpoint picker (``kimik3_dev.devcluster.gateway``)."""

# ComputeDomain (resource.nvidia.com/v1beta1) from NVIDIA's DRA driver for GPUs. Neither
# github.com/NVIDIA/k8s-dra-driver-gpu nor sigs.k8s.io/dra-driver-nvidia-gpu is served by the Go
# module proxy reachable here (403 for every version, 2026-11-29), so a stand-in CRD written by
# this project from the published API description lies beside this module (see its header).
COMPUTE_DOMAIN_CRD = Path(__file__).resolve().parent / "crds" / "resource.nvidia.com_computedomains.yaml"

_GO_DOWNLOAD_TIMEOUT_S = 600.0
"""Upper bound for one ``go mod download`` (seconds); a cold download of these modules is a few MB."""


class ThirdPartyCRDError(RuntimeError):
    """A third-party CRD manifest could not be located."""


@dataclass(frozen=True)
class _ModuleCRD:
    module: str
    version: str
    path: str  # inside the module


_MODULE_CRDS: dict[str, _ModuleCRD] = {
    "LeaderWorkerSet": _ModuleCRD(
        LWS_MODULE, LWS_VERSION, "config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml"
    ),
    "PodMonitor": _ModuleCRD(
        PROMETHEUS_OPERATOR_MODULE,
        PROMETHEUS_OPERATOR_VERSION,
        "example/prometheus-operator-crd/monitoring.coreos.com_podmonitors.yaml",
    ),
    "ServiceMonitor": _ModuleCRD(
        PROMETHEUS_OPERATOR_MODULE,
        PROMETHEUS_OPERATOR_VERSION,
        "example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml",
    ),
    "GatewayClass": _ModuleCRD(
        GATEWAY_API_MODULE, GATEWAY_API_VERSION, "config/crd/standard/gateway.networking.k8s.io_gatewayclasses.yaml"
    ),
    "Gateway": _ModuleCRD(
        GATEWAY_API_MODULE, GATEWAY_API_VERSION, "config/crd/standard/gateway.networking.k8s.io_gateways.yaml"
    ),
    "HTTPRoute": _ModuleCRD(
        GATEWAY_API_MODULE, GATEWAY_API_VERSION, "config/crd/standard/gateway.networking.k8s.io_httproutes.yaml"
    ),
    "ReferenceGrant": _ModuleCRD(
        GATEWAY_API_MODULE, GATEWAY_API_VERSION, "config/crd/standard/gateway.networking.k8s.io_referencegrants.yaml"
    ),
    "InferencePool": _ModuleCRD(
        INFERENCE_EXTENSION_MODULE,
        INFERENCE_EXTENSION_VERSION,
        "config/crd/bases/inference.networking.k8s.io_inferencepools.yaml",
    ),
    # The endpoint picker's manager caches InferenceObjectives (x-k8s.io/v1alpha2) beside the pool and
    # exits at start without their CRD ("no matches for kind InferenceObjective").
    "InferenceObjective": _ModuleCRD(
        INFERENCE_EXTENSION_MODULE,
        INFERENCE_EXTENSION_VERSION,
        "config/crd/bases/inference.networking.x-k8s.io_inferenceobjectives.yaml",
    ),
}


def _go_binary() -> str:
    found = shutil.which("go") or ("/usr/local/go/bin/go" if os.access("/usr/local/go/bin/go", os.X_OK) else None)
    if not found:
        raise ThirdPartyCRDError(
            "the `go` command is needed to fetch third-party CRDs from their Go modules; install Go 1.26"
        )
    return found


@functools.cache
def go_module_dir(module: str, version: str) -> Path:
    """Return the directory of ``module@version`` in the Go module cache, downloading it if needed.

    Runs ``go mod download -json`` in an empty temporary directory with ``GOFLAGS=-mod=mod`` and
    ``GOTOOLCHAIN=local`` (this machine's Go, never a downloaded toolchain). Cached modules are
    answered from disk without network access.
    """
    env = dict(os.environ, GOFLAGS="-mod=mod", GOTOOLCHAIN="local")
    with tempfile.TemporaryDirectory(prefix="kimik3-gomod-") as tmp:
        try:
            proc = subprocess.run(
                [_go_binary(), "mod", "download", "-json", f"{module}@{version}"],
                cwd=tmp,
                env=env,
                capture_output=True,
                text=True,
                timeout=_GO_DOWNLOAD_TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise ThirdPartyCRDError(
                f"go mod download {module}@{version} took longer than {_GO_DOWNLOAD_TIMEOUT_S:.0f} s"
            ) from exc
    try:
        info = json.loads(proc.stdout)
    except json.JSONDecodeError:
        info = {}
    error = info.get("Error") or (proc.stderr.strip() if proc.returncode else "")
    directory = info.get("Dir")
    if error or not directory:
        raise ThirdPartyCRDError(f"go mod download {module}@{version} failed: {error or proc.stderr.strip()}")
    return Path(directory)


def thirdparty_crd_paths() -> dict[str, Path]:
    """Return the third-party CRD manifest files, keyed by the kind each defines.

    Kinds: LeaderWorkerSet, ComputeDomain, PodMonitor, ServiceMonitor, GatewayClass, Gateway,
    HTTPRoute, ReferenceGrant, InferencePool, InferenceObjective, at the versions of ``kimik3_dev.versions``. Raises
    ``ThirdPartyCRDError`` naming the module when one cannot be fetched or lacks the file.
    """
    paths: dict[str, Path] = {}
    for kind, src in _MODULE_CRDS.items():
        path = go_module_dir(src.module, src.version) / src.path
        if not path.is_file():
            raise ThirdPartyCRDError(f"{src.module}@{src.version} has no {src.path} (needed for {kind})")
        paths[kind] = path
    if not COMPUTE_DOMAIN_CRD.is_file():
        raise ThirdPartyCRDError(f"stand-in ComputeDomain CRD missing: {COMPUTE_DOMAIN_CRD}")
    paths["ComputeDomain"] = COMPUTE_DOMAIN_CRD
    return paths
