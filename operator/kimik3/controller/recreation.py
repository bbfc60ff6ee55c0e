"""Bounded recreation: a deployment whose groups keep failing is marked Degraded and started with back-off.

The LeaderWorkerSet recreates a group at once whenever one of its pods fails
(``RecreateGroupOnPodRestart``), and every recreated pod is new, so the kubelet's CrashLoopBackOff
(10 s, doubling, at most 5 min) never applies: an engine that exits at start-up (bad argument,
missing weights) is recreated in a hot loop, each time pulling and mounting for 4-12 GPUs.

``GroupFailures`` remembers the engine container failures the pod watch reports (crashes.py),
each termination once, and not those of pods already being deleted (the group's other pods,
stopped because the LeaderWorkerSet deletes the group: the consequence, not the cause). Each
failure belongs to the group that earned it: its LeaderWorkerSet (one per revision of the
templates, ``controller.fleet``) and index. A failure is *charged* (``GroupFailures.charged``)
while its LeaderWorkerSet is live: a revision rolled away no longer counts, and a new revision
starts clean (issue 25 item 4). Whether the group is Ready between failures is not asked: a
pod without a readinessProbe (a worker; every pod under kwok without ``--readiness-probes``)
is Ready from its start until its engine exits, so a crash-looping group looks Ready between
crashes; like the kubelet's own back-off, a failure is forgotten only with time (the window). When a
deployment's groups have ``FAILURES`` (3) charged failures within ``WINDOW_S`` (10 min):
- ``Degraded=True`` reason ``GroupCrashLooping`` names the groups, how often they failed and the
  last exit codes (``verdict``);
- the launcher plan the spec renders carries ``startDelaySeconds`` (``Crashes.start_delay_s``
  of the LeaderWorkerSet of the spec's templates alone): every engine pod that starts waits that
  long before it starts vLLM, the kubelet's numbers: 10 s at the 3rd failure, doubling with each
  further failure in the window, at most 300 s. Running groups are not touched (the ConfigMap is
  read at start; the LeaderWorkerSet's template does not change).
Failures older than the window are forgotten; with none left the condition returns to
``AsExpected`` and the delay to 0.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from kimik3.api.conditions import Reason, Verdict

__all__ = ["BACKOFF_BASE_S", "BACKOFF_MAX_S", "FAILURES", "WINDOW_S", "Crashes", "Failure", "GroupFailures",
           "backoff_s"]

FAILURES = 3
"""Failures within ``WINDOW_S`` that make a deployment Degraded."""
WINDOW_S = 600.0
"""How long a failure counts, seconds."""
BACKOFF_BASE_S = 10.0
BACKOFF_MAX_S = 300.0
"""Start delay at the ``FAILURES``-th failure and its bound, seconds (the kubelet's CrashLoopBackOff)."""
KEPT = 32
"""Failures remembered per deployment (the window's oldest go first)."""


@dataclass(frozen=True)
class Failure:
    at: float
    """Monotonic time it was seen."""
    leader_worker_set: str
    """The LeaderWorkerSet of the failed pod (one per revision of the templates)."""
    group: str
    """The group's index in it ("?" when the pod had none)."""
    exit_code: int
    reason: str
    """The container's termination reason (Error, OOMKilled, ...)."""


def backoff_s(failures: int) -> float:
    """Start delay after ``failures`` charged failures in the window, seconds (module docstring); 0 below ``FAILURES``."""
    return 0.0 if failures < FAILURES else min(BACKOFF_MAX_S, BACKOFF_BASE_S * 2 ** (failures - FAILURES))


@dataclass(frozen=True)
class Crashes:
    """The charged failures of one deployment in the window, oldest first (``GroupFailures.charged``)."""

    failures: tuple[Failure, ...] = ()

    def start_delay_s(self, leader_worker_sets: Iterable[str]) -> float:
        """The start back-off of pods of ``leader_worker_sets`` (those of the spec's templates), seconds."""
        names = set(leader_worker_sets)
        return backoff_s(sum(1 for f in self.failures if f.leader_worker_set in names))

    def verdict(self) -> Verdict | None:
        """``Degraded=True GroupCrashLooping`` at ``FAILURES`` charged failures, else None."""
        failures = self.failures
        if len(failures) < FAILURES:
            return None
        groups = sorted({(f.leader_worker_set, f.group) for f in failures},
                        key=lambda g: (g[0], not g[1].isdigit(), int(g[1]) if g[1].isdigit() else 0))
        codes = ", ".join(f"{f.exit_code} ({f.reason})" for f in failures[-5:])
        return Verdict("True", Reason.GROUP_CRASH_LOOPING,
                       f"group(s) {', '.join(f'{lws}/{g}' for lws, g in groups)} failed {len(failures)} times in the "
                       f"last {WINDOW_S / 60:g} min (last exit codes: {codes}); each group of their "
                       f"revision recreated now waits {backoff_s(len(failures)):g} s before starting vLLM (back-off, "
                       "doubling per failure up to 300 s; a new revision starts clean); see the EngineFailed Events")


class GroupFailures:
    """Engine failures per deployment in the last ``WINDOW_S`` (thread-safe)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self._by_deployment: dict[tuple[str, str], deque[Failure]] = {}
        self._seen: deque[str] = deque(maxlen=4096)
        self._lock = threading.Lock()

    def record(self, namespace: str, deployment: str, key: str, leader_worker_set: str, group: str, exit_code: int,
               reason: str) -> None:
        """One termination of a pod of ``leader_worker_set``'s group ``group``; ``key`` identifies
        it (pod uid, container, finish time): seen again, it counts once."""
        with self._lock:
            if key in self._seen:
                return
            self._seen.append(key)
            self._by_deployment.setdefault((namespace, deployment), deque(maxlen=KEPT)).append(
                Failure(self.clock(), leader_worker_set, group, exit_code, reason))

    def recent(self, namespace: str, deployment: str) -> list[Failure]:
        """The failures of the last ``WINDOW_S``, oldest first."""
        now = self.clock()
        with self._lock:
            kept = self._by_deployment.get((namespace, deployment))
            if kept is None:
                return []
            while kept and kept[0].at < now - WINDOW_S:
                kept.popleft()
            if not kept:
                del self._by_deployment[(namespace, deployment)]
            return list(kept)

    def charged(self, namespace: str, deployment: str, live: Iterable[str]) -> Crashes:
        """The failures of the window still charged: those of a ``live`` LeaderWorkerSet (by name)."""
        names = set(live)
        return Crashes(tuple(f for f in self.recent(namespace, deployment) if f.leader_worker_set in names))
