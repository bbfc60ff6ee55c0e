"""Recorded request traces from CSV or JSON Lines files: what ``kimik3 simulate --trace-file F``
(the fleet simulator, ``benchmark.traces.recorded``) and ``kimik3 dev load --trace-file F`` (the
load generator, ``sim.load.run_trace``) replay.

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
``timestamp`` in milliseconds from the trace's start, ``hash_ids`` (optional) the ids of the
prompt's blocks of ``MOONCAKE_BLOCK_TOKENS`` (512) tokens, the last one partial: requests with the
same id at the same position share that block and every block before it (a reusable prefix).
``reuse_ceiling`` is the share of the trace's blocks seen before in the trace: the prefix-cache
hit rate an unbounded cache shared by every engine would reach, at the trace's 512-token blocks.
A file is read as JSON Lines when its name ends in ``.jsonl`` or its first character is ``{``.

A CSV timestamp is seconds (a number) or an ISO 8601 date and time; arrivals are replayed relative
to the earliest one, divided by the time-compression factor (6 plays an hour in 10 minutes).
Rows need not be sorted. A request with an output of 0 tokens (a failed or cancelled one in the
recording) is kept as 1 token so that it still arrives. Superposed copies (``superpose``) reach a
fleet size: copy 0 as recorded, the others shifted by a seeded offset and wrapped around the
replay's length (``replay_seconds``); each copy's hash ids are its own (copy c adds c x (largest id
+ 1)): a copy stands for other users, whose prefixes are shared among themselves as the
recording's were, not with the recording's (so copies keep the recording's reuse ceiling).
"""

from __future__ import annotations

import csv
import datetime as dt
import json
import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

MOONCAKE_BLOCK_TOKENS = 512
"""Tokens per block of a Mooncake trace's ``hash_ids`` (its README: blocks of 512 tokens)."""
TAIL_S = 60
"""Seconds a replay lasts after its last arrival."""


@dataclass(frozen=True)
class Request:
    """One request of a trace (recorded or drawn)."""

    arrival_s: float
    """Seconds from the start of the trace."""
    prompt_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...] = ()
    """Ids of the prompt's ``MOONCAKE_BLOCK_TOKENS``-token blocks (empty: unknown, nothing shared)."""

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


def _jsonl(path: Path) -> list[tuple[float, int, int, tuple[int, ...]]]:
    """(arrival seconds, prompt tokens, output tokens, hash ids) of each line of a Mooncake JSON Lines trace."""
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
                hash_ids = row.get("hash_ids", [])
                if not isinstance(hash_ids, list) or not all(isinstance(h, int) for h in hash_ids):
                    raise ValueError(f"hash_ids is {json.dumps(hash_ids)[:60]}, not a list of integers")
                rows.append((float(row["timestamp"]) / 1000.0, *_counts(int(row["input_length"]),
                                                                         int(row["output_length"])), tuple(hash_ids)))
            except (TypeError, ValueError) as exc:
                raise TraceFileError(f"{path}, line {line_num}: {exc} (want a JSON object with timestamp in ms, "
                                     "input_length, output_length and optionally hash_ids, a list of integers)") from None
    return rows


def _counts(prompt: int, output: int) -> tuple[int, int]:
    """(prompt tokens, output tokens) of one request; ValueError naming a negative count (a
    recording holds none: the file is not what it claims to be)."""
    for name, n in (("prompt", prompt), ("output", output)):
        if n < 0:
            raise ValueError(f"{name} tokens {n} is negative")
    return prompt, output


def _is_jsonl(path: Path) -> bool:
    if path.suffix.lower() == ".jsonl":
        return True
    with open(path, encoding="utf-8-sig") as fh:
        return fh.read(1) == "{"


def read(path: Path, compression: float = 1.0) -> tuple[Request, ...]:
    """The requests of the CSV or Mooncake JSON Lines file at ``path`` (module docstring), sorted by
    arrival: seconds from the first one, divided by ``compression``. Raises ``TraceFileError`` for a
    missing column or field, a bad value (with its line) or an empty file, and ValueError for a
    compression <= 0."""
    if compression <= 0:
        raise ValueError(f"time compression must be > 0 (got {compression})")
    rows = _jsonl(path) if _is_jsonl(path) else _csv(path)
    if not rows:
        raise TraceFileError(f"{path}: no requests" + ("" if _is_jsonl(path) else " after the header"))
    first = min(r[0] for r in rows)
    return tuple(sorted((Request((t - first) / compression, max(0, p), max(1, o), ids) for t, p, o, ids in rows),
                        key=lambda r: r.arrival_s))


def replay_seconds(replay: Sequence[Request]) -> int:
    """Whole seconds a replay lasts: its last arrival, rounded up, plus ``TAIL_S``."""
    return math.ceil(max(r.arrival_s for r in replay)) + TAIL_S


def superpose(replay: Sequence[Request], copies: int, duration_s: float, rng: random.Random) -> list[Request]:
    """``copies`` copies of ``replay`` sorted by arrival: copy 0 as it is, each other one shifted by
    ``rng.uniform(0, duration_s)`` and wrapped around ``duration_s``, with hash ids of its own
    (module docstring). Raises ValueError for fewer than 1 copy."""
    if copies < 1:
        raise ValueError(f"copies must be >= 1 (got {copies})")
    out = list(replay)
    stride = max((h for r in replay for h in r.hash_ids), default=-1) + 1
    for copy in range(1, copies):
        offset = rng.uniform(0, duration_s)
        out += [replace(r, arrival_s=(r.arrival_s + offset) % duration_s,
                        hash_ids=tuple(h + copy * stride for h in r.hash_ids)) for r in replay]
    return sorted(out, key=lambda r: r.arrival_s)


def reuse_ceiling(requests: Iterable[Request]) -> float | None:
    """Share (0..1) of the blocks of ``requests`` (in arrival order) whose hash id an earlier block
    of the trace had: the hit rate of an unbounded prefix cache that every request reaches. None
    when no request carries hash ids."""
    seen: set[int] = set()
    blocks = reused = 0
    for r in sorted(requests, key=lambda r: r.arrival_s):
        for h in r.hash_ids:
            blocks += 1
            reused += h in seen
            seen.add(h)
    return reused / blocks if blocks else None


def _csv(path: Path) -> list[tuple[float, int, int, tuple[int, ...]]]:
    """(arrival seconds, prompt tokens, output tokens, no hash ids) of each row of a CSV trace."""
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
        rows: list[tuple[float, int, int, tuple[int, ...]]] = []
        for row in reader:
            line = reader.line_num
            try:
                rows.append((_seconds(row[cols["arrival"]]), *_counts(int(float(row[cols["prompt"]])),
                                                                       int(float(row[cols["output"]]))), ()))
            except (TypeError, ValueError) as exc:
                raise TraceFileError(f"{path}, line {line}: {exc} (want a timestamp, then whole token counts)") from None
    return rows
