"""How a simulated engine starts: from what the operator rendered for its pod, as vLLM would.

A kubelet starts a leader pod's engine container with the rendered command (the in-pod launcher,
``kimik3.engine.launcher``), env and volumes; the launcher reads the launch plan from the
ConfigMap mounted at ``/etc/kimik3`` and execs ``vllm serve`` with its rank's arguments.
``launch(pod, read_configmap)`` takes the same steps short of the exec:

1. the plan file is the one the launcher reads (``launcher.plan_path``: an argument after the
   launcher script in the container command, else ``KIMIK3_PLAN`` of the container env, else
   its default), found through the container's volume mounts in a key of a ConfigMap
   (``podenv``); a missing ConfigMap or key is what a kubelet would not start the container
   for (``LaunchUnresolved``);
2. the argv is ``launcher.build_argv`` of that plan with the container's ``LWS_*`` variables
   (set by LeaderWorkerSet), without waiting for the leader's address (pods under kwok have no
   DNS);
   The plan's ``startDelaySeconds`` (the launcher's start back-off for a deployment whose groups
   keep failing, kimik3.controller.recreation) is ``Launch.start_delay_s``: the supervisor adds it
   to the engine's load time, as the launcher waits that long before it starts vLLM. The group
   watchdog of worker ranks is not simulated (the simulator runs no worker engines);
3. ``engine_config(argv, accelerator, variant)`` reads that argv with ``argparse``: the flags of
   ``vllm serve`` (vLLM 0.33) that decide how the simulated engine behaves.

====================================== ========================================================
argv                                   simulated engine (``EngineConfig``)
====================================== ========================================================
``vllm serve MODEL``                   ``model`` (``/v1/models``' root), and the served name
                                       when ``--served-model-name`` is not given (vLLM's rule)
``--served-model-name``                ``served_model_name``: the ``model_name`` label, the
                                       model a request must name
``--port``                             must be the container's ``http`` port (what the probes,
                                       the Service and the PodMonitor reach), else no engine
``--max-model-len``                    ``max_model_len``
``--max-num-seqs``                     requests in the running batch (more wait)
``--max-num-batched-tokens``           prompt tokens one step prefills
``--gpu-memory-utilization``           KV-cache capacity and prefix-cache blocks (perf model)
``--[no-]enable-prefix-caching``       ``enable_prefix_caching`` (on unless told, as vLLM 0.33
                                       has it for K3)
``--kv-offloading-size``               ``EngineShape.kv_offload_gib``: the host tier of each
                                       engine's prefix cache (GiB over its ranks, perf model)
``--tensor-parallel-size``,            the group's shape: step times and data-parallel engines
``--pipeline-parallel-size``,          (perf model); ``--data-parallel-size`` above 1 is
``--data-parallel-size``,              ``dep`` with TP 1 and expert parallelism, else ``tp-dp``
``--enable-expert-parallel``
``--additional-config``                ``decode_backend``: ``latency_specialized`` is the
                                       megakernel path's step times, else stock
``--speculative-config``               ``method`` and ``num_speculative_tokens``: drafts per
                                       step and their acceptance (perf model)
``--custom-histogram-buckets``         the bounds of each bucket family it names (vLLM 0.33's
                                       ``ObservabilityConfig``), e.g. finer ITL buckets
``--shutdown-timeout``                 ``Exit.shutdown_timeout_s``: how long the engine lets
                                       its requests finish after SIGTERM (0: aborts them)
====================================== ========================================================

How the engine ends when its pod is deleted (``Exit``, ``exit_of``) comes from the pod as a
kubelet reads it: the preStop hook (the launcher's ``drain DEREGISTER_S TIMEOUT_S``: the leader
fails readiness for DEREGISTER_S before SIGTERM, serving what still comes), vLLM's
``--shutdown-timeout`` and the pod's ``terminationGracePeriodSeconds`` (SIGKILL after it).

Flags the simulator does not model are accepted and ignored (vLLM's own parser checks them:
tests/conformance). What vLLM does not read from its command line comes from where vLLM gets it:
the GPU model from the node (here the pod's ``nvidia.com/gpu.product`` node selector), the
checkpoint's quantization from the weights (the simulator has none: the CR's
``spec.model.variant``).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn

from kimik3.autoscaler.perfmodel import EngineShape
from kimik3.engine import launcher
from kimik3.engine.args import API_PORT_NAME
from kimik3.kube.accelerators import PROFILES
from kimik3.kube.labels import PRODUCT_LABEL
from kimik3.render.configmap import LAUNCHER_KEY
from kimik3.render.leaderworkerset import CONTAINER
from kimik3_dev.sim import podenv
from kimik3_dev.sim.engine import EngineConfig

ENGINE_COMMAND = ("vllm", "serve")
LAUNCHER_ENV = ("LWS_WORKER_INDEX", "LWS_GROUP_SIZE", "LWS_LEADER_ADDRESS", "KIMIK3_PLAN")
"""The variables the in-pod launcher reads."""
ACCELERATOR_BY_PRODUCT = {p.product_label: p.name for p in PROFILES.values()}


DEFAULT_GRACE_S = 30
"""terminationGracePeriodSeconds the API server gives a pod that sets none."""


@dataclass(frozen=True)
class Exit:
    """How a pod's engine ends once the pod is deleted (module docstring), seconds."""

    deregister_s: float = 0.0
    """The preStop hook: the engine serves on, its readiness failing, before SIGTERM."""
    shutdown_timeout_s: float = 0.0
    """vLLM's ``--shutdown-timeout``: after SIGTERM, how long the requests in flight may finish."""
    grace_s: float = DEFAULT_GRACE_S
    """``terminationGracePeriodSeconds``: counted from the deletion, then SIGKILL."""


