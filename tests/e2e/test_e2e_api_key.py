"""The engine's API key from a Secret, end to end on ``kimik3 dev up`` (issue 6, security).

A Secret in the namespace, the GB300 recipe with ``spec.service.apiKeySecret`` naming it: the
operator renders ``VLLM_API_KEY`` from ``secretKeyRef`` into the leader pods (it never reads the
Secret); the engine simulator, standing in for the engine container, resolves it from the pod
like a kubelet (``kimik3_dev.sim.podenv``) and enforces it like vLLM 0.32 (checked against a real vLLM
server by tests/conformance/test_launcher_conformance.py). Requests go only to loopback: the
deployment's endpoint (its Service, played by the simulator as kube-proxy would:
``kimik3_dev.sim.services``) and the leader pod's IP.
"""

from __future__ import annotations

import base64
import ipaddress
import json
import secrets
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from click.testing import CliRunner
from devenv import WAIT_S, DevEnv

from kimik3.cli import main
from kimik3_dev.devcluster.readiness import http_get
from kimik3_dev.sim.load import resolve_url
from support.waiting import wait_for

SECRET, SECRET_KEY = "k3-api-key", "api-key"


def call(url: str, body: dict[str, Any] | None = None, authorization: str | None = None) -> tuple[int, Any]:
    """(status, JSON body or None) of a GET (``body`` None) or POST to ``url`` on a loopback address;
    (0, None) when the connection is refused or closed unanswered."""
    assert ipaddress.ip_address(urllib.parse.urlsplit(url).hostname).is_loopback, url
    headers = {"Content-Type": "application/json"}
    if authorization is not None:
        headers["Authorization"] = authorization
    req = urllib.request.Request(url, data=json.dumps(body).encode() if body is not None else None, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            raw, status, ctype = resp.read(), resp.status, resp.headers.get_content_type()
    except urllib.error.HTTPError as exc:
        raw, status, ctype = exc.read(), exc.code, exc.headers.get_content_type()
    except (urllib.error.URLError, ConnectionError):
        return 0, None  # refused: the Service has no Ready endpoint yet
    return status, json.loads(raw) if raw and ctype == "application/json" else None


def load(state_dir: str, ns: str, env: dict[str, str], *extra: str) -> tuple[int, dict[str, Any]]:
    """``kimik3 dev load ns/k3`` (1 user, 2 s, at most 4 requests of 8 tokens): (exit code, total summary)."""
    result = CliRunner().invoke(main, ["dev", "load", f"{ns}/k3", "--state-dir", state_dir, "--concurrency", "1",
                                       "--duration", "2s", "--max-requests", "4", "--prompt-tokens", "16",
                                       "--output-tokens", "8", "--drain", "20s", "--json", *extra], env=env)
    return result.exit_code, json.loads(result.stdout)["summary"]["total"]


def test_api_key_from_a_secret_is_enforced_and_never_leaks(dev_env: DevEnv, ns: str) -> None:
    key = "sk-e2e-" + secrets.token_urlsafe(24)  # unique: any occurrence below is a leak
    dev_env.rest.create(f"/api/v1/namespaces/{ns}/secrets", {
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": SECRET}, "type": "Opaque",
        "data": {SECRET_KEY: base64.b64encode(key.encode()).decode()}})
    cr = dev_env.deployment(ns, replicas=1)
    cr["metadata"]["annotations"] = {"inference.kimik3.io/sim-load-time": "1s"}  # simulator-only override
    cr["spec"].setdefault("service", {})["apiKeySecret"] = {"name": SECRET, "key": SECRET_KEY}
    dev_env.apply(cr)
    wait_for(lambda: (dev_env.condition(ns, "Ready") or {}).get("status") == "True", WAIT_S, "Ready=True")

    # The leader pod (as the API server holds it) carries a reference, not the key.
    leader = wait_for(lambda: dev_env.ready_groups(ns, 2, 1), WAIT_S, "one group of 2 Ready pods")[0][0]
    engine = next(c for c in leader["spec"]["containers"] if c["name"] == "engine")
    assert [e for e in engine["env"] if e["name"] == "VLLM_API_KEY"] == [
        {"name": "VLLM_API_KEY", "valueFrom": {"secretKeyRef": {"name": SECRET, "key": SECRET_KEY}}}]

    def service() -> str | None:
        try:  # the simulator plays the Service from its next look at the cluster
            return resolve_url(dev_env.cluster.kubeconfig, dev_env.cluster.state_dir, "k3", ns)[0]
        except LookupError:
            return None
    url = wait_for(service, WAIT_S, "the simulator to play the deployment's Service")
    wait_for(lambda: call(url + "/health")[0] == 200, WAIT_S, "the Service to reach the loaded engine")
    pod_url = f"http://{leader['status']['podIP']}:8000"
    assert call(pod_url + "/v1/completions", {"prompt": "hi"}) == (401, {"error": "Unauthorized"})  # the engine's own
    completion = {"model": "kimi-k3", "prompt": "hello", "max_tokens": 16}
    unauthorized = (401, {"error": "Unauthorized"})  # real vLLM 0.32's refusal
    assert call(url + "/v1/completions", completion) == unauthorized
    assert call(url + "/v1/completions", completion, f"Bearer {key}x") == unauthorized
    assert call(url + "/v1/models") == unauthorized
    status, answer = call(url + "/v1/completions", completion, f"Bearer {key}")
    assert status == 200 and answer["usage"]["completion_tokens"] == 16
    assert call(url + "/v1/models", None, f"Bearer {key}")[1]["data"][0]["id"] == "kimi-k3"
    assert call(url + "/health")[0] == 200  # probes need no key

    # /metrics needs no key either: Prometheus scrapes the engine (the autoscaler's data source).
    def engine_target() -> dict[str, Any] | None:
        status, body = http_get(dev_env.state["urls"]["prometheus"] + "/api/v1/targets?state=active")
        return next((t for t in json.loads(body)["data"]["activeTargets"]
                     if t["labels"].get("namespace") == ns and t["health"] == "up"), None)
    assert wait_for(engine_target, 60.0, "Prometheus scraping the keyed engine")["lastError"] == ""

    # `kimik3 dev load` sends the key from an environment variable; without it every request is refused.
    state_dir = str(dev_env.cluster.state_dir)
    code, total = load(state_dir, ns, {"E2E_K3_KEY": key}, "--api-key-env", "E2E_K3_KEY")
    assert code == 0 and total["ok"] == total["requests"] >= 1 and total["errors"] == 0, total
    code, total = load(state_dir, ns, {})
    assert code == 1 and total["ok"] == 0 and total["error_kinds"] == {"HTTP 401": total["requests"]}, total

    # The key appears nowhere it should not: the CR (status included), the namespace's Events, the
    # operator's log, the children and pods (references only), the simulator's log and files.
    cr_now = dev_env.get_cr(ns)
    assert cr_now["status"]["conditions"] and key not in json.dumps(cr_now)
    events = dev_env.rest.items(f"/api/v1/namespaces/{ns}/events")
    assert dev_env.events(ns) and key not in json.dumps(events)  # the operator did write Events here
    operator_log = dev_env.cluster.state_dir / "logs" / "operator.log"
    operator_text = operator_log.read_text(errors="replace")
    assert operator_text.strip() and key not in operator_text
    lws = dev_env.rest.items(f"/apis/leaderworkerset.x-k8s.io/v1/namespaces/{ns}/leaderworkersets")
    assert lws and key not in json.dumps(lws) and key not in json.dumps(dev_env.pods(ns))
    logs = {r.name: r.log for r in dev_env.cluster.running()}
    sim_log = open(logs["sim"], errors="replace").read()
    assert f"group {ns}/k3/0" in sim_log and "API key (VLLM_API_KEY) required on /v1" in sim_log
    assert key not in sim_log
    assert not [p.name for p in (dev_env.cluster.state_dir / "sim").iterdir() if key in p.read_text()]
