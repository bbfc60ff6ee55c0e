"""kwok (``KWOK_VERSION`` of ``kimik3_dev.versions``) run out of cluster as the fake kubelet of every simulated tray.

kwok does not schedule (kube-scheduler does); it keeps the managed Node objects Ready (node
leases renewed every ``NODE_LEASE_S / 4`` s by kwok), moves bound pods to Running/Ready with a
pod IP from the cluster's pod network (``write_config``'s ``pod_network``: a 127.N.0.0/16 of its
own, ``kimik3_dev.devcluster.podnet``) and finishes deleted pods. The engine simulator serves each
group's engine on its leader pod's IP (``kimik3_dev.sim.supervisor``). kwok hands out the network's
addresses in order from .0.1 and gives a deleted pod's address to a later pod.

Its behaviour comes from Stage objects: the ``kwok`` binary has none built in (``kwokctl``
writes them into its config). We write a config file (``<state>/kwok/kwok.yaml``) with the
stages kwokctl uses for a fast cluster, read from the kwok module itself in the Go module cache
(``kustomize/stage/node/fast/node-initialize.yaml``,
``kustomize/stage/node/heartbeat-with-lease/...``, ``kustomize/stage/pod/fast/*.yaml``), so no
kwok text is copied into this repository. Two changes: staging-Job pods are left to ``kimik3 dev stagers`` (``STAGER_EXCLUDED``); pod deletion waits
``POD_DELETE_DELAY_MS`` (a kubelet takes time to stop containers; with an instant delete the
LeaderWorkerSet controller can miss a worker's deletion and not recreate its group, F14).

With ``readiness_probes`` (``dev up --readiness-probes``), kwok's ``pod-ready`` stage leaves a pod
with a ``readinessProbe`` Running but not Ready (``Ready``/``ContainersReady`` False, the
container not ready), and the engine simulator plays the kubelet's prober: it marks the leader
Ready once its engine's /health answers 200, so a group is Ready only after its load time, as on
GPUs (``kimik3_dev.sim.supervisor``). Workers have no probe and are Ready at once, as on a kubelet.

Two of kwok's own chaos stages are loaded too, so faults can be injected by label
(``kimik3_dev.devcluster.faults``): ``node-not-ready`` (a Node labelled ``NODE_NOT_READY_LABEL=true``
reports ``Ready=False``; with weight 10000 it wins over ``node-initialize`` until the label goes,
then ``node-initialize`` makes the node Ready again) and ``pod-container-running-failed`` (a
Running pod labelled ``POD_FAILED_LABEL=true`` has its containers terminated, exit code 1, and
phase ``Failed``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from kimik3.api.documents import dump_yaml_all
from kimik3.kube.labels import STAGER_LABEL
from kimik3_dev.devcluster.racks import KWOK_ANNOTATION
from kimik3_dev.devcluster.thirdparty import go_module_dir
from kimik3_dev.versions import KWOK_VERSION

__all__ = ["KWOK_MODULE", "NODE_NOT_READY_LABEL", "POD_FAILED_LABEL", "argv", "stages",
           "write_config"]

KWOK_MODULE = "sigs.k8s.io/kwok"
NODE_LEASE_S = 40
"""Node lease duration, s (kubelet's default); the controller-manager marks a node NotReady
after ``--node-monitor-grace-period`` (50 s) without a renewal."""
NODE_IP = "10.243.0.1"
"""Fake node InternalIP reported on every node (never connected to)."""
POD_DELETE_DELAY_MS = 1000
"""Delay between a pod's deletion request and kwok finishing it, ms (kwok's own "general" pod
profile uses 1000 ms too)."""

NODE_NOT_READY_LABEL = "node-not-ready.stage.kwok.x-k8s.io"
"""Label (value ``"true"``) that selects a Node for kwok's ``node-not-ready`` chaos stage."""
POD_FAILED_LABEL = "pod-container-running-failed.stage.kwok.x-k8s.io"
"""Label (value ``"true"``) that selects a Running pod for kwok's ``pod-container-running-failed`` stage."""

STAGER_EXCLUDED = ("pod-ready", "pod-complete")
"""kwok's pod stages that skip staging-Job pods (label ``STAGER_LABEL``): ``kimik3_dev.devcluster.stagers``
runs those pods as local processes and writes their status, as a kubelet would."""
_STAGE_FILES = (
    "kustomize/stage/node/fast/node-initialize.yaml",
    "kustomize/stage/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
    "kustomize/stage/pod/fast/pod-ready.yaml",
    "kustomize/stage/pod/fast/pod-complete.yaml",
    "kustomize/stage/pod/fast/pod-delete.yaml",
    "kustomize/stage/node/chaos/node-not-ready.yaml",
    "kustomize/stage/pod/chaos/pod-container-running-failed.yaml",
)


