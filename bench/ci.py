"""CI wall time: `bash .ci/run` on a fresh clone, as CI runs it, timed and recorded.

    python bench/ci.py run  --label warm            # clone HEAD into a temp folder, run .ci/run, record
    python bench/ci.py record --label cold --log F --start EPOCH   # record a run already made

`run` clones this repository's HEAD (``git clone``, like CI), runs ``bash .ci/run`` there with its
output in ``<clone>.log``, and writes ``bench/results/ci-<label>.json``: date, commit, wall seconds,
the seconds before pytest's first line (the set-up: venv, Go binaries, vLLM venvs; all cached when
warm), pytest's own seconds and its summary line (passed / failed counts), the load average at the
end, and the FAILED test ids. `record` reads the same figures from the log of a run made by hand
(``--start``: the run's start, epoch seconds; its end is the log's modification time, or an
``end=EPOCH`` line the caller appended)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import click

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "operator"))
from kimik3.kube.times import rfc3339  # noqa: E402

SUMMARY = re.compile(r"=+ (?P<summary>.*(?:passed|failed).*) in (?P<seconds>[\d.]+)s")
SESSION_START = "test session starts"


def figures(log: Path, start: float, end: float) -> dict:
    """What the log of one ``bash .ci/run`` says, with its wall time; ``ValueError`` when the log
    has no pytest summary line (the run did not finish)."""
    text = log.read_text(errors="replace")
    match = None
    for match in SUMMARY.finditer(text):
        pass
    if match is None:
        raise ValueError(f"{log}: no pytest summary line (did the run finish?)")
    counts = {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|errors?|skipped)", match["summary"])}
    pytest_s = float(match["seconds"])
    return {"wall_s": round(end - start, 1), "pytest_s": pytest_s, "setup_s": round(end - start - pytest_s, 1),
            "summary": match["summary"], "counts": counts,
            "failed": re.findall(r"^(?:FAILED|ERROR) (\S+)", text, re.M),
            "setup_lines": [line for line in text.splitlines()[:40] if line.startswith("[")]}


def write(label: str, commit: str, result: dict) -> Path:
    out = REPO / "bench" / "results" / f"ci-{label}.json"
    load = os.getloadavg()
    out.write_text(json.dumps({"date": rfc3339(), "commit": commit, "label": label,
                               "loadavg_at_end": [round(x, 2) for x in load], **result}, indent=2) + "\n")
    return out


@click.group()
def main() -> None:
    """Time `bash .ci/run` on a fresh clone."""


@main.command()
@click.option("--label", required=True, help="warm (builds cached) or cold (nothing in ~/.cache/kimik3).")
def run(label: str) -> None:
    """Clone HEAD into a temp folder and run `bash .ci/run` there."""
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, check=True).stdout.strip()
    clone = Path(tempfile.mkdtemp(prefix="kimik3-ci-")) / "repo"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    log = clone.with_suffix(".log")
    click.echo(f"running bash .ci/run in {clone} (commit {commit}); output in {log}")
    start = time.time()
    with log.open("w") as f:
        rc = subprocess.run(["bash", ".ci/run"], cwd=clone, stdout=f, stderr=subprocess.STDOUT).returncode
    result = {**figures(log, start, time.time()), "returncode": rc}
    click.echo(f"wrote {write(label, commit, result)}: {result['wall_s']:.0f} s wall, {result['summary']}")


@main.command()
@click.option("--label", required=True)
@click.option("--log", "log_path", required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--start", required=True, type=float, help="The run's start, epoch seconds.")
@click.option("--commit", required=True, help="The commit the run tested.")
def record(label: str, log_path: Path, start: float, commit: str) -> None:
    """Record a run made by hand from its log."""
    ends = re.findall(r"end=(\d+)", log_path.read_text(errors="replace"))
    end = float(ends[-1]) if ends else log_path.stat().st_mtime
    result = figures(log_path, start, end)
    click.echo(f"wrote {write(label, commit, result)}: {result['wall_s']:.0f} s wall, {result['summary']}")


if __name__ == "__main__":
    main()
