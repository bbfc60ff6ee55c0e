"""A request stream against an OpenAI-compatible endpoint, and what its users saw.

``run_load(url, phases)`` sends requests phase by phase: each ``Phase`` runs for ``duration_s`` at
either an open-loop Poisson ``rate`` (requests/s) or a closed-loop ``concurrency`` (that many users,
each sending its next request when the previous one ends), with the phase's prompt and output
lengths. Everything is bounded: at most ``max_requests`` requests, at most 512 in flight, and every
request ends (or is cancelled and counted as an error) by ``deadline = sum(durations) + drain_s``.

What a user sees, measured client-side from the stream (``RequestResult``):
- TTFT: request sent -> first content chunk;
- ITL per token: the gap between two content chunks divided by the tokens the later chunk carries
  (vLLM's ``continuous_usage_stats`` gives the running completion-token count in every chunk; a
  DSpark step delivers several tokens in one chunk);
- tokens/s per user: (output tokens - 1) / (last chunk - first chunk) (decode speed, TTFT excluded);
  without streaming: output tokens / end-to-end time.

Built-in shapes (``builtin_phases``): ``steady`` (one phase), ``step`` (half the time at the base
load, then x4), ``burst`` (base, a burst at x8 for a tenth of the time, base again). A phases file
(YAML or JSON) is a list of ``{duration: 30s, rate: 2 | concurrency: 4, promptTokens: 512,
outputTokens: 256, name: warm}``. A phase's prompts share nothing: each starts with a word of its
own (like ``vllm bench serve``'s random prompts, they miss the prefix cache).

``run_trace(url, requests)`` replays a recorded trace instead (``kimik3_dev.sim.tracefile``: each
request at its arrival, with its prompt and output lengths). A prompt follows the trace's
``hash_ids`` (``trace_prompt``): block i of a request is the text of its hash id, the same id
giving the same text, ``MOONCAKE_BLOCK_TOKENS`` (512) words of ``engine.WORDS`` drawn from a
``random.Random`` seeded with the id (the last block cut to the prompt's length). The simulated
tokenizer makes each word one token, so a trace block is exactly 512 tokens (the engines hash them
in blocks of their own size, 1024 on TP8: two trace blocks) and a picker hashing the prompt text
sees the trace's sharing. Blocks past the trace's ids, and prompts of traces without ids, are
words of the request's own.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import math
import random
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from kimik3.api.v1alpha1 import duration_seconds
from kimik3_dev import command
from kimik3_dev.sim.engine import WORDS
from kimik3_dev.sim.tracefile import MOONCAKE_BLOCK_TOKENS, Request

TRACE_PHASE = "trace"
"""The phase name of a replayed trace's requests."""
MAX_IN_FLIGHT = 512
"""Most requests open at once (open-loop rates beyond what the engine serves pile up to this)."""
DEFAULT_DRAIN_S = 60.0
"""Seconds after the last phase that in-flight requests may take to finish."""
_WORD = "token"


@dataclass(frozen=True)
class Phase:
    """One stretch of constant load."""

    duration_s: float
    rate: float | None = None
    """Open loop: Poisson arrivals per second."""
    concurrency: int | None = None
    """Closed loop: users each with one request in flight."""
    prompt_tokens: int = 512
    output_tokens: int = 256
    name: str = "steady"


def builtin_phases(shape: str, duration_s: float, *, rate: float | None = None, concurrency: int | None = None,
                   prompt_tokens: int = 512, output_tokens: int = 256) -> list[Phase]:
    """Phases of a built-in shape (``steady``, ``step``, ``burst``) around a base rate or concurrency."""
    if (rate is None) == (concurrency is None):
        raise ValueError("give exactly one of rate and concurrency")

    def at(scale: float, seconds: float, name: str) -> Phase:
        return Phase(seconds, rate * scale if rate is not None else None,
                     max(1, round(concurrency * scale)) if concurrency is not None else None,
                     prompt_tokens, output_tokens, name)

    if shape == "steady":
        return [at(1, duration_s, "steady")]
    if shape == "step":
        return [at(1, duration_s / 2, "base"), at(4, duration_s / 2, "step-x4")]
    if shape == "burst":
        burst = duration_s / 10
        return [at(1, (duration_s - burst) / 2, "base"), at(8, burst, "burst-x8"),
                at(1, (duration_s - burst) / 2, "after")]
    raise ValueError(f"unknown shape {shape!r}: steady, step or burst")


def _either(item: dict[str, Any], camel: str, snake: str, default: int) -> Any:
    """``item[camel]``, else ``item[snake]``, else ``default`` (a phase file may use either spelling)."""
    return item[camel] if camel in item else item.get(snake, default)