_PROBED = "{{ $probed := false }}{{ range .spec.containers }}{{ if .readinessProbe }}{{ $probed = true }}{{ end }}{{ end }}"
"""Go template: whether any container of the pod has a readinessProbe."""
_READY_IF_UNPROBED = '{{ if $probed }}"False"{{ else }}"True"{{ end }}'
_READY_LINES = ('status: "True"\n  type: Ready\n', 'status: "True"\n  type: ContainersReady\n')


def _readiness_from_probes(doc: dict[str, Any]) -> None:
    """kwok's ``pod-ready`` status template, with Ready/ContainersReady (and each container's
    ``ready``) False for a pod that has a readinessProbe. Raises ValueError when the pinned
    kwok's template no longer reads as expected."""
    template = doc["spec"]["next"]["statusTemplate"]
    if not all(line in template for line in _READY_LINES) or "ready: true" not in template:
        raise ValueError(f"kwok {KWOK_VERSION}'s pod-ready stage changed: cannot leave probed pods unready")
    for line in _READY_LINES:
        template = template.replace(line, line.replace('"True"', _READY_IF_UNPROBED))
    template = template.replace("ready: true", "ready: {{ if $probed }}false{{ else }}true{{ end }}", 1)
    doc["spec"]["next"]["statusTemplate"] = _PROBED + "\n" + template


def stages(module_dir: Path | None = None, readiness_probes: bool = False) -> list[dict[str, Any]]:
    """The Stage documents for kwok, read from the kwok module (see the module docstring)."""
    root = module_dir or go_module_dir(KWOK_MODULE, KWOK_VERSION)
    out = []
    for rel in _STAGE_FILES:
        doc = yaml.safe_load((root / rel).read_text())
        if doc["metadata"]["name"] == "pod-delete":
            doc["spec"]["delay"] = {"durationMilliseconds": POD_DELETE_DELAY_MS}
        if doc["metadata"]["name"] == "pod-ready" and readiness_probes:
            _readiness_from_probes(doc)
        if doc["metadata"]["name"] in STAGER_EXCLUDED:  # run for real by `kimik3 dev stagers`
            doc["spec"]["selector"]["matchExpressions"].append(
                {"key": f'.metadata.labels["{STAGER_LABEL}"]', "operator": "DoesNotExist"})
        out.append(doc)
    return out


def write_config(state_dir: Path, pod_network: str, module_dir: Path | None = None,
                 readiness_probes: bool = False) -> Path:
    """Write ``<state>/kwok/kwok.yaml`` (a KwokConfiguration plus the stages), pods' IPs from
    ``pod_network`` (a CIDR, e.g. ``127.1.0.0/16``); returns its path."""
    config = {
        "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
        "kind": "KwokConfiguration",
        "options": {
            "cidr": pod_network,
            "nodeIP": NODE_IP,
            "manageNodesWithAnnotationSelector": f"{KWOK_ANNOTATION[0]}={KWOK_ANNOTATION[1]}",
            "nodeLeaseDurationSeconds": NODE_LEASE_S,
            # kwok's own defaults (zz_generated.defaults.go), spelled out: the pinned kwok leaves them at
            # zero when options come from a file ("node leases parallelism must be greater than 0").
            "podPlayStageParallelism": 4,
            "nodePlayStageParallelism": 4,
            "nodeLeaseParallelism": 4,
            "podsOnNodeSyncParallelism": 1,
            "enablePodsOnNodeSyncListPager": True,
            "enablePodsOnNodeSyncStreamWatch": False,
            "enableDebuggingHandlers": False,  # no exec/logs/port-forward: nothing runs in the pods
            "enableProfilingHandler": False,
            "enableContentionProfiling": False,
        },
    }
    path = state_dir / "kwok" / "kwok.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dump_yaml_all([config, *stages(module_dir, readiness_probes)]))
    return path


def argv(binary: Path, kubeconfig: Path, config: Path, health_port: int) -> list[str]:
    """kwok's command line: the kubeconfig, our config, and its server (``/healthz``) on loopback."""
    return [str(binary), f"--kubeconfig={kubeconfig}", f"--config={config}",
            f"--server-address=127.0.0.1:{health_port}"]
