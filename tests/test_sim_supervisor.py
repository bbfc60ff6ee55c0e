"""The simulator's supervisor against a real kube-apiserver: engines follow the groups' pods.

No operator runs here: the tests create what it would render (the launcher ConfigMap, from
``render``) and the pods LeaderWorkerSet would make from the rendered LeaderWorkerSet
(``support.lws_pods``); the engines are configured from those, not from the CR.
"""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.error
import urllib.request

from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from kimik3.kube.kinds import GROUP, PLURAL, VERSION
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


def deploy(admin_api: client.ApiClient, namespace: str, **spec: Any) -> list[dict[str, Any]]:
    """The TP8 recipe's CR (``spec`` keys replaced) and the launcher ConfigMap the operator would
    render for it (with --no-compute-domains, as in the dev cluster); the rendered objects."""
    body = recipe(namespace=namespace)
    body["metadata"]["annotations"] = {LOAD_TIME_ANNOTATION: LOAD_TIME}
    body["spec"] |= spec
    created = client.CustomObjectsApi(admin_api).create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL,
                                                                                 body)
    objects = render_cr(created, compute_domains=False).objects
    client.CoreV1Api(admin_api).create_namespaced_config_map(namespace, by_kind(objects, "ConfigMap"))
    return objects


@pytest.fixture
def cr(admin_api: client.ApiClient, namespace: str) -> list[dict[str, Any]]:
    return deploy(admin_api, namespace)


def make_group(core: client.CoreV1Api, namespace: str, objects: list[dict[str, Any]], group: int,
               phases: tuple[str, str] = ("Running", "Running")) -> list[str]:
    """A TP8 group on GB300 as LeaderWorkerSet makes it from the rendered LeaderWorkerSet: leader +
    one worker pod, in ``phases``."""
    names = []
    for pod, phase in zip(group_pods(by_kind(objects, "LeaderWorkerSet"), namespace, group), phases):
        core.create_namespaced_pod(namespace, pod)
        set_phase(core, namespace, pod["metadata"]["name"], phase)
        names.append(pod["metadata"]["name"])
    return names


def set_phase(core: client.CoreV1Api, namespace: str, name: str, phase: str) -> None:
    core.patch_namespaced_pod_status(name, namespace, {"status": {"phase": phase}})


def delete_pods(core: client.CoreV1Api, namespace: str, names: list[str]) -> None:
    for name in names:
        core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
    wait_for(lambda: not [p for p in core.list_namespaced_pod(namespace).items if p.metadata.name in names],
             what="pods deleted")


def read(path: Path) -> Any:
    return json.loads(path.read_text()) if path.exists() else None


