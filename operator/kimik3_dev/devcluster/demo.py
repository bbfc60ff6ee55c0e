"""``kimik3 demo``: the main job end to end on a local GB300 NVL72 cluster with no GPU.

1. ``kimik3 dev up``: etcd, kube-apiserver, kube-controller-manager, kube-scheduler (1.35.4),
   kwok GB300 trays in two NVL72 racks, the LeaderWorkerSet manager, the operator, Prometheus and
   the engine simulator, all on 127.0.0.1;
2. ``kimik3 dev apply`` of the recipe (default: GB300 TP8 over 2 trays, megakernel + DSpark);
3. waits for the CR to be Ready, prints ``kimik3 dev status`` (groups Running on trays of one rack);
4. sends a completion to the deployment's endpoint (its ``status.endpoint``: the client Service,
   played by the simulator as kube-proxy would, spreading connections over the Ready leader pods'
   IPs) and prints the answer;
5. asks Prometheus for the deployment's ITL series and prints what it holds.

The cluster stays up afterwards for kubectl and ``kimik3 dev load``; ``kimik3 dev down`` stops it.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import requests

from kimik3.api.conditions import ConditionType
from kimik3.api.documents import dump_yaml, load_deployments
from kimik3.kube.kinds import KIMIK3_DEPLOYMENT
from kimik3.kube.objects import condition, is_true
from kimik3.controller.kube import Kube
from kimik3_dev.devcluster import cli as dev_cli
from kimik3_dev.devcluster.cluster import DevCluster
from kimik3_dev.sim import load

ITL_SERIES = "vllm:inter_token_latency_seconds_count"


def _step(text: str) -> None:
    print(f"\n==> {text}", flush=True)


def _wait(what: str, fn: Any, timeout_s: float, poll_s: float = 1.0) -> Any:
    """Poll ``fn`` until truthy; say what it waits for when that takes more than a poll, and
    how long it took (seconds)."""
    start = time.monotonic()
    deadline = start + timeout_s
    said = False
    while time.monotonic() < deadline:
        value = fn()
        if value:
            if said:
                print(f"    ... done after {time.monotonic() - start:.1f} s", flush=True)
            return value
        if not said:
            print(f"    waiting for {what} (up to {timeout_s:g} s)", flush=True)
            said = True
        time.sleep(poll_s)
    raise TimeoutError(f"timed out after {timeout_s:g} s waiting for {what}")


def run_demo(recipe: Path, state_dir: Path, timeout_s: float) -> int:
    """The demo's steps; its exit code. Raises BadManifest (a recipe that cannot be read, or holds
    no KimiK3Deployment) before anything starts."""
    cr = load_deployments(str(recipe))[0]
    ns, name = cr["metadata"]["namespace"], cr["metadata"]["name"]
    _step("kimik3 dev up: control plane, simulated GB300 NVL72 racks, LWS, operator, Prometheus, simulator")
    dev_cli.dev.main(["up", "--state-dir", str(state_dir)], standalone_mode=False)
    _step(f"kimik3 dev apply -f {recipe}")
    dev_cli.dev.main(["apply", "--state-dir", str(state_dir), "-f", str(recipe)], standalone_mode=False)
    cluster = DevCluster(state_dir)
    with cluster.api_client() as api:
        kube = Kube(api)

        def ready() -> dict[str, Any] | None:
            # Ready, and where the recipe has a ComputeDomain, every engine pod's node joined it (the
            # simulated driver reports the nodes a few seconds after the pods run).
            obj = kube.get(*KIMIK3_DEPLOYMENT.type_meta, ns, name)
            joined = is_true(obj, ConditionType.COMPUTE_DOMAIN_READY) or condition(obj, ConditionType.COMPUTE_DOMAIN_READY) is None
            return obj if is_true(obj, ConditionType.READY) and joined else None

        _step(f"waiting for {KIMIK3_DEPLOYMENT.kind} {ns}/{name} to be Ready")
        obj = _wait("Ready=True (and ComputeDomainReady=True where the recipe has a ComputeDomain)", ready, timeout_s)
        print(dump_yaml({"status": {k: obj["status"][k] for k in ("conditions", "replicas", "readyReplicas",
                                                                  "endpoint", "plan") if k in obj["status"]}}))
    _step("kimik3 dev status")
    dev_cli.dev.main(["status", "--state-dir", str(state_dir)], standalone_mode=False)

    state = cluster.state() or {}

    def endpoint() -> str | None:
        try:
            url, _ = load.resolve_url(cluster.kubeconfig, state_dir, f"{ns}/{name}")
            return url if requests.get(f"{url}/health", timeout=2).status_code == 200 else None
        except (LookupError, requests.RequestException):
            return None

    _step(f"a completion through the deployment's endpoint {obj['status'].get('endpoint')} "
          "(the engine simulator stands in for vLLM and kube-proxy)")
    url = _wait("the simulated engine to finish loading (dev up --load-time, /health 503 until then)", endpoint,
                timeout_s)
    served = cr["spec"]["model"].get("servedModelName", "kimi-k3")
    t0 = time.monotonic()
    answer = requests.post(f"{url}/v1/completions", json={"model": served, "prompt": "Kimi K3 on GB300 is",
                                                          "max_tokens": 48}, timeout=60).json()
    elapsed = time.monotonic() - t0
    tokens = answer["usage"]["completion_tokens"]
    print(f"POST {url}/v1/completions -> {tokens} tokens in {elapsed:.2f} s ({tokens / elapsed:.0f} tok/s): "
          f"{answer['choices'][0]['text'][:120]!r}")

    prom = state.get("urls", {}).get("prometheus")
    if prom:
        _step(f"Prometheus ({prom}) holds the deployment's ITL series")

        def series() -> list[dict[str, Any]] | None:
            query = f'{ITL_SERIES}{{namespace="{ns}",deployment="{name}"}}'
            result = requests.get(f"{prom}/api/v1/query", params={"query": query}, timeout=5).json()["data"]["result"]
            return result if result and any(float(r["value"][1]) > 0 for r in result) else None

        for row in _wait("the ITL series", series, timeout_s, poll_s=2.0):
            labels = {k: v for k, v in row["metric"].items() if k in ("namespace", "deployment", "group", "engine")}
            print(f"{ITL_SERIES}{labels} = {row['value'][1]} engine steps observed")
    print(f"\nThe cluster is still up: export KUBECONFIG={cluster.kubeconfig}; "
          f"tools/kimik3 dev load --help; tools/kimik3 dev down --state-dir {state_dir}")
    return 0
