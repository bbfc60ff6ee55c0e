"""The usage recording rules (``kimik3.usage.rules``) evaluated by a real Prometheus (Debian's
2.42, scrapes and evaluations every 200 ms) against stand-in targets: two engines' vLLM counters and the
operator's GPU time (the real ``GpuTime`` collector served by prometheus_client). Over a billing
period of 20 s instead of an hour (the same rules, ``rule_groups(period="20s")``), the periods'
values add up to what the targets counted, through an engine restart (counter back to zero),
a scrape gap, a group deleted mid-period and a revision's GPUs released mid-period."""

from __future__ import annotations

import math
import shutil
import subprocess
import threading
import time
from collections.abc import Callable

import pytest
from prometheus_client import CollectorRegistry, start_http_server

from kimik3.api.documents import dump_yaml
from kimik3.autoscaler.observation import MetricsUnavailable
from kimik3.autoscaler.sources import PrometheusClient
from kimik3.controller.metrics import GpuTime
from kimik3.kube.groups import HELD, RESERVED, SERVING
from kimik3.usage.rules import RULES, rule_groups
from kimik3_dev.devcluster import prometheus
from kimik3_dev.devcluster.processes import free_port
from support.metrics_server import MetricsServer
from support.waiting import wait_for

PERIOD_S = 20
SCRAPE_MS = 200
"""Scrape and evaluation interval: 1/100 of the period, as 36 s scrapes are of an hour. ``increase()``
extrapolates each period's average rate over the part of a scrape interval at either edge (it
cannot know when the counter moved in between), so the error of a period's figure is bounded by
that interval's share of the period."""
LABELS = {"namespace": "tenant-a", "deployment": "k3", "revision": "a"}


def engine_page(tokens: float) -> str:
    """vLLM's counters of one engine that generated ``tokens`` (prompt tokens twice as many, half
    of them from the prefix cache, one request finished per 100 tokens)."""
    labels = 'engine="0",model_name="kimi-k3"'
    return "".join(f"# TYPE {name} counter\n{name}_total{{{labels}{extra}}} {value}\n" for name, extra, value in (
        ("vllm:generation_tokens", "", tokens), ("vllm:prompt_tokens", "", 2 * tokens),
        ("vllm:prefix_cache_hits", "", tokens), ("vllm:request_success", ',finished_reason="stop"', tokens / 100)))


def engine_a(t: float) -> tuple[float | None, int]:
    """Engine A's counter and HTTP status at ``t`` s: 100 tokens/s for 15 s, idle, restarted at
    18 s (counter 0, loading), serving again from 21 s to 40 s; its scrapes fail (503) from 24 s
    to 30 s while it serves. Total: 1500 + 1900."""
    if t < 15:
        return 100 * max(t, 0), 200
    if t < 18:
        return 1500, 200
    if t < 21:
        return 0, 200
    return 100 * (min(t, 40) - 21), 503 if 24 <= t < 30 else 200


def engine_b(t: float) -> tuple[float | None, int]:
    """Engine B (another group): 50 tokens/s from 5 s to 30 s, idle, deleted at 33 s (None).
    Total: 1250."""
    if t >= 33:
        return None, 0
    return 50 * (min(max(t, 5), 30) - 5), 200


def drive(servers: list[MetricsServer], laws: list[Callable[[float], tuple[float | None, int]]], gpu: GpuTime,
          zero: float, stop: threading.Event) -> None:
    """Set the stand-ins' pages from their laws every 20 ms; GPUs (its pods created before, at 0
    GPUs: ``gpus_by_revision``): revision a holds 8 from 0 s, serves from 10 s, released at 30 s
    (the deployment deleted mid-period)."""
    gpu_steps = [(0.0, {("a", HELD, RESERVED): 8, ("a", SERVING, RESERVED): 0}),
                 (10.0, {("a", HELD, RESERVED): 8, ("a", SERVING, RESERVED): 8}), (30.0, {})]
    while not stop.is_set():
        t = time.time() - zero
        for server, law in zip(servers, laws):
            tokens, status = law(t)
            if tokens is None and server.text:
                server.close()
                server.text = ""
            elif tokens is not None:
                server.text, server.status = engine_page(tokens), status
        while gpu_steps and t >= gpu_steps[0][0]:
            gpu.set("tenant-a", "k3", gpu_steps.pop(0)[1])
        stop.wait(0.02)