def load_phases(path: str | Path, *, prompt_tokens: int = 512, output_tokens: int = 256) -> list[Phase]:
    """Phases from a YAML/JSON file: a list (or ``{phases: [...]}``) of phase mappings."""
    doc = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    if isinstance(doc, dict):
        doc = doc.get("phases")
    if not isinstance(doc, list) or not doc:
        raise ValueError(f"{path}: expected a list of phases")
    out = []
    for i, item in enumerate(doc):
        if not isinstance(item, dict) or "duration" not in item:
            raise ValueError(f"{path}: phase {i} needs a duration")
        rate, conc = item.get("rate"), item.get("concurrency")
        if (rate is None) == (conc is None):
            raise ValueError(f"{path}: phase {i} needs exactly one of rate and concurrency")
        dur = item["duration"]
        out.append(Phase(duration_seconds(dur) if isinstance(dur, str) else float(dur),
                         float(rate) if rate is not None else None, int(conc) if conc is not None else None,
                         int(_either(item, "promptTokens", "prompt_tokens", prompt_tokens)),
                         int(_either(item, "outputTokens", "output_tokens", output_tokens)),
                         str(item.get("name", f"phase-{i}"))))
    return out


def resolve_url(kubeconfig: str | Path, state_dir: str | Path, deployment: str, namespace: str | None = None,
                api_key: str | None = None, via_gateway: bool = False) -> tuple[str, str | None]:
    """(base URL, served model name) of a deployment, found as a client in the cluster finds it:
    the KimiK3Deployment's ``status.endpoint`` (its client Service, read from the API server with
    ``kubeconfig``), reached through the simulator's stand-in for that Service
    (``kimik3_dev.sim.services``), and the model the engines behind it serve (``GET /v1/models``,
    with ``api_key`` when given; None when they do not answer). ``deployment`` is ``name`` (with
    ``namespace``, else searched in every namespace) or ``namespace/name``. ``via_gateway``: instead
    of the Service, the Envoy listener of the dev cluster's gateway in front of the deployment's
    InferencePool (``spec.routing.enabled``; the pool is named like the deployment, and
    ``kimik3 dev gateways`` records its listener: ``services.gateway_address``), so that the
    endpoint picker chooses the leader of each request; the model name is still asked of the
    Service (the picker routes completions, not ``/v1/models``). Raises LookupError saying what is missing."""
    import requests
    import urllib3

    from kimik3.controller.kube import Kube
    from kimik3.kube.kinds import KIMIK3_DEPLOYMENT
    from kimik3_dev.sim import services
    from kubernetes import config as k8s_config

    if "/" in deployment:
        namespace, deployment = deployment.split("/", 1)
    if not Path(kubeconfig).is_file():
        raise LookupError(f"no kubeconfig {kubeconfig}: is the dev cluster up (`{command()} dev up --state-dir "
                          f"{state_dir}`), or give --kubeconfig")
    with k8s_config.new_client_from_config(config_file=str(kubeconfig)) as api:
        try:
            crs = Kube(api).list(*KIMIK3_DEPLOYMENT.type_meta, namespace or "", "")
        except (urllib3.exceptions.HTTPError, OSError):
            raise LookupError(f"the API server of {kubeconfig} ({api.configuration.host}) is not answering: is the dev "
                              f"cluster up (`{command()} dev status --state-dir {state_dir}`)?") from None
    matches = [c for c in crs if c["metadata"]["name"] == deployment]
    if len(matches) != 1:
        known = ", ".join(sorted(f"{c['metadata']['namespace']}/{c['metadata']['name']}" for c in crs)) or "none"
        raise LookupError(f"{KIMIK3_DEPLOYMENT.kind} {deployment!r} {'not found' if not matches else 'is ambiguous'}"
                          f"{f' in namespace {namespace}' if namespace else ''}; known: {known}")
    cr = matches[0]
    who = f"{cr['metadata']['namespace']}/{deployment}"
    endpoint = (cr.get("status") or {}).get("endpoint")
    if not endpoint:
        raise LookupError(f"{who} has no status.endpoint yet: the operator has not reconciled it")
    url = services.service_address(state_dir, endpoint)
    if url is None:
        raise LookupError(f"nothing serves {who}'s Service ({endpoint}) here: is `{command()} dev sim` running with "
                          f"--state-dir {state_dir}?")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        models = requests.get(f"{url}/v1/models", headers=headers, timeout=10)
        model = models.json()["data"][0]["id"] if models.status_code == 200 else None
    except (requests.RequestException, ValueError, KeyError, IndexError):
        model = None
    if via_gateway:
        if not ((cr.get("spec") or {}).get("routing") or {}).get("enabled"):
            raise LookupError(f"{who} has no InferencePool to route through: set spec.routing.enabled: true")
        url = services.gateway_address(state_dir, cr["metadata"]["namespace"], deployment)
        if url is None:
            raise LookupError(f"no gateway runs for InferencePool {who} yet (see {Path(state_dir) / services.GATEWAYS_FILE}"
                              f" and the log of `{command()} dev gateways`, started by `dev up`)")
    return url, model


