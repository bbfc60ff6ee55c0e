"""Output parity of a canary: golden prompts, greedy, a canary group against an old group.

Latency, errors and health stay green on a release that corrupts its outputs (vllm#52627: under
sustained load over NIXL; vllm#52531: CUDA-graph capture at batch 1). At every analysis check
(``controller.rollout``) the golden prompts (``GOLDEN_PROMPTS``, or the data values of
``spec.rollout.canary.parity.configMap`` in key order) are sent at temperature 0 to the canary
groups' leaders (prompt ``i`` to canary group ``i mod groups``) and to one Ready old group's
leader (``controller.completions``), ``maxTokens`` tokens each, and the outputs are compared
token id for token id (``judge``): a prompt whose outputs differ anywhere is a mismatch, quoted at
its first diverging token (``first_divergence``). Over ``maxMismatchRate`` of the prompts the
round fails and the release is rolled back.

Why greedy outputs must match: with the model and drafter (and their revisions) unchanged, one
engine's greedy output is the argmax chain of the target model, and speculative decoding keeps it
exact under greedy decoding. vLLM 0.33's rejection sampler (``vllm/v1/sample/rejection_sampler.py``,
``rejection_greedy_sample_kernel``) keeps a draft token only where it equals the target's argmax
and otherwise emits the argmax, the bonus token being the target's own: so with
``rejection_sample_method`` ``standard`` or ``block`` and either ``draft_sample_method`` the
output is the target's greedy output. Not exact: ``temperature > 0`` (sampled: never sent here),
``rejection_sample_method: synthetic`` (drafts accepted at fixed rates whatever the target says:
benchmarks only) and ``fly`` (FLy's entropy-gated deferral, "lossy" in vLLM's own words, accepts
drafts the target's argmax refuses); the API admits neither (``speculativeDecoding.
rejectionSampleMethod`` is ``standard`` or ``block``, and ``engine.extraArgs`` may not set
``--speculative-config``), so every configuration it can express keeps parity exact.

Why a threshold above 0: two healthy groups of one revision still differ where kernels are not
batch-invariant (reductions whose order follows the batch), from some token on. The threshold is
set from what two groups of one revision show (``spec.rollout.canary.parity.maxMismatchRate``; on
``dev up`` the simulator's benign divergence, ``kimik3_dev.sim.divergence``).

Skipped (``skip_reason``) when parity cannot hold: the model or drafter path or revision differ
between the two groups' launch plans (their launcher ConfigMaps, ``render.configmap``),
``spec.service.apiKeySecret`` set (the operator holds no key; the engines would refuse it), parity
disabled.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from kimik3.admission import Admitted
from kimik3.api.v1alpha1 import ParityResult
from kimik3.controller import metrics
from kimik3.controller.completions import Completion, CompletionFailed, Greedy
from kimik3.controller.kube import ApiError

GOLDEN_PROMPTS: tuple[str, ...] = (
    "Write a Python function that returns the n-th Fibonacci number iteratively.",
    "Explain in two sentences why the sky is blue.",
    "Translate into French: The rack holds eighteen compute trays linked by NVLink.",
    "What is 17 multiplied by 23? Show the steps.",
    "List the first ten prime numbers, separated by commas.",
    "Summarize the plot of Romeo and Juliet in one paragraph.",
    "Write a SQL query that counts the orders per customer in a table named orders.",
    "Give three tips for writing clear error messages.",
    "Continue the sequence: 2, 4, 8, 16,",
    "Write a haiku about a data center at night.",
    "What does the HTTP status code 503 mean?",
    "Explain the difference between a process and a thread.",
    "Write a JSON object describing a book with a title, an author and a year.",
    "Solve for x: 3x + 7 = 22.",
    "Name the planets of the solar system in order from the Sun.",
    "Write a bash command that counts the lines of every .py file in a folder.",
)
"""The shipped golden prompts: code, arithmetic, prose, translation, structured output; short
prompts so a round costs little next to a group's capacity."""


class ParityUnavailable(Exception):
    """The golden prompts cannot be read (the message names the ConfigMap and the fix)."""


