"""Prometheus 2.42 run by us on loopback: its command line, and hand-written configurations.

The dev cluster's Prometheus is ``prometheus-<PROMETHEUS_VERSION>`` from ``tools/build-binaries.sh
prometheus`` (built with Kubernetes service discovery, which Debian 12's ``prometheus`` package
leaves out); it runs the configuration the Prometheus Operator generates (``promoperator``).
``ensure_installed()`` returns Debian's ``/usr/bin/prometheus`` 2.42 (``apt-get install`` as root
when missing): the ``process``-tier tests, which build no Go binary, scrape stand-in servers with
it through ``write_config`` (file_sd; no API server there).

Targets of ``write_config``: a Prometheus file_sd file (``<state>/sim/targets.json``:
``[{"targets": ["127.0.0.1:<port>"], "labels": {"namespace", "deployment", "group", "role"}}]``),
the labels the PodMonitor gives on a cluster; Prometheus re-reads it when it changes. Until the
simulator serves engines at their pod IPs, the dev cluster scrapes its ``targets.json`` the same
way (``engines_job``, through the Prometheus resource's ``additionalScrapeConfigs``).

Metric names: Prometheus 2.42 asks for OpenMetrics without an ``escaping`` parameter, and
``prometheus_client`` (0.26 here, as in vLLM's own server) then writes sample names with
``:`` turned into ``_`` (``vllm_inter_token_latency_seconds_bucket``) while ``# TYPE`` keeps
``vllm:...`` (prometheus/client_python#1177, open). ``VLLM_NAME_RELABEL`` renames such samples
back, so the series carry vLLM's documented names (``vllm:inter_token_latency_seconds_*``), as
a Prometheus 3 scraping with ``escaping=allow-utf-8`` would store them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from kimik3.api.documents import dump_yaml

__all__ = ["PROMETHEUS_BINARY", "SCRAPE_INTERVAL", "argv", "engines_job", "ensure_installed", "targets_file", "write_config"]

PROMETHEUS_BINARY = Path("/usr/bin/prometheus")
SCRAPE_INTERVAL = "5s"
"""Scrape and rule-evaluation interval: short, so a 30 s autoscaler window holds ~6 samples."""
RETENTION = "1d"
"""TSDB retention of the dev Prometheus."""
APT_TIMEOUT_S = 900.0
"""Bound on ``apt-get update`` + ``apt-get install`` (seconds)."""


VLLM_NAME_RELABEL = {
    "source_labels": ["__name__"],
    "regex": "vllm_(.+)",
    "target_label": "__name__",
    "replacement": "vllm:$1",
}
"""``metric_relabel_configs`` entry: ``vllm_<x>`` -> ``vllm:<x>`` (see the module docstring)."""


class PrometheusInstallError(RuntimeError):
    """Prometheus is missing and could not be installed."""


def ensure_installed(log: Path | None = None) -> Path:
    """``/usr/bin/prometheus``, installing Debian's package first if needed (root only)."""
    if os.access(PROMETHEUS_BINARY, os.X_OK):
        return PROMETHEUS_BINARY
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise PrometheusInstallError(
            f"{PROMETHEUS_BINARY} not found; install Debian's package: sudo apt-get install -y prometheus")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    out = open(log, "ab") if log else subprocess.DEVNULL  # noqa: SIM115 - closed below
    try:
        for cmd in (["apt-get", "update"],
                    ["apt-get", "install", "-y", "--no-install-recommends", "prometheus"]):
            try:
                rc = subprocess.run(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    timeout=APT_TIMEOUT_S, check=False).returncode
            except subprocess.TimeoutExpired as exc:
                raise PrometheusInstallError(f"{' '.join(cmd)} took longer than {APT_TIMEOUT_S:.0f} s") from exc
            if rc != 0:
                raise PrometheusInstallError(f"`{' '.join(cmd)}` failed (exit {rc})" + (f"; see {log}" if log else ""))
    finally:
        if not isinstance(out, int):
            out.close()
    if not os.access(PROMETHEUS_BINARY, os.X_OK):
        raise PrometheusInstallError(f"apt-get installed prometheus but {PROMETHEUS_BINARY} is missing")
    return PROMETHEUS_BINARY


def targets_file(state_dir: Path) -> Path:
    """``<state>/sim/targets.json``, written by the engine simulator."""
    return state_dir / "sim" / "targets.json"


def engines_job(state_dir: Path) -> dict[str, Any]:
    """The ``kimik3-engines`` scrape job over the simulator's file_sd targets file, which it creates
    as ``[]`` when absent (Prometheus then watches it for changes)."""
    targets = targets_file(state_dir)
    targets.parent.mkdir(parents=True, exist_ok=True)
    if not targets.exists():
        targets.write_text("[]\n")
    return {"job_name": "kimik3-engines", "metrics_path": "/metrics",
            "file_sd_configs": [{"files": [str(targets)], "refresh_interval": SCRAPE_INTERVAL}],
            "metric_relabel_configs": [VLLM_NAME_RELABEL]}


def write_config(state_dir: Path, operator_metrics: str | None = None) -> Path:
    """Write ``<state>/prometheus/prometheus.yml`` scraping ``engines_job``; returns its path.

    ``operator_metrics``: ``127.0.0.1:<port>`` of the operator's /metrics, or None.
    """
    scrape = [engines_job(state_dir)]
    if operator_metrics:
        scrape.append({"job_name": "kimik3-operator", "static_configs": [{"targets": [operator_metrics]}]})
    config = {"global": {"scrape_interval": SCRAPE_INTERVAL, "evaluation_interval": SCRAPE_INTERVAL,
                         "scrape_timeout": "4s"},
              "scrape_configs": scrape}
    path = state_dir / "prometheus" / "prometheus.yml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dump_yaml(config))
    return path


def argv(binary: Path, config: Path, state_dir: Path, port: int) -> list[str]:
    """Prometheus 2.x command line: loopback only, storage in ``<state>/prometheus/data``."""
    data = state_dir / "prometheus" / "data"
    if data.exists():
        shutil.rmtree(data)
    return [str(binary), f"--config.file={config}", f"--storage.tsdb.path={data}",
            f"--storage.tsdb.retention.time={RETENTION}", f"--web.listen-address=127.0.0.1:{port}",
            "--web.enable-lifecycle", "--log.level=warn"]
