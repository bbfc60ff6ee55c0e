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
its CRD watch calls on an event; ``kopfadapter.rescan_group``), which starts the watch, then calls
``watched(kind)``: the operator drops what it cached of the kind (no watch kept it true) and
reconciles every deployment at once, so a child deleted before the watch started, or whose apply
failed while the kind was missing (retried with back-off up to 5 min), is restored now. Nothing is
asked while every kind is resolved.

The other way round, a watched kind's CRD deleted: kopf's watch of it gets ``404 page not found``
on its next list or watch request, and kopf lets that error end the whole operator ("Watcher for
... has failed"; with its CRD watch on, only when the watch reconnected before the CRD
event stopped it: a race the chart's minimal-RBAC proof lost in CI). ``tolerate_unserved_kinds``
makes such a watch wait instead (``kopfadapter.unserved_kinds_waited_out``: only the kinds named,
only while the operator runs): it asks again every ``PERIOD_S``, and once the kind is served again
calls ``served_again(kind)``, which drops what the operator cached of the kind and reconciles every
deployment, restoring children the CRD's removal took along.

kopf's private modules are used only in controller/kopfadapter.py, which says why no public API
serves either direction.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable, Iterator

import kopf
from kimik3.controller import kopfadapter
from kimik3.controller.kube import ApiError, Kube, NotFound
from kimik3.kube.kinds import Kind

log = logging.getLogger("kimik3.lateapis")

PERIOD_S = 5.0
"""How often unresolved kinds are looked up in discovery, seconds (one GET per missing group)."""


@contextlib.contextmanager
def tolerate_unserved_kinds(kinds: Iterable[Kind], served_again: Callable[[Kind], None]) -> Iterator[None]:
    """Run ``kopf.operator`` inside this: its watches of ``kinds`` wait out a kind that is not
    served (module docstring), asking again every ``PERIOD_S``, and call ``served_again(kind)``
    once it is served again. Other kinds, and other operators in the process, are unaffected."""
    by_name = {(k.group, k.plural): k for k in kinds}
    def back(group: str, plural: str) -> None:
        served_again(by_name[group, plural])

    with kopfadapter.unserved_kinds_waited_out(by_name, PERIOD_S, back):
        yield


def unresolved(kinds: Iterable[Kind], insights: kopfadapter.Insights) -> list[Kind]:
    """The kinds of ``kinds`` kopf does not watch (no resource of that group and plural resolved)."""
    resolved = kopfadapter.watched(insights)
    return [k for k in kinds if (k.group, k.plural) not in resolved]


def served(kube: Kube, kind: Kind) -> bool:
    """Whether discovery lists ``kind`` in its group version (404: the group version is not served)."""
    try:
        listing = kube.request("GET", f"/apis/{kind.group}/{kind.version}" if kind.group else "/api/v1")
    except NotFound:
        return False
    return any(r.get("name") == kind.plural for r in (listing or {}).get("resources", []))


async def watch_late_apis(kube: Kube, kinds: Iterable[Kind], insights: kopfadapter.Insights,
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
            await kopfadapter.rescan_group(kind.group, settings=settings, registry=registry, insights=insights)
            watched(kind)