@dataclass(frozen=True)
class Divergence:
    """The first token where a canary's output leaves the old group's, for one prompt."""

    prompt: str
    position: int
    """Output token index (0: the first generated token)."""
    canary: str
    """The canary's token there, quoted (``quote_token``)."""
    reference: str
    """The old group's token there."""

    def describe(self) -> str:
        prompt = self.prompt if len(self.prompt) <= 120 else self.prompt[:117] + "..."
        return (f"prompt {json.dumps(prompt)} diverges at output token {self.position}: canary {self.canary}, "
                f"old group {self.reference}")


@dataclass(frozen=True)
class Round:
    """One parity round: the prompts compared and the mismatches against ``max_rate``."""

    result: ParityResult
    prompts: int
    mismatches: tuple[Divergence, ...]
    max_rate: float
    message: str

    @property
    def rate(self) -> float | None:
        return len(self.mismatches) / self.prompts if self.prompts else None


def first_divergence(canary: Sequence[int], reference: Sequence[int]) -> int | None:
    """Index of the first output token where ``canary`` and ``reference`` (token ids) differ,
    an output ending early counting as differing there; None when they are equal."""
    for i, (a, b) in enumerate(zip(canary, reference)):
        if a != b:
            return i
    return None if len(canary) == len(reference) else min(len(canary), len(reference))


def quote_token(output: Completion, position: int) -> str:
    """The token of ``output`` at ``position`` in words: ``" rack" (id 12)``, or the end of output."""
    if position >= len(output.token_ids):
        return "(end of output)"
    text = f"{json.dumps(output.tokens[position])} " if output.tokens is not None else ""
    return f"{text}(id {output.token_ids[position]})"


def judge(prompts: Sequence[str], canary: Sequence[Completion], reference: Sequence[Completion],
          max_rate: float, between: str) -> Round:
    """The round of ``prompts`` whose greedy outputs are ``canary`` and ``reference`` (same
    order): Failed when the share of prompts whose outputs differ is above ``max_rate``;
    ``between`` names the groups for the message."""
    mismatches = []
    for prompt, c, r in zip(prompts, canary, reference, strict=True):
        at = first_divergence(c.token_ids, r.token_ids)
        if at is not None:
            mismatches.append(Divergence(prompt, at, quote_token(c, at), quote_token(r, at)))
    n = len(prompts)
    rate = len(mismatches) / n if n else 0.0
    failed = rate > max_rate
    figures = (f"output parity: {len(mismatches)} of {n} golden prompt(s) differ ({rate:.1%}, limit "
               f"parity.maxMismatchRate {max_rate:.1%}) between {between}")
    first = f"; first: {mismatches[0].describe()}" if mismatches else ""
    return Round("Failed" if failed else "Passed", n, tuple(mismatches), max_rate, figures + first)


def served_model(plan: dict[str, Any]) -> tuple[str | None, ...]:
    """(model path, --revision, drafter path, drafter revision) of a launch plan
    (``render.configmap.group_plan_document``): what decides the greedy output."""
    args = ((plan.get("ranks") or [{}])[0].get("args") or [])

    def flag(name: str) -> str | None:
        return args[args.index(name) + 1] if name in args[:-1] else None
    spec = json.loads(flag("--speculative-config") or "{}")
    return (args[0] if args else None, flag("--revision"), spec.get("model"), spec.get("revision"))


def skip_reason(admitted: Admitted, canary_plan: dict[str, Any] | None, old_plan: dict[str, Any] | None) -> str | None:
    """Why parity cannot hold between a canary of launch plan ``canary_plan`` and an old group of
    ``old_plan`` (None when it must hold)."""
    parity = admitted.spec.rollout.canary.parity if admitted.spec.rollout.canary else None
    if parity is None or not parity.enabled:
        return "parity skipped: spec.rollout.canary.parity.enabled is false"
    if admitted.spec.service.api_key_secret is not None:
        return ("parity skipped: spec.service.apiKeySecret is set and the operator holds no key to ask the engines "
                "with (the latency and error checks still run)")
    if canary_plan is None or old_plan is None:
        return None  # the plans are read again at the next check
    new, old = served_model(canary_plan), served_model(old_plan)
    if new != old:
        names = ("model", "model revision", "drafter", "drafter revision")
        changed = "; ".join(f"{n} {o} -> {c}" for n, o, c in zip(names, old, new) if o != c)
        return f"parity skipped: the model revision changes ({changed}): two models' greedy outputs need not match"
    return None


