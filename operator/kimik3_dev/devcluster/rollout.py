"""Measure a rollout on the running dev cluster: the groups sampled while load runs.

``measure_rollout(rest, state_dir, cr, change)`` applies the KimiK3Deployment ``cr``, waits until
its groups are Ready and its endpoint answers, starts closed-loop users on the deployment's
front (the simulator's stand-in for the client Service), applies the spec patch ``change`` and
samples every group every ``period_s`` (index, leader pod UID, LeaderWorkerSet revision, every pod
Ready, LeaderWorkerSet) until every group runs a new revision Ready and the CR says Progressing=False. Used by
tests/e2e/test_e2e_rollout.py and bench/rollout.py; run it on ``dev up --readiness-probes`` (else
kwok makes a loading group Ready at once and the figures mean nothing).

``measure_release(rest, state_dir, cr, change, window_s=...)`` does the same for a bad release
(``bench/rollout.py --bad``): it watches a fixed window under load and reports when the release
was rolled back (if it was), how many requests the new revision's engines finished, and how many
the users saw fail.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import requests

from kimik3.autoscaler.sources import parse_scrape
from kimik3.kube import pods as kpods
from kimik3.kube.kinds import GROUP, PLURAL, VERSION
from kimik3.kube.labels import DEPLOYMENT_LABEL, LWS_NAME_LABEL, LWS_REVISION_LABEL
from kimik3_dev.devcluster.rest import Rest
from kimik3_dev.devcluster.workloads import apply_deployment
from kimik3_dev.sim.load import Phase, RequestResult, resolve_url, run_load, summarize

Sample = tuple[tuple[int, str, str, bool, str], ...]
"""(group index, leader pod UID, revision, every pod Ready, LeaderWorkerSet) of each live group
(a rollout runs the old and the new LeaderWorkerSet side by side, each with a group 0)."""


def cr_path(namespace: str, name: str) -> str:
    return f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}/{name}"


def sample(rest: Rest, namespace: str, name: str, size: int) -> Sample:
    """The live (not terminating) groups of deployment ``name`` now; ``size`` pods per group."""
    members: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for pod in rest.items(f"/api/v1/namespaces/{namespace}/pods", f"{DEPLOYMENT_LABEL}={name},{LWS_NAME_LABEL}"):
        if not kpods.is_terminating(pod):
            key = (kpods.labels(pod).get(LWS_NAME_LABEL, ""), int(kpods.group_index(pod) or 0))
            members.setdefault(key, []).append(pod)
    out = []
    for (lws, index), group in sorted(members.items()):
        leader = next((p for p in group if kpods.is_leader(p)), None)
        if leader is not None:
            out.append((index, leader["metadata"]["uid"], kpods.labels(leader).get(LWS_REVISION_LABEL, ""),
                        len(group) == size and all(map(kpods.is_ready, group)), lws))
    return tuple(out)


def wait(check: Callable[[], Any], timeout_s: float, what: str, poll_s: float = 0.25) -> Any:
    """``check()``'s first truthy value; TimeoutError naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(poll_s)
    raise TimeoutError(f"waited {timeout_s:.0f} s for {what}")


class _UntilTheBlockEnds:
    """``_run`` in a daemon thread from the start of a ``with`` block to its end: ``_stop`` is set
    then, and the thread is given ``join_s`` seconds to see it and finish."""

    join_s = 10.0

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(self.join_s)


class Load(_UntilTheBlockEnds):
    """Closed-loop users on a deployment's front until the block ends; every result kept."""

    join_s = 60.0  # the last round of requests drains (run_load's drain_s) before the thread ends

    def __init__(self, url: str, model: str | None, users: int = 4):
        super().__init__()
        self.url, self.model, self.users = url, model, users
        self.results: list[RequestResult] = []

    def _run(self) -> None:
        asyncio.run(self._users())

    async def _users(self) -> None:
        while not self._stop.is_set():
            self.results += await run_load(self.url, [Phase(3.0, concurrency=self.users, prompt_tokens=128,
                                                            output_tokens=64)], model=self.model, drain_s=30.0)


class Recorder(_UntilTheBlockEnds):
    """Polls ``fn`` every ``period_s`` in a thread and keeps every distinct consecutive value,
    the value at the moment the block ends included (a change in the last period is not lost).
    A read that raises is no value. Used by ``measure_rollout`` and the e2e tests."""

    def __init__(self, fn: Callable[[], Any], period_s: float = 0.05) -> None:
        super().__init__()
        self.fn, self.period_s = fn, period_s
        self.values: list[Any] = []

    def _sample(self) -> None:
        try:
            value = self.fn()
        except Exception:  # noqa: BLE001 - a failed read is not a value
            value = None
        if value is not None and (not self.values or self.values[-1] != value):
            self.values.append(value)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.period_s)

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        self._sample()


