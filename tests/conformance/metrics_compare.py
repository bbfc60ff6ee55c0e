"""Compare two Prometheus expositions by structure: family names, types, label names, buckets.

Used to hold the engine simulator (kimik3_dev.sim) to real vLLM's ``/metrics``. ``_created`` series
are left out on both sides: prometheus-client adds them per counter/histogram in a single-process
server (real vLLM 0.32 behind its API server shows them as gauges named ``..._created``); nothing
reads them, and the simulator omits them on purpose.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families


@dataclass(frozen=True)
class Family:
    type: str
    label_names: frozenset[str]
    buckets: tuple[float, ...] | None


def structure(text: str, prefix: str = "vllm:") -> dict[str, Family]:
    """{family name: Family} of the ``prefix`` families of an exposition."""
    out = {}
    for fam in text_string_to_metric_families(text):
        if not fam.name.startswith(prefix) or fam.name.endswith("_created"):
            continue
        samples = [s for s in fam.samples if not s.name.endswith("_created")]
        labels = frozenset(k for s in samples for k in s.labels if k != "le")
        buckets = None
        if fam.type == "histogram":
            bounds = sorted({float(s.labels["le"]) for s in samples if s.name.endswith("_bucket")})
            buckets = tuple(bounds)
        out[fam.name] = Family(fam.type, labels, buckets)
    return out


def differences(real_text: str, sim_text: str, required: Iterable[str]) -> list[str]:
    """Every way the simulator's exposition differs from the real one: a family the simulator
    exposes must exist in the real one with the same type, label names and buckets; every
    ``required`` family (what the autoscaler reads) must exist on both sides."""
    real, sim = structure(real_text), structure(sim_text)
    out = []
    for name in sorted(required):
        for side, fams in (("real vLLM", real), ("simulator", sim)):
            if name not in fams:
                out.append(f"{name}: missing from the {side}'s exposition")
    for name, s in sorted(sim.items()):
        r = real.get(name)
        if r is None:
            out.append(f"{name}: the simulator exposes it, real vLLM does not")
            continue
        if s.type != r.type:
            out.append(f"{name}: type {s.type} in the simulator, {r.type} in real vLLM")
        if s.label_names != r.label_names:
            out.append(f"{name}: label names {sorted(s.label_names)} in the simulator, {sorted(r.label_names)} in real vLLM")
        if s.buckets != r.buckets:
            out.append(f"{name}: buckets {s.buckets} in the simulator, {r.buckets} in real vLLM")
    return out
