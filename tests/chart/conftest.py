"""Fixtures of the chart tests: real helm (``HELM_VERSION``, built by tools/build-binaries.sh), a real
kube-apiserver of their own, and the operator run as a process under the chart's RBAC.

The chart tests start their own ControlPlane (not the session one of tests/conftest.py): that one
pre-installs the KimiK3Deployment CRD with another field manager, which Helm refuses to adopt, and
these tests install, downgrade (F13) and keep the CRD. Only the third-party CRDs are installed up
front. The operator's token (``operator.kubeconfig``) is the service account
``system:serviceaccount:kimik3-system:kimik3-operator``: installing the chart as release
``kimik3-operator`` in namespace ``kimik3-system`` binds exactly that identity, so the operator
process these tests start has the chart's RBAC and nothing else.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from kimik3_dev.devcluster.controlplane import ControlPlane
from kimik3_dev.devcluster.processes import free_port
from kimik3_dev.devcluster.rbac import (CHART_DIR, RELEASE, RELEASE_NAMESPACE, HelmMissingError, helm_binary, helm_env,
                                   render_chart)
from kimik3_dev.devcluster import kueue
from kimik3_dev.devcluster import promoperator
from kimik3_dev.devcluster.thirdparty import thirdparty_crd_paths
from support.cluster import http_status, serving_control_plane
from support.waiting import WaitTimeout, wait_for

REPO = Path(__file__).resolve().parents[2]
CHART = CHART_DIR
"""The chart; RELEASE (kimik3-operator, the name the chart gives its ServiceAccount) and
RELEASE_NAMESPACE (kimik3-system) come from kimik3_dev.devcluster.rbac, which renders it the same way
for `kimik3 dev up` and tests/chaos."""
CRD_NAME = "kimik3deployments.inference.kimik3.io"


class Helm:
    """The helm CLI with its own config/cache/data dirs (nothing under ~) and a kubeconfig."""

    def __init__(self, home: Path, kubeconfig: Path | None = None):
        try:
            self.binary = helm_binary()
        except HelmMissingError as exc:
            pytest.fail(str(exc))
        self.home = home
        self.kubeconfig = kubeconfig
        self.env = helm_env(home)

    def run(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        argv = [str(self.binary), *args]
        if self.kubeconfig is not None:
            argv.append(f"--kubeconfig={self.kubeconfig}")
        proc = subprocess.run(argv, capture_output=True, text=True, env=self.env, timeout=timeout, check=False)
        if check and proc.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
        return proc

    def template(self, *args: str, chart: Path = CHART) -> list[dict[str, Any]]:
        """``helm template`` of release RELEASE in RELEASE_NAMESPACE (``rbac.render_chart``)."""
        return render_chart(*args, chart=chart, helm_home=self.home)


def kimik3_argv() -> list[str]:
    """The `kimik3` console script (the operator image's ENTRYPOINT) of this environment."""
    script = Path(sys.executable).parent / "kimik3"
    return [str(script)] if script.exists() else [sys.executable, "-m", "kimik3.cli"]


class OperatorProcess:
    """``kimik3 <args>`` as its own process (what the chart's Deployment runs), with the health
    server moved to a free loopback port, no wake endpoint (``--wake-port`` dropped) and the given
    kubeconfig instead of the in-cluster one. Its output goes to ``log_path``."""

    def __init__(self, args: list[str], kubeconfig: Path, log_path: Path, ready_timeout_s: float = 45.0):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # No wake endpoint: nothing here sends it requests (the routes still move to the wake Service,
        # --wake-service), and a port of its own for each of ten operators would be one more to race for.
        kept = [a for a in args if not a.startswith(("--health-port", "--health-host", "--wake-port"))]
        self.argv = [*kimik3_argv(), *kept, f"--health-port={self.port}", "--health-host=127.0.0.1",
                     f"--kubeconfig={kubeconfig}"]
        self.log_path = log_path
        self.ready_timeout_s = ready_timeout_s
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> OperatorProcess:
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         cwd=REPO)
        proc = self.proc

        def ready() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"operator exited with {proc.returncode}:\n{self.log()[-3000:]}")
            return http_status(f"{self.url}/readyz", timeout=2) == 200
        try:
            wait_for(ready, self.ready_timeout_s, "the operator's /readyz")
        except WaitTimeout:
            self.stop()
            raise AssertionError(
                f"operator not ready within {self.ready_timeout_s:g} s:\n{self.log()[-3000:]}") from None
        return self

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def kill(self) -> None:
        """Stop at once (SIGKILL): for runs whose graceful stop does not matter."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def __enter__(self) -> OperatorProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def install_for_the_chart(cp: ControlPlane) -> None:
    """What the chart does not install itself: the third-party CRDs (the Prometheus Operator's
    PrometheusRule too) and the release's namespace."""
    rules_crd = [p for p in promoperator.crd_paths() if p.name == "monitoring.coreos.com_prometheusrules.yaml"]
    cp.apply_crds([*thirdparty_crd_paths().values(), *rules_crd, *kueue.crd_documents(None)])
    with cp.api_client("admin") as api:
        client.CoreV1Api(api).create_namespace({"metadata": {"name": RELEASE_NAMESPACE}})


@pytest.fixture(scope="package")
def chart_cp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """A control plane with the third-party CRDs only (the chart installs the KimiK3Deployment CRD)
    and the operator's namespace."""
    with serving_control_plane(tmp_path_factory.mktemp("chart-control-plane"), install_for_the_chart) as cp:
        yield cp


@pytest.fixture(scope="package")
def admin_api(chart_cp: ControlPlane) -> Iterator[client.ApiClient]:
    """The admin of ``chart_cp`` (overrides the session's: ``kube`` and ``namespace`` follow)."""
    with chart_cp.api_client("admin") as api:
        yield api


@pytest.fixture(scope="package")
def helm(chart_cp: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Helm:
    """helm with the admin kubeconfig (a platform team installs the chart as cluster admin)."""
    return Helm(tmp_path_factory.mktemp("helm-home"), chart_cp.admin_kubeconfig)


@pytest.fixture
def helm_offline(tmp_path: Path) -> Helm:
    """helm without a cluster (lint, template)."""
    return Helm(tmp_path / "helm-home")


def deployment_args(admin_api: client.ApiClient) -> list[str]:
    """Container args of the operator Deployment the chart installed."""
    dep = client.AppsV1Api(admin_api).read_namespaced_deployment(RELEASE, RELEASE_NAMESPACE)
    (container,) = dep.spec.template.spec.containers
    return list(container.args)


def uninstall_if_present(helm: Helm) -> None:
    listed = json.loads(helm.run("list", "-n", RELEASE_NAMESPACE, "-a", "-o", "json").stdout)
    if any(r["name"] == RELEASE for r in listed):
        helm.run("uninstall", RELEASE, "-n", RELEASE_NAMESPACE, "--wait", "--timeout", "60s")


def copy_chart(dest: Path) -> Path:
    target = dest / CHART.name
    shutil.copytree(CHART, target)
    return target
