"""`kimik3 dev load` against a simulated engine: what users see matches the performance model."""

from __future__ import annotations

import asyncio
import json
import random
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner
from kubernetes import client

from prometheus_client.parser import text_string_to_metric_families

from kimik3_dev.sim import load, tracefile
from kimik3.autoscaler import perfmodel as pm
from kimik3_dev.sim.cli import load_command
from kimik3_dev.sim.engine import EngineConfig, SimEngine, token_ids
from kimik3.autoscaler.perfmodel import EngineShape
from kimik3.kube.kinds import GROUP, PLURAL, VERSION
from support.recipes import recipe

RECIPE_SHAPE = EngineShape(decode_backend="latency_specialized", spec_method="dspark", num_speculative_tokens=7)


class EngineThread:
    """A simulated engine on its own event loop in a thread (so a blocking client can call it)."""

    def __init__(self, config: EngineConfig):
        self.engine = SimEngine(config)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self) -> SimEngine:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.engine.start(), self.loop).result(10)
        return self.engine

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self.engine.stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def test_per_user_speed_matches_the_model():
    model = pm.decode_point(RECIPE_SHAPE, 1, "chat")
    phases = [load.Phase(3.0, concurrency=1, prompt_tokens=64, output_tokens=120, name="one")]
    with EngineThread(EngineConfig(shape=RECIPE_SHAPE, seed=11)) as engine:
        results = asyncio.run(load.run_load(engine.url, phases, seed=1))
    summary = load.summarize(results, phases)["one"]
    assert summary["errors"] == 0 and summary["ok"] >= 3
    assert summary["tokens_per_s_per_user_mean"] == pytest.approx(model.tokens_per_s_per_user, rel=0.25)
    # per-token ITL: a DSpark chunk of n tokens counts n tokens of step/n each
    assert model.tpot_s * 0.5 < summary["itl_p50_s"] < model.step_s * 1.5
    assert summary["itl_p90_s"] >= summary["itl_p50_s"]
    assert 0 < summary["ttft_p50_s"] < 0.2
    # TPOT per request (as vllm bench serve computes it): the model's at batch 1
    assert summary["tpot_p50_s"] == pytest.approx(model.tpot_s, rel=0.25)
    assert summary["tpot_p90_s"] >= summary["tpot_p50_s"]


def test_more_users_get_fewer_tokens_per_second_each():
    phases = [load.Phase(2.0, concurrency=1, prompt_tokens=32, output_tokens=60, name="c1"),
              load.Phase(2.0, concurrency=12, prompt_tokens=32, output_tokens=60, name="c12")]
    with EngineThread(EngineConfig(shape=EngineShape(), seed=12)) as engine:
        results = asyncio.run(load.run_load(engine.url, phases, seed=2, drain_s=20))
    s = load.summarize(results, phases)
    assert s["total"]["errors"] == 0
    one, twelve = s["c1"]["tokens_per_s_per_user_p50"], s["c12"]["tokens_per_s_per_user_p50"]
    assert one == pytest.approx(111, rel=0.25)
    assert twelve < 0.8 * one
    assert twelve == pytest.approx(pm.decode_point(EngineShape(), 12).tokens_per_s_per_user, rel=0.35)


def test_dev_load_command_prints_what_users_see(tmp_path: Path, control_plane, admin_api, namespace):
    kubeconfig = str(control_plane.admin_kubeconfig)
    with EngineThread(EngineConfig(shape=RECIPE_SHAPE, served_model_name="k3-served", seed=13)) as engine:
        # found as a client finds it: the CR's status.endpoint (its Service), reached through the
        # Service's stand-in that `kimik3 dev sim` records in services.json; the model from /v1/models
        objects = client.CustomObjectsApi(admin_api)
        objects.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, recipe(namespace=namespace))
        objects.patch_namespaced_custom_object_status(GROUP, VERSION, namespace, PLURAL, "k3-latency", {
            "status": {"endpoint": f"http://k3-latency.{namespace}.svc:8000/v1"}})
        (tmp_path / "sim").mkdir()
        (tmp_path / "sim" / "services.json").write_text(json.dumps(
            {f"{namespace}/k3-latency": {"8000": engine.url.removeprefix("http://")}}))
        assert load.resolve_url(kubeconfig, tmp_path, f"{namespace}/k3-latency") == (engine.url, "k3-served")
        with pytest.raises(LookupError, match="no InferencePool to route through: set spec.routing.enabled: true"):
            load.resolve_url(kubeconfig, tmp_path, f"{namespace}/k3-latency", via_gateway=True)
        result = CliRunner().invoke(load_command, [
            "k3-latency", "-n", namespace, "--state-dir", str(tmp_path), "--kubeconfig", kubeconfig,
            "--shape", "step", "--concurrency", "1",
            "--duration", "2s", "--prompt-tokens", "100", "--output-tokens", "40", "--seed", "3"])
        assert result.exit_code == 0, result.output
        lines = result.output.splitlines()
        header = next(i for i, line in enumerate(lines) if line.startswith("phase"))
        assert "tok/s/user" in lines[header] and "ITL/tok p50" in lines[header] and "TTFT p50" in lines[header]
        rows = {line.split()[0]: line.split() for line in lines[header + 2:]}
        assert set(rows) >= {"base", "step-x4", "total"}
        assert int(rows["total"][3]) == 0  # no errors
        per_user = float(rows["total"][4])
        assert per_user == pytest.approx(pm.decode_point(RECIPE_SHAPE, 1).tokens_per_s_per_user, rel=0.5)

        # --url, no streaming, chat, JSON output
        result = CliRunner().invoke(load_command, ["--url", engine.url, "--rate", "5", "--duration", "1s",
                                                   "--no-stream", "--chat", "--output-tokens", "8", "--json",
                                                   "--seed", "4"])
        assert result.exit_code == 0, result.output
        doc = json.loads(result.output[result.output.index("{"):])
        assert doc["summary"]["total"]["errors"] == 0 and doc["summary"]["total"]["ok"] >= 1
        assert all(r["output_tokens"] == 8 for r in doc["requests"])

    unknown = CliRunner().invoke(load_command, ["nope", "--state-dir", str(tmp_path), "--kubeconfig", kubeconfig])
    assert unknown.exit_code != 0 and "not found" in unknown.output
    (tmp_path / "sim" / "services.json").write_text("{}")  # the simulator plays no such Service
    with pytest.raises(LookupError, match="is `.* dev sim` running"):
        load.resolve_url(kubeconfig, tmp_path, "k3-latency", namespace)


