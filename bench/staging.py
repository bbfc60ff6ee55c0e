#!/usr/bin/env python3
"""Stager throughput against a plain copy of the same files, at 1, 4 and 8 parallel downloads.

    python bench/staging.py [--shards 8] [--shard-mib 64] [--repeats 2]

Makes a checkpoint of ``--shards`` safetensors shards (plus config, index and tokenizer files) in
a temporary folder, publishes it on the kit's fake hub (``kimik3_dev.hub``, 127.0.0.1, unthrottled)
and, in the same run:
- baseline: ``shutil.copyfile`` of every file vLLM loads into a fresh folder, one after another
  (what staging by hand from a local disk costs);
- ours: ``kimik3.staging.stager.stage`` (huggingface_hub download over HTTP, then sha256 / git blob
  verification of every file, then the manifest) into a fresh folder with ``max_workers`` 1, 4, 8.
Each figure is the best of ``--repeats`` runs. Prints MiB/s and the ratio ours / copy, and writes
bench/results/staging.json. The ratio is what the stager's HTTP, hashing and bookkeeping cost
relative to the disk on this machine; a real hub adds its network, which parallel downloads hide.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "operator"))

from kimik3.engine.weights import Artifact  # noqa: E402
from kimik3.staging.stager import stage  # noqa: E402
from kimik3_dev.hub.checkpoint import write_checkpoint  # noqa: E402
from kimik3_dev.hub.server import FakeHub  # noqa: E402

WORKERS = (1, 4, 8)
RESULTS = Path(__file__).resolve().parent / "results" / "staging.json"


def best_seconds(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--shard-mib", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kimik3-bench-staging-") as tmp:
        root = Path(tmp)
        files = write_checkpoint(root / "src", shards=args.shards, shard_bytes=args.shard_mib << 20)
        total = sum(files.values())
        hub = FakeHub()
        hub.add("moonshotai/Kimi-K3", root / "src")
        hub.start()
        runs = [0]

        def fresh() -> Path:
            runs[0] += 1
            return root / f"run-{runs[0]}"

        def copy() -> None:
            dest = fresh()
            for name in files:
                (dest / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(root / "src" / name, dest / name)

        try:
            copy_s = best_seconds(copy, args.repeats)
            ours = {w: best_seconds(lambda w=w: stage(Artifact("target", "moonshotai/Kimi-K3", "main"), fresh(),
                                                      endpoint=hub.url, max_workers=w), args.repeats)
                    for w in WORKERS}
        finally:
            hub.stop()
    mib = total / (1 << 20)
    print(f"{len(files)} files, {mib:.0f} MiB (best of {args.repeats})")
    print(f"{'':>22} {'MiB/s':>8} {'ratio to copy':>14}")
    print(f"{'plain copy':>22} {mib / copy_s:8.0f} {1.0:14.2f}")
    out = {"files": len(files), "bytes": total, "repeats": args.repeats, "copy_mib_s": mib / copy_s, "stager": {}}
    for w, seconds in ours.items():
        ratio = copy_s / seconds
        print(f"{f'stager, {w} parallel':>22} {mib / seconds:8.0f} {ratio:14.2f}")
        out["stager"][str(w)] = {"mib_s": mib / seconds, "ratio_to_copy": ratio}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {RESULTS.relative_to(Path.cwd()) if RESULTS.is_relative_to(Path.cwd()) else RESULTS}")


if __name__ == "__main__":
    main()
