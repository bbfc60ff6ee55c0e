"""The lifetime of the wake ReferenceGrants: applied when a tenant namespace's route first goes to
the wake Service, deleted once no route of that namespace may.

``render.wake.reference_grant`` is the object (``kimik3-wake-<namespace>`` in the wake Service's
namespace); this module decides when it exists. A tenant namespace needs it while a
KimiK3Deployment there has ``spec.idle.stopAfter`` and ``spec.service.httpRoute`` (``needs_grant``:
its route goes to the wake Service whenever no group serves). ``WakeGrants.grant`` applies it the
first time one of them sleeps (``controller.reconcile``); ``WakeGrants.release`` deletes it when

- the namespace is gone or terminating (``metadata.deletionTimestamp``), or
- no KimiK3Deployment left in it needs it: the last one deleted, or edited to drop
  ``spec.idle.stopAfter`` or ``spec.service.httpRoute``.

Each deletion is decided from the cluster, read at that moment (the namespace, then its
KimiK3Deployments from the API server, not the watch cache), and logged with the reason. Memory
only says when to look: after the reconcile that finds a deployment gone (``gone``), after one that
sees a deployment no longer need it (``seen``), and in a sweep (``sweep_due``) that lists the
operator's grants (label ``app.kubernetes.io/managed-by=kimik3-operator``) and releases each one
no longer needed. A process that starts, or a replica that takes over the Lease, knows nothing, so
the sweep runs at its first reconcile and every ``SWEEP_S`` after: grants left while no operator
ran, or by a replica that led before, go then. An operator watching some namespaces only
(``kimik3 run --namespace``) sweeps the grants of those namespaces only.

Grants are applied and released under one lock: a release lists the deployments after any grant
decided on an older read, and a grant wanted after a release is applied again (``release``
forgets the namespace).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from kimik3.controller.kube import ApiError, Kube
from kimik3.kube.kinds import KIMIK3_DEPLOYMENT, NAMESPACE, REFERENCE_GRANT
from kimik3.kube.labels import MANAGED_BY, MANAGED_BY_LABEL
from kimik3.kube.objects import is_deleting
from kimik3.render.wake import GRANT_PREFIX, WakeEndpoint, reference_grant

log = logging.getLogger("kimik3.grants")

SWEEP_S = 600.0
"""Seconds between two sweeps of the operator's grants (the first at the process's first reconcile):
as often as the safety resync of a settled deployment (``controller.steps.RESYNC_READY_S``)."""


def needs_grant(obj: dict[str, Any]) -> bool:
    """Whether KimiK3Deployment ``obj`` (as stored) may send its route to the wake Service: it has
    ``spec.idle.stopAfter`` and ``spec.service.httpRoute``."""
    spec = obj.get("spec") or {}
    return bool((spec.get("idle") or {}).get("stopAfter")) and bool((spec.get("service") or {}).get("httpRoute"))


class WakeGrants:
    """The ReferenceGrants of ``wake``'s namespace that let tenant namespaces' HTTPRoutes name the
    wake Service. ``namespaces``: the namespaces the operator watches (empty: all); ``clock``:
    monotonic seconds (the sweep's timer)."""

    def __init__(self, kube: Kube, wake: WakeEndpoint, namespaces: Iterable[str] = (),
                 clock: Callable[[], float] = time.monotonic):
        self.kube = kube
        self.wake = wake
        self.namespaces = frozenset(namespaces)
        self.clock = clock
        self._granted: set[str] = set()
        """Tenant namespaces whose grant exists as far as this process knows (applied, or kept by a sweep)."""
        self._users: set[tuple[str, str]] = set()
        """(namespace, name) of the deployments last seen needing a grant."""
        self._swept_at: float | None = None
        self._lock = threading.Lock()

    def grant(self, namespace: str) -> None:
        """Apply the grant of tenant ``namespace`` unless this process knows it exists; raises
        ``ApiError`` when the API server refuses it (no ReferenceGrant CRD, no RBAC)."""
        with self._lock:
            if namespace in self._granted:
                return
            self.kube.apply(reference_grant(self.wake, namespace))
            self._granted.add(namespace)

    def seen(self, obj: dict[str, Any]) -> None:
        """After a reconcile of deployment ``obj``: note whether it needs a grant; when it needed one
        and needs none now, release its namespace's grant if nothing else there needs it."""
        key = (obj["metadata"]["namespace"], obj["metadata"]["name"])
        if key[0] == self.wake.namespace:  # its routes name the wake Service without a grant
            return
        if needs_grant(obj):
            self._users.add(key)
        elif key in self._users:
            self._users.discard(key)
            self._release_logged(key[0], f"{key[0]}/{key[1]} no longer has spec.idle.stopAfter and "
                                 "spec.service.httpRoute")

    def gone(self, namespace: str, name: str) -> None:
        """Deployment ``namespace/name`` is gone: release its namespace's grant if it or the
        namespace needed one and nothing there needs it now."""
        if (namespace, name) in self._users or namespace in self._granted:
            self._users.discard((namespace, name))
            self._release_logged(namespace, f"{namespace}/{name} was deleted")

    def sweep_due(self) -> None:
        """``sweep`` when none ran yet or the last one is ``SWEEP_S`` old; a refusal is logged and
        waits for the next sweep."""
        now = self.clock()
        if self._swept_at is not None and now - self._swept_at < SWEEP_S:
            return
        self._swept_at = now
        try:
            self.sweep()
        except ApiError as exc:
            log.warning("the wake ReferenceGrants in namespace %s could not be swept (%s); again in %.0f s",
                        self.wake.namespace, exc, SWEEP_S)

    def sweep(self) -> list[str]:
        """Release every grant of the operator (in the namespaces it watches) no longer needed;
        returns the tenant namespaces whose grant was deleted. Raises ``ApiError`` when the grants
        cannot be listed; a grant that cannot be released is logged and the sweep goes on."""
        listed = self.kube.list(*REFERENCE_GRANT.type_meta, self.wake.namespace, f"{MANAGED_BY_LABEL}={MANAGED_BY}")
        released = []
        for grant in listed:
            name = grant["metadata"]["name"]
            namespace = name.removeprefix(GRANT_PREFIX)
            if namespace == name or (self.namespaces and namespace not in self.namespaces):
                continue
            if self._release_logged(namespace, "found by the sweep") is not None:
                released.append(namespace)
        return released

    def release(self, namespace: str, trigger: str) -> str | None:
        """Delete the grant of tenant ``namespace`` if the cluster says nothing needs it (logged
        with ``trigger``, what made the operator look, and the reason); returns the reason, None
        when it is kept. Raises ``ApiError`` when a read or the deletion is refused."""
        with self._lock:
            why = self._unneeded(namespace)
            if why is None:
                self._granted.add(namespace)
                return None
            grant = f"{GRANT_PREFIX}{namespace}"
            if self.kube.delete(*REFERENCE_GRANT.type_meta, self.wake.namespace, grant):
                log.info("deleted ReferenceGrant %s/%s (HTTPRoutes of namespace %s may no longer name the wake "
                         "Service %s): %s; %s", self.wake.namespace, grant, namespace, self.wake, trigger, why)
            self._granted.discard(namespace)
            return why

    def _release_logged(self, namespace: str, trigger: str) -> str | None:
        """``release``; a refusal is logged (the next sweep looks again), not raised into the reconcile."""
        try:
            return self.release(namespace, trigger)
        except ApiError as exc:
            log.warning("ReferenceGrant %s/%s%s not released (%s: %s); the sweep looks again within %.0f s",
                        self.wake.namespace, GRANT_PREFIX, namespace, trigger, exc, SWEEP_S)
            return None

    def _unneeded(self, namespace: str) -> str | None:
        """Why tenant ``namespace`` needs no grant (read now from the API server); None while it does."""
        found = self.kube.get(*NAMESPACE.type_meta, "", namespace)
        if found is None:
            return f"namespace {namespace} is gone"
        if is_deleting(found):
            return f"namespace {namespace} is being deleted"
        users = [d for d in self.kube.list(*KIMIK3_DEPLOYMENT.type_meta, namespace, "") if needs_grant(d)]
        if users:
            self._users.update((namespace, d["metadata"]["name"]) for d in users)
            return None
        return (f"no KimiK3Deployment in namespace {namespace} has spec.idle.stopAfter and "
                "spec.service.httpRoute any more")
