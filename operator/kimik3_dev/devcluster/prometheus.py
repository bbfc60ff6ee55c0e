"""Prometheus 2.42 run by us on loopback: its command line, and a hand-written configuration.

The dev cluster's Prometheus is ``prometheus-<PROMETHEUS_VERSION>`` from ``tools/build-binaries.sh
prometheus`` (built with Kubernetes service discovery, which Debian 12's ``prometheus`` package
leaves out); it runs the configuration the Prometheus Operator generates (``promoperator``).
``ensure_installed()`` returns Debian's ``/usr/bin/prometheus`` 2.42 (``apt-get install`` as root
when missing) for the ``process``-tier tests, which build no Go binary and run no API server: they
scrape stand-in servers at static targets (``write_config``).

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

from kimik3.api.documents import dump_yaml

__all__ = ["PROMETHEUS_BINARY", "SCRAPE_INTERVAL", "VLLM_NAME_RELABEL", "argv", "ensure_installed", "write_config"]

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


def write_config(directory: Path, targets: list[tuple[str, dict[str, str]]], rule_files: list[Path] | None = None,
                 interval: str = SCRAPE_INTERVAL) -> Path:
    """Write ``<directory>/prometheus/prometheus.yml``, one job ``engines`` scraping ``targets``
    (``(host:port, labels)``: e.g. the labels the PodMonitor gives on a cluster) every
    ``interval`` (also the rule-evaluation interval of ``rule_files``), vLLM's names restored
    (``VLLM_NAME_RELABEL``); returns its path."""
    job = {"job_name": "engines", "metrics_path": "/metrics",
           "static_configs": [{"targets": [address], "labels": labels} for address, labels in targets],
           "metric_relabel_configs": [VLLM_NAME_RELABEL]}
    config = {"global": {"scrape_interval": interval, "evaluation_interval": interval, "scrape_timeout": interval},
              "scrape_configs": [job], "rule_files": [str(p) for p in rule_files or []]}
    path = directory / "prometheus" / "prometheus.yml"
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
