"""Bounded recreation: a deployment whose groups keep failing is marked Degraded and started with back-off.

The LeaderWorkerSet recreates a group at once whenever one of its pods fails
(``RecreateGroupOnPodRestart``), and every recreated pod is new, so the kubelet's CrashLoopBackOff
(10 s, doubling, at most 5 min) never applies: an engine that exits at start-up (bad argument,
missing weights) is recreated in a hot loop, each time pulling and mounting for 4-12 GPUs.

``GroupFailures`` remembers the engine container failures the pod watch reports (crashes.py),
each termination once, and not those of pods already being deleted (the group's other pods,
stopped because the LeaderWorkerSet deletes the group: the consequence, not the cause). When a deployment's groups failed ``FAILURES`` (3) times within ``WINDOW_S`` (10 min):
- ``Degraded=True`` reason ``GroupCrashLooping`` names the groups, how often they failed and the
  last exit codes (``verdict``);
- the launcher plan carries ``startDelaySeconds`` (``start_delay_s``): every engine pod that
  starts waits that long before it starts vLLM, the kubelet's numbers: 10 s at the 3rd failure,
  doubling with each further failure in the window, at most 300 s. Running groups are not
  touched (the ConfigMap is read at start; the LeaderWorkerSet's template does not change).
Failures older than the window are forgotten; with none left the condition returns to
``AsExpected`` and the delay to 0.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from kimik3.api.conditions import Reason, Verdict

__all__ = ["BACKOFF_BASE_S", "BACKOFF_MAX_S", "FAILURES", "WINDOW_S", "Failure", "GroupFailures"]

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
    group: str
    exit_code: int
    reason: str
    """The container's termination reason (Error, OOMKilled, ...)."""


class GroupFailures:
    """Engine failures per deployment in the last ``WINDOW_S`` (thread-safe)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self._by_deployment: dict[tuple[str, str], deque[Failure]] = {}
        self._seen: deque[str] = deque(maxlen=4096)
        self._lock = threading.Lock()

    def record(self, namespace: str, deployment: str, key: str, group: str, exit_code: int, reason: str) -> None:
        """One termination; ``key`` identifies it (pod uid, container, finish time): seen again, it counts once."""
        with self._lock:
            if key in self._seen:
                return
            self._seen.append(key)
            self._by_deployment.setdefault((namespace, deployment), deque(maxlen=KEPT)).append(
                Failure(self.clock(), group, exit_code, reason))

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

    def start_delay_s(self, namespace: str, deployment: str) -> float:
        """Seconds a starting engine pod waits (module docstring); 0 below ``FAILURES``."""
        n = len(self.recent(namespace, deployment))
        return 0.0 if n < FAILURES else min(BACKOFF_MAX_S, BACKOFF_BASE_S * 2 ** (n - FAILURES))

    def verdict(self, namespace: str, deployment: str) -> Verdict | None:
        """``Degraded=True GroupCrashLooping`` at ``FAILURES`` failures in the window, else None."""
        failures = self.recent(namespace, deployment)
        if len(failures) < FAILURES:
            return None
        groups = sorted({f.group for f in failures}, key=lambda g: (not g.isdigit(), int(g) if g.isdigit() else 0, g))
        codes = ", ".join(f"{f.exit_code} ({f.reason})" for f in failures[-5:])
        return Verdict("True", Reason.GROUP_CRASH_LOOPING,
                       f"group(s) {', '.join(groups)} failed {len(failures)} times in the last {WINDOW_S / 60:g} min "
                       f"(last exit codes: {codes}); each recreated group's pods now wait "
                       f"{self.start_delay_s(namespace, deployment):g} s before starting vLLM "
                       "(back-off, doubling per failure up to 300 s); see the EngineFailed Events")
