"""The activator's answers (``kimik3.controller.activator``): 503 with ``Retry-After`` from the wake
estimate, the deployment named by the route's header, one wake per deployment per interval, and
the errors; over HTTP through its aiohttp application. The wake itself on a real API server:
tests/test_wake_controller.py."""

from __future__ import annotations

import asyncio
import threading

import pytest
from aiohttp.test_utils import TestClient, TestServer
from click.testing import CliRunner

from kimik3.api.v1alpha1 import IdleStatus
from kimik3.cli import main
from kimik3.controller.activator import (MIN_RETRY_AFTER_S, UNKNOWN_ESTIMATE_S, WAKE_INTERVAL_S, Activator,
                                         activator_app)
from kimik3.controller.kube import ApiError, Invalid, NotFound
from kimik3.render.wake import DEPLOYMENT_HEADER, UID_HEADER, WakeEndpoint

UID = "0f6c3a52-7d1e-4d7b-9f5e-3c2b1a0e9d8c"
STOPPED = IdleStatus(stopped_at="2026-12-05T03:00:00Z", stopped_generation=1, wake_estimate_seconds=41.2)
WOKEN = IdleStatus(woke_at="2026-12-05T04:00:00Z")


class Wakes:
    """A stand-in for ``request_wake``: records each call, answers status.idle from ``answers``
    (the first while stopped, then what the controller wrote) or raises ``error``."""

    def __init__(self, *answers: IdleStatus) -> None:
        self.calls: list[tuple[str, str]] = []
        self.answers = list(answers)
        self.error: ApiError | None = None

    def __call__(self, namespace: str, name: str, uid: str) -> IdleStatus:
        assert uid == UID
        self.calls.append((namespace, name))
        if self.error is not None:
            raise self.error
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]


def activator(wakes: Wakes) -> tuple[Activator, list[float]]:
    clock = [100.0]
    return Activator(wakes, clock=lambda: clock[0]), clock


def test_a_request_for_a_stopped_deployment_gets_503_retry_after_the_estimate_and_wakes_it():
    wakes = Wakes(STOPPED, WOKEN)
    act, clock = activator(wakes)
    answer = act.answer("tenant-a/k3", UID)
    assert (answer.status, answer.retry_after) == (503, 42)  # 41.2 s rounded up: never retried too early
    assert answer.headers() == {"Retry-After": "42"}
    assert wakes.calls == [("tenant-a", "k3")]
    assert answer.body()["error"]["code"] == 503 and "tenant-a/k3 is waking" in answer.body()["error"]["message"]
    clock[0] += 30  # the load goes on: the estimate counts from the first wake
    assert act.answer("tenant-a/k3", UID).retry_after == 12
    clock[0] += 30  # past the estimate, still loading: the smallest Retry-After
    assert act.answer("tenant-a/k3", UID).retry_after == MIN_RETRY_AFTER_S


def test_one_wake_per_deployment_per_interval():
    wakes = Wakes(STOPPED, WOKEN)
    act, clock = activator(wakes)
    for _ in range(50):
        assert act.answer("tenant-a/k3", UID).status == 503
    assert len(wakes.calls) == 1
    clock[0] += WAKE_INTERVAL_S - 0.1
    act.answer("tenant-a/k3", UID)
    assert len(wakes.calls) == 1
    clock[0] += 0.1
    assert act.answer("tenant-a/k3", UID).retry_after == 42 - 5  # the woken CR carries no estimate: the first one holds
    assert len(wakes.calls) == 2
    act.answer("tenant-b/k3", UID)  # another deployment has its own interval
    assert wakes.calls[-1] == ("tenant-b", "k3")


