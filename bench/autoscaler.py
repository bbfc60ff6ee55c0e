#!/usr/bin/env python3
"""The autoscaler trace benchmark (issue 4, part 4): every policy on every trace, side by side.

    pip install -e '.[bench]'          # matplotlib, for the plots
    python bench/autoscaler.py         # from the repository root; same as `kimik3 simulate`

Runs seeds 0-4 of every trace by default (``--seed 1``, ``--seed 0-2``; ``-j 2`` for two
processes; ``--policy kimik3 --keep-others`` re-runs ours and the optimum only, every other policy
keeping its figures per trace and seed from the existing results file: valid while their code
and settings are unchanged). Prints the table (min / mean over the seeds) and the goals missed, writes
bench/results/autoscaler.json::

    {"run": {date, commit, seeds, jobs, recipe, target_s, peers: {policy: settings}, wall_s, cpu_s},
     "goal_misses": ["<trace> seed <n>: ...", ...],
     "traces": {trace: {policy: {"seeds": {"<seed>": figures}, "min": figures, "mean": figures,
                                 "max": figures}}}}

with figures ``{slo_attainment, gpu_hours, gpu_hours_x_optimum, scale_events, recovery_s,
worst_p90_itl_s}`` (ours under ``kimik3``, the hindsight optimum under ``optimal``), one PNG per
trace for the first seed (bench/results/autoscaler-<trace>.png) and the spread over seeds
(bench/results/autoscaler-spread.png: SLO attainment against GPU-hours / optimum, a marker per
seed); PNGs are not committed. What is simulated and why: operator/kimik3_dev/benchmark/simulate.py,
benchmark/fleet.py, benchmark/traces.py, benchmark/baselines.py.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "operator"))

from kimik3_dev.benchmark.simulate import simulate_command  # noqa: E402

if __name__ == "__main__":
    simulate_command()
