"""Wiring: kopf watches -> a keyed work queue -> ``Reconciler``; plus health and metrics.

kopf provides the watches (listing, reconnects, 410 Gone re-lists) and login. Its event handlers
only enqueue the owning KimiK3Deployment; the reconcile is level-based (no kopf progress or
diff-base annotations are written, so a large spec never overflows annotation limits, F5).

With ``lease_namespace`` set, replicas elect a leader on a Lease (leadership.py): every replica
watches, only the leader's workers take keys from the queue, and the ``Kube`` client refuses
writes when not leading (``NotLeading``: the key goes back to the queue, not counted as a failure).

Health server (aiohttp, one port, on every replica): ``/healthz`` fails when the work queue of the
leader has not made progress within ``stall_after_s`` while work is due, or the watch layer is
down (a standby's queue waits by design); ``/readyz`` is 200 once kopf is ready; ``/metrics``
serves the operator's Prometheus metrics (``kimik3_operator_leader``: who leads).

Wake endpoint (``wake_port``, every replica): the activator (``controller.activator``) that a
sleeping deployment's HTTPRoute points at (``wake_service``, ``render.wake``). Any replica may
answer: a wake is an annotation patch, not a reconcile, so it is not fenced by the Lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import heapq
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import kopf
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from kimik3.kube.kinds import CHILD_KINDS, KIMIK3_DEPLOYMENT, POD, Kind
from kimik3.admission import AdmissionPolicy
from kimik3.controller import metrics
from kimik3.controller.activator import Activator, activator_app
from kimik3.controller.cache import ObjectCache
from kimik3.controller.crashes import CrashReporter
from kimik3.controller.idle import request_wake
from kimik3.controller.kopfadapter import Insights
from kimik3.controller.kube import Kube, NotLeading, api_client_from_kubeconfig
from kimik3.controller.lateapis import tolerate_unserved_kinds, watch_late_apis
from kimik3.controller.leadership import LeaderElection, LeaseTimings, default_identity
from kimik3.controller.reconcile import Reconciler
from kimik3.controller.recreation import GroupFailures
from kimik3.controller.staging import DEFAULT_STAGER_IMAGE
from kimik3.kube.labels import DEPLOYMENT_LABEL, MANAGED_BY, MANAGED_BY_LABEL
from kimik3.render.wake import WakeEndpoint

log = logging.getLogger("kimik3.operator")

Key = tuple[str, str]

WATCHED: tuple[Kind, ...] = (*CHILD_KINDS, POD)
"""Children watched to catch drift and deletion, and pods for group status and teardown."""


class WorkQueue:
    """Keyed delay queue: each key is pending at most once (earliest due time wins) and is never
    processed by two workers at once; failures back off exponentially per key (1 s .. 5 min)."""

    def __init__(self) -> None:
        self._due: dict[Key, float] = {}
        self._heap: list[tuple[float, Key]] = []
        self._active: set[Key] = set()
        self._later: dict[Key, float] = {}
        """Due times asked for keys that were being reconciled at the time."""
        self._failures: dict[Key, int] = {}
        self._wake = asyncio.Event()
        self.last_progress = time.monotonic()

    def add(self, key: Key, delay: float = 0.0) -> None:
        due = time.monotonic() + delay
        if key in self._active:
            self._later[key] = min(self._later.get(key, due), due)
            return
        if key in self._due and self._due[key] <= due:
            return
        self._due[key] = due
        heapq.heappush(self._heap, (due, key))
        metrics.QUEUE_DEPTH.set(len(self._due))
        self._wake.set()

    def add_all(self) -> None:
        """Make every pending or running key due now (a reconciled key is always pending again:
        every outcome but a deleted CR requeues), e.g. when a child kind became watchable."""
        for key in [*self._due, *self._active]:
            self.add(key)

    def overdue(self, now: float) -> bool:
        """Whether some key has been due for over a second (used by the liveness check)."""
        return any(due < now - 1 for due in self._due.values())

    async def _next(self) -> Key:
        while True:
            now = time.monotonic()
            while self._heap and self._due.get(self._heap[0][1]) != self._heap[0][0]:
                heapq.heappop(self._heap)  # stale entry: the key was re-added earlier or taken
            if self._heap and self._heap[0][0] <= now:
                _, key = heapq.heappop(self._heap)
                del self._due[key]
                self._active.add(key)
                metrics.QUEUE_DEPTH.set(len(self._due))
                return key
            timeout = (self._heap[0][0] - now) if self._heap else None
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), timeout)
            except asyncio.TimeoutError:
                pass

    def _done(self, key: Key, requeue_after: float | None, failed: bool) -> None:
        self._active.discard(key)
        self.last_progress = time.monotonic()
        if failed:
            n = self._failures[key] = self._failures.get(key, 0) + 1
            requeue_after = min(300.0, 2.0 ** (n - 1))
        else:
            self._failures.pop(key, None)
        delays = [] if requeue_after is None else [requeue_after]
        if key in self._later:
            delays.append(self._later.pop(key) - time.monotonic())
        if delays:
            self.add(key, max(0.0, min(delays)))

    async def worker(self, reconciler: Reconciler, election: LeaderElection | None = None) -> None:
        """Reconcile keys as they come due; with ``election``, only while this replica leads."""
        while True:
            if election is not None and not election.leading():
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(election.changed.wait(), 1.0)
                self.last_progress = max(self.last_progress, time.monotonic())  # a standby's wait is no stall
                continue
            key = await self._next()
            failed, requeue = False, None
            try:
                if election is not None and not election.leading():
                    raise NotLeading("lost the Lease before this key's turn")
                result = await asyncio.to_thread(reconciler.reconcile, *key)
                requeue, failed = result.requeue_after, result.retry
                for other in result.wake:  # their PlacementConflict is out of date (controller/placementmix.py)
                    self.add(other)
            except NotLeading:  # the next leader reconciles it; here it waits for leadership again
                requeue = 0.0
            except Exception:  # the queue retries with backoff; the error is counted and logged
                log.exception("reconcile of %s/%s failed", *key)
                failed = True
            self._done(key, requeue, failed)


@dataclass
class OperatorConfig:
    kubeconfig: str | None = None
    """Kubeconfig file; None = in-cluster service account."""
    namespaces: list[str] = field(default_factory=list)
    """Namespaces to watch; empty = cluster-wide."""
    health_port: int = 8080
    health_host: str = "0.0.0.0"
    workers: int = 4
    compute_domains: bool = True
    """Create ComputeDomains and channel claims (needs NVIDIA's DRA driver in the cluster)."""
    policy: AdmissionPolicy = field(default_factory=AdmissionPolicy)
    """What specs may do beyond the schema (allowed hostPath folders)."""
    stager_image: str = DEFAULT_STAGER_IMAGE
    """Image of the staging Jobs (the operator's own: it holds ``kimik3 stage``)."""
    stall_after_s: float = 120.0
    """Liveness fails when due work waited this long without any reconcile finishing (F6)."""
    lease_namespace: str | None = None
    """Namespace of the leader-election Lease (the operator's own); None = no election (one replica)."""
    lease_name: str = "kimik3-operator"
    identity: str = field(default_factory=default_identity)
    """This replica's ``holderIdentity`` in the Lease."""
    lease_timings: LeaseTimings = field(default_factory=LeaseTimings)
    wake_port: int | None = None
    """Port of the activator (on ``health_host``); None: not served."""
    wake_service: WakeEndpoint | None = None
    """The Service in front of the activator, where sleeping deployments' HTTPRoutes go; None: routes never
    change for idleness (requests through the gateway to a stopped deployment find no engine)."""


def kind_served(cache: ObjectCache, queue: WorkQueue, kind: Kind) -> None:
    """A watched kind that kopf did not watch (not served, or not yet) is watched now: drop what was
    cached of it (no watch kept it true) and reconcile every deployment at once."""
    cache.forget_kind(*kind.type_meta)
    queue.add_all()


def connection_info(kube: Kube) -> kopf.ConnectionInfo:
    """kopf's login from the operator's own client configuration (kubeconfig or service account)."""
    c = kube.api.configuration
    header = c.get_api_key_with_prefix("BearerToken") or c.get_api_key_with_prefix("authorization") or ""
    token = header.split(" ", 1)[-1] if header else None
    return kopf.ConnectionInfo(server=c.host, ca_path=c.ssl_ca_cert, insecure=not c.verify_ssl,
                               scheme="Bearer" if token else None, token=token,
                               certificate_path=c.cert_file, private_key_path=c.key_file)


def configure(settings: kopf.OperatorSettings) -> None:
    """kopf's settings: our own Events, watch timeouts, no peering, no CRD or namespace scanning."""
    settings.posting.enabled = False  # our Events are posted by the reconciler
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.watching.connect_timeout = 10
    settings.watching.reconnect_backoff = 1.0
    settings.networking.request_timeout = 60
    settings.peering.standalone = True
    # No CRD or namespace observation by kopf, cluster-wide or not: a child kind whose CRD is
    # installed later is found by the operator's own discovery look-up within lateapis.PERIOD_S,
    # and a watched kind whose CRD is deleted is waited out, not fatal (controller/lateapis.py);
    # so the operator needs no RBAC on CRDs (a Role per namespace when namespace-scoped).
    settings.scanning.disabled = True


def owner_key(body: kopf.Body) -> Key | None:
    """The KimiK3Deployment that owns ``body`` (owner reference, else the deployment label)."""
    namespace = body.metadata.namespace or ""
    for ref in body.metadata.get("ownerReferences", []) or []:
        if ref.get("kind") == KIMIK3_DEPLOYMENT.kind and \
                ref.get("apiVersion", "").startswith(KIMIK3_DEPLOYMENT.group + "/"):
            return namespace, ref["name"]
    name = (body.metadata.labels or {}).get(DEPLOYMENT_LABEL)
    return (namespace, name) if name else None


def watch_children(registry: kopf.OperatorRegistry, queue: WorkQueue, cache: ObjectCache,
                   crashes: CrashReporter) -> None:
    """An event handler per ``WATCHED`` kind: the cache updated, engine failures recorded, the
    owning deployment queued (not for the echo of our own apply)."""
    for kind in WATCHED:
        def on_child(body: kopf.Body, event: kopf.RawEvent, _plural: str = kind.plural, **_: Any) -> None:
            metrics.WATCH_EVENTS.labels(resource=_plural).inc()
            raw: dict[str, Any] = dict(event.get("object") or body)
            echo = event.get("type") != "DELETED" and cache.is_echo(raw)
            cache.update(event.get("type"), raw)
            key = owner_key(body)
            failed = 0
            if _plural == POD.plural and key and event.get("type") != "DELETED":
                failed = crashes.pod_seen(raw, key[1])
            if key and not echo:
                # coalesce bursts (a group's pods change together); a new engine failure at once: the
                # start back-off must reach the launcher ConfigMap before the recreated group starts
                queue.add(key, 0.0 if failed else 0.5)

        kopf.on.event(kind.group, kind.version, kind.plural, registry=registry, id=f"child-{kind.plural}",
                      labels={MANAGED_BY_LABEL: MANAGED_BY})(on_child)


def build_registry(cfg: OperatorConfig, queue: WorkQueue, cache: ObjectCache, crashes: CrashReporter,
                   insights: Insights) -> kopf.OperatorRegistry:
    """kopf handlers for one operator instance (a registry of its own, so tests can run several).
    ``crashes`` reports engine container failures seen on the pod watch (crashes.py);
    ``insights`` (the one given to ``kopf.operator``) lets kinds whose CRD comes later be watched
    (lateapis.py)."""
    registry = kopf.OperatorRegistry()
    api = api_client_from_kubeconfig(cfg.kubeconfig)

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return connection_info(Kube(api))

    late: list[asyncio.Task[None]] = []

    @kopf.on.startup(registry=registry)
    async def start(settings: kopf.OperatorSettings, **_: Any) -> None:
        configure(settings)
        # started here: kopf's re-scan needs the context kopf runs its tasks in
        late.append(asyncio.get_running_loop().create_task(
            watch_late_apis(Kube(api), (*WATCHED, KIMIK3_DEPLOYMENT), insights, settings, registry,
                            functools.partial(kind_served, cache, queue)),
            name="kimik3 late APIs"))

    @kopf.on.cleanup(registry=registry)
    async def stop_late_apis(**_: Any) -> None:
        for task in late:
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)

    @kopf.on.event(KIMIK3_DEPLOYMENT.group, KIMIK3_DEPLOYMENT.version, KIMIK3_DEPLOYMENT.plural,
                   registry=registry)
    def on_deployment(body: kopf.Body, event: kopf.RawEvent, **_: Any) -> None:
        metrics.WATCH_EVENTS.labels(resource=KIMIK3_DEPLOYMENT.plural).inc()
        namespace = body.metadata.namespace or ""
        if event.get("type") is None:  # listed (start, or re-list after a lost watch / 410 Gone)
            cache.forget_applied(namespace, body.metadata.name)
        cache.update(event.get("type"), dict(event.get("object") or body))  # every CR, for controller/placementmix.py
        queue.add((namespace, body.metadata.name))

    watch_children(registry, queue, cache, crashes)
    return registry


