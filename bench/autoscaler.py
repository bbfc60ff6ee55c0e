#!/usr/bin/env python3
"""The autoscaler trace benchmark (issue 4, part 4): every policy on every trace, side by side.

    pip install -e '.[bench]'          # matplotlib, for the plots
    python bench/autoscaler.py         # from the repository root; same as `kimik3 simulate`

Prints the table, writes bench/results/autoscaler.json
(``{trace: {policy: {slo_attainment, gpu_hours, scale_events, recovery_s, worst_p90_itl_s}}}``,
ours under ``kimik3``, the hindsight optimum under ``optimal``) and one PNG per trace
(bench/results/autoscaler-<trace>.png, not committed). What is simulated and why:
operator/kimik3_dev/benchmark/simulate.py, benchmark/fleet.py, sim/traces.py, benchmark/baselines.py.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "operator"))

from kimik3_dev.benchmark.simulate import simulate_command  # noqa: E402

if __name__ == "__main__":
    simulate_command()