@dataclass
class RequestResult:
    """One request as its user saw it (seconds)."""

    phase: str
    ok: bool
    start: float
    error: str | None = None
    ttft: float | None = None
    e2e: float | None = None
    output_tokens: int = 0
    itl_per_token: list[float] = field(default_factory=list)
    tokens_per_s: float | None = None


def _prompt(tokens: int, rng: random.Random) -> str:
    """``tokens`` words: a word of this prompt's own (so it shares no prefix), then ``_WORD``s."""
    return " ".join([f"u{rng.getrandbits(64):x}"] + [_WORD] * (max(1, tokens) - 1))


@functools.lru_cache(maxsize=4096)
def _block_words(hash_id: int) -> tuple[str, ...]:
    rng = random.Random(hash_id)
    return tuple(rng.choices(WORDS, k=MOONCAKE_BLOCK_TOKENS))


def trace_prompt(request: Request, rng: random.Random) -> str:
    """The prompt text of a trace's request (module docstring): ``request.prompt_tokens`` words,
    block i the words of ``hash_ids[i]``, the blocks past the ids words drawn from ``rng``."""
    words: list[str] = []
    for i in range(math.ceil(request.prompt_tokens / MOONCAKE_BLOCK_TOKENS)):
        n = min(MOONCAKE_BLOCK_TOKENS, request.prompt_tokens - len(words))
        if i < len(request.hash_ids):
            words += _block_words(request.hash_ids[i])[:n]
        else:
            words += rng.choices(WORDS, k=n)
    return " ".join(words or [_WORD])


async def _one_request(session: aiohttp.ClientSession, url: str, model: str | None, name: str, prompt: str,
                       output_tokens: int, *, stream: bool, chat: bool, workload: str | float | None) -> RequestResult:
    body: dict[str, Any] = {"max_tokens": output_tokens, "temperature": 0.0}
    if model:
        body["model"] = model
    if chat:
        body["messages"] = [{"role": "user", "content": prompt}]
        path = "/v1/chat/completions"
    else:
        body["prompt"] = prompt
        path = "/v1/completions"
    if workload is not None:
        body["kimik3_workload"] = workload
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    start = time.monotonic()
    res = RequestResult(name, False, start)
    try:
        async with session.post(url.rstrip("/") + path, json=body) as resp:
            if resp.status != 200:
                res.error = f"HTTP {resp.status}"
                return res
            if not stream:
                doc = await resp.json()
                res.e2e = time.monotonic() - start
                res.output_tokens = int(doc.get("usage", {}).get("completion_tokens") or 0)
                res.ttft = res.e2e
                if res.output_tokens and res.e2e > 0:
                    res.tokens_per_s = res.output_tokens / res.e2e
                res.ok = True
                return res
            first: float | None = None
            last = start  # read only once ``first`` is set, which sets it too
            seen = 0
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                doc = json.loads(data)
                usage = doc.get("usage") or {}
                choices = doc.get("choices") or []
                total = usage.get("completion_tokens")
                if total is None:  # no usage in chunks: count one token per non-empty chunk
                    has_text = any((c.get("text") or (c.get("delta") or {}).get("content")) for c in choices)
                    total = seen + (1 if has_text else 0)
                new = int(total) - seen
                if new <= 0 or not choices:
                    continue
                now = time.monotonic()
                if first is None:
                    first = now
                    res.ttft = now - start
                else:
                    res.itl_per_token.extend([(now - last) / new] * new)
                last = now
                seen = int(total)
            res.e2e = time.monotonic() - start
            res.output_tokens = seen
            if first is not None and seen > 1 and last > first:
                res.tokens_per_s = (seen - 1) / (last - first)
            res.ok = seen > 0
            if not res.ok:
                res.error = "empty stream"
            return res
    except asyncio.CancelledError:
        res.error = "cancelled at the deadline"
        raise
    except (aiohttp.ClientError, asyncio.TimeoutError, json.JSONDecodeError, ValueError) as exc:
        res.error = f"{type(exc).__name__}: {exc}"[:200]
        return res


