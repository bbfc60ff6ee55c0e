"""``kimik3 demo``: the main job on this machine (the kit's other verbs live beside their code:
``kimik3_dev.devcluster.cli.dev``, ``kimik3_dev.doctor.doctor``,
``kimik3_dev.benchmark.simulate.simulate_command``)."""

from __future__ import annotations

import sys
from pathlib import Path

import click


@click.command()
@click.option("-f", "--filename", default="recipes/gb300-tp8-megakernel-dspark.yaml", show_default=True)
@click.option("--state-dir", default=".state/dev", show_default=True, type=click.Path(file_okay=False))
@click.option("--timeout", default=300.0, show_default=True, help="Seconds to wait for each step.")
def demo(filename: str, state_dir: str, timeout: float) -> None:
    """The main job on this machine: `dev up` a simulated GB300 NVL72 cluster, apply FILENAME, wait
    until it is Ready, show where the groups landed, answer a completion and read its ITL series
    from Prometheus. The cluster stays up (`kimik3 dev down` stops it)."""
    from kimik3.api.documents import BadManifest
    from kimik3_dev.devcluster.demo import run_demo
    try:
        code = run_demo(Path(filename), Path(state_dir), timeout)
    except BadManifest as exc:  # read before anything starts
        raise click.ClickException(str(exc)) from None
    sys.exit(code)