class UsersSaw:
    """The users' tally of their requests (``results``, each as one user saw it)."""

    results: list[RequestResult]

    @property
    def failed(self) -> int:
        return int(summarize(self.results)["total"]["errors"])

    @property
    def requests(self) -> int:
        return int(summarize(self.results)["total"]["requests"])


@dataclass
class Rollout(UsersSaw):
    """What a rollout did, as the samples and the users saw it."""

    seconds: float
    """From the spec change until every group ran a new revision Ready and Progressing was False."""
    old_revision: str
    samples: list[Sample] = field(default_factory=list)
    results: list[RequestResult] = field(default_factory=list)

    @property
    def fewest_ready(self) -> int:
        return min(sum(1 for g in s if g[3]) for s in self.samples)


def serving(rest: Rest, state_dir: Path, namespace: str, name: str, groups: int, size: int,
            timeout_s: float) -> tuple[str, str | None]:
    """(Service URL, served model) once ``groups`` groups are Ready and the deployment's Service
    (``resolve_url``) answers /health and names its model (/health can answer a moment before
    /v1/models does: a full CI run read no model, 2026-12-05)."""
    def answering() -> tuple[str, str | None] | None:
        if sum(1 for g in sample(rest, namespace, name, size) if g[3]) < groups:
            return None
        try:
            url, model = resolve_url(Path(state_dir) / "admin.kubeconfig", state_dir, name, namespace)
            healthy = model is not None and requests.get(f"{url}/health", timeout=2).status_code == 200
            return (url, model) if healthy else None
        except Exception:  # noqa: BLE001 - not there yet
            return None
    return wait(answering, timeout_s, f"{groups} Ready group(s) of {namespace}/{name} and its endpoint")


def _done(rest: Rest, namespace: str, name: str, size: int, old: str, groups: int) -> bool:
    status = (rest.get(cr_path(namespace, name)) or {}).get("status") or {}
    progressing: dict[str, Any] = next((c for c in status.get("conditions", []) if c["type"] == "Progressing"), {})
    now = sample(rest, namespace, name, size)
    return (len(now) == groups and all(g[3] and g[2] != old for g in now) and progressing.get("status") == "False"
            and len((status.get("rollout") or {}).get("revisions") or []) == 1)


def measure_rollout(rest: Rest, state_dir: Path, cr: dict[str, Any], change: dict[str, Any], *, size: int = 2,
                    timeout_s: float = 300.0, period_s: float = 0.1, users: int = 4) -> Rollout:
    """Apply ``cr``, then the spec merge patch ``change`` under load (module docstring)."""
    meta = cr["metadata"]
    namespace, name, groups = meta["namespace"], meta["name"], int(cr["spec"]["replicas"])
    apply_deployment(rest, cr)
    url, model = serving(rest, state_dir, namespace, name, groups, size, timeout_s)
    (old,) = {g[2] for g in sample(rest, namespace, name, size)}
    with Load(url, model, users) as load, Recorder(lambda: sample(rest, namespace, name, size), period_s) as rec:
        time.sleep(1.0)
        start = time.monotonic()
        rest.call("PATCH", cr_path(namespace, name), body={"spec": change},
                  content_type="application/merge-patch+json")
        wait(lambda: _done(rest, namespace, name, size, old, groups), timeout_s, f"the rollout of {namespace}/{name}")
        took = time.monotonic() - start
        time.sleep(1.0)
    return Rollout(took, old, rec.values, load.results)


def finished(rest: Rest, namespace: str, name: str, not_revision: str, port: int = 8000) -> dict[str, float]:
    """Requests finished so far (``vllm:request_success``, every ``finished_reason``) by each live
    leader pod of deployment ``name`` whose LeaderWorkerSet revision is not ``not_revision``: leader
    pod UID -> count, read from the engine's /metrics at the pod IP (the dev cluster's pod network).
    A leader whose engine does not answer yet is left out."""
    out: dict[str, float] = {}
    for pod in rest.items(f"/api/v1/namespaces/{namespace}/pods", f"{DEPLOYMENT_LABEL}={name},{LWS_NAME_LABEL}"):
        ip = (pod.get("status") or {}).get("podIP")
        if not kpods.is_leader(pod) or not ip or kpods.labels(pod).get(LWS_REVISION_LABEL) in (None, not_revision):
            continue
        try:
            text = requests.get(f"http://{ip}:{port}/metrics", timeout=2).text
        except requests.RequestException:
            continue
        out[pod["metadata"]["uid"]] = sum(v for (metric, _), v in parse_scrape(text).scalars.items()
                                          if metric == "vllm:request_success")
    return out