def test_engines_follow_groups_and_files_tell_prometheus(admin_api, namespace, cr, tmp_path):
    core = client.CoreV1Api(admin_api)
    with SupervisorThread(admin_api, tmp_path) as st:
        sup = st.supervisor
        targets, endpoints = tmp_path / "sim" / "targets.json", tmp_path / "sim" / "endpoints.json"
        wait_for(lambda: read(targets) == [], what="an empty targets file at start")
        group0 = make_group(core, namespace, cr, 0)
        group1 = make_group(core, namespace, cr, 1, ("Running", "Pending"))  # worker not running: no engine

        mine = lambda: [t for t in read(targets) or [] if t["labels"]["namespace"] == namespace]  # noqa: E731
        entries = wait_for(lambda: len(mine()) == 1 and mine(), what="one target")
        assert entries[0]["labels"] == {"namespace": namespace, "deployment": "k3-latency", "group": "0",
                                        "pod": "k3-latency-engine-0", "role": "leader"}
        host, port = entries[0]["targets"][0].split(":")
        assert host == "127.0.0.1"
        engine0 = f"http://127.0.0.1:{port}"
        ep = read(endpoints)[f"{namespace}/k3-latency"]
        assert ep["model"] == "kimi-k3" and ep["groups"]["0"]["url"] == engine0
        assert ep["groups"]["0"]["ready"] is False
        # loading: /health 503, and the front (client Service stand-in) has no ready endpoint
        assert http(engine0 + "/health")[0] == 503
        assert http(ep["url"] + "/v1/completions", {"prompt": "x", "max_tokens": 2})[0] == 503
        wait_for(lambda: http(engine0 + "/health")[0] == 200, what="group 0 loaded")
        status, doc = http(ep["url"] + "/v1/completions", {"model": "kimi-k3", "prompt": "hi", "max_tokens": 3})
        assert status == 200 and doc["usage"]["completion_tokens"] == 3
        # streaming passes through the front as server-sent events
        req = urllib.request.Request(ep["url"] + "/v1/chat/completions", headers={"Content-Type": "application/json"},
                                     data=json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 9,
                                                      "stream": True}).encode())
        with urllib.request.urlopen(req, timeout=10) as r:
            assert r.headers["Content-Type"].startswith("text/event-stream")
            events = [line.decode().strip() for line in r if line.strip()]
        assert events[-1] == "data: [DONE]" and len(events) >= 3
        wait_for(lambda: read(endpoints)[f"{namespace}/k3-latency"]["groups"]["0"]["ready"], what="ready in file")
        # the engine is configured from the leader's rendered argv: TP8 megakernel + DSpark 7
        group = sup.groups[(namespace, "k3-latency", "0")]
        assert group.engine.config.shape.k == 7 and group.engine.config.shape.decode_backend == "latency_specialized"
        assert group.engine.config.shape.tensor_parallel_size == 8

        # group 1's worker runs: a second engine; the front now round-robins over both once loaded
        set_phase(core, namespace, group1[1], "Running")
        wait_for(lambda: len(mine()) == 2, what="two targets")
        assert sorted(t["labels"]["group"] for t in mine()) == ["0", "1"]
        groups = lambda: read(endpoints)[f"{namespace}/k3-latency"]["groups"].values()  # noqa: E731
        wait_for(lambda: len(groups()) == 2 and all(g["ready"] for g in groups()), what="both groups ready")
        for _ in range(4):
            assert http(ep["url"] + "/v1/completions", {"prompt": "x", "max_tokens": 2})[0] == 200
        served = [sup.groups[(namespace, "k3-latency", g)].engine.metrics.by_reason["length"][0]._value.get()
                  for g in ("0", "1")]
        assert served == [4, 2]  # group 0: 2 before + 2 of the 4 round-robin requests

        # scale-down: group 1's pods go, its engine stops and its target disappears
        engine1 = f"http://{mine()[1]['targets'][0]}"
        delete_pods(core, namespace, group1)
        wait_for(lambda: len(mine()) == 1, what="group 1 target removed")
        assert http(engine1 + "/health")[0] == 0  # nothing listens any more

        # group 0 recreated (new leader UID): a new engine with a new load time
        old_uid = read(endpoints)[f"{namespace}/k3-latency"]["groups"]["0"]["leaderUid"]
        delete_pods(core, namespace, group0)
        wait_for(lambda: not mine(), what="group 0 target removed")
        make_group(core, namespace, cr, 0)
        wait_for(lambda: mine(), what="group 0 back")
        new = read(endpoints)[f"{namespace}/k3-latency"]["groups"]["0"]
        assert new["leaderUid"] != old_uid
        assert http(new["url"] + "/health")[0] == 503  # loading again
        wait_for(lambda: http(new["url"] + "/health")[0] == 200, what="group 0 reloaded")

        # an edit of the CR alone (nothing rendered it: the operator refused it, or has not run)
        # changes nothing: the engine keeps what its pod was started with
        engine = sup.groups[(namespace, "k3-latency", "0")].engine
        client.CustomObjectsApi(admin_api).patch_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, "k3-latency", {"spec": {"speculativeDecoding": {"numSpeculativeTokens": 3}}})
        sup_polls = sup.polls
        wait_for(lambda: sup.polls >= sup_polls + 2, what="two more polls")
        assert sup.groups[(namespace, "k3-latency", "0")].engine is engine and engine.config.shape.k == 7
        assert http(new["url"] + "/health")[0] == 200

        # what the operator renders for that edit (a new plan, the groups recreated) reaches the engine
        edited = render_cr(client.CustomObjectsApi(admin_api).get_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, "k3-latency"), compute_domains=False).objects
        cm = by_kind(edited, "ConfigMap")
        old_cm = by_kind(cr, "ConfigMap")["metadata"]["name"]
        assert cm["metadata"]["name"] != old_cm  # one launcher ConfigMap per plan: the new plan's is new
        core.create_namespaced_config_map(namespace, cm)
        delete_pods(core, namespace, [p.metadata.name for p in core.list_namespaced_pod(namespace).items])
        make_group(core, namespace, edited, 0)
        k3 = wait_for(lambda: (g := sup.groups.get((namespace, "k3-latency", "0"))) is not None
                      and g.engine is not engine and g.engine.config.shape.k, what="group 0 on the new plan")
        assert k3 == 3

        # deleting the CR stops everything of it
        client.CustomObjectsApi(admin_api).delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL,
                                                                           "k3-latency")
        wait_for(lambda: not mine() and f"{namespace}/k3-latency" not in read(endpoints), what="all gone")
    assert read(targets) == [] and read(endpoints) == {}  # stopping the supervisor empties the files


