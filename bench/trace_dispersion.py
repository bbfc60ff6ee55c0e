#!/usr/bin/env python3
"""How bursty each trace of the autoscaling benchmark is, minute to minute, against Poisson
arrivals of the same rate and lengths.

    python bench/trace_dispersion.py [--seed 0]     # from the repository root

For each trace of ``bench/autoscaler.py`` (the synthetic ones and the recorded ones, as the
benchmark draws or replays them for ``--seed``): the output tokens asked for in each whole
minute, each minute's relative deviation from the centred 5-minute mean around it (a trend is
not burstiness), and their standard deviation, scaled by sqrt(5/4) (the centred mean holds the
minute itself). Beside it, what Poisson arrivals at the trace's mean rate with its output
lengths would give: ``sqrt(E[L^2] / (rate x 60)) / E[L]``. The ratio is how much burstier the
trace is than the arrivals the policy's noise margin was measured on
(``LatencyPolicySettings.noise_z``). Prints the table and writes
bench/results/trace-dispersion.json (with the date and commit).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "operator"))

from kimik3_dev.benchmark.provenance import checkout_commit  # noqa: E402
from kimik3_dev.benchmark.simulate import benchmark_traces  # noqa: E402
from kimik3_dev.benchmark.traces import Trace  # noqa: E402

TREND_MINUTES = 5
"""The centred mean a minute is compared with (minutes, odd)."""


def dispersion(trace: Trace, seed: int) -> dict[str, float]:
    """The trace's minute-to-minute deviation of output tokens (``minute_cv``) against Poisson
    arrivals' (``poisson_cv``), both as shares of the local mean, and the request rate (per
    second) and mean output length (tokens) they come from."""
    minutes = trace.duration_s // 60
    tokens = [0.0] * minutes
    lengths = []
    for r in trace.requests(seed):
        m = int(r.arrival_s // 60)
        if m < minutes:
            tokens[m] += r.output_tokens
            lengths.append(r.output_tokens)
    half = TREND_MINUTES // 2
    deviations = []
    for m in range(half, minutes - half):
        local = statistics.mean(tokens[m - half:m + half + 1])
        if local > 0:
            deviations.append((tokens[m] - local) / local)
    minute_cv = statistics.pstdev(deviations) * math.sqrt(TREND_MINUTES / (TREND_MINUTES - 1))
    mean_length = statistics.mean(lengths)
    rate = len(lengths) / (minutes * 60)
    poisson_cv = math.sqrt(statistics.mean([x * x for x in lengths]) / (rate * 60)) / mean_length
    return {"minutes": minutes, "requests_per_s": round(rate, 2), "mean_output_tokens": round(mean_length, 1),
            "minute_cv": round(minute_cv, 4), "poisson_cv": round(poisson_cv, 4),
            "ratio": round(minute_cv / poisson_cv, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0, help="The traces' draw (the benchmark's seeds are 0-4).")
    args = parser.parse_args()
    rows = {t.name: dispersion(t, args.seed) for t in benchmark_traces()}
    print(f"{'trace':<22} {'min':>4} {'req/s':>6} {'out':>5} {'minute CV':>9} {'Poisson':>8} {'ratio':>5}")
    for name, r in rows.items():
        print(f"{name:<22} {r['minutes']:>4} {r['requests_per_s']:>6} {r['mean_output_tokens']:>5.0f} "
              f"{r['minute_cv'] * 100:>8.1f}% {r['poisson_cv'] * 100:>7.1f}% {r['ratio']:>5}")
    out = REPO / "bench" / "results" / "trace-dispersion.json"
    out.write_text(json.dumps({"measured": time.strftime("%Y-%m-%d", time.gmtime()), "commit": checkout_commit(REPO),
                               "seed": args.seed, "trend_minutes": TREND_MINUTES, "traces": rows}, indent=2) + "\n")
    print(f"wrote {out.relative_to(REPO)}")


if __name__ == "__main__":
    main()