Spawn = Callable[[str, str, int], "asyncio.Task[None]"]
"""Sends one request (phase name, prompt text, output tokens) and records its result."""
Track = Callable[["asyncio.Task[None]"], None]
"""Counts a task (a closed-loop user) among those that end, or are cancelled, by the deadline."""


async def _drive(url: str, schedule: Callable[[Spawn, Track], Awaitable[None]], deadline: float, *,
                 model: str | None, stream: bool, chat: bool, workload: str | float | None,
                 api_key: str | None) -> list[RequestResult]:
    """Run ``schedule`` (it calls ``spawn`` per request, and ``track`` for the users it starts) and
    every request it sends, cancelling those still open at ``deadline`` (monotonic seconds);
    returns every result."""
    results: list[RequestResult] = []
    tasks: set[asyncio.Task] = set()
    in_flight = asyncio.Semaphore(MAX_IN_FLIGHT)
    connector = aiohttp.TCPConnector(limit=MAX_IN_FLIGHT)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None),
                                     headers=headers) as session:

        async def fire(name: str, prompt: str, output_tokens: int) -> None:
            placeholder = RequestResult(name, False, time.monotonic(), error="cancelled at the deadline")
            try:
                async with in_flight:
                    placeholder = await _one_request(session, url, model, name, prompt, output_tokens, stream=stream,
                                                     chat=chat, workload=workload)
            finally:
                results.append(placeholder)

        def track(task: asyncio.Task) -> None:
            tasks.add(task)
            task.add_done_callback(tasks.discard)

        def spawn(name: str, prompt: str, output_tokens: int) -> asyncio.Task:
            task = asyncio.create_task(fire(name, prompt, output_tokens))
            track(task)
            return task

        await schedule(spawn, track)
        remaining = max(0.0, deadline - time.monotonic())
        if tasks:
            _, pending = await asyncio.wait(set(tasks), timeout=remaining)
            for task in pending:
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(*pending, return_exceptions=True)
    return results


async def run_load(url: str, phases: list[Phase], *, model: str | None = None, stream: bool = True,
                   chat: bool = False, max_requests: int = 10_000, drain_s: float = DEFAULT_DRAIN_S,
                   seed: int | None = None, workload: str | float | None = None,
                   api_key: str | None = None) -> list[RequestResult]:
    """Send the phases' requests to ``url`` (a base URL such as ``http://127.0.0.1:8000``) and
    return every request's result (cancelled ones as errors). ``api_key``: sent as
    ``Authorization: Bearer <key>`` (vLLM's ``VLLM_API_KEY`` / ``--api-key``)."""
    rng = random.Random(seed)
    sent = 0
    deadline = time.monotonic() + sum(p.duration_s for p in phases) + drain_s

    async def schedule(spawn: Spawn, track: Track) -> None:
        def send(phase: Phase) -> asyncio.Task:
            nonlocal sent
            sent += 1
            tokens = phase.prompt_tokens - 8 if chat else phase.prompt_tokens  # chat: the template's tokens
            return spawn(phase.name, _prompt(tokens, rng), phase.output_tokens)

        for phase in phases:
            end = time.monotonic() + phase.duration_s
            if phase.rate is not None:
                next_at = time.monotonic()
                while sent < max_requests:
                    next_at += rng.expovariate(phase.rate) if phase.rate > 0 else math.inf
                    if next_at >= end:
                        break
                    await asyncio.sleep(max(0.0, next_at - time.monotonic()))
                    send(phase)
                await asyncio.sleep(max(0.0, end - time.monotonic()))
            else:
                async def user(phase: Phase = phase, end: float = end) -> None:
                    while time.monotonic() < end and sent < max_requests:
                        await send(phase)

                users = [asyncio.create_task(user()) for _ in range(phase.concurrency or 0)]
                await asyncio.sleep(max(0.0, end - time.monotonic()))
                for task in users:  # users finish their current request in the next phase's time (closed loop)
                    track(task)

    return await _drive(url, schedule, deadline, model=model, stream=stream, chat=chat, workload=workload,
                        api_key=api_key)


