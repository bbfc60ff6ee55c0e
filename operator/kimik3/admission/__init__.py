"""The one front door: every KimiK3Deployment spec passes ``admit()`` before anything uses it.

``admit(spec_dict, policy)`` parses the spec (the schema of ``kimik3.api.v1alpha1``), runs every
rule of every concern (one module each: ``shape``, ``memory``, ``batch``, ``megakernel``, ``speculative``,
``extra_args``, ``api_keys``, ``source``, ``autoscaling``, ``idle``, ``disruption``, ``placement``,
``rollout``) and returns one
``Admitted`` value: the parsed spec, its group plan, every duration in seconds and the settings
vLLM 0.33 will override without an error (warnings, ``kimik3.engine.overrides``). It raises
``SpecErrors`` with every problem found, each with its field path, so ``kimik3 validate`` and the
controller report them all at once.

Each concern's ``Table`` pairs each Python check with the CEL rules of the CRD that refuse the
same specs on the API server, or says why the check is the operator's alone
(``kimik3.admission.rules``). The controller admits once per reconcile and hands the same
``Admitted`` to render, status and the autoscaler.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from kimik3.admission.api_keys import API_KEYS
from kimik3.admission.autoscaling import AUTOSCALING
from kimik3.admission.batch import BATCH
from kimik3.admission.disruption import DISRUPTION
from kimik3.admission.extra_args import EXTRA_ARGS
from kimik3.admission.idle import IDLE
from kimik3.admission.megakernel import MEGAKERNEL
from kimik3.admission.memory import MEMORY
from kimik3.admission.placement import PLACEMENT
from kimik3.admission.rollout import ROLLOUT
from kimik3.admission.rules import AdmissionPolicy, Candidate, Table
from kimik3.admission.shape import SHAPE
from kimik3.admission.source import SOURCE
from kimik3.admission.speculative import SPECULATIVE
from kimik3.api.errors import SpecError, SpecErrors, from_validation_error
from kimik3.api.v1alpha1 import EngineOverride, KimiK3DeploymentSpec, duration_seconds
from kimik3.engine.overrides import engine_overrides
from kimik3.topology.plan import GroupPlan, plan_group

__all__ = ["PROGRESS_MARGIN_S", "TABLES", "AdmissionPolicy", "Admitted", "Seconds", "Table", "admit"]

TABLES: tuple[Table, ...] = (SHAPE, MEMORY, BATCH, MEGAKERNEL, SPECULATIVE, EXTRA_ARGS, API_KEYS, SOURCE, AUTOSCALING,
                             IDLE, DISRUPTION, PLACEMENT, ROLLOUT)
"""Every concern's rules, in the order their problems are reported."""


PROGRESS_MARGIN_S = 600.0
"""Added to ``probes.loadTimeout`` for the default progress deadline, seconds: a group's pods must
be scheduled and pull the engine image (~20 GB for vLLM 0.33's image: about 3 min at 1 Gb/s, more
on a busy registry) before the load the startup probe allows ``loadTimeout`` for."""


