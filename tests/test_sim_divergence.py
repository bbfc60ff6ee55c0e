"""The simulator's greedy outputs: the reference, the benign divergence of healthy groups and a
corrupting release (``kimik3_dev.sim.divergence``), through the engine's OpenAI API and the
supervisor's ``KIMIK3_SIM_*`` knobs."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from kimik3_dev.sim import divergence
from kimik3_dev.sim.divergence import HORIZON, diverges_at
from kimik3_dev.sim.engine import WORDS, EngineConfig, SimEngine, token_id, token_text
from kimik3_dev.sim.supervisor import release_overrides

PROMPTS = [f"golden prompt {i}: explain the rack layout" for i in range(2000)]


def share(group: str, benign: float, corrupt: float) -> float:
    return sum(diverges_at(p, group, benign, corrupt)[0] is not None for p in PROMPTS) / len(PROMPTS)


def test_rates_are_shares_of_prompts_deterministic_per_prompt_and_group():
    assert share("k3-engine-0", 0.0, 0.0) == 0.0
    assert 0.015 <= share("k3-engine-0", 0.02, 0.0) <= 0.025
    assert 0.45 <= share("k3-engine-abc-0", 0.0, 0.5) <= 0.55
    assert share("g", 0.0, 1.0) == 1.0
    # the same (prompt, group) always diverges the same way; another group diverges elsewhere
    assert [diverges_at(p, "a", 0.3, 0.0) for p in PROMPTS[:50]] == [diverges_at(p, "a", 0.3, 0.0) for p in PROMPTS[:50]]
    assert [diverges_at(p, "a", 0.3, 0.0)[0] for p in PROMPTS[:200]] != \
        [diverges_at(p, "b", 0.3, 0.0)[0] for p in PROMPTS[:200]]
    positions = {diverges_at(p, "a", 1.0, 0.0)[0] for p in PROMPTS}
    assert min(positions) == 1 and max(positions) == HORIZON - 1  # benign: never the first token
    assert min(diverges_at(p, "a", 0.0, 1.0)[0] for p in PROMPTS) == 0


def test_two_healthy_groups_disagree_on_about_twice_the_benign_rate():
    """What an output-parity threshold must allow between two groups of one revision."""
    b = divergence.BENIGN_DIVERGENCE

    def output(prompt: str, group: str) -> list[int]:
        return [token_id(i, *diverges_at(prompt, group, b, 0.0)) for i in range(HORIZON)]
    differ = sum(output(p, "k3-engine-0") != output(p, "k3-engine-1") for p in PROMPTS)
    assert abs(differ / len(PROMPTS) - (1 - (1 - b) ** 2)) < 0.01


def test_a_diverging_output_differs_at_every_token_from_its_position():
    at, offset = 5, 17
    assert [token_text(i, at, offset) for i in range(5)] == [token_text(i) for i in range(5)]
    assert all(token_text(i, at, offset) != token_text(i) for i in range(5, 200))
    assert all(1 <= token_id(i, at, offset) <= len(WORDS) for i in range(200))
    assert token_id(3) == WORDS.index(token_text(3).strip()) + 1


def completions(config: EngineConfig, prompts: list[str], max_tokens: int = 32) -> list[dict]:
    async def main() -> list[dict]:
        engine = SimEngine(config)
        await engine.start()
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
                out = []
                for p in prompts:
                    async with session.post(engine.url + "/v1/completions", json={
                            "model": "kimi-k3", "prompt": p, "max_tokens": max_tokens, "temperature": 0,
                            "return_token_ids": True, "logprobs": 0}) as r:
                        assert r.status == 200
                        out.append((await r.json())["choices"][0])
                return out
        finally:
            await engine.stop()
    return asyncio.run(main())


def test_the_engine_answers_token_ids_and_a_corrupting_release_leaves_the_reference():
    prompts = PROMPTS[:40]
    healthy = completions(EngineConfig(group_name="k3-engine-0"), prompts)
    reference = [token_id(i) for i in range(32)]
    assert all(c["token_ids"] == reference for c in healthy)
    assert healthy[0]["logprobs"]["tokens"] == [token_text(i) for i in range(32)]
    assert healthy[0]["text"] == "".join(token_text(i) for i in range(32))
    corrupt = completions(EngineConfig(group_name="k3-engine-9f-0", corrupt_rate=0.5), prompts)
    expected = [diverges_at(p, "k3-engine-9f-0", 0.0, 0.5) for p in prompts]
    for choice, (at, offset) in zip(corrupt, expected):
        assert choice["token_ids"] == [token_id(i, at, offset) for i in range(32)]
    assert 10 <= sum(at is not None for at, _ in expected) <= 30


@pytest.mark.parametrize(("env", "fields"), [
    ({"KIMIK3_SIM_CORRUPT_RATE": "0.3"}, {"corrupt_rate": 0.3}),
    ({"KIMIK3_SIM_BENIGN_DIVERGENCE": "0"}, {"benign_divergence": 0.0}),
    ({"KIMIK3_SIM_LOAD_TIME": "2h", "KIMIK3_SIM_SLOWDOWN": "2"}, {"load_time_s": 7200.0, "step_slowdown": 2.0}),
])
def test_release_env_sets_the_knobs(env, fields):
    spec = {"containers": [{"name": "engine", "env": [{"name": k, "value": v} for k, v in env.items()]}]}
    assert release_overrides(spec) == fields


def test_a_rate_above_one_is_refused_naming_the_variable():
    spec = {"containers": [{"name": "engine", "env": [{"name": "KIMIK3_SIM_CORRUPT_RATE", "value": "1.5"}]}]}
    with pytest.raises(ValueError, match="KIMIK3_SIM_CORRUPT_RATE='1.5' is out of range"):
        release_overrides(spec)