async def run_trace(url: str, requests: Sequence[Request], *, model: str | None = None, stream: bool = True,
                    chat: bool = False, drain_s: float = DEFAULT_DRAIN_S, seed: int | None = None,
                    workload: str | float | None = None, api_key: str | None = None) -> list[RequestResult]:
    """Replay ``requests`` (a trace's, ``tracefile``) against ``url``: each sent at its
    ``arrival_s`` after the start with its ``trace_prompt`` and ``max_tokens`` = its output length,
    results in phase ``trace``; requests still open ``drain_s`` after the last arrival are cancelled."""
    rng = random.Random(seed)
    ordered = sorted(requests, key=lambda r: r.arrival_s)
    start = time.monotonic()
    deadline = start + (ordered[-1].arrival_s if ordered else 0.0) + drain_s

    async def schedule(spawn: Spawn, track: Track) -> None:
        for r in ordered:
            await asyncio.sleep(max(0.0, start + r.arrival_s - time.monotonic()))
            spawn(TRACE_PHASE, trace_prompt(r, rng), r.output_tokens)

    return await _drive(url, schedule, deadline, model=model, stream=stream, chat=chat, workload=workload,
                        api_key=api_key)


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q / 100 * len(s)) - 1))]


def summarize(results: list[RequestResult], phases: list[Phase] | None = None) -> dict[str, dict[str, Any]]:
    """Per phase (in order) and ``total``: requests, errors, tokens/s per user (mean, P50, P10),
    ITL per token (P50, P90, seconds), TTFT (P50, P90, seconds), TPOT (P50, P90, seconds: per
    request, the inverse of its tokens/s, i.e. (last chunk - first chunk) / (output tokens - 1),
    as ``vllm bench serve`` computes it), output tokens/s of the phase."""
    order = [p.name for p in phases] if phases else []
    for r in results:
        if r.phase not in order:
            order.append(r.phase)
    out: dict[str, dict[str, Any]] = {}
    for name in [*order, "total"]:
        rs = [r for r in results if name == "total" or r.phase == name]
        ok = [r for r in rs if r.ok]
        tps = [r.tokens_per_s for r in ok if r.tokens_per_s]
        itl = [x for r in ok for x in r.itl_per_token]
        ttft = [r.ttft for r in ok if r.ttft is not None]
        tpot = [1.0 / x for x in tps]
        errors: dict[str, int] = {}
        for r in rs:
            if not r.ok:
                errors[r.error or "error"] = errors.get(r.error or "error", 0) + 1
        out[name] = {
            "requests": len(rs), "ok": len(ok), "errors": sum(errors.values()), "error_kinds": errors,
            "output_tokens": sum(r.output_tokens for r in ok),
            "tokens_per_s_per_user_mean": statistics.fmean(tps) if tps else None,
            "tokens_per_s_per_user_p50": _pct(tps, 50), "tokens_per_s_per_user_p10": _pct(tps, 10),
            "itl_p50_s": _pct(itl, 50), "itl_p90_s": _pct(itl, 90),
            "ttft_p50_s": _pct(ttft, 50), "ttft_p90_s": _pct(ttft, 90),
            "tpot_p50_s": _pct(tpot, 50), "tpot_p90_s": _pct(tpot, 90),
        }
    return out


def format_summary(summary: dict[str, dict[str, Any]]) -> str:
    """A table for people: one line per phase and a total."""
    def num(v: float | None, scale: float = 1.0, fmt: str = "{:.0f}") -> str:
        return "-" if v is None else fmt.format(v * scale)

    head = (f"{'phase':<12} {'reqs':>5} {'ok':>5} {'err':>4}  {'tok/s/user':>10} {'p50':>6} {'p10':>6}"
            f"  {'ITL/tok p50':>11} {'p90':>7}  {'TTFT p50':>8} {'p90':>7}")
    lines = [head, "-" * len(head)]
    for name, s in summary.items():
        lines.append(
            f"{name:<12} {s['requests']:>5} {s['ok']:>5} {s['errors']:>4}  "
            f"{num(s['tokens_per_s_per_user_mean']):>10} {num(s['tokens_per_s_per_user_p50']):>6} "
            f"{num(s['tokens_per_s_per_user_p10']):>6}  "
            f"{num(s['itl_p50_s'], 1e3, '{:.2f}') + ' ms':>11} {num(s['itl_p90_s'], 1e3, '{:.2f}'):>7}  "
            f"{num(s['ttft_p50_s'], 1e3) + ' ms':>8} {num(s['ttft_p90_s'], 1e3):>7}")
    errs = {k: v for s in list(summary.values())[-1:] for k, v in s["error_kinds"].items()}
    if errs:
        lines.append("errors: " + ", ".join(f"{k} x{v}" for k, v in sorted(errs.items())))
    return "\n".join(lines)


def results_json(results: list[RequestResult], summary: dict[str, dict[str, Any]]) -> str:
    """Summary and per-request results as JSON (ITL lists left out)."""
    rows = [{k: v for k, v in asdict(r).items() if k != "itl_per_token"} for r in results]
    return json.dumps({"summary": summary, "requests": rows}, indent=2)
