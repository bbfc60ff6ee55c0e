"""The development kit of kimik3-operator: everything that is not the operator the image ships.

- ``sim``: the engine simulator (the one fake: GPUs and the 2.8T model) and the load generator.
- ``benchmark``: the fleet simulator, request traces, the peers' autoscaling rules and the trace
  benchmark (``kimik3 simulate``, ``bench/autoscaler.py``).
- ``devcluster``: a real control plane with simulated GB300 NVL72 racks (``kimik3 dev``, the tests).
- ``doctor``: each rank's command line checked by vLLM's own parser in a vLLM virtualenv.
- ``cli``: the kit's ``kimik3`` verbs (entry points ``kimik3.commands``).

The kit imports the core (``kimik3``); the core never imports the kit (an import-linter contract).
"""

import os


def command() -> str:
    """How the user runs the CLI, for the commands hints print: ``tools/kimik3`` from a checkout
    (that script sets ``KIMIK3_COMMAND``), else ``kimik3`` (an installed package)."""
    return os.environ.get("KIMIK3_COMMAND", "kimik3")
