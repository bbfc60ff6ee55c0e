"""One simulated vLLM engine server (aiohttp on a loopback address) for one engine group.

It speaks vLLM's interface: OpenAI ``POST /v1/completions`` and ``POST /v1/chat/completions``
(non-streaming, and ``"stream": true`` as server-sent events ``data: {...}`` ending with
``data: [DONE]``; ``stream_options.include_usage`` / ``continuous_usage_stats``), ``GET /v1/models``,
``GET /health`` (503 while the simulated weights load, then 200) and ``GET /metrics`` with vLLM
0.32's series (``kimik3_dev.sim.vllm_metrics``), one ``engine`` label value per data-parallel engine.
The answers carry the fields of vLLM 0.32's protocol classes, as its serving code dumps them
(``_full_response``, ``_stream_chunk``); the ``openai`` client and ``vllm bench serve`` accept them
(tests/test_sim_clients.py, tests/conformance/test_sim_clients_vllm.py).

Behind it, a continuous-batching scheduler per lockstep unit (``perfmodel.PerfParams``): requests
wait (``max_num_seqs``), are prefilled in chunks inside the steps (``max_num_batched_tokens``),
then decode; every step lasts ``perfmodel.step_time`` of the running batch, so latency really
rises with concurrency. Like vLLM, ``vllm:inter_token_latency_seconds`` is observed once per
running request per engine step, and a step emits 1 + accepted draft tokens under speculative
decoding (accepted drafts drawn from the model's chain acceptance, seeded).

Prefix caching (``EngineConfig.enable_prefix_caching``, from ``--[no-]enable-prefix-caching``; on
by default, as vLLM 0.33 has it for K3): each data-parallel engine holds a ``prefixcache.PrefixCache``
of ``perfmodel.kv_cache_blocks`` blocks (the group's GPUs, memory and K3's layer mix; 1024-token
blocks on TP8). When a request is scheduled, the leading blocks of its prompt's token ids found
there are not prefilled (the step time counts only the rest); its blocks are cached as its
prefill computes them and stay cached, least recently freed evicted first, once it ends. Like
vLLM 0.33 (``KVCacheManager.record_prefix_cache_stats``), ``vllm:prefix_cache_queries`` counts the
prompt tokens of each scheduled request and ``vllm:prefix_cache_hits`` the tokens found cached.
With a host tier (``--kv-offloading-size``: ``perfmodel.kv_cache_blocks``' ``host_blocks``) each
engine also holds a ``prefixcache.HostTier``: every block a prefill computes is stored there too;
the blocks of a prompt found there after those the GPU cache holds are loaded back into it, the
request waiting ``perfmodel.host_tier_load_s`` for them (not a step: others keep running, as
vLLM 0.33 loads asynchronously) instead of prefilling them. Like vLLM 0.33 with its
OffloadingConnector, ``vllm:external_prefix_cache_queries`` counts the prompt tokens the GPU cache
did not hold and ``vllm:external_prefix_cache_hits`` those loaded; ``vllm:kv_offload_load_bytes`` and
``vllm:kv_offload_store_bytes`` the bytes moved, every rank's pages. ``vllm:cache_config_info``
carries the cache's ``block_size`` and ``num_gpu_blocks`` (what the endpoint picker's ``autoTune``
reads) and the tier's settings.

API key (``EngineConfig.api_keys``, from the pod's ``VLLM_API_KEY``: ``kimik3_dev.sim.podenv``): like
vLLM 0.32's ``AuthenticationMiddleware`` (vllm/entrypoints/serve/middleware/authenticate.py; the
same file in 0.33.0), every request whose path starts with ``/v1``, ``/v2``, ``/inference`` or
``/cohere`` (method other than OPTIONS) must carry ``Authorization: Bearer <key>`` (scheme
case-insensitive, the rest of the header after the first space compared exactly, by SHA-256
digest), else 401 with the body ``{"error":"Unauthorized"}`` (``application/json``), before any
routing (an unknown ``/v1`` path is 401 too, not 404). ``/health`` and ``/metrics`` stay open.
Empty keys are ignored (vLLM: no key, no authentication). The keys are kept only as digests.

A bad release (``EngineConfig.step_slowdown``, ``error_rate``, ``corrupt_rate``, from the pod's
``KIMIK3_SIM_*`` env: ``kimik3_dev.sim.supervisor``): every engine step takes ``step_slowdown``
times as long, a share ``error_rate`` of the requests fail with HTTP 500 (counted in
``vllm:request_success`` with ``finished_reason="error"``, as vLLM counts a request its engine
failed), and a share ``corrupt_rate`` of the prompts get a greedy output that leaves the reference
(``kimik3_dev.sim.divergence``, which also plays the benign divergence of healthy groups,
``benign_divergence``).

Greedy outputs and token ids: every request is answered greedily (``temperature`` is not read);
the output is the reference (``token_text``) unless ``divergence`` says it leaves it. With
``"return_token_ids": true`` a choice (and each stream chunk) carries the output's ``token_ids``
(ids of the simulated tokenizer, ``token_id``), as vLLM does; a completion with ``"logprobs": N``
carries ``logprobs`` (the sampled tokens' text, log-probability 0).

Simulator specifics (not vLLM): the text is made-up words, one token per word; prompt tokens are
the words and punctuation marks (``token_ids``; chat: + 4 per message + 2 for the reply header); without
``max_tokens`` a request stops (``finish_reason: stop``) after ``default_max_tokens``, standing in
for an end-of-sequence token; a request may carry ``"kimik3_workload"`` (``code``, ``chat``,
``creative``, ... or an acceptance length) to change its speculative acceptance.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import hmac
import ipaddress
import json
import logging
import random
import re
import socket
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from kimik3.autoscaler import perfmodel
from kimik3.autoscaler.observation import FAILED_REASON
from kimik3.autoscaler.perfmodel import EngineShape, PerfParams
from kimik3.engine.kvcache import KVBlocks
from kimik3_dev.sim import divergence
from kimik3_dev.sim.prefixcache import HostTier, PrefixCache, block_hashes
from kimik3_dev.sim.vllm_metrics import EngineMetrics

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
DEFAULT_MAX_TOKENS = 256
"""Output length of a request without ``max_tokens`` (our stand-in for the model's EOS)."""
CHAT_TOKENS_PER_MESSAGE = 4
"""Chat-template tokens added per message (role markers), an approximation."""
CHAT_REPLY_HEADER_TOKENS = 2
RESYNC_S = 0.05
"""Steps follow the model's schedule (wake-up jitter is absorbed by the next sleep); a unit that
falls further behind than this (a starved event loop) restarts its schedule at the present."""
GUARDED_PREFIXES = ("/v1", "/v2", "/inference", "/cohere")
"""Paths that need the API key: vLLM 0.32's ``GUARDED_PREFIX`` (serve/middleware/authenticate.py)."""
UNAUTHORIZED_BODY = b'{"error":"Unauthorized"}'
"""vLLM 0.32's refusal: Starlette's ``JSONResponse(content={"error": "Unauthorized"}, status_code=401)``
renders compact JSON, ``Content-Type: application/json`` (no charset), no ``WWW-Authenticate``."""
_TOKEN_RE = re.compile(r"\w+|[^\w\s]")
WORDS = ("kimi", "tensor", "rack", "tray", "draft", "accept", "token", "step", "expert", "route",
          "latent", "delta", "spark", "mega", "kernel", "batch", "decode", "prefill", "cache", "group",
          "leader", "worker", "clique", "link", "fleet", "scale", "queue", "serve", "model", "layer",
          "shard", "block")
"""The words the simulated model speaks, one token each (``kimik3_dev.sim.tokenizer`` is their tokenizer)."""
UNK = "<unk>"
VOCAB = {UNK: 0, **{word: i + 1 for i, word in enumerate(WORDS)}}
"""Token ids of the simulated tokenizer (``kimik3_dev.sim.tokenizer`` writes this vocabulary)."""
def token_ids(text: str) -> list[int]:
    """Simulated token ids of ``text``: one per word or punctuation mark, the vocabulary's id for
    ``WORDS``, any other token a stable id above the vocabulary from its bytes (blake2b, 4 bytes;
    the tokenizer files map those to ``<unk>``), so different text keeps different ids for the
    prefix cache."""
    return [VOCAB.get(tok) or len(VOCAB) + int.from_bytes(hashlib.blake2b(tok.encode(), digest_size=4).digest(), "little")
            for tok in _TOKEN_RE.findall(text)]


def chat_token_ids(messages: list[Any]) -> list[int]:
    """Simulated prompt token ids of chat ``messages``: per message its template
    (``CHAT_TOKENS_PER_MESSAGE`` ids, the last its role's) and its content (the text, or the texts
    of its parts), then the reply header (``CHAT_REPLY_HEADER_TOKENS`` ids)."""
    ids: list[int] = []
    for msg in messages:
        content = msg.get("content") if isinstance(msg, dict) else None
        if isinstance(content, list):
            content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        role = token_ids(str(msg.get("role", ""))) if isinstance(msg, dict) else []
        ids += ([0] * CHAT_TOKENS_PER_MESSAGE + role[:1])[-CHAT_TOKENS_PER_MESSAGE:]
        ids += token_ids(content) if content else []
    return ids + [0] * CHAT_REPLY_HEADER_TOKENS


def token_word(index: int, at: int | None = None, offset: int = 0) -> int:
    """Word (index in ``WORDS``) of the ``index``-th generated token of an output diverging from
    the greedy reference ``at`` (None: the reference) by ``offset`` (``divergence.diverges_at``)."""
    return divergence.output_word(index, len(WORDS), at, offset)


def token_text(index: int, at: int | None = None, offset: int = 0) -> str:
    """Text of the ``index``-th generated token (a space and a word; ``token_word``)."""
    return " " + WORDS[token_word(index, at, offset)]


def token_id(index: int, at: int | None = None, offset: int = 0) -> int:
    """Token id of the ``index``-th generated token: its word's id in the simulated tokenizer
    (``tokenizer.tokenizer_json``: ``<unk>`` is 0, ``WORDS[i]`` is ``i + 1``)."""
    return token_word(index, at, offset) + 1


@dataclass
class EngineConfig:
    """Configuration of one simulated server (one engine group); in the dev cluster read from the
    argv the operator rendered for the group's leader (``kimik3_dev.sim.launch``)."""

    shape: EngineShape = field(default_factory=EngineShape)
    served_model_name: str = "kimi-k3"
    model: str = "moonshotai/Kimi-K3"
    max_model_len: int = 1048576
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    load_time_s: float = 0.0
    """Seconds after start during which /health answers 503 (weights loading)."""
    workload: str | float = perfmodel.DEFAULT_WORKLOAD
    """Default workload for speculative acceptance (``perfmodel.AL_DSPARK`` key or an AL)."""
    default_max_tokens: int = DEFAULT_MAX_TOKENS
    seed: int | None = None
    buckets_override: dict[str, tuple[float, ...]] | None = None
    step_slowdown: float = 1.0
    """Factor on every engine step's time (a release that decodes slower: 2.0 is twice as slow)."""
    error_rate: float = 0.0
    """Share of requests the engine fails (HTTP 500, ``finished_reason="error"``)."""
    corrupt_rate: float = 0.0
    """Share of prompts whose greedy output leaves the reference (a corrupting release:
    ``divergence``); latency and errors unchanged."""
    benign_divergence: float = 0.0
    """Share of prompts whose greedy output leaves the reference on a healthy group (kernels that
    are not batch-invariant: ``divergence``); ``dev up`` sets ``divergence.BENIGN_DIVERGENCE``."""
    group_name: str = ""
    """The group the engine serves (on ``dev up`` its leader pod's name): which prompts diverge,
    and where, is a hash of it and the prompt (``divergence.diverges_at``)."""
    enable_prefix_caching: bool = True
    """Hold a prefix cache per engine (module docstring); off: every prompt token is prefilled."""
    api_keys: tuple[str, ...] = field(default=(), repr=False, compare=False)
    """Keys accepted as ``Authorization: Bearer <key>`` on the guarded paths (empty: no
    authentication). Never in ``repr`` (the key must not reach a log)."""


@dataclass(eq=False)
class SimRequest:
    """One request inside the simulated engine (times are event-loop seconds)."""

    rid: str
    prompt_tokens: int
    max_tokens: int
    max_tokens_param: int | None
    arrival: float
    accept_p: float
    block_hashes: list[bytes] = field(default_factory=list)
    """Chained hashes of the prompt's full blocks (``prefixcache.block_hashes``)."""
    out: asyncio.Queue = field(default_factory=asyncio.Queue)
    engine: int = 0
    scheduled_ts: float = 0.0
    first_token_ts: float = 0.0
    last_token_ts: float = 0.0
    prefilled: int = 0
    ready_at: float = 0.0
    """When the blocks loaded from the host tier are on the GPUs (prefill waits until then)."""
    held_blocks: int = 0
    """Leading ``block_hashes`` pinned in the engine's prefix cache."""
    generated: int = 0
    aborted: bool = False
    done: bool = False

    @property
    def end_reason(self) -> str:
        return "length" if self.max_tokens_param is not None else "stop"


class _EngineState:
    """One data-parallel engine: its queue and running batch."""

    def __init__(self, index: int, cache: PrefixCache, host: HostTier | None = None):
        self.index = index
        self.cache = cache
        self.host = host
        self.waiting: collections.deque[SimRequest] = collections.deque()
        self.running: list[SimRequest] = []

    def release(self, r: SimRequest) -> None:
        """Unpin the prefix-cache blocks of a request leaving the engine."""
        self.cache.release(r.block_hashes[:r.held_blocks])
        r.held_blocks = 0

    @property
    def load(self) -> int:
        return len(self.waiting) + len(self.running)


class _Unit:
    """Engines that step together (see ``perfmodel.PerfParams``)."""

    def __init__(self, engines: list[_EngineState]):
        self.engines = engines
        self.wake = asyncio.Event()
        self.task: asyncio.Task | None = None
        self.steps = 0

    def has_work(self) -> bool:
        return any(e.waiting or e.running for e in self.engines)


def cache_config_info(config: EngineConfig, kv: KVBlocks) -> dict[str, str]:
    """The labels of the engine's ``vllm:cache_config_info`` (``vllm_metrics.CACHE_CONFIG_INFO``):
    the CacheConfig fields the simulator knows, as vLLM 0.33 writes them (``str()`` of the value;
    K3's align mode keeps the KDA state at every block, ``mamba_block_size = block_size``)."""
    shape, caching = config.shape, config.enable_prefix_caching
    return {"block_size": str(kv.block_size), "gpu_memory_utilization": str(shape.gpu_memory_utilization),
            "enable_prefix_caching": str(caching), "mamba_block_size": str(kv.block_size) if caching else "None",
            "mamba_cache_mode": "align" if caching else "none", "num_gpu_blocks": str(kv.blocks),
            "kv_offloading_size": str(float(shape.kv_offload_gib)) if shape.kv_offload_gib else "None",
            "kv_offloading_backend": "native"}


class SimEngine:
    """A simulated vLLM server. ``await start(host, port)`` binds a loopback address (in the dev
    cluster its leader pod's IP and rendered port, as vLLM listens in the pod)."""

    def __init__(self, config: EngineConfig):
        self.config = config
        self.params: PerfParams = perfmodel.perf_params(config.shape)
        shape = config.shape
        self.k = shape.k
        self.dp = max(1, shape.data_parallel_size)
        self.kv_blocks = perfmodel.kv_cache_blocks(self.params)
        offload = shape.kv_offload_gib > 0
        self.metrics = EngineMetrics(config.served_model_name, range(self.dp), config.max_model_len,
                                     self.k, config.buckets_override, kv_offload=offload,
                                     cache_config=cache_config_info(config, self.kv_blocks))
        self.rng = random.Random(config.seed)
        self._default_p = perfmodel.acceptance_rate(shape.spec_method, shape.k, config.workload) if self.k else 0.0
        blocks = self.kv_blocks.blocks if config.enable_prefix_caching else 0
        host = self.kv_blocks.host_blocks if config.enable_prefix_caching else 0
        self.block_load_s = perfmodel.host_tier_load_s(self.params, 1)
        self.block_bytes_all_ranks = self.kv_blocks.block_bytes * shape.gpus_per_engine
        self.engines = [_EngineState(i, PrefixCache(blocks, self.kv_blocks.block_size),
                                     HostTier(host) if offload else None) for i in range(self.dp)]
        per = self.params.engines_per_unit
        self.units = [_Unit(self.engines[i:i + per]) for i in range(0, self.dp, per)]
        self._unit_of = {e.index: u for u in self.units for e in u.engines}
        self._rr = 0
        self._responding = 0
        """Responses being written (a request's last tokens may be decoded and not yet sent)."""
        self.started_at: float | None = None
        self.host = LOOPBACK
        self.port: int | None = None
        self._runner: web.AppRunner | None = None
        self._key_digests = [hashlib.sha256(k.encode("utf-8")).digest() for k in config.api_keys if k]
        self._closing = False
        """Draining: every response closes its connection (``drain``)."""
        self._shutting_down = False
        """SIGTERM came: new requests are refused (``drain``)."""
        self.app = self._make_app()

    # ---------------------------------------------------------------- lifecycle
    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def ready(self) -> bool:
        """True once the load time has passed since start."""
        return self.started_at is not None and time.monotonic() >= self.started_at + self.config.load_time_s

    async def start(self, port: int = 0, host: str = LOOPBACK) -> int:
        """Serve on ``host``:``port`` (0: a free port); returns the port. Raises ValueError for a
        host outside 127.0.0.0/8 (nothing else is ever bound or contacted here) and OSError when
        the address is taken."""
        if not ipaddress.ip_address(host).is_loopback:
            raise ValueError(f"engine host {host} is not a loopback address (127.0.0.0/8)")
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            sock.close()
            raise
        self.host = host
        self.port = sock.getsockname()[1]
        self._runner = web.AppRunner(self.app, access_log=None, handle_signals=False, shutdown_timeout=0.5)
        await self._runner.setup()
        await web.SockSite(self._runner, sock).start()
        self.started_at = time.monotonic()
        for unit in self.units:
            unit.task = asyncio.create_task(self._run_unit(unit), name=f"sim-unit-{self.port}")
        return self.port

    async def drain(self, deregister_s: float, shutdown_timeout_s: float, grace_s: float) -> None:
        """What a pod's deletion gives the engine, step by step as in the pod
        (``kimik3.render.leaderworkerset``; seconds from the deletion):
        1. the preStop hook, ``deregister_s``: nothing sends it new connections any more (the
           Service drops a terminating pod at once, and kwok removes the pod object, so the
           endpoint picker drops it too), so it stops listening (kwok may give the address to a new
           pod); it serves what comes on the connections it has, each response with ``Connection:
           close`` so a keep-alive client comes back through the Service (a simulator kindness
           standing in for the gateway's per-request routing: vLLM keeps such a connection open);
        2. SIGTERM, as vLLM 0.33 takes it: it refuses new requests (503) and lets those in flight
           finish for up to ``shutdown_timeout_s`` (``--shutdown-timeout``; 0: none);
        3. then, or at ``grace_s`` (``terminationGracePeriodSeconds``: SIGKILL), it stops
           (``stop``), aborting what is left."""
        kill_at = time.monotonic() + grace_s
        self._closing = True
        if self._runner is not None:
            for site in list(self._runner.sites):
                await site.stop()
        await asyncio.sleep(max(0.0, min(deregister_s, grace_s)))
        self._shutting_down = True
        until = min(time.monotonic() + shutdown_timeout_s, kill_at)
        while (self._responding or any(u.has_work() for u in self.units)) and time.monotonic() < until:
            await asyncio.sleep(0.05)
        await self.stop()

    async def stop(self) -> None:
        """Stop serving and abort every request."""
        for unit in self.units:
            if unit.task:
                unit.task.cancel()
        for unit in self.units:
            if unit.task:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await unit.task
        for eng in self.engines:
            for r in list(eng.waiting) + eng.running:
                r.aborted = True
                eng.release(r)
                r.out.put_nowait(None)
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # ---------------------------------------------------------------- scheduling
    def submit(self, prompt_tokens: int, max_tokens: int | None, workload: str | float | None = None,
               prompt_ids: list[int] | None = None) -> SimRequest:
        """Queue a request on the least-loaded engine (vLLM's DP load balancing). ``prompt_ids``:
        the prompt's token ids, looked up in the prefix cache (without them nothing is cached)."""
        loop = asyncio.get_running_loop()
        p = self._default_p
        if self.k and workload is not None:
            p = perfmodel.acceptance_rate(self.config.shape.spec_method, self.k, workload)
        limit = max_tokens if max_tokens is not None else self.config.default_max_tokens
        limit = max(1, min(limit, self.config.max_model_len - prompt_tokens))
        req = SimRequest(rid=uuid.uuid4().hex, prompt_tokens=max(1, prompt_tokens), max_tokens=limit,
                         max_tokens_param=max_tokens, arrival=loop.time(), accept_p=p)
        if prompt_ids and self.config.enable_prefix_caching:
            req.block_hashes = block_hashes(prompt_ids, self.kv_blocks.block_size)
        best = min(self.engines, key=lambda e: (e.load, (e.index - self._rr) % self.dp))
        self._rr = (best.index + 1) % self.dp
        req.engine = best.index
        best.waiting.append(req)
        self.metrics["num_requests_waiting"][best.index].inc()
        self._unit_of[best.index].wake.set()
        return req

    async def _run_unit(self, unit: _Unit) -> None:
        loop = asyncio.get_running_loop()
        cfg, params = self.config, self.params
        verified = params.tokens_verified_per_seq
        clock = loop.time()
        while True:
            self._drop_aborted(unit)
            if not unit.has_work():
                self._set_gauges(unit)
                unit.wake.clear()
                await unit.wake.wait()
                clock = loop.time()
                continue
            if loop.time() - clock > RESYNC_S:  # starved of CPU: give up the lost time, do not catch up
                clock = loop.time()
            plan: list[tuple[_EngineState, list[SimRequest], list[tuple[SimRequest, int]]]] = []
            decode_seqs = prefill_tokens = 0
            for eng in unit.engines:
                while eng.waiting and len(eng.running) < cfg.max_num_seqs:
                    self._schedule(eng, eng.waiting.popleft(), clock)
                budget = cfg.max_num_batched_tokens
                decode = [r for r in eng.running if r.prefilled >= r.prompt_tokens]
                budget -= len(decode) * verified
                chunks: list[tuple[SimRequest, int]] = []
                for r in eng.running:
                    if r.prefilled < r.prompt_tokens and budget > 0 and r.ready_at <= clock:
                        chunk = min(budget, r.prompt_tokens - r.prefilled)
                        chunks.append((r, chunk))
                        budget -= chunk
                decode_seqs += len(decode)
                prefill_tokens += sum(c for _, c in chunks)
                plan.append((eng, decode, chunks))
            self._set_gauges(unit)
            if not decode_seqs and not prefill_tokens:  # only loads from the host tier in flight
                loads = [r.ready_at for eng in unit.engines for r in eng.running if r.ready_at > clock]
                if loads:
                    clock = min(loads)
                    await asyncio.sleep(max(0.0, clock - loop.time()))
                    continue
            end = clock + perfmodel.step_time(params, decode_seqs, prefill_tokens) * self.config.step_slowdown
            delay = end - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            clock = end
            unit.steps += 1
            for eng, decode, chunks in plan:
                self._apply_step(eng, decode, chunks, end)

    def _schedule(self, eng: _EngineState, r: SimRequest, clock: float) -> None:
        """Move a waiting request into the running batch; what the prefix cache holds of its
        prompt counts as prefilled (vLLM's ``get_computed_blocks`` and its prefix-cache stats), and
        so does what the host tier holds after it, once loaded (the connector's
        ``get_num_new_matched_tokens`` and its stats)."""
        m, e, size = self.metrics, eng.index, eng.cache.block_size
        local = eng.cache.match(r.block_hashes, r.prompt_tokens)
        found = 0
        if eng.host is not None:
            found = eng.host.match(r.block_hashes, local, max(0, r.prompt_tokens - 1) // size)
        r.held_blocks = eng.cache.acquire(r.block_hashes[:local + found])
        loaded = max(0, r.held_blocks - local)  # what the GPU cache had no room for is prefilled
        r.prefilled = r.held_blocks * size  # found cached: not prefilled
        r.scheduled_ts = max(clock, r.arrival)
        r.ready_at = r.scheduled_ts + loaded * self.block_load_s
        m["prefix_cache_queries"][e].inc(r.prompt_tokens)
        m["prefix_cache_hits"][e].inc(min(local, r.held_blocks) * size)
        if eng.host is not None:
            m["external_prefix_cache_queries"][e].inc(r.prompt_tokens - min(local, r.held_blocks) * size)
            m["external_prefix_cache_hits"][e].inc(loaded * size)
            m["kv_offload_load_bytes"][e].inc(loaded * self.block_bytes_all_ranks)
        eng.running.append(r)

    def _apply_step(self, eng: _EngineState, decode: list[SimRequest], chunks: list[tuple[SimRequest, int]],
                    now: float) -> None:
        m, e, k = self.metrics, eng.index, self.k
        generated = drafts = accepted_total = 0
        per_pos = [0] * k
        for r in decode:
            if r.aborted:
                continue
            accepted = perfmodel.sample_accepted(r.accept_p, k, self.rng) if k else 0
            if k:
                drafts += 1
                accepted_total += accepted
                for i in range(accepted):
                    per_pos[i] += 1
            n = min(1 + accepted, r.max_tokens - r.generated)
            m["inter_token_latency_seconds"][e].observe(now - r.last_token_ts)
            r.last_token_ts = now
            generated += n
            self._emit(r, n)
        prefilled = 0
        size = eng.cache.block_size
        for r, chunk in chunks:
            if r.aborted:
                continue
            if eng.host is not None:  # written through: every block this chunk completes
                stored = eng.host.store(r.block_hashes[r.prefilled // size:(r.prefilled + chunk) // size])
                m["kv_offload_store_bytes"][e].inc(stored * self.block_bytes_all_ranks)
            r.prefilled += chunk
            prefilled += chunk
            if r.held_blocks < len(r.block_hashes):  # cache the blocks this chunk completed
                computed = r.block_hashes[r.held_blocks:r.prefilled // size]
                r.held_blocks += eng.cache.acquire(computed)
            if r.prefilled >= r.prompt_tokens:
                m["time_to_first_token_seconds"][e].observe(now - r.arrival)
                m["prompt_tokens"][e].inc(r.prompt_tokens)
                r.first_token_ts = r.last_token_ts = now
                generated += 1
                self._emit(r, 1)
        if generated or prefilled:
            m["iteration_tokens_total"][e].observe(prefilled + generated)
            m["generation_tokens"][e].inc(generated)
        if k and drafts:
            m["spec_decode_num_drafts"][e].inc(drafts)
            m["spec_decode_num_draft_tokens"][e].inc(drafts * k)
            m["spec_decode_num_accepted_tokens"][e].inc(accepted_total)
            for i, count in enumerate(per_pos):
                if count:
                    m.per_pos[e][i].inc(count)
        for r in [r for r in eng.running if r.done]:
            eng.running.remove(r)
            eng.release(r)
            self._finish(r, now)

    def _emit(self, r: SimRequest, n: int) -> None:
        start = r.generated
        r.generated += n
        finished = r.generated >= r.max_tokens
        if finished:
            r.done = True
        r.out.put_nowait((start, n, r.end_reason if finished else None))

    def _finish(self, r: SimRequest, now: float) -> None:
        m, e = self.metrics, r.engine
        m.by_reason[r.end_reason][e].inc()
        decode_time = r.last_token_ts - r.first_token_ts
        m["e2e_request_latency_seconds"][e].observe(now - r.arrival)
        m["request_queue_time_seconds"][e].observe(r.scheduled_ts - r.arrival)
        m["request_prefill_time_seconds"][e].observe(r.first_token_ts - r.scheduled_ts)
        m["request_decode_time_seconds"][e].observe(decode_time)
        m["request_inference_time_seconds"][e].observe(r.last_token_ts - r.scheduled_ts)
        m["request_time_per_output_token_seconds"][e].observe(
            decode_time / (r.generated - 1) if r.generated > 1 else 0.0)
        m["request_prompt_tokens"][e].observe(r.prompt_tokens)
        m["request_generation_tokens"][e].observe(r.generated)
        m["request_num_preemptions"][e].observe(0)
        if r.max_tokens_param is not None:
            m["request_params_max_tokens"][e].observe(r.max_tokens_param)

    def _drop_aborted(self, unit: _Unit) -> None:
        for eng in unit.engines:
            if any(r.aborted for r in eng.waiting):
                eng.waiting = collections.deque(r for r in eng.waiting if not r.aborted)
            for r in eng.running:
                if r.aborted:
                    eng.release(r)
            eng.running = [r for r in eng.running if not r.aborted]

    def _set_gauges(self, unit: _Unit) -> None:
        m = self.metrics
        capacity = self.params.kv_free_bytes / max(1, self.params.engines_per_unit)
        for eng in unit.engines:
            m["num_requests_running"][eng.index].set(len(eng.running))
            m["num_requests_waiting"][eng.index].set(len(eng.waiting))
            ctx = sum(r.prefilled + r.generated for r in eng.running)
            used = ctx * perfmodel.KV_BYTES_PER_TOKEN + len(eng.running) * self.params.kda_state_bytes_per_seq
            m["kv_cache_usage_perc"][eng.index].set(min(1.0, used / capacity) if capacity > 0 else 1.0)

    # ---------------------------------------------------------------- HTTP
    @property
    def requires_api_key(self) -> bool:
        return bool(self._key_digests)

    def authorized(self, method: str, path: str, authorization: str | None) -> bool:
        """vLLM 0.32's ``AuthenticationMiddleware`` decision for one request (module docstring)."""
        if not self._key_digests or method == "OPTIONS" or not path.startswith(GUARDED_PREFIXES):
            return True
        if not authorization:
            return False
        scheme, _, param = authorization.partition(" ")
        if scheme.lower() != "bearer":
            return False
        digest = hashlib.sha256(param.encode("utf-8")).digest()
        match = False
        for key in self._key_digests:  # every key compared, in constant time, like vLLM
            match |= hmac.compare_digest(digest, key)
        return match

    def _make_app(self) -> web.Application:
        @web.middleware
        async def authenticate(request: web.Request, handler: Any) -> web.StreamResponse:
            if not self.authorized(request.method, request.path, request.headers.get("Authorization")):
                return web.Response(status=401, body=UNAUTHORIZED_BODY, content_type="application/json")
            return await handler(request)

        # No request size limit, like vLLM (uvicorn reads any body): aiohttp's default 1 MiB refused
        # prompts past ~150k words with 413 (a 1M-token context is several MB of text).
        app = web.Application(middlewares=[authenticate] if self._key_digests else [], client_max_size=0)

        async def close_when_draining(request: web.Request, response: web.StreamResponse) -> None:
            if self._closing:
                response.force_close()  # the connection closes after this response...
                response.headers["Connection"] = "close"  # ...and says so: the client reconnects, through the Service
        app.on_response_prepare.append(close_when_draining)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/chat/completions", self._chat)
        return app

    def _not_ready(self) -> web.Response:
        return _error(503, "The engine is loading the model.", "ServiceUnavailableError")

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(status=200) if self.ready else web.Response(status=503)

    async def _metrics(self, request: web.Request) -> web.Response:
        if not self.ready:
            return self._not_ready()
        body, content_type = self.metrics.render(request.headers.get("Accept"))
        resp = web.Response(body=body)
        resp.headers["Content-Type"] = content_type
        return resp

    async def _models(self, request: web.Request) -> web.Response:
        if not self.ready:
            return self._not_ready()
        created = int(time.time())
        return web.json_response({"object": "list", "data": [{
            "id": self.config.served_model_name, "object": "model", "created": created, "owned_by": "vllm",
            "root": self.config.model, "parent": None, "max_model_len": self.config.max_model_len,
            "permission": [{"id": f"modelperm-{uuid.uuid4().hex}", "object": "model_permission",
                            "created": created, "allow_create_engine": False, "allow_sampling": True,
                            "allow_logprobs": True, "allow_search_indices": False, "allow_view": True,
                            "allow_fine_tuning": False, "organization": "*", "group": None,
                            "is_blocking": False}]}]})

    async def _body(self, request: web.Request) -> dict[str, Any] | web.Response:
        if not self.ready:
            return self._not_ready()
        if self._shutting_down:
            return _error(503, "The engine is shutting down.", "ServiceUnavailableError")
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return _error(400, "The request body is not valid JSON.")
        if not isinstance(body, dict):
            return _error(400, "The request body must be a JSON object.")
        model = body.get("model")
        if model is not None and model != self.config.served_model_name:
            return _error(404, f"The model `{model}` does not exist.", "NotFoundError", "model")
        if body.get("n", 1) != 1:
            return _error(400, "The simulator serves n=1 only.", param="n")
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
            return _error(400, "max_tokens must be a positive integer.", param="max_tokens")
        return body

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request)
        if isinstance(body, web.Response):
            return body
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        if isinstance(prompt, str):
            ids = token_ids(prompt)
        elif isinstance(prompt, list) and prompt and all(isinstance(t, int) and 0 <= t < 2**63 for t in prompt):
            ids = prompt
        else:
            return _error(400, "prompt must be a string or a list of token ids (one prompt).", param="prompt")
        return await self._serve(request, body, ids, chat=False,
                                 key=prompt if isinstance(prompt, str) else json.dumps(prompt))

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request)
        if isinstance(body, web.Response):
            return body
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return _error(400, "messages must be a non-empty list.", param="messages")
        return await self._serve(request, body, chat_token_ids(messages), chat=True,
                                 key=json.dumps(messages, sort_keys=True))

    async def _serve(self, request: web.Request, body: dict[str, Any], ids: list[int], chat: bool,
                     key: str) -> web.StreamResponse:
        """Serve one request of prompt token ids ``ids`` whose prompt is ``key`` (its text, or its
        token ids / messages as JSON: what decides whether its output diverges,
        ``divergence.diverges_at``)."""
        n_prompt = max(1, len(ids))
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        if max_tokens is not None and n_prompt + max_tokens > self.config.max_model_len:
            return _error(400, f"This model's maximum context length is {self.config.max_model_len} tokens. "
                               f"However, you requested {n_prompt + max_tokens} tokens "
                               f"({n_prompt} in the messages, {max_tokens} in the completion).", param="max_tokens")
        if self.config.error_rate and self.rng.random() < self.config.error_rate:
            self.metrics.by_reason[FAILED_REASON][0].inc()
            return _error(500, "The engine failed the request (simulated bad release).", "InternalServerError")
        req = self.submit(n_prompt, max_tokens, body.get("kimik3_workload"), ids)
        at, offset = divergence.diverges_at(key, self.config.group_name, self.config.benign_divergence,
                                            self.config.corrupt_rate)
        return_ids = bool(body.get("return_token_ids"))
        rid = ("chatcmpl-" if chat else "cmpl-") + req.rid
        created = int(time.time())
        self._responding += 1
        try:
            if body.get("stream"):
                opts = body.get("stream_options") or {}
                return await self._stream(request, req, rid, created, chat, n_prompt,
                                          bool(opts.get("include_usage")), bool(opts.get("continuous_usage_stats")),
                                          (at, offset), return_ids)
            text: list[str] = []
            reason = None
            while reason is None:
                item = await req.out.get()
                if item is None:
                    return _error(503, "The engine stopped.", "ServiceUnavailableError")
                start, n, reason = item
                text.extend(token_text(i, at, offset) for i in range(start, start + n))
            logprobs = body.get("logprobs") if not chat and isinstance(body.get("logprobs"), int) else None
            return web.json_response(_full_response(
                rid, created, self.config.served_model_name, chat, "".join(text), reason, n_prompt, req.generated,
                [token_id(i, at, offset) for i in range(req.generated)] if return_ids else None,
                _completion_logprobs(text) if logprobs is not None else None))
        finally:
            self._responding -= 1
            if not req.done:
                req.aborted = True
                self._unit_of[req.engine].wake.set()

    async def _stream(self, request: web.Request, req: SimRequest, rid: str, created: int, chat: bool,
                      n_prompt: int, include_usage: bool, continuous: bool, diverging: tuple[int | None, int],
                      ids: bool) -> web.StreamResponse:
        """Server-sent events as vLLM 0.32 writes them (``_stream_chunk``): one chunk per engine step
        that emitted tokens (a DSpark step carries 1 + accepted tokens); chat opens with a chunk
        carrying the role, sent with the first tokens (vLLM sends it on the first engine output,
        so it marks the first token for a client); with ``include_usage``, a last chunk with no
        choices and the usage; then ``data: [DONE]``. ``diverging``: where the output leaves the
        greedy reference (``divergence.diverges_at``); ``ids``: each chunk carries its ``token_ids``."""
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8",
                                           "Cache-Control": "no-cache"})
        await resp.prepare(request)
        model = self.config.served_model_name

        async def send(doc: dict[str, Any]) -> None:
            await resp.write(b"data: " + json.dumps(doc, separators=(",", ":")).encode() + b"\n\n")

        reason = None
        while reason is None:
            item = await req.out.get()
            if item is None:
                break
            start, n, reason = item
            if chat and start == 0:
                await send(_chat_role_chunk(rid, created, model, n_prompt if include_usage and continuous else None))
            text = "".join(token_text(i, *diverging) for i in range(start, start + n))
            usage = (n_prompt, start + n) if include_usage and continuous else None
            await send(_stream_chunk(rid, created, model, chat, text, reason, usage,
                                     [token_id(i, *diverging) for i in range(start, start + n)] if ids else None))
        if include_usage and reason is not None:
            await send({"id": rid, "object": "chat.completion.chunk" if chat else "text_completion",
                        "created": created, "model": model, "choices": [],
                        "usage": _usage(n_prompt, req.generated)})
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


# The answers below follow vLLM 0.32's protocol classes field for field, in their order
# (vllm/entrypoints/openai/{completion,chat_completion}/protocol.py, UsageInfo in
# vllm/entrypoints/serve/engine/protocol.py) as its serving code writes them: a whole response with
# ``model_dump()`` (every field, None included), a stream chunk with ``model_dump_json(exclude_unset=True)``
# (the fields the serving code passed, None included), the last usage chunk without None fields.


def _usage(prompt: int, completion: int, *, details: tuple[str, ...] = ()) -> dict[str, Any]:
    """``UsageInfo``: the three counts, then ``details`` (the None-valued fields a dump carries)."""
    return {"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion,
            **dict.fromkeys(details)}


def _full_response(rid: str, created: int, model: str, chat: bool, text: str, reason: str,
                   prompt: int, completion: int, token_ids: list[int] | None = None,
                   logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
    """A whole ``CompletionResponse`` / ``ChatCompletionResponse`` (``"stream": false``);
    ``token_ids``: the output's (``return_token_ids``); ``logprobs``: a completion's (``logprobs``)."""
    usage = _usage(prompt, completion, details=("prompt_tokens_details", "completion_tokens_details"))
    if chat:
        message = {"role": "assistant", "content": text, "refusal": None, "annotations": None, "audio": None,
                   "function_call": None, "reasoning": None}  # tool_calls: dropped when empty
        choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": reason, "stop_reason": None,
                  "token_ids": token_ids, "routed_experts": None}
        return {"id": rid, "object": "chat.completion", "created": created, "model": model, "choices": [choice],
                "service_tier": None, "system_fingerprint": None, "usage": usage, "prompt_logprobs": None,
                "prompt_token_ids": None, "prompt_text": None, "kv_transfer_params": None,
                "ec_transfer_params": None, "metrics": None}
    choice = {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": reason, "stop_reason": None,
              "token_ids": token_ids, "prompt_logprobs": None, "prompt_token_ids": None, "routed_experts": None}
    return {"id": rid, "object": "text_completion", "created": created, "model": model, "choices": [choice],
            "service_tier": None, "system_fingerprint": None, "usage": usage, "kv_transfer_params": None,
            "ec_transfer_params": None, "metrics": None}


def _chat_role_chunk(rid: str, created: int, model: str, continuous_prompt: int | None) -> dict[str, Any]:
    """The first chat chunk: the role and empty content (with ``continuous_usage_stats``: usage of
    ``continuous_prompt`` prompt tokens and none generated)."""
    doc: dict[str, Any] = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
                           "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                        "logprobs": None, "finish_reason": None}]}
    if continuous_prompt is not None:
        doc["usage"] = _usage(continuous_prompt, 0, details=("completion_tokens_details",))
    doc["prompt_token_ids"] = doc["prompt_text"] = None
    return doc


def _completion_logprobs(tokens: list[str]) -> dict[str, Any]:
    """A completion's ``logprobs`` (vLLM's ``CompletionLogProbs``) for greedy ``tokens``: each
    token's text and offset; the simulated model is certain of each (log-probability 0), and
    only the sampled token is listed (``logprobs: 0``)."""
    offsets = [sum(len(t) for t in tokens[:i]) for i in range(len(tokens))]
    return {"text_offset": offsets, "token_logprobs": [0.0] * len(tokens), "tokens": tokens,
            "top_logprobs": [{t: 0.0} for t in tokens]}


def _stream_chunk(rid: str, created: int, model: str, chat: bool, text: str, reason: str | None,
                  usage: tuple[int, int] | None, token_ids: list[int] | None = None) -> dict[str, Any]:
    """One chunk of generated text; ``stop_reason`` only on the last chat chunk (on every
    completions chunk); ``usage`` (prompt, completion tokens so far) with ``continuous_usage_stats``."""
    if chat:
        choice: dict[str, Any] = {"index": 0, "delta": {"content": text}, "logprobs": None, "finish_reason": reason}
        if reason is not None:
            choice["stop_reason"] = None
        choice["token_ids"] = token_ids
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason, "stop_reason": None,
                  "prompt_token_ids": None, "token_ids": token_ids}
    doc: dict[str, Any] = {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion",
                           "created": created, "model": model, "choices": [choice]}
    if usage is not None:
        doc["usage"] = _usage(*usage, details=("completion_tokens_details",) if chat else ())
    return doc


def _error(status: int, message: str, kind: str = "BadRequestError", param: str | None = None) -> web.Response:
    return web.json_response({"error": {"message": message, "type": kind, "param": param, "code": status}},
                             status=status)