def test_api_key_from_the_leaders_secret_as_a_kubelet_reads_it(admin_api, namespace, tmp_path, caplog):
    """A leader pod whose engine container has VLLM_API_KEY from a Secret (what the renderer writes
    for spec.service.apiKeySecret): no engine while the Secret is missing (a kubelet would not
    start the container); once it exists, the engine and the front (which passes Authorization on)
    refuse /v1 without the key (401, vLLM's body) and serve it with ``Bearer <key>``; /health stays
    open. The key never reaches the supervisor's log or its files."""
    import base64
    import logging
    import secrets

    core = client.CoreV1Api(admin_api)
    key = "sk-sup-" + secrets.token_hex(12)
    objects = deploy(admin_api, namespace, service={"apiKeySecret": {"name": "k3-api-key", "key": "api-key"}})
    make_group(core, namespace, objects, 0)
    caplog.set_level(logging.DEBUG)
    with SupervisorThread(admin_api, tmp_path) as st:
        endpoints = tmp_path / "sim" / "endpoints.json"
        wait_for(lambda: st.supervisor.polls >= 3, what="three polls")
        assert (read(endpoints) or {}).get(f"{namespace}/k3-latency", {}).get("groups") == {}  # no engine
        assert any('secret "k3-api-key" not found' in r.getMessage() for r in caplog.records)
        core.create_namespaced_secret(namespace, {"metadata": {"name": "k3-api-key"},
                                                  "data": {"api-key": base64.b64encode(key.encode()).decode()}})
        group = wait_for(lambda: read(endpoints)[f"{namespace}/k3-latency"]["groups"].get("0"), what="the engine")
        assert group["apiKeyRequired"] is True
        wait_for(lambda: http(group["url"] + "/health")[0] == 200, what="loaded")
        front = read(endpoints)[f"{namespace}/k3-latency"]["url"]
        body = {"model": "kimi-k3", "prompt": "hi", "max_tokens": 3}
        for url in (group["url"], front):
            assert http(url + "/v1/completions", body) == (401, {"error": "Unauthorized"})
            req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"})
            with urllib.request.urlopen(req, timeout=10) as r:
                assert r.status == 200 and json.loads(r.read())["usage"]["completion_tokens"] == 3
    assert key not in caplog.text
    assert not [p for p in (tmp_path / "sim").iterdir() if key in p.read_text()]
