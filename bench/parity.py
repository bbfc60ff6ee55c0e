#!/usr/bin/env python3
"""Output-parity benchmark (issue 25 item 2): how often the canary's parity round fails two
healthy groups of one revision, and how often it lets a corrupting release through, under the
simulator's divergence (``kimik3_dev.sim.divergence``), with the operator's own comparison
(``kimik3.controller.parity.judge``) at the default threshold.

    python bench/parity.py [--pairs 2000] [--corrupt 0.3 0.5 0.6 1.0]     # from the repository root

For each of ``--pairs`` (old group, canary group) name pairs (``k3-engine-<i>`` beside
``k3-engine-<8 hex digits>-0``, as ``dev up`` names them), the 16 shipped golden prompts are
answered as the simulated engines answer them (greedy, ``parity.maxTokens`` tokens, the benign
divergence of 2% per group on both) and judged against ``maxMismatchRate`` 25%. Prints and writes
bench/results/parity.json: the share of prompts on which two healthy groups differ, the share of
healthy rounds that fail (a healthy release rolled back), and per corrupt rate the share of rounds
that pass (a corrupting release let through at one check).
"""

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "operator"))

from kimik3.api.v1alpha1 import PARITY_MAX_MISMATCH_RATE_DEFAULT, PARITY_MAX_TOKENS_DEFAULT  # noqa: E402
from kimik3.controller.completions import Completion  # noqa: E402
from kimik3.controller.parity import GOLDEN_PROMPTS, judge  # noqa: E402
from kimik3_dev.sim.divergence import BENIGN_DIVERGENCE, diverges_at  # noqa: E402
from kimik3_dev.sim.engine import token_id  # noqa: E402
from kimik3_dev.benchmark.provenance import checkout_commit  # noqa: E402


def answer(prompt: str, group: str, corrupt: float) -> Completion:
    """The greedy output a simulated group gives (``SimEngine._serve``)."""
    at, offset = diverges_at(prompt, group, BENIGN_DIVERGENCE, corrupt)
    return Completion(tuple(token_id(i, at, offset) for i in range(PARITY_MAX_TOKENS_DEFAULT)), None)


def rounds(pairs: int, corrupt: float) -> tuple[float, float]:
    """(share of prompts whose outputs differ, share of rounds that fail) over ``pairs`` pairs."""
    differ = failed = 0
    for i in range(pairs):
        old, canary = f"k3-engine-{i}", f"k3-engine-{hashlib.sha256(str(i).encode()).hexdigest()[:8]}-0"
        done = judge(GOLDEN_PROMPTS, [answer(p, canary, corrupt) for p in GOLDEN_PROMPTS],
                     [answer(p, old, 0.0) for p in GOLDEN_PROMPTS], PARITY_MAX_MISMATCH_RATE_DEFAULT, "bench")
        differ += len(done.mismatches)
        failed += done.result == "Failed"
    return differ / (pairs * len(GOLDEN_PROMPTS)), failed / pairs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=2000)
    parser.add_argument("--corrupt", type=float, nargs="+", default=[0.3, 0.5, 0.6, 1.0])
    args = parser.parse_args()
    healthy_differ, healthy_failed = rounds(args.pairs, 0.0)
    corrupt = {}
    for rate in args.corrupt:
        differ, failed = rounds(args.pairs, rate)
        corrupt[f"{rate:g}"] = {"prompts_differing": round(differ, 4), "rounds_passed": round(1 - failed, 4)}
    commit = checkout_commit(REPO)
    result = {"measured": time.strftime("%Y-%m-%d"), "commit": commit, "pairs": args.pairs,
              "prompts": len(GOLDEN_PROMPTS), "max_tokens": PARITY_MAX_TOKENS_DEFAULT,
              "benign_divergence_per_group": BENIGN_DIVERGENCE,
              "max_mismatch_rate": PARITY_MAX_MISMATCH_RATE_DEFAULT,
              "healthy": {"prompts_differing": round(healthy_differ, 4), "rounds_failed": round(healthy_failed, 4)},
              "corrupt": corrupt}
    out = REPO / "bench" / "results" / "parity.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    print(f"wrote {out.relative_to(REPO)}")


if __name__ == "__main__":
    main()