@dataclass
class Release(UsersSaw):
    """What a bad release did in a fixed window under load, as the CR, the engines and the users saw it."""

    window_s: float
    """From the spec change to the end of the load: ``window_s`` asked for, or the rollback's end if later."""
    rollback_s: float | None
    """From the spec change until ``status.rollout.rolledBack`` named this release and only groups of the
    old revision were live, every one Ready; None when that did not happen in the window."""
    took_over_s: float | None
    """From the spec change until every live group ran the new revision, Ready, and Progressing was
    False (the release promoted and rolled out); None when it did not in the window."""
    rolled_back: dict[str, Any] | None
    """``status.rollout.rolledBack`` at the end (reason and message quoting the figures), None if none."""
    canary: dict[str, Any] | None
    """The last ``status.rollout.canary`` seen (its checks' history with their figures), None without a canary."""
    served_by_new: int
    """Requests the new revision's engines finished in the window (``finished``: the largest count
    seen of each leader, polled every 0.5 s, so a request in the last poll before a pod went may be
    missed); the operator's own parity and probe requests to canary groups are among them."""
    results: list[RequestResult] = field(default_factory=list)


def measure_release(rest: Rest, state_dir: Path, cr: dict[str, Any], change: dict[str, Any], *, window_s: float,
                    size: int = 2, timeout_s: float = 300.0, users: int = 4, port: int = 8000) -> Release:
    """Apply ``cr``, wait until it serves, then apply the spec merge patch ``change`` (a bad
    release) under ``users`` closed-loop users and watch for ``window_s`` seconds, longer (up to
    ``timeout_s``) while a rollback is under way (module docstring)."""
    meta = cr["metadata"]
    namespace, name, groups = meta["namespace"], meta["name"], int(cr["spec"]["replicas"])
    apply_deployment(rest, cr)
    url, model = serving(rest, state_dir, namespace, name, groups, size, timeout_s)
    (old,) = {g[2] for g in sample(rest, namespace, name, size)}

    def state() -> tuple[str, dict[str, Any] | None]:
        status = (rest.get(cr_path(namespace, name)) or {}).get("status") or {}
        rolled_back = (status.get("rollout") or {}).get("rolledBack")
        now = sample(rest, namespace, name, size)
        progressing: dict[str, Any] = next((c for c in status.get("conditions", []) if c["type"] == "Progressing"), {})
        if rolled_back and rolled_back.get("revision") != old and len(now) == groups and \
                all(g[3] and g[2] == old for g in now):
            return "rolled back", rolled_back
        if len(now) == groups and all(g[3] and g[2] != old for g in now) and progressing.get("status") == "False":
            return "took over", rolled_back
        return ("rolling back" if rolled_back and rolled_back.get("revision") != old else "rolling"), rolled_back

    seen: dict[str, float] = {}
    times: dict[str, float] = {}
    def canary() -> dict[str, Any] | None:
        return (((rest.get(cr_path(namespace, name)) or {}).get("status") or {}).get("rollout") or {}).get("canary")

    with Load(url, model, users) as load, Recorder(canary, 0.5) as canaries, \
            Recorder(lambda: finished(rest, namespace, name, old, port) or None, 0.5) as counts:
        time.sleep(1.0)
        start = time.monotonic()
        rest.call("PATCH", cr_path(namespace, name), body={"spec": change},
                  content_type="application/merge-patch+json")
        last: dict[str, Any] | None = None
        while (elapsed := time.monotonic() - start) < timeout_s:
            phase, last = state()
            times.setdefault(phase, elapsed)
            if elapsed >= window_s and phase != "rolling back":
                break
            time.sleep(0.25)
        window = time.monotonic() - start
    for value in counts.values:
        for uid, n in value.items():
            seen[uid] = max(seen.get(uid, 0.0), n)
    return Release(window, times.get("rolled back"), times.get("took over"), last,
                   canaries.values[-1] if canaries.values else None, int(sum(seen.values())), load.results)
