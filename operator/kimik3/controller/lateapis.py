"""Watch the child kinds whose API appears after the operator started (a CRD installed later).

kopf re-reads a group's discovery on every watch event of a CRD in that group, but the API server
publishes a new CRD's resource in discovery asynchronously, after it set the CRD Established: when
the CRD's last event arrives before discovery lists the resource, kopf logs "Unresolved resources
cannot be served" and does not watch that kind until its CRD watch reconnects (``server_timeout``,
300 s here); with ``settings.scanning.disabled`` (a namespace-scoped install) not until a restart.
Seen on a loaded machine: the Gateway API CRD installed after the operator, a deleted HTTPRoute not
healed within 20 s. The same race is known from other kopf operators (azimuth-cloud/zenith#15).

``watch_late_apis`` closes both gaps: every ``period_s`` it asks discovery (``GET
/apis/<group>/<version>``, readable by every authenticated user) about each watched kind kopf has
not resolved, and once the resource is served runs kopf's own re-scan of that group (the function
its CRD watch calls on an event), which starts the watch, then calls ``watched(kind)``: the
operator drops what it cached of the kind (no watch kept it true) and reconciles every deployment
at once, so a child deleted before the watch started, or whose apply failed while the kind was
missing (retried with back-off up to 5 min), is restored now. Nothing is asked while every
kind is resolved.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable

import kopf
from kopf._cogs.structs.references import Insights
from kopf._core.reactor.observation import process_discovered_resource_event
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kimik3.controller.kube import call_json
from kimik3.kube.kinds import Kind

log = logging.getLogger("kimik3.lateapis")

PERIOD_S = 5.0
"""How often unresolved kinds are looked up in discovery, seconds (one GET per missing group)."""


def unresolved(kinds: Iterable[Kind], insights: Insights) -> list[Kind]:
    """The kinds of ``kinds`` kopf does not watch (no resource of that group and plural resolved)."""
    watched = {(r.group, r.plural) for r in insights.watched_resources}
    return [k for k in kinds if (k.group, k.plural) not in watched]


def served(api: client.ApiClient, kind: Kind) -> bool:
    """Whether discovery lists ``kind`` in its group version (404: the group version is not served)."""
    try:
        listing = call_json(api, "GET", f"/apis/{kind.group}/{kind.version}" if kind.group else "/api/v1")
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return any(r.get("name") == kind.plural for r in (listing or {}).get("resources", []))


async def watch_late_apis(api: client.ApiClient, kinds: Iterable[Kind], insights: Insights,
                          settings: kopf.OperatorSettings, registry: kopf.OperatorRegistry,
                          watched: Callable[[Kind], None], period_s: float = PERIOD_S) -> None:
    """Run forever: start kopf's watch of each kind of ``kinds`` whose API is served but unwatched,
    then call ``watched(kind)``; call it too for a kind kopf's own CRD watch resolved since the last
    look (cluster-wide; seen on ``dev up``: a re-installed CRD's HTTPRoute came back only at the
    next apply retry, 30-50 s later). Must run in a task kopf's context was copied into (its re-scan reads
    kopf's context variables): start it from a kopf startup handler."""
    kinds = tuple(kinds)
    missing: list[Kind] = []
    while True:
        await asyncio.sleep(period_s)
        now_missing = unresolved(kinds, insights)
        for kind in (k for k in missing if k not in now_missing):  # kopf's own CRD watch resolved it
            log.info("%s (%s) is watched now", kind.kind, kind.api_version)
            watched(kind)
        for kind in now_missing:
            try:
                if not await asyncio.to_thread(served, api, kind):
                    continue
            except (ApiException, OSError) as exc:
                log.debug("discovery of %s/%s: %s", kind.group, kind.version, exc)
                continue
            log.info("%s (%s) is served now and was not watched: re-scanning the group", kind.kind, kind.api_version)
            await process_discovered_resource_event(
                raw_event={"type": "MODIFIED", "object": {"spec": {"group": kind.group}}},
                settings=settings, registry=registry, insights=insights)
            watched(kind)
        missing = unresolved(kinds, insights)
