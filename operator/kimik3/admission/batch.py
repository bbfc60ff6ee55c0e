"""Batch limits vLLM's scheduler accepts: one engine step must hold at least one token per sequence.

vLLM 0.33.0 refuses at start-up a ``--max-num-batched-tokens`` below ``--max-num-seqs``
(``vllm/config/scheduler.py`` ``SchedulerConfig.verify_max_model_len``: "max_num_batched_tokens
(N) must be greater than or equal to max_num_seqs (M)"), so such a spec would render groups
whose engines exit at every start. Refused here and by the CRD's CEL rule instead.
"""

from __future__ import annotations

from kimik3.admission.rules import Candidate, Rule, Table, example, refuse
from kimik3.api.errors import SpecError


def tokens_cover_seqs(c: Candidate) -> list[SpecError]:
    engine = c.spec.engine
    return refuse(engine.max_num_batched_tokens < engine.max_num_seqs, "spec.engine.maxNumBatchedTokens",
                  f"maxNumBatchedTokens ({engine.max_num_batched_tokens}) is below maxNumSeqs ({engine.max_num_seqs}): "
                  "vLLM refuses to start (one step holds at least one token per sequence); raise "
                  f"maxNumBatchedTokens to >= {engine.max_num_seqs} or lower maxNumSeqs")


BATCH = Table("batch", (
    Rule(tokens_cover_seqs, example(engine={"maxNumSeqs": 1024, "maxNumBatchedTokens": 512}),
         cel=("batched-tokens-cover-seqs",)),
))
