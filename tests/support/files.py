"""The repository's own files as tests read them."""

from __future__ import annotations

from pathlib import Path


def header(path: Path, sep: str = "\n") -> str:
    """The leading ``#`` comment block of ``path`` (a Dockerfile, a recipe), its lines without the
    ``# `` and joined with ``sep`` (``" "``: the prose as one line, sentences across line ends)."""
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("# "))
    return sep.join(lines)