def test_errors_are_counted_not_hidden():
    phases = [load.Phase(0.5, concurrency=2, prompt_tokens=8, output_tokens=4, name="down")]
    with EngineThread(EngineConfig(load_time_s=60)) as engine:  # still loading: 503
        results = asyncio.run(load.run_load(engine.url, phases, max_requests=6))
    s = load.summarize(results, phases)["down"]
    assert s["ok"] == 0 and s["errors"] == len(results) == 6 and s["error_kinds"] == {"HTTP 503": 6}


def test_shapes_and_phase_files(tmp_path: Path):
    step = load.builtin_phases("step", 60, rate=2)
    assert [(p.duration_s, p.rate) for p in step] == [(30, 2), (30, 8)]
    burst = load.builtin_phases("burst", 100, concurrency=2)
    assert [(p.duration_s, p.concurrency) for p in burst] == [(45, 2), (10, 16), (45, 2)]
    path = tmp_path / "phases.yaml"
    path.write_text("- {duration: 10s, rate: 1, name: warm}\n- {duration: 1m, concurrency: 4, outputTokens: 32}\n")
    phases = load.load_phases(path)
    assert phases[0] == load.Phase(10, 1.0, None, 512, 256, "warm")
    assert phases[1] == load.Phase(60, None, 4, 512, 32, "phase-1")
    with pytest.raises(ValueError):
        load.builtin_phases("steady", 10, rate=1, concurrency=1)


def test_a_trace_replays_its_arrivals_lengths_and_shared_prefixes(tmp_path: Path):
    """Mooncake lines with hash_ids: the second request shares the first's 3 blocks of 512 tokens;
    the TP8 engine caches 1024-token blocks, so it finds 1024 of them (the first's one full block)."""
    path = tmp_path / "prefixed.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 1536, "output_length": 2, "hash_ids": [1, 2, 3]}\n'
                    '{"timestamp": 1000, "input_length": 1800, "output_length": 3, "hash_ids": [1, 2, 3, 7]}\n'
                    '{"timestamp": 2000, "input_length": 700, "output_length": 1, "hash_ids": [9, 10]}\n')
    requests = tracefile.read(path, compression=2.0)
    rng = random.Random(0)
    prompts = [load.trace_prompt(r, rng) for r in requests]
    assert [len(token_ids(p)) for p in prompts] == [1536, 1800, 700]
    assert prompts[1].startswith(prompts[0] + " ") and not prompts[2].startswith(prompts[0][:100])
    with EngineThread(EngineConfig(shape=EngineShape(), seed=14)) as engine:
        results = asyncio.run(load.run_trace(engine.url, requests, seed=5, drain_s=10))
        result = CliRunner().invoke(load_command, ["--url", engine.url, "--trace-file", str(path),
                                                   "--time-compression", "4", "--copies", "2", "--seed", "6"])
        families = {f.name: f for f in text_string_to_metric_families(engine.metrics.render()[0].decode())}
    assert [(r.phase, r.ok, r.output_tokens) for r in sorted(results, key=lambda r: r.start)] == [
        ("trace", True, 2), ("trace", True, 3), ("trace", True, 1)]
    starts = sorted(r.start for r in results)
    assert [s - starts[0] for s in starts] == pytest.approx([0.0, 0.5, 1.0], abs=0.1)
    assert result.exit_code == 0, result.output
    assert "6 requests of prefixed.jsonl" in result.output
    assert "prefix reuse ceiling: 33.3% of the trace's 512-token blocks were seen before in it" in result.output
    counters = {s.name: s.value for f in families.values() for s in f.samples if s.name.startswith("vllm:prefix_cache")}
    # the first run: 4036 prompt tokens looked up, 1024 found; then the CLI's 2 copies: the
    # recording's prompts again (1024 of the 1536 found, the last token is always computed, and
    # 1024 of the 1800; the 700-token prompt has no full block), and a copy with ids of its own,
    # shifted so that its 1800-token request comes first: the 1536-token one finds its block
    assert counters == {"vllm:prefix_cache_queries_total": 3 * 4036.0,
                        "vllm:prefix_cache_hits_total": 1024.0 + (1024 + 1024) + 1024}