def test_concurrent_first_requests_wake_once():
    wakes = Wakes(STOPPED)
    act, _ = activator(wakes)
    answers = []
    threads = [threading.Thread(target=lambda: answers.append(act.answer("tenant-a/k3", UID))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(wakes.calls) == 1 and {a.retry_after for a in answers} == {42}


def test_no_estimate_and_a_new_stop():
    wakes = Wakes(IdleStatus(stopped_at="2026-12-05T03:00:00Z"))
    act, clock = activator(wakes)
    assert act.answer("ns/k3", UID).retry_after == UNKNOWN_ESTIMATE_S  # no load time measured before the stop
    # it served, stopped again later with a measured load: a new wake with the new estimate
    clock[0] += 3600
    wakes.answers = [IdleStatus(stopped_at="2026-12-05T05:00:00Z", wake_estimate_seconds=7.0)]
    assert act.answer("ns/k3", UID).retry_after == 7


def test_which_deployment_and_the_errors():
    wakes = Wakes(STOPPED)
    act, clock = activator(wakes)
    for header, uid in ((None, UID), ("", UID), ("k3", UID), ("ns/", UID), ("/k3", UID), ("a/b/c", UID),
                        ("ns/k3", None), ("ns/k3", " ")):
        answer = act.answer(header, uid)
        assert answer.status == 400 and answer.retry_after is None, header
        assert DEPLOYMENT_HEADER in answer.message and UID_HEADER in answer.message
    assert wakes.calls == []
    wakes.error = NotFound(404, "Not Found", '{"message": "not found"}')
    answer = act.answer("ns/gone", UID)
    assert (answer.status, answer.retry_after, answer.message) == (404, None, f"no KimiK3Deployment ns/gone with uid {UID}")
    wakes.error = Invalid(422, "Unprocessable Entity", '{"message": "metadata.uid: Invalid value: field is immutable"}')
    assert act.answer("ns/other", UID).status == 404  # another object of that name: the same answer
    wakes.error = Invalid(422, "Unprocessable Entity", '{"message": "spec.replicas: must be at most 64"}')
    assert act.answer("ns/invalid", UID).status == 503  # any other refusal is the wake's failure, not a 404
    wakes.error = ApiError(403, "Forbidden", '{"message": "cannot patch"}')
    answer = act.answer("ns/k3", UID)
    assert (answer.status, answer.retry_after) == (503, 5) and "its wake failed" in answer.message
    act.answer("ns/k3", UID)  # a refused wake is not retried at every request either
    assert wakes.calls.count(("ns", "k3")) == 1
    clock[0] += WAKE_INTERVAL_S
    wakes.error = None
    assert act.answer("ns/k3", UID).retry_after == 42
    assert wakes.calls.count(("ns", "k3")) == 2


def test_over_http_any_path_and_method():
    wakes = Wakes(STOPPED)
    act, _ = activator(wakes)

    async def go() -> list[tuple[int, str | None, dict]]:
        out = []
        async with TestClient(TestServer(activator_app(act))) as client:
            named = {DEPLOYMENT_HEADER: "tenant-a/k3", UID_HEADER: UID}
            for method, path, headers in (("POST", "/v1/chat/completions", named), ("GET", "/v1/models", named),
                                          ("POST", "/v1/completions", {DEPLOYMENT_HEADER: "tenant-a/k3"})):
                response = await client.request(method, path, headers=headers, json={"prompt": "hi"})
                out.append((response.status, response.headers.get("Retry-After"), await response.json()))
        return out

    (s1, r1, b1), (s2, r2, _), (s3, r3, b3) = asyncio.run(go())
    assert (s1, r1, s2, r2) == (503, "42", 503, "42")
    assert b1["error"]["type"] == "ServiceUnavailableError"
    assert (s3, r3, b3["error"]["code"]) == (400, None, 400)
    assert wakes.calls == [("tenant-a", "k3")]


def test_the_wake_service_is_namespace_slash_service_colon_port():
    assert WakeEndpoint.parse("kimik3-system/kimik3-operator-wake:8081") == \
        WakeEndpoint("kimik3-system", "kimik3-operator-wake", 8081)
    for bad in ("kimik3-operator-wake:8081", "kimik3-system/kimik3-operator-wake", "/w:1", "ns/w:http", "ns/w:70000"):
        with pytest.raises(ValueError, match="is not NAMESPACE/SERVICE:PORT"):
            WakeEndpoint.parse(bad)
    out = CliRunner().invoke(main, ["run", "--wake-port", "8081", "--wake-service", "kimik3-operator-wake:8081"])
    assert out.exit_code == 2 and "--wake-service" in out.output and "NAMESPACE/SERVICE:PORT" in out.output