async def _health_server(cfg: OperatorConfig, queue: WorkQueue, ready: asyncio.Event) -> web.AppRunner:
    async def healthz(_: web.Request) -> web.Response:
        now = time.monotonic()
        if queue.overdue(now) and now - queue.last_progress > cfg.stall_after_s:
            return web.Response(status=500, text=f"stalled: no reconcile finished for {now - queue.last_progress:.0f} s")
        return web.Response(text="ok")

    async def readyz(_: web.Request) -> web.Response:
        return web.Response(text="ready") if ready.is_set() else web.Response(status=503, text="starting")

    async def metrics_handler(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.add_routes([web.get("/healthz", healthz), web.get("/readyz", readyz), web.get("/metrics", metrics_handler)])
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, cfg.health_host, cfg.health_port).start()
    return runner


async def run_operator(cfg: OperatorConfig, stop: threading.Event | asyncio.Event | None = None,
                       ready: threading.Event | None = None) -> None:
    """Run until ``stop`` is set (or forever). ``ready`` is set once kopf has started watching."""
    queue = WorkQueue()
    cache = ObjectCache()
    api = api_client_from_kubeconfig(cfg.kubeconfig)
    election = None if cfg.lease_namespace is None else \
        LeaderElection(Kube(api), cfg.lease_namespace, cfg.lease_name, cfg.identity, cfg.lease_timings)
    kube = Kube(api, fence=election)
    failures = GroupFailures()
    insights = Insights()  # what kopf resolved and watches; shared with controller/lateapis.py
    registry = build_registry(cfg, queue, cache, CrashReporter(kube, failures), insights)
    reconciler = Reconciler(kube, compute_domains=cfg.compute_domains, cache=cache, policy=cfg.policy,
                            failures=failures, stager_image=cfg.stager_image, wake=cfg.wake_service,
                            namespaces=tuple(cfg.namespaces))
    kopf_ready = asyncio.Event()
    runner = await _health_server(cfg, queue, kopf_ready)
    waker = None
    if cfg.wake_port is not None:
        unfenced = Kube(api)  # a wake is the client's request, as `kimik3 wake` is: any replica writes it
        waker = web.AppRunner(activator_app(Activator(lambda ns, name, uid: request_wake(unfenced, ns, name, uid=uid))),
                              access_log=None)
        await waker.setup()
        await web.TCPSite(waker, cfg.health_host, cfg.wake_port).start()
    workers = [asyncio.create_task(queue.worker(reconciler, election)) for _ in range(cfg.workers)]
    if election is not None:
        workers.append(asyncio.create_task(election.run()))

    async def mark_ready() -> None:
        await kopf_ready.wait()
        if ready is not None:
            ready.set()

    marker = asyncio.create_task(mark_ready())
    try:
        with tolerate_unserved_kinds((*WATCHED, KIMIK3_DEPLOYMENT), functools.partial(kind_served, cache, queue)):
            await kopf.operator(registry=registry, insights=insights, clusterwide=not cfg.namespaces,
                                namespaces=cfg.namespaces, stop_flag=stop, ready_flag=kopf_ready, standalone=True)
    finally:
        for task in [*workers, marker]:
            task.cancel()
        await asyncio.gather(*workers, marker, return_exceptions=True)
        await runner.cleanup()
        if waker is not None:
            await waker.cleanup()
