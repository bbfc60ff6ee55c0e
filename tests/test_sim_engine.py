"""One simulated engine on loopback: the OpenAI API, /health, and metrics that behave like vLLM's."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kimik3.autoscaler import perfmodel as pm
from kimik3_dev.sim.engine import WORDS, EngineConfig, SimEngine, token_ids
from kimik3.autoscaler.perfmodel import EngineShape

MK_DSPARK = EngineShape(decode_backend="latency_specialized", spec_method="dspark", num_speculative_tokens=7)


def run(config: EngineConfig, body: Callable[[SimEngine, aiohttp.ClientSession], Awaitable[Any]]) -> Any:
    """Start an engine, run ``body`` against it (bounded to 30 s), stop it."""
    async def main() -> Any:
        engine = SimEngine(config)
        await engine.start()
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
                return await asyncio.wait_for(body(engine, session), 30)
        finally:
            await engine.stop()
    return asyncio.run(main())


async def sse(resp: aiohttp.ClientResponse) -> list[Any]:
    """The data items of a server-sent event stream ("[DONE]" kept as a string)."""
    out: list[Any] = []
    async for raw in resp.content:
        line = raw.decode().strip()
        if not line:
            continue
        assert line.startswith("data: "), line
        data = line[len("data: "):]
        out.append(data if data == "[DONE]" else json.loads(data))
    return out


async def metric_families(engine: SimEngine, session: aiohttp.ClientSession) -> dict[str, Any]:
    async with session.get(engine.url + "/metrics") as r:
        assert r.status == 200
        return {f.name: f for f in text_string_to_metric_families(await r.text())}


def value(families: dict[str, Any], sample: str, **labels: str) -> float:
    name = sample.removesuffix("_total").removesuffix("_count").removesuffix("_sum")
    fam = families.get(name) or families[sample]
    total = 0.0
    for s in fam.samples:
        if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()):
            total += s.value
    return total


def test_completion_not_streaming_counts_tokens():
    async def body(engine, s):
        prompt = "Write a haiku about racks of GPUs, please."
        async with s.post(engine.url + "/v1/completions",
                          json={"model": "kimi-k3", "prompt": prompt, "max_tokens": 40}) as r:
            assert r.status == 200
            doc = await r.json()
        assert doc["object"] == "text_completion" and doc["model"] == "kimi-k3"
        assert doc["id"].startswith("cmpl-")
        assert doc["usage"] == {"prompt_tokens": len(token_ids(prompt)), "completion_tokens": 40,
                                "total_tokens": len(token_ids(prompt)) + 40, "prompt_tokens_details": None,
                                "completion_tokens_details": None}
        choice = doc["choices"][0]
        assert choice["finish_reason"] == "length" and len(choice["text"].split()) == 40
        # token ids as prompt, and the served model name or no model at all
        async with s.post(engine.url + "/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 3}) as r:
            doc = await r.json()
        assert doc["usage"]["prompt_tokens"] == 3 and doc["usage"]["completion_tokens"] == 3
        # without max_tokens: stops on its own ("stop") after the default length
        async with s.post(engine.url + "/v1/completions", json={"prompt": "hi"}) as r:
            doc = await r.json()
        assert doc["choices"][0]["finish_reason"] == "stop"
        assert doc["usage"]["completion_tokens"] == engine.config.default_max_tokens
    run(EngineConfig(shape=MK_DSPARK, seed=1, default_max_tokens=20), body)


def test_a_prompt_of_several_megabytes_is_answered_as_vllm_answers_it():
    """vLLM sets no request size limit (uvicorn); aiohttp's default 1 MiB would refuse it with 413."""
    async def body(engine, s):
        prompt = " ".join(["megakernel"] * 200_000)  # 2.2 MB, 200k tokens
        async with s.post(engine.url + "/v1/completions",
                          json={"model": "kimi-k3", "prompt": prompt, "max_tokens": 2}) as r:
            assert r.status == 200, await r.text()
            doc = await r.json()
        assert doc["usage"]["prompt_tokens"] == 200_000
    run(EngineConfig(shape=MK_DSPARK, seed=1), body)


