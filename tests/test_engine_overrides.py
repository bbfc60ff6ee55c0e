"""The override warnings (kimik3.engine.overrides): their fields, figures and remedies, and where
they reach the user (Admitted, ``kimik3 validate``, render's Warning Events, the status model).
Whether vLLM 0.33 really does each is tests/conformance/test_overrides_conformance.py."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from click.testing import CliRunner

from kimik3 import cli
from kimik3.admission import admit
from kimik3.api.conditions import EventReason
from kimik3.api.documents import dump_yaml_all
from kimik3.api.v1alpha1 import KimiK3DeploymentStatus
from kimik3.engine import overrides as ov
from kimik3.engine.args import rank_args
from kimik3.render.children import render
from kimik3.render.meta import Owner

PVC = {"source": {"pvc": {"claimName": "weights"}}}
DSPARK = {"method": "dspark", "draftModel": "/models/Kimi-K3-DSpark", "numSpeculativeTokens": 7}
MEGA = {"decodeBackend": "latency_specialized"}


def spec(**fields: Any) -> dict[str, Any]:
    return {"model": copy.deepcopy(PVC), **fields}


def warnings_of(raw: dict[str, Any]) -> list:
    return list(admit(raw).overrides)


def test_a_default_spec_has_no_warning():
    assert warnings_of(spec()) == []
    assert warnings_of(spec(speculativeDecoding={"method": "ngram", "numSpeculativeTokens": 3},
                            engine={"maxNumSeqs": 64})) == []


def test_naive_all2all_names_the_field_the_backend_vllm_runs_and_the_fix():
    [w] = warnings_of(spec(topology={"strategy": "dep", "dataParallelSize": 16}, engine={"all2allBackend": "naive"}))
    assert w.fields == ["spec.engine.all2allBackend"]
    assert w.vllm_uses == "all2all_backend allgather_reducescatter"
    assert "allgather_reducescatter" in w.avoid
    fixed = spec(topology={"strategy": "dep", "dataParallelSize": 16}, engine={"all2allBackend": "allgather_reducescatter"})
    assert warnings_of(fixed) == []


def test_naive_all2all_without_expert_parallelism_is_not_rendered_so_not_warned():
    raw = spec(engine={"all2allBackend": "naive"})
    a = admit(raw)
    assert "--all2all-backend" not in rank_args(a.spec, a.plan, 0)
    assert ov.all2all_naive(a.spec, a.plan) == []


def test_enforce_eager_with_a_cudagraph_mode():
    [w] = warnings_of(spec(engine={"enforceEager": True, "cudagraphMode": "FULL_DECODE_ONLY"}))
    assert w.fields == ["spec.engine.enforceEager", "spec.engine.cudagraphMode"]
    assert w.vllm_uses == "cudagraph_mode NONE, no torch.compile"
    assert "cudagraphMode FULL_DECODE_ONLY is not used" in w.message
    assert warnings_of(spec(engine={"enforceEager": True})) == []


@pytest.mark.parametrize("seqs, batched, tokens, active", [(1024, 4096, 7, 585), (512, 2048, 7, 292),
                                                            (256, 1024, 8, 128)])
def test_dspark_lowers_the_active_requests(seqs, batched, tokens, active):
    raw = spec(engine={"maxNumSeqs": seqs, "maxNumBatchedTokens": batched},
               speculativeDecoding={**DSPARK, "numSpeculativeTokens": tokens})
    [w] = [w for w in warnings_of(raw) if w.vllm_uses.startswith("max_num_active_seqs")]
    assert w.vllm_uses == f"max_num_active_seqs {active}"
    assert w.fields == ["spec.engine.maxNumSeqs", "spec.engine.maxNumBatchedTokens",
                        "spec.speculativeDecoding.numSpeculativeTokens"]
    assert f"at most {active} requests at once, not maxNumSeqs {seqs}" in w.message
    assert f"maxNumBatchedTokens to at least {seqs * tokens}" in w.avoid and f"maxNumSeqs to {active}" in w.avoid
    for remedy in ({"maxNumSeqs": seqs, "maxNumBatchedTokens": seqs * tokens}, {"maxNumSeqs": active,
                                                                              "maxNumBatchedTokens": batched}):
        raw["engine"] = remedy
        assert not [w for w in warnings_of(raw) if w.vllm_uses.startswith("max_num_active_seqs")]


@pytest.mark.parametrize("seqs, batched, q, sm100, top", [
    (256, 8192, 1, True, 512), (256, 8192, 8, True, 1024), (256, 8192, 8, False, 512),
    (128, 8192, 9, False, 512), (256, 300, 4, True, 300), (2048, 16384, 1, True, 1024), (8, 8192, 8, True, 128)])
def test_capture_ceiling_model(seqs, batched, q, sm100, top):
    """Figures worked by hand from VllmConfig._set_cudagraph_sizes (and checked against vLLM in the
    conformance tier): 2 x 256 x 1 = 512; 256 x 8 x 2 = 4096 capped at 1024 on SM100, 512 on H200;
    300 batched tokens cap the capture; 8 requests x 8 tokens x 2 = 128."""
    assert ov.max_cudagraph_capture_size(seqs, batched, q, sm100) == top


def test_capture_ceiling_warning_and_its_remedy():
    raw = spec(topology={"accelerator": "h200", "tensorParallelSize": 16}, engine={"maxNumSeqs": 128},
               speculativeDecoding={"method": "ngram", "numSpeculativeTokens": 8})
    [w] = warnings_of(raw)
    assert w.fields == ["spec.engine.maxNumSeqs", "spec.speculativeDecoding.numSpeculativeTokens"]
    assert w.vllm_uses == "max_cudagraph_capture_size 512"
    assert "at most 512 tokens (9 tokens per request) on h200: steps of more than 56 requests" in w.message
    assert "lower engine.maxNumSeqs to 56" in w.avoid
    raw["engine"]["maxNumSeqs"] = 56
    assert warnings_of(raw) == []


def test_capture_capped_by_batched_tokens_names_that_field():
    [w] = warnings_of(spec(engine={"maxNumSeqs": 256, "maxNumBatchedTokens": 300},
                           speculativeDecoding={"method": "ngram", "numSpeculativeTokens": 3}))
    assert "spec.engine.maxNumBatchedTokens" in w.fields and w.vllm_uses == "max_cudagraph_capture_size 300"


def test_no_capture_warning_when_eager():
    assert warnings_of(spec(engine={"enforceEager": True, "maxNumSeqs": 2048, "maxNumBatchedTokens": 16384})) == []


def test_megakernel_step_width():
    raw = spec(engine={**MEGA, "maxNumSeqs": 64}, speculativeDecoding=DSPARK)
    [w] = [w for w in warnings_of(raw) if "megakernel" in w.vllm_uses]
    assert w.fields == ["spec.engine.decodeBackend", "spec.engine.maxNumSeqs",
                        "spec.speculativeDecoding.numSpeculativeTokens"]
    assert w.message == "decode steps of more than 8 requests (8 tokens per request) run the stock decode path, " \
                        "though maxNumSeqs is 64"
    assert ov.describe(w).count("64 tokens") == 1  # said once, by vllm_uses (a new user read it twice, 2026-12-05)
    assert "lower engine.maxNumSeqs to 8" in w.avoid
    raw["engine"]["maxNumSeqs"] = 8
    assert warnings_of(raw) == []
    [w] = warnings_of(spec(engine={**MEGA, "maxNumSeqs": 128}))
    assert "steps of more than 64 requests" in w.message and "numSpeculativeTokens" not in " ".join(w.fields)


def test_prefix_caching_off_is_said_to_vllm():
    a = admit(spec(model={**PVC, "features": {"prefixCaching": False}}))
    args = rank_args(a.spec, a.plan, 0)
    assert "--no-enable-prefix-caching" in args and "--enable-prefix-caching" not in args


def test_describe_is_one_line_with_fields_value_and_remedy():
    [w] = warnings_of(spec(engine={"enforceEager": True, "cudagraphMode": "FULL"}))
    assert ov.describe(w) == ("spec.engine.enforceEager, spec.engine.cudagraphMode: enforceEager turns CUDA graphs "
                              "off: cudagraphMode FULL is not used; vLLM 0.33 uses cudagraph_mode NONE, no "
                              "torch.compile; to avoid it: unset engine.cudagraphMode (eager), or set "
                              "engine.enforceEager to false to keep the graphs")


def test_validate_prints_the_warnings_and_exits_zero(tmp_path):
    doc = {"apiVersion": "inference.kimik3.io/v1alpha1", "kind": "KimiK3Deployment", "metadata": {"name": "k3"},
           "spec": spec(engine={"enforceEager": True, "cudagraphMode": "FULL"})}
    path = tmp_path / "k3.yaml"
    path.write_text(dump_yaml_all([doc]), encoding="utf-8")
    result = CliRunner().invoke(cli.main, ["validate", "-f", str(path)])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith("k3: valid:")
    assert lines[1] == "  warning: " + ov.describe(admit(doc["spec"]).overrides[0])


def test_render_posts_each_as_a_warning_event_and_status_carries_them():
    a = admit(spec(engine={"enforceEager": True, "cudagraphMode": "FULL"}))
    owner = Owner(name="k3", namespace="ns", uid="u1")
    events = [e for e in render(a, owner).warnings if e.reason == EventReason.ENGINE_SETTING_OVERRIDDEN]
    assert [(e.type, e.message) for e in events] == [("Warning", ov.describe(a.overrides[0]))]
    status = KimiK3DeploymentStatus(engine_overrides=list(a.overrides)).model_dump(by_alias=True, exclude_none=True)
    assert status["engineOverrides"] == [{"fields": ["spec.engine.enforceEager", "spec.engine.cudagraphMode"],
                                          "vllmUses": "cudagraph_mode NONE, no torch.compile",
                                          "message": a.overrides[0].message, "avoid": a.overrides[0].avoid}]
