"""The simulator's supervisor against a real kube-apiserver: engines follow the groups' pods.

No operator runs here: the tests create what it would render (the launcher ConfigMap and the
client Service, from ``render``) and the pods LeaderWorkerSet would make from the rendered
LeaderWorkerSet (``support.lws_pods``), with the IPs and Ready conditions kwok would give them
(from a loopback /16 of the test's own: ``podnet``); the engines are configured from those, not
from the CR, and listen on the leader pods' IPs.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import os
import threading
import time
import urllib.error
import urllib.request

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from kimik3.kube.kinds import GROUP, PLURAL, VERSION
from kimik3_dev.devcluster import podnet, processes
from kimik3_dev.sim import services
from kimik3_dev.sim.supervisor import LOAD_TIME_ANNOTATION, Supervisor
from support.lws_pods import group_pods
from support.recipes import recipe
from support.rendering import by_kind, render_cr
from support.waiting import wait_for

LOAD_TIME = "1s"


class SupervisorThread:
    """A Supervisor polling every 0.2 s on its own event loop in a thread."""

    def __init__(self, api: client.ApiClient, state_dir: Path):
        self.supervisor = Supervisor(api, state_dir, load_time_s=30.0, poll_interval_s=0.2, seed=1)
        self.loop = asyncio.new_event_loop()
        self.stop = asyncio.Event()
        self.thread = threading.Thread(target=self._main, daemon=True)
        self.error: BaseException | None = None

    def _main(self) -> None:
        try:
            self.loop.run_until_complete(self.supervisor.run(self.stop))
        except BaseException as exc:  # surfaced by the test
            self.error = exc

    def __enter__(self) -> SupervisorThread:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.loop.call_soon_threadsafe(self.stop.set)
        self.thread.join(timeout=15)
        assert not self.thread.is_alive(), "supervisor did not stop"
        assert self.error is None, self.error


def http(url: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    req = urllib.request.Request(url, data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            raw = r.read()
            return r.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        return exc.code, json.loads(raw) if raw and exc.headers.get_content_type() == "application/json" else None
    except (urllib.error.URLError, ConnectionError):
        return 0, None


@pytest.fixture
def pod_ips(tmp_path: Path) -> Iterator[Iterator[ipaddress.IPv4Address]]:
    """Pod IPs of a loopback /16 claimed for this test (as a dev cluster claims its own), so
    engines of tests running side by side never share an address."""
    owner = tmp_path / "podnet"
    processes.write_record(owner, processes.ProcessRecord("pytest", os.getpid(), 0, ["pytest"], ""))
    network = podnet.claim(owner)
    yield network.hosts()
    podnet.release(owner)


def deploy(admin_api: client.ApiClient, namespace: str, **spec: Any) -> list[dict[str, Any]]:
    """The TP8 recipe's CR (``spec`` keys replaced) and the launcher ConfigMap and client Service
    the operator would render for it (with --no-compute-domains, as in the dev cluster); the
    rendered objects."""
    body = recipe(namespace=namespace)
    body["metadata"]["annotations"] = {LOAD_TIME_ANNOTATION: LOAD_TIME}
    body["spec"] |= spec
    created = client.CustomObjectsApi(admin_api).create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL,
                                                                                 body)
    objects = render_cr(created, compute_domains=False).objects
    client.CoreV1Api(admin_api).create_namespaced_config_map(namespace, by_kind(objects, "ConfigMap"))
    client.CoreV1Api(admin_api).create_namespaced_service(namespace, by_kind(objects, "Service"))
    return objects


@pytest.fixture
def cr(admin_api: client.ApiClient, namespace: str) -> list[dict[str, Any]]:
    # a short drain: the leader's preStop fails readiness for 1 s x 3 + 5 s, then 5 s for requests in flight
    return deploy(admin_api, namespace, probes={"periodSeconds": 1, "drainTimeout": "5s"})


def make_group(core: client.CoreV1Api, namespace: str, objects: list[dict[str, Any]], group: int,
               ips: Iterator[ipaddress.IPv4Address], phases: tuple[str, str] = ("Running", "Running")) -> list[str]:
    """A TP8 group on GB300 as LeaderWorkerSet makes it from the rendered LeaderWorkerSet: leader +
    one worker pod, in ``phases``, each with the next of ``ips``."""
    names = []
    for pod, phase in zip(group_pods(by_kind(objects, "LeaderWorkerSet"), namespace, group), phases):
        core.create_namespaced_pod(namespace, pod)
        core.patch_namespaced_pod_status(pod["metadata"]["name"], namespace, {"status": {"podIP": str(next(ips))}})
        set_phase(core, namespace, pod["metadata"]["name"], phase)
        names.append(pod["metadata"]["name"])
    return names


def set_phase(core: client.CoreV1Api, namespace: str, name: str, phase: str) -> None:
    """``phase``, and Ready once Running (what kwok's fast stages write)."""
    ready = "True" if phase == "Running" else "False"
    core.patch_namespaced_pod_status(name, namespace, {"status": {"phase": phase, "conditions": [
        {"type": "Ready", "status": ready}, {"type": "ContainersReady", "status": ready}]}})


def delete_pods(core: client.CoreV1Api, namespace: str, names: list[str]) -> None:
    for name in names:
        core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
    wait_for(lambda: not [p for p in core.list_namespaced_pod(namespace).items if p.metadata.name in names],
             what="pods deleted")


def read(path: Path) -> Any:
    return json.loads(path.read_text()) if path.exists() else None


def service_url(state_dir: Path, namespace: str) -> str | None:
    """The base URL of the stand-in for the deployment's client Service (port 8000)."""
    return services.service_address(state_dir, f"http://k3-latency.{namespace}.svc:8000/v1")


def test_engines_follow_groups_at_their_pod_ips_behind_the_service(admin_api, namespace, cr, pod_ips, tmp_path):
    core = client.CoreV1Api(admin_api)
    with SupervisorThread(admin_api, tmp_path) as st:
        sup = st.supervisor
        wait_for(lambda: sup.polls >= 1 and not any(ns == namespace for ns, _, _ in sup.groups),
                 what="a first look at the cluster, no engine of the namespace")
        group0 = make_group(core, namespace, cr, 0, pod_ips)
        group1 = make_group(core, namespace, cr, 1, pod_ips, ("Running", "Pending"))  # worker not running: no engine
        leader0_ip = core.read_namespaced_pod(group0[0], namespace).status.pod_ip

        def mine() -> dict[str, str]:
            """group index -> the address its engine serves at (Prometheus finds it by the pod's)."""
            return {gi: f"{g.engine.host}:{g.engine.port}" for (ns, _, gi), g in sorted(sup.groups.items())
                    if ns == namespace}
        entries = wait_for(lambda: len(mine()) == 1 and mine(), what="one engine")
        assert sup.groups[(namespace, "k3-latency", "0")].leader_pod == "k3-latency-engine-0"
        # vLLM's place: the leader pod's IP (from the API server) and the rendered --port
        assert entries == {"0": f"{leader0_ip}:8000"}
        engine0 = f"http://{leader0_ip}:8000"
        service = wait_for(lambda: service_url(tmp_path, namespace), what="the Service's stand-in")
        # loading: /health 503; the prober's answer is not 200, so the Service has no endpoint
        # and refuses the connection
        assert http(engine0 + "/health")[0] == 503
        assert http(service + "/v1/completions", {"prompt": "x", "max_tokens": 2})[0] == 0
        wait_for(lambda: http(engine0 + "/health")[0] == 200, what="group 0 loaded")
        wait_for(lambda: http(service + "/v1/completions", {"prompt": "x", "max_tokens": 1})[0] == 200,
                 what="the Service sends to the loaded leader")
        status, doc = http(engine0 + "/v1/completions", {"model": "kimi-k3", "prompt": "hi", "max_tokens": 3})
        assert status == 200 and doc["usage"]["completion_tokens"] == 3
        # streaming passes through the Service as server-sent events
        req = urllib.request.Request(service + "/v1/chat/completions", headers={"Content-Type": "application/json"},
                                     data=json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 9,
                                                      "stream": True}).encode())
        with urllib.request.urlopen(req, timeout=10) as r:
            assert r.headers["Content-Type"].startswith("text/event-stream")
            events = [line.decode().strip() for line in r if line.strip()]
        assert events[-1] == "data: [DONE]" and len(events) >= 3
        # the engine is configured from the leader's rendered argv: TP8 megakernel + DSpark 7
        group = sup.groups[(namespace, "k3-latency", "0")]
        assert group.engine.config.shape.k == 7 and group.engine.config.shape.decode_backend == "latency_specialized"
        assert group.engine.config.shape.tensor_parallel_size == 8

        # group 1's worker runs: a second engine; the Service spreads connections over both once loaded
        set_phase(core, namespace, group1[1], "Running")
        wait_for(lambda: len(mine()) == 2, what="two engines")
        assert sorted(mine()) == ["0", "1"]
        engine1 = f"http://{mine()['1']}"
        wait_for(lambda: http(engine1 + "/health")[0] == 200, what="group 1 loaded")
        key = (namespace, "k3-latency", 8000)
        wait_for(lambda: len(sup.services[key].backends) == 2, what="two endpoints")

        def served() -> list[float]:
            return [sup.groups[(namespace, "k3-latency", g)].engine.metrics.by_reason["length"][0]._value.get()
                    for g in ("0", "1")]
        before = served()
        for _ in range(20):  # one connection each (urllib): kube-proxy picks an endpoint per connection
            assert http(service + "/v1/completions", {"prompt": "x", "max_tokens": 2})[0] == 200
        spread = [after - was for after, was in zip(served(), before)]
        assert sum(spread) == 20 and min(spread) >= 1, spread  # all on one of two: p = 2 x 2^-20
        finished = sum(served())  # every completion of this test: none comes after

        # scale-down: group 1's pods go; nothing listens at its IP, its engine drains through the preStop (8 s)
        delete_pods(core, namespace, group1)
        wait_for(lambda: len(mine()) == 1, what="group 1's engine draining")
        deleted = time.monotonic()
        wait_for(lambda: http(engine1 + "/health")[0] == 0, what="nothing listens at group 1's pod IP")
        (draining,) = sup._draining.values()
        assert draining.url == engine1
        wait_for(lambda: not sup._draining, 20, "group 1's engine stopped")
        assert 8 - 3 <= time.monotonic() - deleted <= 8 + 5  # the preStop's wait, give or take a poll

        # group 0 recreated (new leader UID, new pod IP): a new engine with a new load time
        old_uid = sup.groups[(namespace, "k3-latency", "0")].leader_uid
        delete_pods(core, namespace, group0)
        wait_for(lambda: not mine(), what="group 0's engine stopped")
        make_group(core, namespace, cr, 0, pod_ips)
        new = wait_for(lambda: sup.groups.get((namespace, "k3-latency", "0")), what="group 0 back")
        assert new.leader_uid != old_uid and new.engine.host != leader0_ip
        assert http(new.engine.url + "/health")[0] == 503  # loading again
        wait_for(lambda: http(new.engine.url + "/health")[0] == 200, what="group 0 reloaded")

        # an edit of the CR alone (nothing rendered it: the operator refused it, or has not run)
        # changes nothing: the engine keeps what its pod was started with
        engine = new.engine
        client.CustomObjectsApi(admin_api).patch_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, "k3-latency", {"spec": {"speculativeDecoding": {"numSpeculativeTokens": 3}}})
        sup_polls = sup.polls
        wait_for(lambda: sup.polls >= sup_polls + 2, what="two more polls")
        assert sup.groups[(namespace, "k3-latency", "0")].engine is engine and engine.config.shape.k == 7
        assert http(engine.url + "/health")[0] == 200

        # what the operator renders for that edit (a new plan, the groups recreated) reaches the engine
        edited = render_cr(client.CustomObjectsApi(admin_api).get_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, "k3-latency"), compute_domains=False).objects
        cm = by_kind(edited, "ConfigMap")
        old_cm = by_kind(cr, "ConfigMap")["metadata"]["name"]
        assert cm["metadata"]["name"] != old_cm  # one launcher ConfigMap per plan: the new plan's is new
        core.create_namespaced_config_map(namespace, cm)
        delete_pods(core, namespace, [p.metadata.name for p in core.list_namespaced_pod(namespace).items])
        make_group(core, namespace, edited, 0, pod_ips)
        k3 = wait_for(lambda: (g := sup.groups.get((namespace, "k3-latency", "0"))) is not None
                      and g.engine is not engine and g.engine.config.shape.k, what="group 0 on the new plan")
        assert k3 == 3

        # deleting the CR stops its engines; deleting the Service (the garbage collector's part) its stand-in
        client.CustomObjectsApi(admin_api).delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL,
                                                                           "k3-latency")
        core.delete_namespaced_service("k3-latency", namespace)
        wait_for(lambda: not mine() and service_url(tmp_path, namespace) is None, what="all gone")
    assert read(tmp_path / "sim" / "services.json") == {}  # stopping empties the file
    # usage.json: every engine run for the namespace (4: two groups, group 0 twice recreated) with its
    # final counts, those of engines stopped long before included
    rows = [r for r in read(tmp_path / "sim" / "usage.json") if r["namespace"] == namespace]
    assert sum(r["engines"] for r in rows) == 4
    assert sum(r["counters"]['vllm:request_success_total{finished_reason="length"}'] for r in rows) == finished
    assert sum(r["counters"]["vllm:generation_tokens_total"] for r in rows) == (finished - 22) * 1 + 3 + 9 + 20 * 2