@pytest.mark.tier("process")  # a real Prometheus
def test_recorded_periods_add_up_to_what_was_counted_through_restart_gap_and_deletion(tmp_path):
    rules = tmp_path / "rules.yaml"
    rules.write_text(dump_yaml(rule_groups(period=f"{PERIOD_S}s")))
    if shutil.which("promtool"):
        check = subprocess.run(["promtool", "check", "rules", str(rules)], capture_output=True, text=True)
        assert check.returncode == 0 and "SUCCESS: 7 rules found" in check.stdout, check.stdout + check.stderr

    engines = [MetricsServer(), MetricsServer()]
    for server in engines:
        server.text = engine_page(0)
    registry = CollectorRegistry()
    gpu = GpuTime()
    gpu.set("tenant-a", "k3", {("a", HELD, RESERVED): 0, ("a", SERVING, RESERVED): 0})  # its pods exist, none bound yet
    registry.register(gpu)
    operator_port = free_port()
    operator, _ = start_http_server(operator_port, addr="127.0.0.1", registry=registry)
    targets = [(s.url.split("/")[2], {**LABELS, "group": str(g)}) for g, s in enumerate(engines)]
    config = prometheus.write_config(tmp_path, [*targets, (f"127.0.0.1:{operator_port}", {})], [rules],
                                     f"{SCRAPE_MS}ms")
    port = free_port()
    proc = subprocess.Popen(prometheus.argv(prometheus.ensure_installed(), config, tmp_path, port),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = PrometheusClient(f"http://127.0.0.1:{port}")
    stop = threading.Event()
    try:
        wait_for(lambda: _up(client) == 3, 60, "Prometheus scraping both engines and the operator",
                 retry_on=(MetricsUnavailable,))  # not listening yet
        zero = math.ceil((time.time() + 3) / PERIOD_S) * PERIOD_S  # a period's start
        threading.Thread(target=drive, args=(engines, [engine_a, engine_b], gpu, zero, stop), daemon=True).start()
        last_end = zero + 3 * PERIOD_S  # every counter flat from 40 s: the period ending at 60 s holds the rest
        time.sleep(max(0.0, last_end + 2 - time.time()))

        def total(key: str, **match: str) -> float:
            selector = ",".join(f'{k}="{v}"' for k, v in {**LABELS, **match}.items())
            answer = client.query_range(f"sum({RULES[key].record(f'{PERIOD_S}s')}{{{selector}}})",
                                        zero, last_end, PERIOD_S)
            return sum(float(v) for s in answer for _, v in s["values"])

        assert total("generation_tokens") == pytest.approx(1500 + 1900 + 1250, rel=0.01)
        assert total("prompt_tokens") == pytest.approx(2 * (1500 + 1900 + 1250), rel=0.01)
        assert total("cached_prompt_tokens") == pytest.approx(1500 + 1900 + 1250, rel=0.01)
        assert total("requests", finished_reason="stop") == pytest.approx((1500 + 1900 + 1250) / 100, rel=0.01)
        counted = {dict(labels)["state"]: value for (_, labels), value in _gpu_seconds(gpu).items()}
        assert counted[HELD] == pytest.approx(8 * 30, abs=1) and counted[SERVING] == pytest.approx(8 * 20, abs=1)
        assert total("gpu_seconds", state=HELD) == pytest.approx(counted[HELD], rel=0.01)
        assert total("gpu_seconds", state=SERVING) == pytest.approx(counted[SERVING], rel=0.01)
    finally:
        stop.set()
        proc.terminate()
        proc.wait(10)
        operator.shutdown()
        for server in engines:
            server.close()


def _up(client: PrometheusClient) -> int:
    return sum(1 for s in client.query("up == 1", time.time()))


def _gpu_seconds(gpu: GpuTime) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The collector's own final counts (what it exported last), by series."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for family in gpu.collect()
            if family.name == "kimik3_gpu_seconds" for s in family.samples}
