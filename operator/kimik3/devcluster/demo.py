"""``kimik3 demo``: the main job end to end on a real, local API server.

Starts etcd + kube-apiserver (Kubernetes 1.35.4) on loopback, installs the real CRDs of
LeaderWorkerSet, ComputeDomain, PodMonitor/ServiceMonitor, HTTPRoute and our own, runs the
operator, applies the recipe with strict field validation, waits for the operator's status,
then prints the children it created and the CR's status. No LeaderWorkerSet controller,
scheduler or kubelet runs here (that is ``kimik3 dev up``), so groups stay at 0 ready and the
status says what they wait for. Everything it started is stopped before it returns.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from kimik3 import GROUP, KIND, PLURAL, VERSION
from kimik3.controller.kube import Kube
from kimik3.devcluster.controlplane import ControlPlane
from kimik3.devcluster.operator_thread import OperatorThread
from kimik3.devcluster.install import install_apis

CHILD_KINDS = [("resource.nvidia.com/v1beta1", "ComputeDomain"), ("v1", "ConfigMap"),
               ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet"), ("v1", "Service"),
               ("policy/v1", "PodDisruptionBudget"), ("monitoring.coreos.com/v1", "PodMonitor")]


def apply_strict(kube: Kube, obj: dict[str, Any]) -> dict[str, Any]:
    return kube.apply(obj, force=False)


def ensure_namespace(api: client.ApiClient, name: str) -> None:
    core = client.CoreV1Api(api)
    try:
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    except client.ApiException as exc:
        if exc.status != 409:
            raise


def _step(text: str) -> None:
    print(f"==> {text}", flush=True)


def run_demo(recipe: Path, state_dir: Path, timeout_s: float) -> int:
    docs = [d for d in yaml.safe_load_all(recipe.read_text()) if d and d.get("kind") == KIND]
    if not docs:
        print(f"{recipe}: no {KIND} in it")
        return 2
    cr = docs[0]
    ns, name = cr["metadata"].get("namespace", "default"), cr["metadata"]["name"]
    _step(f"starting etcd 3.6.16 + kube-apiserver 1.35.4 on loopback (state in {state_dir})")
    with ControlPlane(state_dir) as cp:
        print(f"    API server {cp.server} ready in {cp.startup_seconds:.1f} s; kubeconfig {cp.admin_kubeconfig}")
        _step("installing CRDs: LeaderWorkerSet, ComputeDomain, PodMonitor, ServiceMonitor, HTTPRoute, KimiK3Deployment")
        names = install_apis(cp)
        print("    " + ", ".join(names))
        with cp.api_client("admin") as api:
            kube = Kube(api)
            ensure_namespace(api, ns)
            _step("starting the operator (kopf)")
            with OperatorThread(str(cp.admin_kubeconfig)) as op:
                print(f"    health and metrics on {op.health_url}/healthz, /metrics")
                _step(f"applying {recipe} ({KIND} {ns}/{name})")
                apply_strict(kube, cr)
                deadline = time.monotonic() + timeout_s
                obj: dict[str, Any] | None = None
                while time.monotonic() < deadline:
                    obj = kube.get(f"{GROUP}/{VERSION}", KIND, ns, name)
                    status = (obj or {}).get("status") or {}
                    if status.get("observedGeneration") == (obj or {}).get("metadata", {}).get("generation"):
                        break
                    time.sleep(0.5)
                else:
                    print(f"the operator did not report status within {timeout_s:g} s")
                    return 1
                _step("children created by the operator (all owned by the CR)")
                for api_version, kind in CHILD_KINDS:
                    for child_name in (name, f"{name}-engine", f"{name}-launcher"):
                        child = kube.get(api_version, kind, ns, child_name)
                        if child:
                            owner = child["metadata"]["ownerReferences"][0]
                            print(f"    {kind:<20} {ns}/{child_name:<28} owner {owner['kind']}/{owner['name']}")
                lws = kube.get("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", ns, f"{name}-engine")
                tmpl = lws["spec"]["leaderWorkerTemplate"]
                print(f"    LeaderWorkerSet: {lws['spec']['replicas']} group(s) of {tmpl['size']} pods, "
                      f"restartPolicy {tmpl['restartPolicy']}, exclusive topology "
                      f"{lws['metadata'].get('annotations', {}).get('leaderworkerset.sigs.k8s.io/exclusive-topology')}")
                cm = kube.get("v1", "ConfigMap", ns, f"{name}-launcher")
                plan = json.loads(cm["data"]["plan.json"])
                for rank in plan["ranks"]:
                    print(f"    rank {rank['index']}: vllm serve {' '.join(rank['args'])}")
                _step(f"status of {KIND} {ns}/{name}")
                print(yaml.safe_dump({"status": obj["status"]}, sort_keys=False, width=120))
                print(f"kubectl --kubeconfig {cp.admin_kubeconfig} get {PLURAL} -A   # while a demo runs")
    _step("stopped the operator, kube-apiserver and etcd")
    return 0