def exit_of(pod_spec: dict[str, Any], argv: list[str] | tuple[str, ...]) -> Exit:
    """The ``Exit`` of the engine container in ``pod_spec`` (camelCase) running ``argv``. A preStop
    hook other than the launcher's ``drain`` is taken as instant."""
    command = (((podenv.container(pod_spec, CONTAINER).get("lifecycle") or {}).get("preStop") or {})
               .get("exec") or {}).get("command") or []
    deregister_s = 0.0
    for i, arg in enumerate(command[:-1]):
        if arg == "drain" and i > 0 and str(command[i - 1]).endswith(LAUNCHER_KEY):
            try:
                deregister_s = float(command[i + 1])
            except ValueError:
                raise LaunchUnresolved(f"the preStop hook's DEREGISTER_S {command[i + 1]!r} is not a number") from None
    grace = pod_spec.get("terminationGracePeriodSeconds")
    return Exit(deregister_s, float(_parse(argv).shutdown_timeout),
                float(DEFAULT_GRACE_S if grace is None else grace))


class LaunchUnresolved(Exception):
    """The engine would not serve: the kubelet would not start the container, the launcher or
    vLLM would refuse what they were given, or vLLM would listen where nothing reaches it."""


@dataclass(frozen=True)
class Launch:
    """What one pod's engine container would run."""

    argv: tuple[str, ...]
    """``vllm serve ...``: the plan's command and this rank's arguments."""
    group_size: int
    """Pods of the group (the plan's ranks)."""
    accelerator: str
    """``kimik3.kube.accelerators`` profile of the node the pod asks for."""
    start_delay_s: float = 0.0
    """The plan's ``startDelaySeconds``: how long the launcher waits before starting vLLM."""
    port: int = 8000
    """``--port``: where vLLM listens in the pod (checked to be the container's API port)."""
    on_delete: Exit = Exit()
    """How the engine ends when the pod is deleted."""


def launch(pod: dict[str, Any], read_configmap: Callable[[str], dict[str, Any] | None]) -> Launch:
    """The engine container's launch in ``pod`` (camelCase, as the API server serves it).
    ``read_configmap(name)``: the ConfigMap ``name`` of the pod's namespace (``{"data": ...}``), or
    None when it does not exist (``podenv.EnvUnresolved`` when it cannot tell). Raises
    ``LaunchUnresolved`` (module docstring)."""
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    namespace = meta.get("namespace", "")
    try:
        env = {name: value for name in LAUNCHER_ENV
               if (value := podenv.resolve(podenv.env_entry(spec, name, CONTAINER), namespace,
                                           lambda _: None, meta)) is not None}
        command = podenv.container(spec, CONTAINER).get("command") or []
        path = launcher.plan_path([*command[2:], *(podenv.container(spec, CONTAINER).get("args") or [])], env)
        name, key = podenv.mounted_configmap_key(spec, CONTAINER, path)
        configmap = read_configmap(name)
    except podenv.EnvUnresolved as exc:
        raise LaunchUnresolved(str(exc)) from None
    if configmap is None:
        raise LaunchUnresolved(f'configmap "{name}" not found')
    if key not in (configmap.get("data") or {}):
        raise LaunchUnresolved(f"couldn't find key {key} in ConfigMap {namespace}/{name}")
    try:
        plan = json.loads(configmap["data"][key])
        argv = launcher.build_argv(plan, env, wait=False)
    except ValueError as exc:
        raise LaunchUnresolved(f"the launcher cannot read {path} (ConfigMap {name}, key {key}): {exc}") from None
    except launcher.LaunchError as exc:
        raise LaunchUnresolved(f"the launcher exits {exc.code}: {exc}") from None
    product = (spec.get("nodeSelector") or {}).get(PRODUCT_LABEL)
    if product not in ACCELERATOR_BY_PRODUCT:
        raise LaunchUnresolved(f"the pod asks for no known GPU ({PRODUCT_LABEL} node selector: {product!r})")
    port = next((p.get("containerPort") for p in podenv.container(spec, CONTAINER).get("ports") or []
                 if p.get("name") == API_PORT_NAME), None)
    served_port = _parse(argv).port
    if port != served_port:
        raise LaunchUnresolved(f"vLLM would listen on port {served_port}, the pod's {API_PORT_NAME} port is {port}: "
                               "no probe, Service or scrape would reach it")
    return Launch(tuple(argv), len(plan["ranks"]), ACCELERATOR_BY_PRODUCT[product],
                  float(plan.get("startDelaySeconds") or 0), served_port, exit_of(spec, argv))


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise LaunchUnresolved(f"vllm serve would refuse its arguments: {message}")