@dataclass(frozen=True)
class Seconds:
    """Every duration of the spec (Go-style strings such as ``90m``), in seconds."""

    load_timeout: float
    """``probes.loadTimeout``: the leader's startup-probe budget and VLLM_ENGINE_READY_TIMEOUT_S."""
    leader_address_timeout: float
    """``probes.leaderAddressTimeout``: how long a worker waits for the leader's address."""
    drain_timeout: float
    """``probes.drainTimeout``: how long the requests in flight on a group that goes may take to finish."""
    latency_target: float
    """``autoscaling.target.value``: the decode latency held at the target percentile."""
    autoscaling_interval: float
    """``autoscaling.interval``: time between decisions."""
    autoscaling_window: float
    """``autoscaling.window``: window of the histogram quantile."""
    scale_up_stabilization: float
    """``autoscaling.scaleUpStabilization``."""
    scale_down_stabilization: float
    """``autoscaling.scaleDownStabilization``."""
    scrape_interval: float
    """``monitoring.interval``: the PodMonitor's scrape interval."""
    progress_deadline: float
    """``rollout.progressDeadline``, else ``probes.loadTimeout`` + ``PROGRESS_MARGIN_S``: how long
    new-revision groups may take to turn Ready before the release is rolled back."""
    canary_bake: float | None = None
    """``rollout.canary.bake``; None without a canary."""
    canary_interval: float | None = None
    """``rollout.canary.analysis.interval``: time between canary checks; None without a canary."""
    canary_max_latency: float | None = None
    """``rollout.canary.analysis.maxLatency``, else ``autoscaling.target.value``; None without a canary."""
    ttft_target: float | None = None
    """``autoscaling.ttftTarget.value``: the time to first token held at its percentile; None without one."""
    idle_stop_after: float | None = None
    """``idle.stopAfter``: the time without a request after which the deployment stops; None: never."""

    @classmethod
    def of(cls, spec: KimiK3DeploymentSpec) -> Seconds:
        a, p, canary = spec.autoscaling, spec.probes, spec.rollout.canary
        return cls(
            load_timeout=duration_seconds(p.load_timeout),
            leader_address_timeout=duration_seconds(p.leader_address_timeout),
            drain_timeout=duration_seconds(p.drain_timeout),
            latency_target=duration_seconds(a.target.value),
            autoscaling_interval=duration_seconds(a.interval),
            autoscaling_window=duration_seconds(a.window),
            scale_up_stabilization=duration_seconds(a.scale_up_stabilization),
            scale_down_stabilization=duration_seconds(a.scale_down_stabilization),
            scrape_interval=duration_seconds(spec.monitoring.interval),
            progress_deadline=(duration_seconds(spec.rollout.progress_deadline) if spec.rollout.progress_deadline
                               else duration_seconds(p.load_timeout) + PROGRESS_MARGIN_S),
            canary_bake=duration_seconds(canary.bake) if canary else None,
            canary_interval=duration_seconds(canary.analysis.interval) if canary else None,
            canary_max_latency=duration_seconds(canary.analysis.max_latency or a.target.value) if canary else None,
            ttft_target=duration_seconds(a.ttft_target.value) if a.ttft_target else None,
            idle_stop_after=duration_seconds(spec.idle.stop_after) if spec.idle.stop_after else None,
        )


@dataclass(frozen=True)
class Admitted:
    """A spec that passed every rule: what render, status, the autoscaler, the simulator and the
    benchmark take (computed once per reconcile). Derived sizes (GPUs per node and per group,
    nodes per group, whether a ComputeDomain is needed) are the plan's."""

    spec: KimiK3DeploymentSpec
    """The parsed spec (defaults filled in)."""
    plan: GroupPlan
    """The parallel plan of one engine group."""
    seconds: Seconds
    """The spec's durations in seconds."""
    overrides: tuple[EngineOverride, ...] = ()
    """Settings vLLM 0.33 will change or narrow without an error (``kimik3.engine.overrides``): warnings, not refusals."""

    @property
    def target_quantile(self) -> float:
        """``autoscaling.target.percentile`` as a fraction (90 -> 0.9)."""
        return self.spec.autoscaling.target.percentile / 100


def admit(spec: dict[str, Any], policy: AdmissionPolicy = AdmissionPolicy()) -> Admitted:
    """Parse and check a spec (camelCase, as in the CR). Raises SpecErrors listing every problem
    with its field path: the schema's, or else every rule's."""
    try:
        parsed = KimiK3DeploymentSpec.model_validate(spec)
    except ValidationError as exc:
        raise SpecErrors(from_validation_error(exc)) from None
    candidate = Candidate(parsed, policy)
    errors: list[SpecError] = [e for table in TABLES for e in table.errors(candidate)]
    if errors:
        raise SpecErrors(errors)
    plan = plan_group(parsed)
    return Admitted(parsed, plan, Seconds.of(parsed), tuple(engine_overrides(parsed, plan)))