def test_completion_streaming_sse_with_usage():
    async def body(engine, s):
        req = {"model": "kimi-k3", "prompt": "one two three", "max_tokens": 50, "stream": True,
               "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
        async with s.post(engine.url + "/v1/completions", json=req) as r:
            assert r.status == 200 and r.headers["Content-Type"].startswith("text/event-stream")
            items = await sse(r)
        assert items[-1] == "[DONE]"
        usage_chunk = items[-2]
        assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] == 50
        content = [i for i in items[:-2]]
        assert all(c["object"] == "text_completion" and c["model"] == "kimi-k3" for c in content)
        assert sum(len(c["choices"][0]["text"].split()) for c in content) == 50
        assert [c["usage"]["completion_tokens"] for c in content] == sorted(c["usage"]["completion_tokens"] for c in content)
        assert content[-1]["choices"][0]["finish_reason"] == "length"
        assert all(c["choices"][0]["finish_reason"] is None for c in content[:-1])
        # DSpark: a step delivers several tokens in one chunk
        assert len(content) < 30 and max(len(c["choices"][0]["text"].split()) for c in content) > 1
        # plain stream: no usage at all
        async with s.post(engine.url + "/v1/completions",
                          json={"prompt": "x", "max_tokens": 5, "stream": True}) as r:
            items = await sse(r)
        assert items[-1] == "[DONE]" and all("usage" not in i for i in items[:-1])
    run(EngineConfig(shape=MK_DSPARK, seed=2), body)


def test_chat_completions_streaming_and_not():
    async def body(engine, s):
        msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hello there"}]
        async with s.post(engine.url + "/v1/chat/completions", json={"model": "kimi-k3", "messages": msgs,
                                                                     "max_tokens": 12}) as r:
            doc = await r.json()
        assert doc["object"] == "chat.completion" and doc["id"].startswith("chatcmpl-")
        assert doc["choices"][0]["message"]["role"] == "assistant"
        assert len(doc["choices"][0]["message"]["content"].split()) == 12
        assert doc["usage"]["prompt_tokens"] == 2 + (4 + 4) + (4 + 2)  # "You are terse." = 4 tokens
        async with s.post(engine.url + "/v1/chat/completions",
                          json={"model": "kimi-k3", "messages": msgs, "max_completion_tokens": 12, "stream": True,
                                "stream_options": {"include_usage": True}}) as r:
            items = await sse(r)
        assert items[0]["object"] == "chat.completion.chunk" and items[0]["choices"][0]["delta"]["role"] == "assistant"
        text = "".join(i["choices"][0]["delta"].get("content", "") for i in items[1:-2])
        assert len(text.split()) == 12 and items[-2]["usage"]["completion_tokens"] == 12
    run(EngineConfig(shape=EngineShape(), seed=3), body)


def test_models_and_errors():
    async def body(engine, s):
        async with s.get(engine.url + "/v1/models") as r:
            doc = await r.json()
        assert [m["id"] for m in doc["data"]] == ["k3-test"] and doc["data"][0]["max_model_len"] == 4096
        async with s.post(engine.url + "/v1/completions", json={"model": "other", "prompt": "x"}) as r:
            assert r.status == 404 and (await r.json())["error"]["code"] == 404
        async with s.post(engine.url + "/v1/completions", json={"prompt": "x", "max_tokens": 5000}) as r:
            assert r.status == 400 and "maximum context length" in (await r.json())["error"]["message"]
        async with s.post(engine.url + "/v1/completions", data=b"{not json") as r:
            assert r.status == 400
    run(EngineConfig(served_model_name="k3-test", max_model_len=4096), body)


def test_health_is_503_until_the_load_time_passed():
    async def body(engine, s):
        async with s.get(engine.url + "/health") as r:
            assert r.status == 503
        async with s.post(engine.url + "/v1/completions", json={"prompt": "x", "max_tokens": 1}) as r:
            assert r.status == 503
        async with s.get(engine.url + "/metrics") as r:
            assert r.status == 503
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            async with s.get(engine.url + "/health") as r:
                if r.status == 200:
                    break
            await asyncio.sleep(0.05)
        elapsed = time.monotonic() - engine.started_at
        assert 0.4 <= elapsed < 2.0
        async with s.post(engine.url + "/v1/completions", json={"prompt": "x", "max_tokens": 1}) as r:
            assert r.status == 200
    run(EngineConfig(load_time_s=0.4), body)


