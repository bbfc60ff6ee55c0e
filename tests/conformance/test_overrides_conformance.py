"""The override warnings (kimik3.engine.overrides) against vLLM 0.33.0's own config classes.

For stated cases (each warning, and its neighbour without one), the recipes and 40 generated
admitted specs, the leader's rendered arguments go to vLLM 0.33.0 (``vllm_overrides.py`` in the
pinned venv: the parsed arguments, ``ParallelConfig``, a whole ``VllmConfig`` from
``EngineArgs.create_engine_config``, ``VllmConfig._set_max_num_scheduled_tokens``, the megakernel's
``PREPARED_MAX``, the prefix-caching default of a hybrid model). Each warned override must happen
with the value the warning quotes, and the fields a warning covers must come out as the spec asks
when there is no warning: the warning list cannot drift from vLLM.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from conformance_cases import Case, generated_cases, make_case, recipe_cases
from kimik3.engine import overrides as ov
from kimik3.engine.args import VLLM_VERSION

HERE = Path(__file__).resolve().parent
pytestmark = pytest.mark.timeout(1200)

PVC = {"source": {"pvc": {"claimName": "weights"}}}
DSPARK = {"method": "dspark", "draftModel": "/models/Kimi-K3-DSpark", "numSpeculativeTokens": 7}
MEGA = {"decodeBackend": "latency_specialized"}
STATED: dict[str, dict[str, Any]] = {
    "naive-dep": {"model": PVC, "topology": {"strategy": "dep", "dataParallelSize": 16}, "engine": {"all2allBackend": "naive"}},
    "allgather-dep": {"model": PVC, "topology": {"strategy": "dep", "dataParallelSize": 16},
                      "engine": {"all2allBackend": "allgather_reducescatter"}},
    "deepep-tp-dp": {"model": PVC, "topology": {"strategy": "tp-dp", "tensorParallelSize": 4, "dataParallelSize": 4,
                                                "expertParallel": True}, "engine": {"all2allBackend": "deepep_v2"}},
    "eager-with-mode": {"model": PVC, "engine": {"enforceEager": True, "cudagraphMode": "FULL_DECODE_ONLY"}},
    "eager-alone": {"model": PVC, "engine": {"enforceEager": True}},
    "full-decode-only": {"model": PVC, "engine": {"cudagraphMode": "FULL_DECODE_ONLY"}},
    "dspark-active-capped": {"model": PVC, "engine": {"maxNumSeqs": 1024, "maxNumBatchedTokens": 4096},
                             "speculativeDecoding": DSPARK},
    "dspark-active-at-edge": {"model": PVC, "engine": {"maxNumSeqs": 585, "maxNumBatchedTokens": 4096},
                              "speculativeDecoding": DSPARK},
    "dspark-defaults": {"model": PVC, "speculativeDecoding": DSPARK},
    "capture-h200-wide": {"model": PVC, "topology": {"accelerator": "h200", "tensorParallelSize": 16},
                          "engine": {"maxNumSeqs": 600, "maxNumBatchedTokens": 8192}},
    "capture-h200-fits": {"model": PVC, "topology": {"accelerator": "h200", "tensorParallelSize": 16},
                          "engine": {"maxNumSeqs": 256}},
    "capture-small-batched-tokens": {"model": PVC, "engine": {"maxNumSeqs": 256, "maxNumBatchedTokens": 300},
                                     "speculativeDecoding": {"method": "ngram", "numSpeculativeTokens": 3}},
    "capture-wide-sm100": {"model": PVC, "engine": {"maxNumSeqs": 2048, "maxNumBatchedTokens": 16384}},
    "megakernel-wide": {"model": PVC, "engine": {**MEGA, "maxNumSeqs": 64}, "speculativeDecoding": DSPARK},
    "megakernel-fits": {"model": PVC, "engine": {**MEGA, "maxNumSeqs": 8}, "speculativeDecoding": DSPARK},
    "prefix-caching-off": {"model": {**PVC, "features": {"prefixCaching": False}}},
}


def cases() -> list[Case]:
    """The stated cases, the recipes and 40 generated specs (admitted ones: admission refuses
    maxNumSeqs above maxNumBatchedTokens, as vLLM does, ``kimik3.admission.batch``)."""
    generated, _ = generated_cases()
    return [make_case(name, raw) for name, raw in STATED.items()] + recipe_cases() + generated[:40]


@pytest.fixture(scope="module")
def settled(parser_venv) -> list[tuple[Case, dict[str, Any]]]:
    """(case, what vLLM 0.33.0 settled on) for every case, from one helper process."""
    if not parser_venv.is_pinned:
        pytest.fail(f"the override warnings are vLLM {VLLM_VERSION}'s: run tools/vllm-envs.sh")
    todo = cases()
    payload = [{"name": c.name, "argv": c.argvs[0], "sm100": c.sm100_family} for c in todo]
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env |= {"HF_ENDPOINT": "http://127.0.0.1:9", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
    run = subprocess.run([str(parser_venv.python), str(HERE / "vllm_overrides.py")], input=json.dumps(payload),
                         capture_output=True, text=True, timeout=1100, env=env, cwd="/tmp")
    assert run.returncode == 0, run.stderr[-3000:]
    results = {r["name"]: r for r in map(json.loads, run.stdout.splitlines())}
    failed = {n: r["error"] for n, r in results.items() if not r["ok"]}
    assert not failed, failed
    return [(c, results[c.name]) for c in todo]


def flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def test_all2all_backend_is_what_the_warning_says(settled):
    warned = 0
    for case, vllm in settled:
        rendered = flag(case.argvs[0], "--all2all-backend")
        if rendered is None:
            continue
        found = ov.all2all_naive(case.spec, case.plan)
        expected = found[0].vllm_uses.split()[-1] if found else rendered
        warned += bool(found)
        assert vllm["all2all_backend"] == expected, case.name
    assert warned >= 1


def test_enforce_eager_drops_the_cudagraph_mode_exactly_when_warned(settled):
    warned = 0
    for case, vllm in settled:
        e, found = case.spec.engine, ov.eager_drops_cudagraph_mode(case.spec, case.plan)
        warned += bool(found)
        if e.enforce_eager:
            assert (vllm["cudagraph_mode"], vllm["compilation_mode"]) == ("NONE", "NONE"), case.name
            assert bool(found) == (e.cudagraph_mode is not None), case.name
        else:
            assert not found
            assert vllm["cudagraph_mode"] == (e.cudagraph_mode or "FULL_AND_PIECEWISE"), case.name
    assert warned >= 1


def test_dspark_active_requests_lowered_exactly_when_warned(settled):
    warned = 0
    for case, vllm in settled:
        if case.spec.speculative_decoding.method != "dspark":
            assert vllm["dspark_max_num_active_seqs"] is None
            continue
        found = ov.dspark_active_seqs(case.spec, case.plan)
        warned += bool(found)
        expected = int(found[0].vllm_uses.split()[-1]) if found else None  # None: max_num_seqs rules
        assert vllm["dspark_max_num_active_seqs"] == expected, case.name
    assert warned >= 1


def test_cudagraph_capture_ceiling_is_vllms(settled):
    """The modelled capture ceiling equals vLLM's max_cudagraph_capture_size for every case, and
    the warning is there exactly when the widest decode step is above it."""
    warned = 0
    for case, vllm in settled:
        e, q = case.spec.engine, ov.decode_query_len(case.spec)
        found = ov.cudagraph_capture_ceiling(case.spec, case.plan)
        warned += bool(found)
        if e.enforce_eager:
            assert vllm["max_cudagraph_capture_size"] == 0 and not found, case.name
            continue
        top = vllm["max_cudagraph_capture_size"]
        assert ov.max_cudagraph_capture_size(e.max_num_seqs, e.max_num_batched_tokens, q,
                                             case.plan.profile.megakernel_capable) == top, case.name
        assert bool(found) == (top < e.max_num_seqs * q), case.name
        if found:
            assert found[0].vllm_uses == f"max_cudagraph_capture_size {top}"
    assert warned >= 3


def test_megakernel_step_width_is_vllms(settled):
    for case, vllm in settled:
        assert vllm["megakernel_max_tokens"] == ov.MEGAKERNEL_MAX_TOKENS, case.name
    names = {c.name for c, _ in settled if ov.megakernel_step_width(c.spec, c.plan)}
    assert "megakernel-wide" in names and "megakernel-fits" not in names


def test_prefix_caching_is_what_the_spec_asks(settled):
    """vLLM 0.33 turns prefix caching on for a hybrid model unless told: off is rendered as
    --no-enable-prefix-caching, so no warning is needed."""
    for case, vllm in settled:
        assert vllm["prefix_caching"] == case.spec.model.features.prefix_caching, case.name
    assert any(not c.spec.model.features.prefix_caching for c, _ in settled)