ConfigMapReader = Callable[[str, str], dict[str, Any] | None]
"""(namespace, name) -> the ConfigMap, None when it does not exist; ``ApiError`` when it cannot be read."""


class Parity:
    """Parity rounds: the prompts read, sent to the groups' leaders concurrently, judged."""

    def __init__(self, greedy: Greedy, config_maps: ConfigMapReader, workers: int = 8):
        self.greedy = greedy
        self.config_maps = config_maps
        self.workers = workers

    def prompts(self, namespace: str, admitted: Admitted) -> list[str]:
        """The golden prompts of the deployment (module docstring). Raises ``ParityUnavailable``."""
        canary = admitted.spec.rollout.canary
        name = canary.parity.config_map if canary is not None else None
        if name is None:
            return list(GOLDEN_PROMPTS)
        try:
            found = self.config_maps(namespace, name)
        except ApiError as exc:
            raise ParityUnavailable(f"spec.rollout.canary.parity.configMap: reading ConfigMap {namespace}/{name}: HTTP "
                                    f"{exc.status} {exc.reason}: {exc.message} (the operator lists "
                                    "configmaps: the chart's ClusterRole grants it)") from None
        if found is None:
            raise ParityUnavailable(f"spec.rollout.canary.parity.configMap: ConfigMap {namespace}/{name} does not "
                                    "exist: create it (one golden prompt per data key) or unset the field to use the "
                                    "shipped prompts")
        data = found.get("data") or {}
        prompts = [data[k] for k in sorted(data) if str(data[k]).strip()]
        if not prompts:
            raise ParityUnavailable(f"spec.rollout.canary.parity.configMap: ConfigMap {namespace}/{name} has no "
                                    "prompt: put one golden prompt in each data key")
        return prompts

    def round(self, namespace: str, name: str, admitted: Admitted, canary: Sequence[tuple[str, str]],
              old: tuple[str, str]) -> Round:
        """One round for deployment ``namespace/name``: the prompts to the ``canary`` leaders
        ((leader pod name, base URL), prompt ``i`` to ``canary[i % len]``) and to the ``old``
        leader; Unanswered when a request fails or the prompts cannot be read. Each request is
        counted in ``kimik3_canary_probe_requests_total{purpose="parity"}``."""
        canary_spec = admitted.spec.rollout.canary
        assert canary_spec is not None and canary
        p, model = canary_spec.parity, admitted.spec.model.served_model_name
        try:
            prompts = self.prompts(namespace, admitted)
        except ParityUnavailable as exc:
            return Round("Unanswered", 0, (), p.max_mismatch_rate, str(exc))
        jobs = [(canary[i % len(canary)][1], prompt) for i, prompt in enumerate(prompts)] + \
            [(old[1], prompt) for prompt in prompts]

        def ask(job: tuple[str, str]) -> Completion | CompletionFailed:
            try:
                out: Completion | CompletionFailed = self.greedy(job[0], model, job[1], p.max_tokens)
            except CompletionFailed as exc:
                out = exc
            metrics.CANARY_PROBE_REQUESTS.labels(namespace, name, "parity", "failed" if isinstance(out, Exception)
                                                 else "ok").inc()
            return out
        with ThreadPoolExecutor(max_workers=self.workers) as pool:
            answers = list(pool.map(ask, jobs))
        failed = next((a for a in answers if isinstance(a, CompletionFailed)), None)
        if failed is not None:
            return Round("Unanswered", 0, (), p.max_mismatch_rate,
                         f"output parity: a group did not answer the golden prompts: {failed}")
        outputs = [a for a in answers if isinstance(a, Completion)]
        groups = sorted({name for name, _ in canary})
        between = f"canary group(s) {', '.join(groups)} and old group {old[0]} over {p.max_tokens} token(s)"
        return judge(prompts, outputs[:len(prompts)], outputs[len(prompts):], p.max_mismatch_rate, between)
