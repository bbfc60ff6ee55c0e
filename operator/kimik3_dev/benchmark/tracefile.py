"""Recorded request traces from CSV or JSON Lines files: ``kimik3 simulate --trace-file F``.

Public production LLM traces are published as CSV with one row per request: an arrival
timestamp, the prompt's tokens and the output's tokens. The column names differ by publisher;
``load`` accepts these (case and spacing ignored):

============== ========================================== ==============================================
column         accepted names                             publisher
============== ========================================== ==============================================
arrival        ``TIMESTAMP``, ``Timestamp``, ``arrival``,  Azure LLM inference traces (2023, 2024):
               ``arrival_s``, ``time``                     ``TIMESTAMP`` as a date and time
                                                           (``2023-11-16 18:15:46.6805900``);
                                                           BurstGPT: ``Timestamp`` in seconds
prompt         ``ContextTokens``, ``Request tokens``,      Azure: ``ContextTokens``; BurstGPT:
               ``prompt_tokens``, ``input_tokens``         ``Request tokens``
output         ``GeneratedTokens``, ``Response tokens``,   Azure: ``GeneratedTokens``; BurstGPT:
               ``output_tokens``                           ``Response tokens``
============== ========================================== ==============================================

Mooncake's traces (kvcache-ai/Mooncake, ``FAST25-release/traces/``; its synthetic trace built
from public datasets among them) are JSON Lines instead, one request per line:
``{"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, ...]}``,
``timestamp`` in milliseconds from the trace's start, ``hash_ids`` (the prompt's 512-token blocks,
for prefix-cache studies) optional and not used. A file is read as JSON Lines when its name ends
in ``.jsonl`` or its first character is ``{``.

A CSV timestamp is seconds (a number) or an ISO 8601 date and time; arrivals are replayed relative
to the earliest one, divided by the time-compression factor (6 plays an hour in 10 minutes).
Rows need not be sorted. A request with an output of 0 tokens (a failed or cancelled one in the
recording) is kept as 1 token so that it still arrives. Superposed copies (``copies``) reach a
fleet size: copy 0 as recorded, the others shifted by a seeded offset and wrapped around
(``Trace.requests``).
"""

from __future__ import annotations

import csv
import datetime as dt
import json
import math
from pathlib import Path

from kimik3_dev.benchmark.traces import Request, Trace

COLUMNS: dict[str, tuple[str, ...]] = {
    "arrival": ("timestamp", "arrival", "arrival_s", "time"),
    "prompt": ("contexttokens", "requesttokens", "prompt_tokens", "input_tokens"),
    "output": ("generatedtokens", "responsetokens", "output_tokens"),
}
"""Accepted column names per field, normalized (lower case, no spaces)."""


class TraceFileError(ValueError):
    """The file cannot be read as a request trace: the message names the file, the line and the fix."""


def _normal(name: str) -> str:
    return name.strip().lower().replace(" ", "")


def _seconds(value: str) -> float:
    try:
        return float(value)
    except ValueError:
        pass
    at = dt.datetime.fromisoformat(value.strip())  # Python 3.11: any ISO 8601, extra digits of a second cut
    if at.tzinfo is None:
        at = at.replace(tzinfo=dt.timezone.utc)
    return at.timestamp()


MOONCAKE_FIELDS = ("timestamp", "input_length", "output_length")
"""The fields of a Mooncake JSON Lines request (``timestamp`` in milliseconds)."""


def _jsonl(path: Path) -> list[tuple[float, int, int]]:
    """(arrival seconds, prompt tokens, output tokens) of each line of a Mooncake JSON Lines trace."""
    rows = []
    with open(path, encoding="utf-8-sig") as fh:
        for line_num, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                missing = [f for f in MOONCAKE_FIELDS if f not in row] if isinstance(row, dict) else MOONCAKE_FIELDS
                if missing:
                    raise ValueError(f"no {', '.join(missing)}")
                rows.append((float(row["timestamp"]) / 1000.0, int(row["input_length"]), int(row["output_length"])))
            except (TypeError, ValueError) as exc:
                raise TraceFileError(f"{path}, line {line_num}: {exc} (want a JSON object with timestamp in ms, "
                                     "input_length and output_length)") from None
    return rows


def _is_jsonl(path: Path) -> bool:
    if path.suffix.lower() == ".jsonl":
        return True
    with open(path, encoding="utf-8-sig") as fh:
        return fh.read(1) == "{"


def load(path: Path, compression: float = 1.0, copies: int = 1, name: str | None = None) -> Trace:
    """The requests of the CSV or Mooncake JSON Lines file at ``path`` (module docstring) as a
    replayed ``Trace`` named ``name`` (default: the file's stem): arrivals in seconds from the
    first one, divided by ``compression``; the trace lasts until the last arrival plus a minute,
    whole seconds. Raises ``TraceFileError`` for a missing column or field, a bad value (with its
    line) or an empty file, and ValueError for a compression <= 0 or fewer than 1 copy."""
    if compression <= 0 or copies < 1:
        raise ValueError(f"time compression must be > 0 (got {compression}) and copies >= 1 (got {copies})")
    rows = _jsonl(path) if _is_jsonl(path) else _csv(path)
    if not rows:
        raise TraceFileError(f"{path}: no requests" + ("" if _is_jsonl(path) else " after the header"))
    first = min(r[0] for r in rows)
    replay = tuple(sorted((Request((t - first) / compression, max(0, p), max(1, o)) for t, p, o in rows),
                          key=lambda r: r.arrival_s))
    duration = math.ceil(replay[-1].arrival_s) + 60
    rates = [0.0] * duration
    for r in replay:
        rates[int(r.arrival_s)] += copies
    return Trace(name or path.stem, tuple(rates), (),
                 f"{len(replay)} recorded requests from {path.name}" + (f" x{copies} copies" if copies > 1 else "")
                 + (f", {compression:g}x faster" if compression != 1 else ""), replay=replay, copies=copies)


def _csv(path: Path) -> list[tuple[float, int, int]]:
    """(arrival seconds, prompt tokens, output tokens) of each row of a CSV trace."""
    with open(path, newline="", encoding="utf-8-sig") as fh:
        reader = csv.DictReader(fh)
        header = {_normal(h): h for h in reader.fieldnames or []}
        cols = {}
        for field, names in COLUMNS.items():
            found = next((header[n] for n in names if n in header), None)
            if found is None:
                raise TraceFileError(
                    f"{path}: no {field} column; the header has {', '.join(reader.fieldnames or []) or 'nothing'}, "
                    f"accepted names are {', '.join(names)} (case and spaces ignored)")
            cols[field] = found
        rows = []
        for row in reader:
            line = reader.line_num
            try:
                rows.append((_seconds(row[cols["arrival"]]), int(float(row[cols["prompt"]])),
                             int(float(row[cols["output"]]))))
            except (TypeError, ValueError) as exc:
                raise TraceFileError(f"{path}, line {line}: {exc} (want a timestamp, then whole token counts)") from None
    return rows
