"""Which code a benchmark measured: the commit written beside its figures."""

from __future__ import annotations

import subprocess
from pathlib import Path


def checkout_commit(cwd: str | Path | None = None) -> str | None:
    """The commit of the checkout at ``cwd`` (None: the current folder) as ``git describe --always
    --dirty`` names it (``-dirty`` when the work tree differs), None outside a git checkout. What the
    benchmarks write beside their figures."""
    try:
        out = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True, text=True,
                             timeout=10, check=True, cwd=cwd)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None