def test_itl_is_observed_once_per_engine_step_under_dspark():
    async def body(engine, s):
        req = {"prompt": "a b c d", "max_tokens": 80, "stream": True,
               "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
        async with s.post(engine.url + "/v1/completions", json=req) as r:
            items = await sse(r)
        chunks = [i for i in items if i != "[DONE]" and i["choices"]]
        fam = await metric_families(engine, s)
        steps = engine.units[0].steps
        itl_count = value(fam, "vllm:inter_token_latency_seconds_count")
        drafts = value(fam, "vllm:spec_decode_num_drafts_total")
        accepted = value(fam, "vllm:spec_decode_num_accepted_tokens_total")
        # one step prefills (first token, no ITL); every later step is one ITL observation
        assert itl_count == steps - 1 == len(chunks) - 1 == drafts
        assert itl_count < 80 / 2  # not one per token: ~4.26 tokens per step
        assert value(fam, "vllm:generation_tokens_total") == 80
        assert value(fam, "vllm:spec_decode_num_draft_tokens_total") == 7 * drafts
        per_pos = [value(fam, "vllm:spec_decode_num_accepted_tokens_per_pos_total", position=str(i)) for i in range(7)]
        assert sum(per_pos) == accepted and per_pos[0] >= per_pos[-1]
        # the observed step time is the model's step time at batch 1
        mean_itl = value(fam, "vllm:inter_token_latency_seconds_sum") / itl_count
        assert mean_itl == pytest.approx(pm.step_time(engine.params, 1), rel=1e-6)
        assert value(fam, "vllm:time_to_first_token_seconds_count") == 1
        assert value(fam, "vllm:request_success_total", finished_reason="length") == 1
        tpot = value(fam, "vllm:request_time_per_output_token_seconds_sum")
        assert tpot == pytest.approx(mean_itl * itl_count / 79, rel=1e-6)
    run(EngineConfig(shape=MK_DSPARK, seed=4), body)


def test_latency_rises_with_concurrency():
    async def mean_itl(concurrency: int) -> float:
        async def body(engine, s):
            async def one() -> None:
                async with s.post(engine.url + "/v1/completions", json={"prompt": "a", "max_tokens": 30}) as r:
                    assert r.status == 200
            await asyncio.gather(*(one() for _ in range(concurrency)))
            fam = await metric_families(engine, s)
            return (value(fam, "vllm:inter_token_latency_seconds_sum")
                    / value(fam, "vllm:inter_token_latency_seconds_count"))
        engine = SimEngine(EngineConfig(shape=EngineShape(), seed=5))
        await engine.start()
        try:
            async with aiohttp.ClientSession() as s:
                return await asyncio.wait_for(body(engine, s), 30)
        finally:
            await engine.stop()

    async def main() -> tuple[float, float]:
        return await mean_itl(1), await mean_itl(16)

    one, sixteen = asyncio.run(main())
    params = pm.perf_params(EngineShape())
    assert one == pytest.approx(pm.step_time(params, 1), rel=1e-6)
    assert sixteen > 1.5 * one
    assert sixteen <= pm.step_time(params, 16) * 1.01


def test_data_parallel_engines_each_get_a_series_and_requests():
    shape = EngineShape(strategy="dep", tensor_parallel_size=1, data_parallel_size=4, expert_parallel=True)

    async def body(engine, s):
        async def one() -> None:
            async with s.post(engine.url + "/v1/completions", json={"prompt": "a", "max_tokens": 4}) as r:
                assert r.status == 200
        await asyncio.gather(*(one() for _ in range(8)))
        fam = await metric_families(engine, s)
        per_engine = [value(fam, "vllm:request_success_total", engine=str(e)) for e in range(4)]
        assert per_engine == [2, 2, 2, 2]  # least-loaded placement
        assert value(fam, "vllm:generation_tokens_total") == 32
    run(EngineConfig(shape=shape, seed=6), body)


def test_a_draining_engine_sends_every_response_whole_and_a_bad_release_is_slower_and_fails():
    """A removed group's engine (``drain``) finishes the streams it holds before it stops; the
    bad-release knobs: ``step_slowdown`` 2 doubles the step time, ``error_rate`` 1 fails every
    request with HTTP 500, counted with finished_reason="error"."""
    async def body(engine, s):
        req = {"prompt": "one two", "max_tokens": 40, "stream": True}
        streams = [asyncio.create_task(_stream_items(s, engine.url, req)) for _ in range(4)]
        await asyncio.sleep(0.05)  # the requests are decoding
        await engine.drain(0.0, 10.0, 60.0)
        for items in await asyncio.gather(*streams):
            assert items[-1] == "[DONE]"
            assert sum(len(c["choices"][0]["text"].split()) for c in items[:-1]) == 40
    run(EngineConfig(shape=MK_DSPARK, seed=3), body)

    async def timed(engine, s):
        start = time.monotonic()
        async with s.post(engine.url + "/v1/completions", json={"prompt": "x", "max_tokens": 60}) as r:
            assert r.status == 200
        return time.monotonic() - start
    fast = run(EngineConfig(shape=MK_DSPARK, seed=4), timed)
    slow = run(EngineConfig(shape=MK_DSPARK, seed=4, step_slowdown=2.0), timed)
    assert 1.7 < slow / fast < 2.3, (fast, slow)

    async def failing(engine, s):
        async with s.post(engine.url + "/v1/completions", json={"prompt": "x", "max_tokens": 5}) as r:
            assert r.status == 500
        return value(await metric_families(engine, s), "vllm:request_success_total", finished_reason="error")
    assert run(EngineConfig(shape=MK_DSPARK, error_rate=1.0), failing) == 1.0


def test_a_draining_engine_serves_through_its_prestop_then_finishes_in_flight_requests_after_sigterm():
    """A pod's deletion, as the rendered pod plays it: nothing listens any more; through the preStop
    hook (0.5 s here) a request on a kept-alive connection is served, its connection closed after;
    after SIGTERM a request on a kept-alive connection is refused with 503 (vLLM 0.33 refuses new
    requests once it shuts down), and the generation in flight finishes whole within
    --shutdown-timeout."""
    async def body(engine, s):
        async def kept_connection() -> Callable[[], Awaitable[bytes]]:
            reader, writer = await asyncio.open_connection(engine.host, engine.port)

            async def completion() -> bytes:
                payload = json.dumps({"prompt": "x", "max_tokens": 2}).encode()
                writer.write(f"POST /v1/completions HTTP/1.1\r\nHost: {engine.host}\r\nContent-Type: "
                             f"application/json\r\nContent-Length: {len(payload)}\r\n\r\n".encode() + payload)
                await writer.drain()
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
                length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length:"))
                await asyncio.wait_for(reader.readexactly(length), 5)
                return head
            return completion
        first, second = await kept_connection(), await kept_connection()
        assert b"Connection: close" not in await first()
        assert b"Connection: close" not in await second()
        streaming = asyncio.create_task(_stream_items(s, engine.url, {"prompt": "one two", "max_tokens": 400,
                                                                       "stream": True}))
        await asyncio.sleep(0.05)
        drain = asyncio.create_task(engine.drain(0.5, 10.0, 60.0))
        await asyncio.sleep(0.1)
        with pytest.raises(OSError):  # nothing listens any more
            await asyncio.open_connection(engine.host, engine.port)
        head = await first()  # the preStop: still served, the connection closed after
        assert head.startswith(b"HTTP/1.1 200") and b"Connection: close" in head
        await asyncio.sleep(0.6)  # SIGTERM came
        assert (await second()).startswith(b"HTTP/1.1 503")  # refused, as vLLM does once it shuts down
        items = await asyncio.wait_for(streaming, 20)
        assert items[-1] == "[DONE]" and sum(len(c["choices"][0]["text"].split()) for c in items[:-1]) == 400
        await asyncio.wait_for(drain, 5)
    run(EngineConfig(shape=MK_DSPARK, seed=5), body)


@pytest.mark.parametrize("shutdown_timeout_s, grace_s", [(0.0, 60.0), (30.0, 0.3)],
                         ids=["no-shutdown-timeout", "grace-period-ends"])
def test_a_generation_longer_than_its_drain_is_cut(shutdown_timeout_s, grace_s):
    """Without --shutdown-timeout vLLM aborts what is in flight at SIGTERM; with one, the
    kubelet's SIGKILL at the end of the grace period still ends it."""
    async def body(engine, s):
        streaming = asyncio.create_task(_stream_items(s, engine.url, {"prompt": "one two", "max_tokens": 4000,
                                                                       "stream": True}))
        await asyncio.sleep(0.1)
        start = time.monotonic()
        await engine.drain(0.0, shutdown_timeout_s, grace_s)
        assert time.monotonic() - start < grace_s + 1.0
        with contextlib.suppress(aiohttp.ClientError):
            items = await asyncio.wait_for(streaming, 5)
            assert sum(len(c["choices"][0]["text"].split()) for c in items if isinstance(c, dict)) < 4000
    run(EngineConfig(shape=MK_DSPARK, seed=7), body)


async def _stream_items(s, url, req):
    async with s.post(url + "/v1/completions", json=req) as r:
        return await sse(r)


def test_a_repeated_prompt_hits_its_full_blocks_and_skips_their_prefill():
    """TP8: 1024-token blocks (``perfmodel.kv_cache_blocks``). A 20,000-token prompt sent twice: the
    second finds its 19 full blocks (19,456 tokens) cached and prefills the other 544 in one step;
    the counters say so, in tokens, as vLLM's do."""
    words = [WORDS[(i * 7 + i // 5) % len(WORDS)] for i in range(20_000)]
    prompt = " ".join(words)

    async def body(engine, s):
        ttft = []
        for _ in range(2):
            before = value(await metric_families(engine, s), "vllm:time_to_first_token_seconds_sum")
            async with s.post(engine.url + "/v1/completions", json={"prompt": prompt, "max_tokens": 1}) as r:
                assert r.status == 200 and (await r.json())["usage"]["prompt_tokens"] == 20_000
            ttft.append(value(await metric_families(engine, s), "vllm:time_to_first_token_seconds_sum") - before)
        fams = await metric_families(engine, s)
        return ttft, {name: value(fams, name, engine="0") for name in
                      ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:prompt_tokens_total")}

    cfg = EngineConfig(shape=EngineShape(), seed=4)
    params = pm.perf_params(cfg.shape)
    (first, second), counters = run(cfg, body)
    assert counters == {"vllm:prefix_cache_queries_total": 40_000.0, "vllm:prefix_cache_hits_total": 19_456.0,
                        "vllm:prompt_tokens_total": 40_000.0}
    cold = sum(pm.step_time(params, 0, chunk) for chunk in (8192, 8192, 3616))
    warm = pm.step_time(params, 0, 544)
    assert first == pytest.approx(cold, abs=0.05) and second == pytest.approx(warm, abs=0.05)
    assert second < first / 2

    # --no-enable-prefix-caching: the same two requests find nothing
    (_, again), off = run(EngineConfig(shape=EngineShape(), enable_prefix_caching=False), body)
    assert off["vllm:prefix_cache_hits_total"] == 0.0 and again == pytest.approx(cold, abs=0.05)


def test_blocks_the_gpus_evicted_come_back_from_the_host_tier_instead_of_being_prefilled():
    """A GPU cache of 2 blocks of 1024 tokens (TP8 at a utilization that leaves ~110 MB per GPU)
    and a host tier of 2 GiB (4 blocks over the 8 GPUs' pages). Prompt A (3,000 tokens: 2 full
    blocks), then B (2 other blocks) evicts A from the GPUs; A again finds nothing on the GPUs and
    both its blocks in the host tier (written through, it holds A and B): 2,048 tokens loaded (the connector's counters), the rest
    prefilled, and its TTFT is the load plus the 952-token step. Without the tier A is prefilled
    whole again."""
    def prompt(seed: int) -> str:
        return " ".join(WORDS[(i * seed + i // 3) % len(WORDS)] for i in range(3_000))

    async def body(engine, s):
        ttft = []
        for text in (prompt(7), prompt(11), prompt(7)):
            before = value(await metric_families(engine, s), "vllm:time_to_first_token_seconds_sum")
            async with s.post(engine.url + "/v1/completions", json={"prompt": text, "max_tokens": 1}) as r:
                assert r.status == 200
            ttft.append(value(await metric_families(engine, s), "vllm:time_to_first_token_seconds_sum") - before)
        fams = await metric_families(engine, s)
        names = ("vllm:prefix_cache_hits_total", "vllm:external_prefix_cache_queries_total",
                 "vllm:external_prefix_cache_hits_total", "vllm:kv_offload_load_bytes_total",
                 "vllm:kv_offload_store_bytes_total")
        return ttft, {n: value(fams, n, engine="0") for n in names if n.removesuffix("_total") in fams}

    shape = EngineShape(gpu_memory_utilization=0.7296, kv_offload_gib=2)
    params = pm.perf_params(shape)
    kv = pm.kv_cache_blocks(params)
    assert (kv.block_size, kv.blocks, kv.host_blocks) == (1024, 2, 4)
    ttft, counters = run(EngineConfig(shape=shape, seed=4), body)
    all_ranks = kv.block_bytes * 8
    assert counters == {"vllm:prefix_cache_hits_total": 0.0,
                        "vllm:external_prefix_cache_queries_total": 9_000.0,
                        "vllm:external_prefix_cache_hits_total": 2_048.0,
                        "vllm:kv_offload_load_bytes_total": 2 * all_ranks,
                        "vllm:kv_offload_store_bytes_total": 4 * all_ranks}  # A's and B's blocks, once each
    cold, warm = pm.step_time(params, 0, 3_000), pm.host_tier_load_s(params, 2) + pm.step_time(params, 0, 952)
    assert ttft[0] == pytest.approx(cold, abs=0.01) and ttft[2] == pytest.approx(warm, abs=0.01)
    assert cold - warm > 0.02

    off_shape = EngineShape(gpu_memory_utilization=0.7296)
    (first, _, again), plain = run(EngineConfig(shape=off_shape, seed=4), body)
    assert first == pytest.approx(cold, abs=0.01) and again == pytest.approx(cold, abs=0.01)
    assert "vllm:kv_offload_load_bytes_total" not in plain and plain["vllm:external_prefix_cache_hits_total"] == 0.0
