"""The engine simulator's API key: vLLM 0.32's authentication rules, and the kubelet's reading of
``VLLM_API_KEY`` from a pod spec (``kimik3_dev.sim.podenv``). The comparison with a real vLLM server
is in tests/conformance/test_launcher_conformance.py (``test_simulator_refuses_like_real_vllm``);
the dev-cluster path (Secret -> CR -> pods -> simulator) in tests/e2e/test_e2e_api_key.py."""

from __future__ import annotations

import asyncio
import base64
import logging
from typing import Any

import aiohttp
import pytest

from kimik3.render.leaderworkerset import API_KEY_ENV, CONTAINER
from kimik3_dev.sim import podenv
from kimik3_dev.sim.engine import UNAUTHORIZED_BODY, EngineConfig, SimEngine
from support.rendering import render_cr

KEY = "sk-test-7f3a"


def probe(config: EngineConfig, requests: list[tuple[str, str, dict[str, str]]]) -> list[tuple[int, str, bytes]]:
    """(status, Content-Type, body) of each (method, path, headers) against a fresh engine."""
    async def main() -> list[tuple[int, str, bytes]]:
        engine = SimEngine(config)
        await engine.start()
        out = []
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
                for method, path, headers in requests:
                    body = {"prompt": "hi", "max_tokens": 2} if method == "POST" else None
                    async with session.request(method, engine.url + path, json=body, headers=headers) as r:
                        out.append((r.status, r.headers.get("Content-Type", ""), await r.read()))
        finally:
            await engine.stop()
        return out
    return asyncio.run(main())


def test_engine_without_key_serves_everyone():
    status = [s for s, _, _ in probe(EngineConfig(), [("GET", "/v1/models", {}), ("POST", "/v1/completions", {})])]
    assert status == [200, 200]
    # an empty key is no key (vLLM drops falsy keys: no authentication)
    assert probe(EngineConfig(api_keys=("",)), [("GET", "/v1/models", {})])[0][0] == 200


def test_engine_with_key_follows_vllms_middleware():
    bearer = {"Authorization": f"Bearer {KEY}"}
    cases = [
        ("GET", "/v1/models", {}, 401), ("POST", "/v1/completions", {}, 401),
        ("POST", "/v1/chat/completions", {}, 401),
        ("GET", "/v1/models", {"Authorization": "Bearer wrong"}, 401),
        ("GET", "/v1/models", {"Authorization": KEY}, 401),  # no scheme
        ("GET", "/v1/models", {"Authorization": f"Basic {KEY}"}, 401),
        ("GET", "/v1/models", {"Authorization": f"Bearer  {KEY}"}, 401),  # the key is what follows the 1st space
        ("GET", "/v1/models", bearer, 200), ("POST", "/v1/completions", bearer, 200),
        ("GET", "/v1/models", {"Authorization": f"bEaReR {KEY}"}, 200),  # scheme case-insensitive
        ("GET", "/v2/anything", {}, 401), ("GET", "/inference/v1/generate", {}, 401), ("GET", "/cohere/x", {}, 401),
        ("GET", "/v1x", {}, 401),  # a prefix match, like vLLM's str.startswith
        ("GET", "/v2/anything", bearer, 404),  # authenticated first, then routed
        ("GET", "/health", {}, 200), ("GET", "/metrics", {}, 200), ("GET", "/metrics", {"Authorization": "x"}, 200),
        ("OPTIONS", "/v1/models", {}, 405),  # OPTIONS skips authentication (CORS preflight), then routing
    ]
    got = probe(EngineConfig(api_keys=(KEY,)), [(m, p, h) for m, p, h, _ in cases])
    assert [s for s, _, _ in got] == [want for *_, want in cases]
    for (status, content_type, body), case in zip(got, cases):
        if status == 401:
            assert (content_type, body) == ("application/json", UNAUTHORIZED_BODY), case
    # two keys: either is accepted (vLLM's --api-key takes several)
    two = probe(EngineConfig(api_keys=("a1", "b2")), [("GET", "/v1/models", {"Authorization": "Bearer b2"}),
                                                      ("GET", "/v1/models", {"Authorization": "Bearer a1"})])
    assert [s for s, _, _ in two] == [200, 200]


def test_the_key_is_kept_out_of_repr():
    config = EngineConfig(api_keys=(KEY,))
    assert KEY not in repr(config)
    assert KEY not in repr(SimEngine(config).__dict__)  # only digests are kept by the engine


# ---------------------------------------------------------------- podenv (the kubelet's rules)