def _json_object(text: str) -> dict[str, Any]:
    value = json.loads(text)
    if not isinstance(value, dict):
        raise ValueError("not a JSON object")
    return value


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="vllm serve", add_help=False, allow_abbrev=False)
    p.add_argument("model")
    p.add_argument("--served-model-name")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--max-model-len", type=int)
    p.add_argument("--max-num-seqs", type=int)
    p.add_argument("--max-num-batched-tokens", type=int)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    p.add_argument("--pipeline-parallel-size", "-pp", type=int, default=1)
    p.add_argument("--data-parallel-size", "-dp", type=int, default=1)
    p.add_argument("--enable-expert-parallel", "-ep", action="store_true")
    p.add_argument("--additional-config", type=_json_object, default={})
    p.add_argument("--speculative-config", "-sc", type=_json_object)
    p.add_argument("--custom-histogram-buckets", type=_json_object)
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--kv-offloading-size", type=float)
    p.add_argument("--shutdown-timeout", type=int, default=0)
    return p


PARSER = _parser()


def _parse(argv: list[str] | tuple[str, ...]) -> argparse.Namespace:
    if tuple(argv[:2]) != ENGINE_COMMAND:
        raise LaunchUnresolved(f"the plan's command is {' '.join(argv[:2])!r}, not {' '.join(ENGINE_COMMAND)!r}")
    args, _ = PARSER.parse_known_args(list(argv[2:]))
    return args


def engine_config(argv: list[str] | tuple[str, ...], accelerator: str, variant: str = "mxfp4",
                  **overrides: Any) -> EngineConfig:
    """The simulated engine ``argv`` (``vllm serve ...``) describes on ``accelerator`` with
    weights of ``variant`` (module docstring); ``overrides``: other ``EngineConfig`` fields (load
    time, workload, seed). Raises ``LaunchUnresolved`` for arguments vLLM would refuse."""
    a = _parse(argv)
    sc = a.speculative_config or {}
    tp, dp = a.tensor_parallel_size, a.data_parallel_size
    shape = EngineShape(
        accelerator=accelerator,
        strategy="tp" if dp == 1 else ("dep" if tp == 1 and a.enable_expert_parallel else "tp-dp"),
        tensor_parallel_size=tp, pipeline_parallel_size=a.pipeline_parallel_size, data_parallel_size=dp,
        expert_parallel=a.enable_expert_parallel,
        decode_backend=a.additional_config.get("decode_backend", "stock"),
        spec_method=sc.get("method", "none") if sc else "none",
        num_speculative_tokens=int(sc.get("num_speculative_tokens") or 0),
        gpu_memory_utilization=a.gpu_memory_utilization, variant=variant,
        kv_offload_gib=int(a.kv_offloading_size or 0))
    values: dict[str, Any] = dict(shape=shape, model=a.model, served_model_name=a.served_model_name or a.model,
                                  enable_prefix_caching=a.enable_prefix_caching)
    for field_name in ("max_model_len", "max_num_seqs", "max_num_batched_tokens"):
        if getattr(a, field_name) is not None:
            values[field_name] = getattr(a, field_name)
    if a.custom_histogram_buckets:  # vLLM 0.33's ObservabilityConfig: bucket family -> upper bounds
        values["buckets_override"] = {k: tuple(float(b) for b in v) for k, v in a.custom_histogram_buckets.items()}
    return EngineConfig(**(values | overrides))
