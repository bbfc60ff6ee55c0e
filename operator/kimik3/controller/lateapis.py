"""Follow the kinds the operator watches as their APIs come and go (a CRD installed or deleted after start).

kopf's own CRD observation is off (``settings.scanning.disabled``, cluster-wide too: the chart
grants nothing on CRDs). It was not enough anyway: kopf re-reads a group's discovery on every watch
event of a CRD in that group, but the API server publishes a new CRD's resource in discovery
asynchronously, after it set the CRD Established; when the CRD's last event arrived before
discovery listed the resource, kopf logged "Unresolved resources cannot be served" and did not
watch that kind until its CRD watch reconnected (300 s here). Seen on a loaded machine: the Gateway
API CRD installed after the operator, a deleted HTTPRoute not healed within 20 s. The same race is
known from other kopf operators (azimuth-cloud/zenith#15).

``watch_late_apis`` does it instead: every ``period_s`` it asks discovery (``GET
/apis/<group>/<version>``, readable by every authenticated user) about each watched kind kopf has
not resolved, and once the resource is served runs kopf's own re-scan of that group (the function
its CRD watch calls on an event), which starts the watch, then calls ``watched(kind)``: the
operator drops what it cached of the kind (no watch kept it true) and reconciles every deployment
at once, so a child deleted before the watch started, or whose apply failed while the kind was
missing (retried with back-off up to 5 min), is restored now. Nothing is asked while every
kind is resolved.

The other way round, a watched kind's CRD deleted: kopf's watch of it gets ``404 page not found``
on its next list or watch request, and kopf lets that error end the whole operator ("Watcher for
... has failed"; with its CRD watch on, only when the watch reconnected before the CRD
event stopped it: a race the chart's minimal-RBAC proof lost in CI). ``tolerate_unserved_kinds``
makes such a watch wait instead: it asks again every ``PERIOD_S``, and once the kind is served
again calls the operator's ``served_again(group, plural)``, which drops what it cached
of the kind and reconciles every deployment, restoring children the CRD's removal took along.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

import kopf
from kopf._cogs.clients import errors as kopf_errors
from kopf._cogs.clients import watching as kopf_watching
from kopf._cogs.structs.references import Insights, Resource
from kopf._core.reactor.observation import process_discovered_resource_event

from kimik3.controller.kube import ApiError, Kube, NotFound
from kimik3.kube.kinds import Kind

log = logging.getLogger("kimik3.lateapis")

PERIOD_S = 5.0
"""How often unresolved kinds are looked up in discovery, seconds (one GET per missing group)."""


ServedAgain = Callable[[str, str], None]
"""Told ``(group, plural)`` of a watched kind that was not served (404) and is served again."""
_served_again: contextvars.ContextVar[ServedAgain | None] = contextvars.ContextVar("kimik3_served_again",
                                                                                   default=None)


def tolerate_unserved_kinds(served_again: ServedAgain) -> None:
    """Make kopf's watches wait out a kind that is not served (module docstring), and tell
    ``served_again`` when it is back. Call it in the task that then runs ``kopf.operator``: the
    callback is held in a context variable, so every watch task kopf starts from there (and only
    those: several operators may run in one process) reports to it. kopf's watch function is
    wrapped once per process (kopf==1.45.2's ``infinite_watch``, which its watcher calls through
    the module; ``tests/test_late_apis.py`` fails if that changes)."""
    _served_again.set(served_again)
    if not getattr(kopf_watching.infinite_watch, "kimik3_tolerant", False):
        kopf_watching.infinite_watch = _tolerant(kopf_watching.infinite_watch)


def _tolerant(watch: Callable[..., AsyncIterator[Any]]) -> Callable[..., AsyncIterator[Any]]:
    async def infinite_watch(*, settings: kopf.OperatorSettings, resource: Resource,
                             **kwargs: Any) -> AsyncIterator[Any]:
        unserved = False
        while True:
            try:
                async for event in watch(settings=settings, resource=resource, **kwargs):
                    if unserved:  # listed again (the first item after a list, even an empty one)
                        unserved = False
                        log.info("%s is served again", resource)
                        callback = _served_again.get()
                        if callback is not None:
                            callback(resource.group, resource.plural)
                    yield event
                return
            except kopf_errors.APINotFoundError:
                if not unserved:
                    log.warning("%s is not served (404: its CRD was removed?): asking again every %g s",
                                resource, PERIOD_S)
                unserved = True
                await asyncio.sleep(PERIOD_S)
    infinite_watch.kimik3_tolerant = True  # type: ignore[attr-defined]
    return infinite_watch


def unresolved(kinds: Iterable[Kind], insights: Insights) -> list[Kind]:
    """The kinds of ``kinds`` kopf does not watch (no resource of that group and plural resolved)."""
    watched = {(r.group, r.plural) for r in insights.watched_resources}
    return [k for k in kinds if (k.group, k.plural) not in watched]


def served(kube: Kube, kind: Kind) -> bool:
    """Whether discovery lists ``kind`` in its group version (404: the group version is not served)."""
    try:
        listing = kube.request("GET", f"/apis/{kind.group}/{kind.version}" if kind.group else "/api/v1")
    except NotFound:
        return False
    return any(r.get("name") == kind.plural for r in (listing or {}).get("resources", []))


async def watch_late_apis(kube: Kube, kinds: Iterable[Kind], insights: Insights,
                          settings: kopf.OperatorSettings, registry: kopf.OperatorRegistry,
                          watched: Callable[[Kind], None], period_s: float = PERIOD_S) -> None:
    """Run forever: start kopf's watch of each kind of ``kinds`` whose API is served but unwatched,
    then call ``watched(kind)`` (the operator drops its cache of the kind and reconciles at once:
    seen on ``dev up``, a re-installed CRD's HTTPRoute otherwise came back only at the next apply
    retry, 30-50 s later). Must run in a task kopf's context was copied into (its re-scan reads
    kopf's context variables): start it from a kopf startup handler."""
    kinds = tuple(kinds)
    while True:
        await asyncio.sleep(period_s)
        for kind in unresolved(kinds, insights):
            try:
                if not await asyncio.to_thread(served, kube, kind):
                    continue
            except (ApiError, OSError) as exc:
                log.debug("discovery of %s/%s: %s", kind.group, kind.version, exc)
                continue
            log.info("%s (%s) is served now and was not watched: re-scanning the group", kind.kind, kind.api_version)
            await process_discovered_resource_event(
                raw_event={"type": "MODIFIED", "object": {"spec": {"group": kind.group}}},
                settings=settings, registry=registry, insights=insights)
            watched(kind)
