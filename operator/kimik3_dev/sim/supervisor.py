"""Runs one simulated engine per running engine group of every KimiK3Deployment.

Every ``poll_interval`` seconds (2 s by default) it lists, through the core's client (``Kube``),
the KimiK3Deployments and the pods of their LeaderWorkerSets (labels
``inference.kimik3.io/deployment=<cr>`` and ``leaderworkerset.sigs.k8s.io/name``; during a
rollout a deployment has two), and for every group (label ``group-index``)
whose pods all exist (as many as the launch plan has ranks), are not terminating and are
``Running``, and whose leader has an IP (``status.podIP``: kwok hands out loopback addresses,
``kimik3_dev.devcluster.podnet``), it keeps one ``SimEngine`` listening where vLLM would: on the
leader pod's IP and the rendered ``--port`` (the container's API port), configured from what the
operator rendered for the group's leader pod, as vLLM would be: the ``vllm serve`` argv the
in-pod launcher builds from the launcher ConfigMap's plan and the pod's env
(``kimik3_dev.sim.launch``), read once per leader pod UID, when its engine starts (a kubelet
starts the container once). The CR's spec is not read for it, so a wrong flag or value in the
operator's argument builder changes what the simulated engine does; an edit the operator refuses
(or has not rendered yet) changes nothing. A group whose launch cannot be resolved (the
ConfigMap missing, a plan the launcher refuses, ``--port`` not the pod's) gets no engine, with a
warning, retried every poll. A group that goes away (scale-down, deletion, a pod no longer
Running) stops its engine; a group recreated under a new leader pod UID restarts it, with a new
load time. kwok may give a new pod the address of a deleted one whose engine still drains: the
new engine then starts once that drain ends (a kubelet would not reuse an address so soon).

It writes, atomically (temp file + rename), under ``<state-dir>/sim/``,
``services.json``: where each Service's stand-in listens (``kimik3_dev.sim.services``), and
``usage.json``: the engines' own counts (``USAGE_FILE``, ``Supervisor.usage``), which a Prometheus
scraping them can be checked against (``kimik3_dev.devcluster.usagecheck``).
Prometheus finds the engines itself, as on a cluster: Kubernetes service discovery of the leader
pods through the PodMonitor the operator renders (``kimik3_dev.devcluster.promoperator``).

Services: every poll it also lists the Services and plays kube-proxy for them
(``kimik3_dev.sim.services``): connections to a Service spread over the Ready pods it selects, at
its targetPort, as the API server says. The client Service the operator renders selects the
group leaders, so a client of the Service reaches the engines at their pod IPs.

API key: when the leader pod's engine container has ``VLLM_API_KEY`` in its env (a ``value``, or
``valueFrom.secretKeyRef`` as ``render/leaderworkerset.py`` writes it for ``spec.service.apiKeySecret``),
the engine requires it on ``/v1`` exactly like vLLM (``kimik3_dev.sim.engine``). It is resolved like
a kubelet does (``kimik3_dev.sim.podenv``): once, when the engine starts for that leader pod UID (a
later change of the Secret reaches a group only when its pods are recreated), by reading the
Secret from the API server; a missing Secret or key leaves the group without an engine (the
kubelet would not start the container), with a warning naming the Secret, retried every poll.
The key is never logged nor written to a file.

Readiness: the supervisor plays the kubelet's prober: each poll it sends the leader container's
readinessProbe (``httpGet`` path and port, its ``timeoutSeconds``) to the leader pod's IP, Ready
after one success and not Ready after ``failureThreshold`` failures in a row (a leader whose engine
stopped: at once), as the kubelet counts. With
``readiness_probes`` (``dev up --readiness-probes``) kwok leaves a pod with a readinessProbe
unready, and the supervisor sets the leader pod's ``Ready`` and ``ContainersReady`` conditions (and
its container's ``ready``) to whether the probe answered 200, so the LeaderWorkerSet sees a group
Ready only after its load time. Without it kwok marks every pod Ready at once and the API server
cannot tell a loading engine from a loaded one; the Service stand-in then also requires the
probe's last answer, which is what the Ready condition would have said. The leader's readiness
probe is the launcher's ``ready PORT`` (an exec probe: ``kimik3.engine.launcher``), played as
what it does in the pod: vLLM's ``/health`` on PORT until the pod's drain began. A group that
goes away (its pods deleted) drains as its leader pod says (``launch.Exit``: the preStop hook's
wait, vLLM's ``--shutdown-timeout``, the pod's ``terminationGracePeriodSeconds``): the Service
opens it no new connection, its engine stops listening (kwok may give the address to a new pod)
and serves the connections it has through the preStop, then finishes the requests it holds after
SIGTERM (``SimEngine.drain``).

A bad release, to rehearse a rollback: the engine container's env (``spec.engine.env``, so it
is part of the group templates and rolls out like a new image) may carry
``KIMIK3_SIM_SLOWDOWN`` (a factor on every engine step, e.g. ``2`` for a release twice as slow),
``KIMIK3_SIM_LOAD_TIME`` (this release's load time, a duration such as ``40s``) and
``KIMIK3_SIM_ERROR_RATE`` (the share of requests it fails, e.g. ``0.2``),
``KIMIK3_SIM_CORRUPT_RATE`` (the share of prompts whose greedy output leaves the reference, latency
unchanged: a release that corrupts its outputs, ``kimik3_dev.sim.divergence``) and
``KIMIK3_SIM_BENIGN_DIVERGENCE`` (the benign divergence of its healthy groups, default
``divergence.BENIGN_DIVERGENCE``); read when the engine starts for a leader pod, like the rest of
its env. A release that never becomes Ready: ``KIMIK3_SIM_LOAD_TIME`` past the startup probe's
``probes.loadTimeout``, or ``KIMIK3_SIM_EXIT_CODE`` below. A bad value gives the group no engine, with a
warning naming the variable. ``KIMIK3_SIM_EXIT_CODE`` (1-255) is a release that crashes at
start-up (a bad argument, missing weights): the group gets no engine; once the plan's
``startDelaySeconds`` have passed (the launcher's start back-off) the supervisor writes the
leader pod's status as the kubelet would after the container exited with that code (state
``terminated``, reason ``Error``, phase ``Failed``), and the LeaderWorkerSet recreates the group.

Per-CR annotations (simulator only): ``inference.kimik3.io/sim-load-time`` (a duration such as
``90s``) and ``inference.kimik3.io/sim-workload`` (``code``, ``chat``, ``creative``, ... or an
acceptance length) override the command's defaults for that deployment's engines. The CR's
``spec.model.variant`` stands for the checkpoint's quantization, which vLLM reads from the weights.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import json
import logging
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from kimik3.api.v1alpha1 import ModelSpec, duration_seconds
from kimik3.kube.kinds import CONFIG_MAP, GROUP, KIMIK3_DEPLOYMENT, POD, SERVICE
from kimik3.kube import pods as kpods
from kimik3.kube.labels import DEPLOYMENT_LABEL, LWS_NAME_LABEL, LWS_REVISION_LABEL
from kimik3.kube.objects import is_deleting
from kimik3.engine.args import API_KEY_ENV
from kimik3.kube.times import rfc3339
from kimik3.render.configmap import LAUNCHER_KEY
from kimik3.render.leaderworkerset import CONTAINER
from kimik3.render.meta import engine_set_name
from kimik3_dev.sim import launch, podenv, services
from kimik3_dev.sim.divergence import BENIGN_DIVERGENCE
from kimik3_dev.sim.engine import SimEngine

log = logging.getLogger(__name__)

LOAD_TIME_ANNOTATION = f"{GROUP}/sim-load-time"
WORKLOAD_ANNOTATION = f"{GROUP}/sim-workload"
DEFAULT_POLL_INTERVAL_S = 2.0
API_TIMEOUT_S = 10.0
"""Bound on one list call to the API server, seconds."""
DEFAULT_PROBE_TIMEOUT_S = 1.0
"""A probe's ``timeoutSeconds`` when the pod does not set it (the kubelet's default)."""
DEFAULT_FAILURE_THRESHOLD = 3
"""A probe's ``failureThreshold`` when the pod does not set it (the kubelet's default)."""
READINESS_CONDITIONS = ("Ready", "ContainersReady")
RELEASE_ENV = {"KIMIK3_SIM_SLOWDOWN": "step_slowdown", "KIMIK3_SIM_LOAD_TIME": "load_time_s",
               "KIMIK3_SIM_ERROR_RATE": "error_rate", "KIMIK3_SIM_CORRUPT_RATE": "corrupt_rate",
               "KIMIK3_SIM_BENIGN_DIVERGENCE": "benign_divergence"}
"""The engine env of a simulated bad release -> the ``EngineConfig`` field it sets (module docstring)."""
RATE_FIELDS = frozenset({"error_rate", "corrupt_rate", "benign_divergence"})
"""The ``RELEASE_ENV`` fields that are shares, in [0, 1]."""
USAGE_FILE = "usage.json"
"""``[{"namespace", "deployment", "revision", "engines", "counters": {name: value}}, ...]``: every
counter of every engine the supervisor ran for each (namespace, deployment, LeaderWorkerSet
revision), summed over its engines, those stopped (a group deleted, a crashed pod's group
recreated: its final count) and those running (their count now); names as exposed
(``vllm:generation_tokens_total``, ``vllm:request_success_total{finished_reason="stop"}``:
``EngineMetrics.counter_totals``). Rewritten each poll when it changed."""
EXIT_CODE_ENV = "KIMIK3_SIM_EXIT_CODE"
"""Engine env: the engine exits with this code at start (module docstring)."""


def exit_code(pod_spec: dict[str, Any]) -> int | None:
    """The exit code ``EXIT_CODE_ENV`` of the engine container asks for, None when unset. Raises
    ValueError when it is not an integer in 1-255."""
    entry = podenv.env_entry(pod_spec, EXIT_CODE_ENV, CONTAINER)
    if entry is None:
        return None
    value = str(entry.get("value", ""))
    if not value.isdigit() or not 1 <= int(value) <= 255:
        raise ValueError(f"{EXIT_CODE_ENV}={value!r} is not an exit code in 1-255")
    return int(value)


def release_overrides(pod_spec: dict[str, Any]) -> dict[str, float]:
    """The ``EngineConfig`` fields the engine container's ``KIMIK3_SIM_*`` env sets. Raises
    ValueError naming the variable whose value is not a number (a duration for the load time)."""
    out: dict[str, float] = {}
    for name, field_name in RELEASE_ENV.items():
        entry = podenv.env_entry(pod_spec, name, CONTAINER)
        if entry is None:
            continue
        value = str(entry.get("value", ""))
        try:
            number = duration_seconds(value) if field_name == "load_time_s" else float(value)
        except ValueError:
            raise ValueError(f"{name}={value!r} is not a {'duration' if field_name == 'load_time_s' else 'number'}")
        if number < 0 or (field_name in RATE_FIELDS and number > 1):
            raise ValueError(f"{name}={value!r} is out of range")
        out[field_name] = number
    return out


@dataclass
class _Group:
    """A running simulated engine for one group."""

    namespace: str
    deployment: str
    group: str
    leader_pod: str
    leader_uid: str
    engine: SimEngine
    started_at: str
    revision: str = ""
    """The leader pod's LeaderWorkerSet revision label (the PodMonitor's ``revision`` label)."""
    on_delete: launch.Exit = launch.Exit()
    """How the engine ends when its leader pod is deleted."""

    @property
    def usage_key(self) -> tuple[str, str, str]:
        """(namespace, deployment, revision): where ``usage.json`` counts the engine."""
        return self.namespace, self.deployment, self.revision


@dataclass(frozen=True)
class _Wanted:
    """A group whose leader pod runs (the engine it gets is read from that pod: ``launch``)."""

    namespace: str
    deployment: str
    group: str
    leader_pod: str
    leader_uid: str
    pod: dict[str, Any] = field(repr=False)
    """The leader pod, camelCase (as the API server serves it)."""
    running: int = 1
    """Pods of the group that exist, are not terminating and are Running."""
    pod_ip: str = ""
    """The leader pod's ``status.podIP``."""
    load_time_s: float = 0.0
    workload: str | float = "chat"
    variant: str = ModelSpec.model_fields["variant"].default
    """The checkpoint's quantization (the CR's spec.model.variant)."""

    @property
    def api_key_env(self) -> dict[str, Any] | None:
        """The leader's engine container env entry of ``VLLM_API_KEY`` (camelCase), None when unset."""
        return podenv.env_entry(self.pod.get("spec") or {}, API_KEY_ENV, CONTAINER)