def secret(**data: str) -> dict[str, Any]:
    return {"data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}}


def test_rendered_pod_env_resolves_to_the_secrets_value():
    """The renderer's pod (spec.service.apiKeySecret) -> VLLM_API_KEY = the Secret's data[key]."""
    cr = {"metadata": {"name": "k3", "namespace": "ns", "uid": "u"},
          "spec": {"model": {"source": {"hub": {}}}, "topology": {"accelerator": "b300", "tensorParallelSize": 8},
                   "service": {"apiKeySecret": {"name": "keys", "key": "api"}}}}
    lws = next(o for o in render_cr(cr).objects if o["kind"] == "LeaderWorkerSet")
    pod_spec = lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]
    entry = podenv.env_entry(pod_spec, API_KEY_ENV, CONTAINER)
    assert entry == {"name": API_KEY_ENV, "valueFrom": {"secretKeyRef": {"name": "keys", "key": "api"}}}
    asked: list[str] = []

    def read(name: str) -> dict[str, Any] | None:
        asked.append(name)
        return secret(api=KEY, other="x") if name == "keys" else None
    assert podenv.resolve(entry, "ns", read) == KEY
    assert asked == ["keys"]


def test_kubelet_rules():
    spec = {"containers": [{"name": "sidecar", "env": [{"name": API_KEY_ENV, "value": "side"}]},
                           {"name": CONTAINER, "env": [{"name": API_KEY_ENV, "value": "first"},
                                                       {"name": "OTHER", "value": "o"},
                                                       {"name": API_KEY_ENV, "value": "last"}]}]}
    entry = podenv.env_entry(spec, API_KEY_ENV, CONTAINER)
    assert podenv.resolve(entry, "ns", lambda n: None) == "last"  # the engine container; the last entry wins
    assert podenv.env_entry({"containers": [{"name": "x", "env": [{"name": API_KEY_ENV, "value": "v"}]}]},
                            API_KEY_ENV, CONTAINER) == {"name": API_KEY_ENV, "value": "v"}  # else the first container
    assert podenv.env_entry({"containers": [{"name": CONTAINER}]}, API_KEY_ENV, CONTAINER) is None
    assert podenv.resolve(None, "ns", lambda n: None) is None

    ref = lambda **r: {"name": API_KEY_ENV, "valueFrom": {"secretKeyRef": {"name": "s", "key": "k", **r}}}  # noqa: E731
    with pytest.raises(podenv.EnvUnresolved, match='secret "s" not found'):
        podenv.resolve(ref(), "ns", lambda n: None)
    with pytest.raises(podenv.EnvUnresolved, match="couldn't find key k in Secret ns/s"):
        podenv.resolve(ref(), "ns", lambda n: secret(other=KEY))
    assert podenv.resolve(ref(optional=True), "ns", lambda n: None) is None  # optional: left unset
    assert podenv.resolve(ref(optional=True), "ns", lambda n: secret(other=KEY)) is None
    with pytest.raises(podenv.EnvUnresolved, match="configMapKeyRef") as err:
        podenv.resolve({"name": API_KEY_ENV, "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}},
                       "ns", lambda n: None)
    with pytest.raises(podenv.EnvUnresolved) as bad:
        podenv.resolve(ref(), "ns", lambda n: {"data": {"k": "@@" + KEY}})
    assert "is not base64-encoded" in str(bad.value)
    assert KEY not in str(err.value) and KEY not in str(bad.value)  # names, never values


def test_unresolved_key_is_logged_without_value(caplog: pytest.LogCaptureFixture):
    """The supervisor's warning for a group whose Secret lacks the key names Secret and key only."""
    from kimik3_dev.sim.supervisor import Supervisor, _Wanted

    sup = Supervisor.__new__(Supervisor)
    sup._unresolved = {}
    sup._read_secret = lambda ns, name: secret(other=KEY)  # type: ignore[method-assign]
    want = _Wanted("ns", "k3", "0", "k3-engine-0", "uid-1", {"spec": {"containers": [{"name": "engine", "env": [
        {"name": API_KEY_ENV, "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]}]}})
    with caplog.at_level(logging.INFO, logger="kimik3_dev.sim.supervisor"):
        assert asyncio.run(sup._api_keys(("ns", "k3", "0"), want)) is None
        assert asyncio.run(sup._api_keys(("ns", "k3", "0"), want)) is None  # once per leader pod
    assert [r.getMessage() for r in caplog.records] == [
        "group ns/k3/0 (leader k3-engine-0): no engine, as a kubelet would not start the container: "
        "env VLLM_API_KEY: couldn't find key k in Secret ns/s"]
    sup._read_secret = lambda ns, name: secret(k=KEY)  # type: ignore[method-assign]
    assert asyncio.run(sup._api_keys(("ns", "k3", "0"), want)) == (KEY,)
    assert KEY not in repr(want)
