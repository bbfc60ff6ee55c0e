"""Leader election on a ``coordination.k8s.io/v1`` Lease: one replica reconciles and writes.

Every replica watches (its caches stay warm, its /healthz, /readyz and /metrics answer), but only
the one holding the Lease ``<namespace>/<name>`` reconciles, autoscales and writes. The rules are
client-go's leader election (``k8s.io/client-go/tools/leaderelection``), with its default timings:

- the holder renews ``spec.renewTime`` every ``retry_period_s`` (2 s) with an update that carries
  the Lease's resourceVersion, so of two replicas writing one Lease only one wins;
- a replica that does not hold the Lease takes it over only after it has seen the same Lease
  record (holder, renewTime, resourceVersion) unchanged for ``lease_duration_s`` (15 s) of its
  own clock, or at once when the holder released it (``holderIdentity`` empty);
- the holder counts itself leader until ``renew_deadline_s`` (10 s) after the *start* of its last
  successful renewal, and a write it starts may take at most until ``lease_duration_s`` after that
  start (``write_timeout``): ``renew_deadline_s < lease_duration_s``, so a leader cut off from the
  API server stops writing 5 s before any other replica may take over. A request the API server
  received before the client gave up may still be applied: the one gap no client-side election
  closes (the 5 s margin bounds the time it has).

Takeover after the leader dies: at most ``lease_duration_s + 2 * retry_period_s`` (19 s); after a
leader that stops cleanly (SIGTERM: it releases the Lease) at most ``retry_period_s`` plus one
request. Measured figures: docs/reliability.md.

Why not kopf's peering: kopf's peering objects (``KopfPeering``) only pause the operators of
lower priority; there is no renew deadline, so a replica cut off from the API server keeps
handling events while another starts, and its handlers are not stopped from writing (kopf
docs: "Peering"). The Lease API gives the fencing above with two verbs of RBAC.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from kimik3.controller import metrics
from kimik3.controller.kube import Kube, NotFound, NotLeading
from kimik3.kube.kinds import LEASE
from kimik3.kube.times import rfc3339

__all__ = ["LeaderElection", "LeaseTimings", "default_identity"]

log = logging.getLogger("kimik3.leadership")

@dataclass(frozen=True)
class LeaseTimings:
    """Seconds of the election (client-go's and controller-runtime's defaults)."""

    lease_duration_s: float = 15.0
    """How long a standby waits on an unchanged Lease before it takes it over."""
    renew_deadline_s: float = 10.0
    """How long the holder counts itself leader after the start of its last successful renewal."""
    retry_period_s: float = 2.0
    """Time between two attempts to acquire or renew."""

    def __post_init__(self) -> None:
        if not 0 < self.retry_period_s < self.renew_deadline_s < self.lease_duration_s:
            raise ValueError(f"need 0 < retry period ({self.retry_period_s:g} s) < renew deadline "
                             f"({self.renew_deadline_s:g} s) < lease duration ({self.lease_duration_s:g} s)")

    @property
    def takeover_bound_s(self) -> float:
        """Longest a standby takes to lead after the leader died without releasing the Lease."""
        return self.lease_duration_s + 2 * self.retry_period_s


def default_identity() -> str:
    """``<hostname>_<random>``: the pod name in a cluster, unique per process (client-go's form)."""
    return f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"


class LeaderElection:
    """The election of one replica (module docstring). ``run()`` is the loop; ``leading()`` and
    ``write_timeout()`` (the ``WriteFence`` of ``kimik3.controller.kube.Kube``) answer from the
    local monotonic clock, from any thread."""

    def __init__(self, kube: Kube, namespace: str, name: str, identity: str,
                 timings: LeaseTimings = LeaseTimings(), clock: Callable[[], float] = time.monotonic):
        self.kube = replace(kube, fence=None, timeout_s=timings.retry_period_s)
        """Unfenced (the election itself decides who leads); each call ends within a retry period."""
        self.namespace, self.name, self.identity = namespace, name, identity
        self.timings = timings
        self.clock = clock
        self._renewed_at: float | None = None
        """Local time at which the last successful renewal (or acquisition) was sent."""
        self._observed: tuple[Any, ...] | None = None
        self._observed_at = 0.0
        self.changed = asyncio.Event()
        """Set whenever leading() may have changed (for the work queue's workers)."""
        metrics.LEADER.set(0)

    # -- what the rest of the operator asks ---------------------------------------------------
    def leading(self) -> bool:
        return self._renewed_at is not None and self.clock() < self._renewed_at + self.timings.renew_deadline_s

    def write_timeout(self) -> float:
        """Seconds a write started now may take; raises ``NotLeading`` when this replica does not lead."""
        if not self.leading():
            raise NotLeading(f"{self.identity} does not hold Lease {self.namespace}/{self.name}")
        assert self._renewed_at is not None
        return max(0.1, self._renewed_at + self.timings.lease_duration_s - self.clock())

    # -- the loop ---------------------------------------------------------------------------
    async def run(self) -> None:
        """Acquire, then renew, every retry period, until cancelled; on cancel, release the Lease
        when holding it (the standby then takes over within one retry period)."""
        was_leading = False
        try:
            while True:
                await asyncio.to_thread(self.try_acquire_or_renew)
                now_leading = self.leading()
                if now_leading != was_leading:
                    log.warning("%s %s Lease %s/%s", self.identity, "now holds" if now_leading else "lost",
                                self.namespace, self.name)
                    metrics.LEADER.set(1 if now_leading else 0)
                    if now_leading:
                        metrics.LEADER_TRANSITIONS.inc()
                    else:
                        metrics.GPU_TIME.clear()
                    was_leading = now_leading
                    self.changed.set()
                    self.changed = asyncio.Event()
                await asyncio.sleep(self._sleep_s())
        except asyncio.CancelledError:
            if self.leading():
                await asyncio.to_thread(self.release)
            raise

    def _sleep_s(self) -> float:
        """The retry period, shortened so that leading() flips to False on time."""
        period = self.timings.retry_period_s
        if self._renewed_at is not None and self.leading():
            period = min(period, self._renewed_at + self.timings.renew_deadline_s - self.clock() + 0.01)
        return max(0.01, period)

    def _path(self) -> str:
        return LEASE.path(self.namespace, self.name)

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        return self.kube.request(method, path, body)

    def try_acquire_or_renew(self) -> bool:
        """One attempt (synchronous): True when this replica holds the Lease afterwards."""
        started = self.clock()
        try:
            lease = self._call("GET", self._path())
        except NotFound:
            lease = None
        except Exception as exc:  # unreachable API server: retried next period
            log.info("reading Lease %s/%s failed: %s", self.namespace, self.name, exc)
            return False
        now = rfc3339(micro=True)
        spec: dict[str, Any] = {"holderIdentity": self.identity,
                                "leaseDurationSeconds": int(self.timings.lease_duration_s),
                                "renewTime": now}
        try:
            if lease is None:
                spec |= {"acquireTime": now, "leaseTransitions": 0}
                self._call("POST", LEASE.path(self.namespace), {
                    "apiVersion": LEASE.api_version, "kind": LEASE.kind,
                    "metadata": {"name": self.name, "namespace": self.namespace}, "spec": spec})
            else:
                current = lease.get("spec") or {}
                holder = current.get("holderIdentity") or ""
                record = (holder, current.get("renewTime"), lease["metadata"]["resourceVersion"])
                if record != self._observed:
                    self._observed, self._observed_at = record, started
                if holder != self.identity:
                    if holder and started < self._observed_at + self.timings.lease_duration_s:
                        self._renewed_at = None
                        return False  # held by another replica whose Lease has not expired
                    spec |= {"acquireTime": now, "leaseTransitions": int(current.get("leaseTransitions") or 0) + 1}
                else:
                    spec |= {"acquireTime": current.get("acquireTime") or now,
                             "leaseTransitions": int(current.get("leaseTransitions") or 0)}
                self._call("PUT", self._path(), {**lease, "spec": {**current, **spec}})
        except Exception as exc:  # conflict (another replica won), forbidden, unreachable
            log.info("%s: writing Lease %s/%s failed: %s", self.identity, self.namespace, self.name,
                     getattr(exc, "status", None) or exc)
            return False
        self._renewed_at = started
        return True

    def release(self) -> None:
        """Give the Lease up (holder empty, 1 s duration) so a standby takes it at its next try."""
        self._renewed_at = None
        metrics.LEADER.set(0)
        metrics.GPU_TIME.clear()
        log.warning("%s stops leading: releasing Lease %s/%s", self.identity, self.namespace, self.name)
        try:
            lease = self._call("GET", self._path())
            if (lease.get("spec") or {}).get("holderIdentity") != self.identity:
                return
            lease["spec"] |= {"holderIdentity": "", "leaseDurationSeconds": 1, "renewTime": rfc3339(micro=True)}
            self._call("PUT", self._path(), lease)
        except Exception as exc:  # the Lease then expires on its own
            log.info("releasing Lease %s/%s failed: %s", self.namespace, self.name, exc)