def _launcher_ready(probe: dict[str, Any]) -> dict[str, Any] | None:
    """The launcher's ``ready PORT`` exec probe as the ``httpGet`` it amounts to for an engine
    whose pod is not being deleted (vLLM's /health on PORT); None for any other probe."""
    command = (probe.get("exec") or {}).get("command") or []
    if len(command) >= 3 and str(command[-3]).endswith(LAUNCHER_KEY) and command[-2] == "ready":
        return {"path": "/health", "port": command[-1]}
    return None


def write_json_atomic(path: Path, data: Any) -> None:
    """Write ``data`` as JSON to ``path`` through a temp file in the same folder and a rename, so a
    reader (``kimik3 dev load``, a test) never sees a half-written file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=2, sort_keys=True)
            fh.write("\n")
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


class Supervisor:
    """Keeps simulated engines in line with the cluster's running groups (see the module docstring).

    ``api_client``: a ``kubernetes.client.ApiClient``; ``load_time_s``: default model load time
    of a new engine; ``workload``: default speculative-acceptance workload."""

    def __init__(self, api_client: Any, state_dir: Path | str, *, load_time_s: float = 20.0,
                 poll_interval_s: float = DEFAULT_POLL_INTERVAL_S, workload: str | float = "chat",
                 seed: int | None = None, readiness_probes: bool = False):
        from kimik3.controller.kube import Kube  # imports the kubernetes package: only where it is needed

        self.kube = Kube(api_client, timeout_s=API_TIMEOUT_S)
        self.sim_dir = Path(state_dir) / "sim"
        self.services_path = self.sim_dir / services.FILE
        self.usage_path = self.sim_dir / USAGE_FILE
        self.load_time_s = load_time_s
        self.poll_interval_s = poll_interval_s
        self.workload = workload
        self.seed = seed
        self.readiness_probes = readiness_probes
        self._draining: dict[asyncio.Task, SimEngine] = {}
        """The engines of groups that went, each draining in its task."""
        self.groups: dict[tuple[str, str, str], _Group] = {}
        self._stopped: dict[tuple[str, str, str], tuple[int, dict[str, float]]] = {}
        """(namespace, deployment, revision) -> (engines stopped, their final counts summed)."""
        self._counted: dict[asyncio.Task, tuple[str, str, str]] = {}
        """The usage key of each draining engine."""
        self.services: dict[tuple[str, str, int], services.ServicePort] = {}
        """The stand-in of each (namespace, Service, port) kube-proxy would program."""
        self.probed: dict[str, bool] = {}
        """Whether the readiness probe counts each leader pod UID Ready (the kubelet's thresholds)."""
        self._probe_failures: dict[str, int] = {}
        """Readiness probe failures in a row per leader pod UID."""
        self._session: aiohttp.ClientSession | None = None
        self._launches: dict[str, launch.Launch] = {}
        """The launch of each leader pod UID that runs or waits for its group's other pods."""
        self._unlaunched: dict[tuple[str, str, str], tuple[str, str]] = {}
        """(leader UID, why) of groups whose launch could not be resolved (warned once each)."""
        self._unresolved: dict[tuple[str, str, str], str] = {}
        self._exits: dict[str, asyncio.Task] = {}
        """Per leader pod UID of a release that crashes at start (``EXIT_CODE_ENV``): its exit, pending."""
        self._last_written: str | None = None
        self._usage_written: str | None = None
        self.polls = 0

    # ---------------------------------------------------------------- main loop
    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Poll until ``stop`` is set (or the task is cancelled), then stop every engine (``close``)."""
        stop = stop or asyncio.Event()
        self._write_files(force=True)
        try:
            while not stop.is_set():
                try:
                    await self.poll_once()
                except Exception as exc:  # an API outage must not kill the engines: retry next poll
                    log.warning("poll failed (engines kept as they are): %s", exc)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.poll_interval_s)
        finally:
            await self.close()

    async def close(self) -> None:
        """Stop every engine (a draining one too: the simulator goes, not a pod) and Service
        stand-in; write an empty service file and the final usage."""
        for port in list(self.services.values()):
            await port.stop()
        self.services.clear()
        engines = [(g.usage_key, g.engine) for g in [self.groups.pop(key) for key in list(self.groups)]]
        engines += [(self._counted.pop(task), engine) for task, engine in list(self._draining.items())]
        for task in [*self._draining, *self._exits.values()]:
            task.cancel()
        await asyncio.gather(*self._draining, *self._exits.values(), return_exceptions=True)
        for usage_key, engine in engines:
            await engine.stop()
            self._count_stopped(usage_key, engine)
        self._exits.clear()
        if self._session is not None:
            await self._session.close()
            self._session = None
        self._write_files(force=True)

    async def poll_once(self) -> None:
        """One pass: list CRs, pods and Services, update the Service stand-ins, start/stop engines,
        probe the leaders, rewrite the files."""
        crs, pods, svcs = await asyncio.gather(
            asyncio.to_thread(self.kube.list, *KIMIK3_DEPLOYMENT.type_meta, "", ""),
            asyncio.to_thread(self.kube.list, *POD.type_meta, "", ""),
            asyncio.to_thread(self.kube.list, *SERVICE.type_meta, "", ""),
        )
        # The Services first: kwok may have given a deleted pod's IP to a new pod, whose engine
        # starts below; no connection may reach it through a stand-in still showing the old pod.
        await self._sync_services(svcs, pods)
        wanted, _ = self._wanted(crs, [p for p in pods if LWS_NAME_LABEL in kpods.labels(p)])
        for key, group in list(self.groups.items()):
            want = wanted.get(key)
            if want is None or want.leader_uid != group.leader_uid or \
                    want.running < self._launches[group.leader_uid].group_size:
                log.info("group %s/%s/%s gone or recreated: its engine on %s drains", *key, group.engine.url)
                await self._stop_group(key)
        live = {w.leader_uid for w in wanted.values()}
        for uid in [u for u in self._launches if u not in live]:
            del self._launches[uid]
        for uid in [u for u in self.probed if u not in live]:
            del self.probed[uid]
            self._probe_failures.pop(uid, None)
        for uid in [u for u in self._exits if u not in live]:
            self._exits.pop(uid).cancel()
        for key, want in wanted.items():
            if key not in self.groups:
                await self._start_group(key, want)
        await self._probe(wanted)
        self.polls += 1
        self._write_files()

    # ---------------------------------------------------------------- what should run
    def _wanted(self, crs: list[dict[str, Any]], pods: list[dict[str, Any]]
                ) -> tuple[dict[tuple[str, str, str], _Wanted], set[tuple[str, str]]]:
        by_deployment: dict[tuple[str, str], dict[str, list[dict[str, Any]]]] = {}
        for pod in pods:
            pod_labels = kpods.labels(pod)
            lws, gi, name = pod_labels.get(LWS_NAME_LABEL), kpods.group_index(pod), pod_labels.get(DEPLOYMENT_LABEL)
            if lws is None or gi is None or name is None:
                continue
            gid = gi if lws == engine_set_name(name) else f"{lws}/{gi}"  # a rollout's new LeaderWorkerSet beside the old
            by_deployment.setdefault((pod["metadata"]["namespace"], name), {}).setdefault(gid, []).append(pod)
        wanted: dict[tuple[str, str, str], _Wanted] = {}
        deployments: set[tuple[str, str]] = set()
        for cr in crs:
            meta = cr.get("metadata", {})
            ns, name = meta.get("namespace", "default"), meta.get("name", "")
            if is_deleting(cr):
                continue
            deployments.add((ns, name))
            annotations = meta.get("annotations") or {}
            load_time = self.load_time_s
            if LOAD_TIME_ANNOTATION in annotations:
                try:
                    load_time = duration_seconds(annotations[LOAD_TIME_ANNOTATION])
                except ValueError:
                    log.warning("%s/%s: ignoring bad %s", ns, name, LOAD_TIME_ANNOTATION)
            workload: str | float = annotations.get(WORKLOAD_ANNOTATION, self.workload)
            with contextlib.suppress(ValueError):
                workload = float(workload)
            variant = ((cr.get("spec") or {}).get("model") or {}).get("variant") or _Wanted.variant
            for gi, members in by_deployment.get((ns, name), {}).items():
                running = self._running(members)
                leader = self._leader(running)
                if leader is None or len(running) < len([p for p in members if not kpods.is_terminating(p)]):
                    continue
                pod_ip = (leader.get("status") or {}).get("podIP")
                if not pod_ip:
                    continue  # no address yet: nothing could reach the engine
                wanted[(ns, name, gi)] = _Wanted(
                    ns, name, gi, leader["metadata"]["name"], leader["metadata"]["uid"], leader, len(running),
                    pod_ip, load_time, workload, variant)
        return wanted, deployments

    @staticmethod
    def _running(members: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The group's pods that are not terminating and are Running."""
        return [p for p in members if not kpods.is_terminating(p) and kpods.phase(p) == "Running"]

    @staticmethod
    def _leader(running: list[dict[str, Any]]) -> dict[str, Any] | None:
        """The group's one Running leader pod, else None."""
        leaders = [p for p in running if kpods.is_leader(p)]
        return leaders[0] if len(leaders) == 1 else None

    def _read_data(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        """The ``data`` of the ConfigMap or Secret (``kind``) ``namespace/name`` as ``{"data":
        {...}}`` (a Secret's values base64), None when it does not exist; ``podenv.EnvUnresolved``
        when the API server does not answer."""
        from kimik3.controller.kube import ApiError, NotFound

        path = CONFIG_MAP.path(namespace, name) if kind == "ConfigMap" \
            else f"/api/v1/namespaces/{namespace}/secrets/{name}"
        try:
            found = self.kube.request("GET", path)
        except NotFound:
            return None
        except ApiError as exc:
            # not `from exc`: the exception would carry the API server's response into a log
            raise podenv.EnvUnresolved(f"reading {kind} {namespace}/{name}: HTTP {exc.status} {exc.reason}") from None
        return {"data": dict(found.get("data") or {})}

    def _read_secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._read_data("Secret", namespace, name)

    async def _launch(self, key: tuple[str, str, str], want: _Wanted) -> launch.Launch | None:
        """The launch of ``want``'s leader pod (once per UID), None when it cannot be resolved."""
        found = self._launches.get(want.leader_uid)
        if found is not None:
            return found
        try:
            found = await asyncio.to_thread(launch.launch, want.pod,
                                            lambda name: self._read_data("ConfigMap", want.namespace, name))
        except launch.LaunchUnresolved as exc:
            if self._unlaunched.get(key) != (want.leader_uid, str(exc)):
                log.warning("group %s/%s/%s (leader %s): no engine, its launch does not resolve: %s",
                            *key, want.leader_pod, exc)
                self._unlaunched[key] = (want.leader_uid, str(exc))
            return None
        self._unlaunched.pop(key, None)
        self._launches[want.leader_uid] = found
        return found

    async def _api_keys(self, key: tuple[str, str, str], want: _Wanted) -> tuple[str, ...] | None:
        """The keys the engine of ``want`` accepts (() = no authentication), resolved like a
        kubelet at container start; None when the kubelet would not start the container."""
        try:
            value = await asyncio.to_thread(podenv.resolve, want.api_key_env, want.namespace,
                                            lambda name: self._read_secret(want.namespace, name))
        except podenv.EnvUnresolved as exc:
            if self._unresolved.get(key) != want.leader_uid:
                log.warning("group %s/%s/%s (leader %s): no engine, as a kubelet would not start the container: %s",
                            *key, want.leader_pod, exc)
                self._unresolved[key] = want.leader_uid
            return None
        self._unresolved.pop(key, None)
        return (value,) if value else ()

    # ---------------------------------------------------------------- engines
    async def _start_group(self, key: tuple[str, str, str], want: _Wanted) -> None:
        started_with = await self._launch(key, want)
        if started_with is None or want.running < started_with.group_size:
            return  # no launch, or not every rank of the plan runs yet
        try:
            code = exit_code(want.pod.get("spec") or {})
            if code is not None:
                if want.leader_uid not in self._exits:
                    self._exits[want.leader_uid] = asyncio.create_task(
                        self._exit_at_start(key, want, code, started_with.start_delay_s))
                return
            release = release_overrides(want.pod.get("spec") or {})
            config = launch.engine_config(started_with.argv, started_with.accelerator, want.variant,
                                          **({"benign_divergence": BENIGN_DIVERGENCE} | release
                                             | {"load_time_s": release.get("load_time_s", want.load_time_s)
                                                + started_with.start_delay_s}),
                                          workload=want.workload, seed=self.seed, group_name=want.leader_pod)
        except (launch.LaunchUnresolved, ValueError) as exc:
            log.warning("group %s/%s/%s (leader %s): no engine: %s", *key, want.leader_pod, exc)
            return
        api_keys = await self._api_keys(key, want)
        if api_keys is None:
            return
        engine = SimEngine(dataclasses.replace(config, api_keys=api_keys))
        try:
            await engine.start(started_with.port, want.pod_ip)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
            if self._unlaunched.get(key) != (want.leader_uid, "address in use"):
                log.info("group %s/%s/%s (leader %s): %s:%d is still held (a deleted pod's engine drains there): "
                         "the engine starts once it is free", *key, want.leader_pod, want.pod_ip, started_with.port)
                self._unlaunched[key] = (want.leader_uid, "address in use")
            return
        self._unlaunched.pop(key, None)
        started = rfc3339()
        group = _Group(want.namespace, want.deployment, want.group, want.leader_pod, want.leader_uid, engine, started,
                       kpods.labels(want.pod).get(LWS_REVISION_LABEL, ""), started_with.on_delete)
        self.groups[key] = group
        log.info("group %s/%s/%s (leader %s): engine on %s (%s), ready in %.0f s%s",
                 *key, want.leader_pod, engine.url, " ".join(started_with.argv), config.load_time_s,
                 f", API key ({API_KEY_ENV}) required on /v1" if engine.requires_api_key else "")

    async def _exit_at_start(self, key: tuple[str, str, str], want: _Wanted, code: int, delay_s: float) -> None:
        """After the launcher's start back-off, the leader's engine container exits ``code``."""
        started = rfc3339()
        if delay_s > 0:
            log.info("group %s/%s/%s (leader %s): start back-off %.0f s (startDelaySeconds)", *key, want.leader_pod,
                     delay_s)
            await asyncio.sleep(delay_s)
        finished = rfc3339()
        body = {"status": {"phase": "Failed", "conditions": [
            {"type": t, "status": "False", "lastTransitionTime": finished} for t in READINESS_CONDITIONS],
            "containerStatuses": [{"name": CONTAINER, "ready": False, "started": False, "restartCount": 0,
                                   "image": podenv.container(want.pod.get("spec") or {}, CONTAINER).get("image", ""),
                                   "imageID": "", "state": {"terminated": {
                                       "exitCode": code, "reason": "Error", "startedAt": started,
                                       "finishedAt": finished, "message": f"{EXIT_CODE_ENV}={code}"}}}]}}
        try:
            await asyncio.to_thread(self._patch_status, want.namespace, want.leader_pod, body)
            log.info("group %s/%s/%s (leader %s): engine exited %d at start (%s)", *key, want.leader_pod, code,
                     EXIT_CODE_ENV)
        except Exception as exc:  # noqa: BLE001 - the pod went meanwhile: nothing to crash
            log.info("pod %s/%s: exit not written (%s)", want.namespace, want.leader_pod, exc)

    async def _stop_group(self, key: tuple[str, str, str]) -> None:
        """The group's engine drains in the background as its leader pod says (the Service
        stand-ins drop its pod as soon as the API server shows it gone or terminating)."""
        group = self.groups.pop(key)
        end = group.on_delete
        task = asyncio.create_task(group.engine.drain(end.deregister_s, end.shutdown_timeout_s, end.grace_s))
        self._draining[task] = group.engine
        self._counted[task] = group.usage_key

        def drained(done: asyncio.Task) -> None:
            engine = self._draining.pop(done, None)
            usage_key = self._counted.pop(done, None)
            if engine is not None and usage_key is not None:
                self._count_stopped(usage_key, engine)
        task.add_done_callback(drained)

    def _count_stopped(self, usage_key: tuple[str, str, str], engine: SimEngine) -> None:
        """Add a stopped engine's final counts to its deployment revision's."""
        engines, counts = self._stopped.get(usage_key, (0, {}))
        for name, value in engine.metrics.counter_totals().items():
            counts[name] = counts.get(name, 0.0) + value
        self._stopped[usage_key] = (engines + 1, counts)

    def usage(self) -> list[dict[str, Any]]:
        """``usage.json`` (``USAGE_FILE``): the counts of every engine run, stopped or not."""
        out: dict[tuple[str, str, str], tuple[int, dict[str, float]]] = {
            k: (n, dict(c)) for k, (n, c) in self._stopped.items()}
        live = [(g.usage_key, g.engine) for g in self.groups.values()]
        live += [(self._counted[t], e) for t, e in self._draining.items() if t in self._counted]
        for usage_key, engine in live:
            engines, counts = out.get(usage_key, (0, {}))
            for name, value in engine.metrics.counter_totals().items():
                counts[name] = counts.get(name, 0.0) + value
            out[usage_key] = (engines + 1, counts)
        return [{"namespace": ns, "deployment": dep, "revision": rev, "engines": n, "counters": counts}
                for (ns, dep, rev), (n, counts) in sorted(out.items())]

    # ---------------------------------------------------------------- the kubelet's readiness prober
    async def _probe(self, wanted: dict[tuple[str, str, str], _Wanted]) -> None:
        """Send each running leader's readinessProbe to its pod IP; with ``readiness_probes``,
        write the answer into the pod's status as a kubelet does."""
        if self._session is None:
            # a connection per probe, as the kubelet's prober (no keep-alive): a kept connection
            # would still reach a deleted pod's draining engine after kwok gave its IP to a new pod
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True))
        for key, want in wanted.items():
            probe = podenv.container(want.pod.get("spec") or {}, CONTAINER).get("readinessProbe")
            if not probe:
                continue
            group = self.groups.get(key)
            answered = group is not None and group.leader_uid == want.leader_uid and await self._http_probe(want, probe)
            failures = 0 if answered else self._probe_failures.get(want.leader_uid, 0) + 1
            self._probe_failures[want.leader_uid] = failures
            # the kubelet's thresholds: Ready after one success, not Ready after failureThreshold failures in a row
            ready = answered or (self.probed.get(want.leader_uid, False) and group is not None
                                 and failures < int(probe.get("failureThreshold") or DEFAULT_FAILURE_THRESHOLD))
            self.probed[want.leader_uid] = ready
            if self.readiness_probes and kpods.is_ready(want.pod) != ready:
                await asyncio.to_thread(self._set_ready, want.namespace, want.leader_pod, ready)

    async def _http_probe(self, want: _Wanted, probe: dict[str, Any]) -> bool:
        """Whether ``probe``'s ``httpGet`` (or the launcher's ``ready``) at the pod's IP answers
        2xx/3xx within its timeout, as the kubelet's prober counts success."""
        action = probe.get("httpGet") or _launcher_ready(probe) or {}
        port = action.get("port")
        if not isinstance(port, int) and not str(port).isdigit():
            port = next((p.get("containerPort") for p in podenv.container(want.pod.get("spec") or {}, CONTAINER)
                         .get("ports") or [] if p.get("name") == port), None)
        if port is None:
            return False
        url = f"http://{want.pod_ip}:{port}{action.get('path', '/')}"
        timeout = aiohttp.ClientTimeout(total=float(probe.get("timeoutSeconds") or DEFAULT_PROBE_TIMEOUT_S))
        assert self._session is not None
        try:
            async with self._session.get(url, timeout=timeout, allow_redirects=False) as resp:
                return 200 <= resp.status < 400
        except (aiohttp.ClientError, asyncio.TimeoutError):
            return False

    def _endpoint_ready(self, pod: dict[str, Any]) -> bool:
        """Ready as the EndpointSlice controller reads it; without ``readiness_probes`` (kwok marks
        pods Ready at once) a probed container counts only once its probe answered."""
        if not kpods.is_ready(pod):
            return False
        if self.readiness_probes or not podenv.container(pod.get("spec") or {}, CONTAINER).get("readinessProbe"):
            return True
        return self.probed.get(pod["metadata"].get("uid", ""), False)

    def _set_ready(self, namespace: str, pod: str, ready: bool) -> None:
        now = rfc3339()
        value = "True" if ready else "False"
        body = {"status": {"conditions": [{"type": t, "status": value, "lastTransitionTime": now}
                                          for t in READINESS_CONDITIONS],
                           "containerStatuses": [{"name": CONTAINER, "ready": ready}]}}
        try:
            self._patch_status(namespace, pod, body)
        except Exception as exc:  # noqa: BLE001 - the pod went meanwhile: the next poll sees it
            log.info("pod %s/%s: readiness not set (%s)", namespace, pod, exc)

    def _patch_status(self, namespace: str, pod: str, body: dict[str, Any]) -> None:
        """A strategic merge patch of the pod's status, as a kubelet writes it (conditions and
        container statuses merged by their ``type`` and ``name``)."""
        self.kube.request("PATCH", POD.path(namespace, pod) + "/status", body,
                          content_type="application/strategic-merge-patch+json")

    # ---------------------------------------------------------------- Services (kube-proxy's part)
    async def _sync_services(self, svcs: list[dict[str, Any]], pods: list[dict[str, Any]]) -> None:
        """A stand-in per port of every Service kube-proxy would program, its endpoints from the
        pods as listed this poll."""
        seen = set()
        for svc in svcs:
            meta = svc["metadata"]
            for port in services.programmed_ports(svc):
                key = (meta["namespace"], meta["name"], int(port["port"]))
                seen.add(key)
                stand_in = self.services.get(key)
                if stand_in is None:
                    stand_in = services.ServicePort(*key)
                    await stand_in.start()
                    self.services[key] = stand_in
                backends = services.endpoints(svc, port, pods, self._endpoint_ready)
                if backends != stand_in.backends:
                    log.info("service %s/%s port %d: endpoints %s", *key,
                             ", ".join(f"{ip}:{n}" for ip, n in backends) or "none")
                stand_in.backends = backends
        for key in [k for k in self.services if k not in seen]:
            await self.services.pop(key).stop()

    # ---------------------------------------------------------------- files
    def service_addresses(self) -> dict[str, dict[str, str]]:
        """``services.json``: ``{"namespace/name": {"<port>": "127.0.0.1:PORT"}}``."""
        out: dict[str, dict[str, str]] = {}
        for (ns, name, port), stand_in in sorted(self.services.items()):
            out.setdefault(f"{ns}/{name}", {})[str(port)] = stand_in.address
        return out

    def _write_files(self, force: bool = False) -> None:
        addresses = self.service_addresses()
        key = json.dumps(addresses, sort_keys=True)
        if force or key != self._last_written:
            write_json_atomic(self.services_path, addresses)
            self._last_written = key
        usage = self.usage()
        key = json.dumps(usage, sort_keys=True)
        if force or key != self._usage_written:
            write_json_atomic(self.usage_path, usage)
            self._usage_written = key


async def run_supervisor(kubeconfig: str, state_dir: Path | str, *, load_time_s: float,
                         poll_interval_s: float = DEFAULT_POLL_INTERVAL_S, workload: str | float = "chat",
                         seed: int | None = None, readiness_probes: bool = False,
                         stop: asyncio.Event | None = None) -> None:
    """Build an API client from ``kubeconfig`` and run a ``Supervisor`` until ``stop`` is set."""
    from kubernetes import config as k8s_config

    api = k8s_config.new_client_from_config(config_file=kubeconfig)
    log.info("engine simulator: watching KimiK3Deployments every %.1f s, load time %.0f s; writing %s",
             poll_interval_s, load_time_s, Path(state_dir) / "sim")
    try:
        await Supervisor(api, state_dir, load_time_s=load_time_s, poll_interval_s=poll_interval_s,
                         workload=workload, seed=seed, readiness_probes=readiness_probes).run(stop)
    finally:
        api.close()