def test_api_key_from_the_leaders_secret_as_a_kubelet_reads_it(admin_api, namespace, pod_ips, tmp_path, caplog):
    """A leader pod whose engine container has VLLM_API_KEY from a Secret (what the renderer writes
    for spec.service.apiKeySecret): no engine while the Secret is missing (a kubelet would not
    start the container); once it exists, the engine and the Service (which passes every byte on)
    refuse /v1 without the key (401, vLLM's body) and serve it with ``Bearer <key>``; /health stays
    open. The key never reaches the supervisor's log or its files."""
    import base64
    import logging
    import secrets

    core = client.CoreV1Api(admin_api)
    key = "sk-sup-" + secrets.token_hex(12)
    objects = deploy(admin_api, namespace, service={"apiKeySecret": {"name": "k3-api-key", "key": "api-key"}})
    leader = make_group(core, namespace, objects, 0, pod_ips)[0]
    engine = f"http://{core.read_namespaced_pod(leader, namespace).status.pod_ip}:8000"
    caplog.set_level(logging.DEBUG)
    with SupervisorThread(admin_api, tmp_path) as st:
        wait_for(lambda: st.supervisor.polls >= 3, what="three polls")
        assert (namespace, "k3-latency", "0") not in st.supervisor.groups  # no engine
        assert any('secret "k3-api-key" not found' in r.getMessage() for r in caplog.records)
        core.create_namespaced_secret(namespace, {"metadata": {"name": "k3-api-key"},
                                                  "data": {"api-key": base64.b64encode(key.encode()).decode()}})
        group = wait_for(lambda: st.supervisor.groups.get((namespace, "k3-latency", "0")), what="the engine")
        assert group.engine.requires_api_key and group.engine.url == engine
        wait_for(lambda: http(engine + "/health")[0] == 200, what="loaded")
        service = wait_for(lambda: service_url(tmp_path, namespace), what="the Service's stand-in")
        wait_for(lambda: st.supervisor.services[(namespace, "k3-latency", 8000)].backends, what="an endpoint")
        body = {"model": "kimi-k3", "prompt": "hi", "max_tokens": 3}
        for url in (engine, service):
            assert http(url + "/v1/completions", body) == (401, {"error": "Unauthorized"})
            req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"})
            with urllib.request.urlopen(req, timeout=10) as r:
                assert r.status == 200 and json.loads(r.read())["usage"]["completion_tokens"] == 3
    assert key not in caplog.text
    assert not [p for p in (tmp_path / "sim").iterdir() if key in p.read_text()]
