"""Which greedy outputs of a simulated engine leave the reference, and from which token.

The simulated model's greedy reference output is the same for every prompt: token ``i`` is word
``reference_word(i)`` of ``engine.WORDS`` (``engine.token_text``). A group departs from it in two
ways, each decided by a hash of (what, the group, the prompt), so a test sees the same outputs
every run, and two groups see different ones:

- **benign divergence** (``EngineConfig.benign_divergence``, on ``dev up`` ``BENIGN_DIVERGENCE``):
  kernels that are not batch-invariant (reductions whose order follows the batch) make a healthy
  group's greedy output leave the reference on a share of the prompts, from a position in
  ``[1, HORIZON)``. Two healthy groups of one revision then disagree on about
  ``1 - (1 - b)**2`` (~``2b``) of the prompts: the divergence an output-parity threshold must allow
  (``bench/parity.py`` measures it);
- **corruption** (``EngineConfig.corrupt_rate``, the bad release ``KIMIK3_SIM_CORRUPT_RATE``): a
  release that corrupts its outputs (vllm#52627, vllm#52531) leaves the reference on that share of
  the prompts, from a position in ``[0, HORIZON)``; its latency, errors and health are unchanged.

Where several apply the earliest position wins. From the diverging position on, every token is a
different word than the reference's (shifted by a hash-chosen offset), as a corrupted or
differently reduced logit row changes the argmax and everything conditioned on it.
"""

from __future__ import annotations

import hashlib

BENIGN_DIVERGENCE = 0.02
"""Share of prompts on which a healthy simulated group's greedy output leaves the reference on
``dev up`` (per group, independently): two healthy groups of one revision differ on ~4% of the
prompts. An assumption of the simulator, not a measurement of Kimi K3 (docs/rollouts.md)."""
HORIZON = 32
"""Diverging positions are drawn below this output token: within the operator's default parity
``maxTokens`` (32), so every divergence the simulator plays is visible to it."""


def _unit(*parts: str) -> float:
    """A number in [0, 1) from a SHA-256 of ``parts``."""
    digest = hashlib.sha256("\x1f".join(parts).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2.0 ** 64


def reference_word(index: int, words: int) -> int:
    """Word (of ``words``) of the reference output's ``index``-th token."""
    return (index * 7 + index // words) % words


def diverges_at(prompt: str, group: str, benign: float, corrupt: float) -> tuple[int | None, int]:
    """(first output token that leaves the reference or None, the word offset from there on) of
    ``prompt`` (its text, or its token ids / messages as JSON) on ``group`` (the simulated group's
    name), given its ``benign`` divergence and ``corrupt`` rates (shares in [0, 1])."""
    positions = []
    if benign and _unit("benign", group, prompt) < benign:
        positions.append(1 + int(_unit("benign-at", group, prompt) * (HORIZON - 1)))
    if corrupt and _unit("corrupt", group, prompt) < corrupt:
        positions.append(int(_unit("corrupt-at", group, prompt) * HORIZON))
    offset = 1 + int(_unit("offset", group, prompt) * 1000)
    return (min(positions) if positions else None), offset


def output_word(index: int, words: int, at: int | None, offset: int) -> int:
    """Word of the ``index``-th output token of a request diverging ``at`` (None: never) by
    ``offset`` (``diverges_at``); always another word than the reference's from ``at`` on."""
    word = reference_word(index, words)
    if at is None or index < at:
        return word
    return (word + 1 + offset % (words - 1)) % words
