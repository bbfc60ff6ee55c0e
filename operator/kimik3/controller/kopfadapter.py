"""The one module that uses kopf's private modules (``kopf._cogs``, ``kopf._core``): an import-linter
contract in pyproject.toml lets no other module import them, and ``tests/test_kopf_adapter.py``
fails, naming what changed (a module path, a signature, an attribute, or the source of a function
whose behaviour is relied on), when the installed kopf changes anything listed under "What it
relies on" below.

Everything else goes through kopf's public API (``kopf.operator``, ``kopf.on``, ``kopf.Resource``,
``kopf.OperatorSettings``). kopf==1.45.2 has no public way to do two things that
controller/lateapis.py needs, so this module does them:

1. **Watch a kind whose API was first served after the start** (``rescan_group``), with no RBAC
   on CRDs. kopf works out which resources to watch once, when it starts; only its own CRD watch
   (``settings.scanning``) re-scans a group later. That watch needs list/watch on CRDs, which the
   chart does not grant, and it misses a kind whose discovery entry appears after the CRD's last
   event (lateapis.py). Registering handlers later (``kopf.on.event``) changes the registry, not
   the set of resources kopf resolved. Stopping ``kopf.operator`` and running it again after each
   change is public, but it lists every watched kind again and loses the events between the runs.
2. **Wait out a watched kind that is no longer served** (``unserved_kinds_waited_out``). When a
   kind's CRD is deleted, kopf's next list or watch request gets a 404, and that error ends the
   watcher task and with it the whole operator. kopf's configuration docs say so ("deleted CRDs
   causing failures" when scanning is disabled). No setting or error hook catches it. Running
   ``kopf.operator`` again after it ended that way does not work either: when kopf ends a run
   itself, it starts a timer that SIGKILLs the process 10 min later
   (``settings.process.ultimate_exiting_timeout``), and turning that off also removes the guard for
   a real shutdown. So, only while an operator runs and only for the kinds it names, kopf's watch
   function (``watching.infinite_watch``, which ``queueing.watcher`` looks up on its module for
   each watch) is replaced by one that waits out a 404 instead of raising it. Every other resource
   gets kopf's own generator object, not a wrapper. When the last such operator in the process
   stops, the function kopf had is put back.

What it relies on (``tests/test_kopf_adapter.py`` checks each item):
- ``kopf._cogs.structs.references.Insights`` (what ``kopf.operator(insights=)`` takes): its
  ``watched_resources``, a set of ``kopf.Resource``.
- ``kopf._core.reactor.observation.process_discovered_resource_event(raw_event=, settings=,
  registry=, insights=)``: re-scans the group ``raw_event['object']['spec']['group']`` and
  updates ``insights``; kopf then starts the watches. It reads kopf's context variables, so it
  has to run in a task that kopf's context was copied into.
- ``kopf._cogs.clients.watching.infinite_watch(*, settings, resource, namespace, ...)``: an async
  generator that ``kopf._core.reactor.queueing.watcher`` calls through the module for each watch.
  It ends only by raising, and raises ``kopf._cogs.clients.errors.APINotFoundError`` on a 404.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import threading
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, cast

import kopf
from kopf._cogs.clients import errors as _errors
from kopf._cogs.clients import watching as _watching
from kopf._cogs.structs.references import Insights
from kopf._core.reactor.observation import process_discovered_resource_event

__all__ = ["Insights", "watched", "rescan_group", "unserved_kinds_waited_out"]

log = logging.getLogger("kimik3.kopfadapter")

GroupPlural = tuple[str, str]
"""A resource as kopf identifies one across versions: ``(group, plural)``; group "" for core."""


def watched(insights: Insights) -> frozenset[GroupPlural]:
    """The resources kopf watches now (resolved from discovery), as ``(group, plural)``."""
    return frozenset((r.group, r.plural) for r in insights.watched_resources)


async def rescan_group(group: str, *, settings: kopf.OperatorSettings, registry: kopf.OperatorRegistry,
                       insights: Insights) -> None:
    """Re-scan the discovery of API ``group`` the way kopf's CRD watch does after an event in
    that group; kopf then starts a watch for every resource it now resolves there. Call it from
    a task started inside ``kopf.operator`` (for example, from a startup handler)."""
    await process_discovered_resource_event(
        raw_event={"type": "MODIFIED", "object": {"spec": {"group": group}}},
        settings=settings, registry=registry, insights=insights)


@dataclass(frozen=True)
class _Waiting:
    kinds: frozenset[GroupPlural]
    period_s: float
    served_again: Callable[[str, str], None]


_waiting: contextvars.ContextVar[_Waiting | None] = contextvars.ContextVar("kimik3_waiting", default=None)
_lock = threading.Lock()
_users = 0
_kopfs_watch: Callable[..., AsyncIterator[Any]] = _watching.infinite_watch
"""The ``infinite_watch`` that was in kopf's module when this adapter replaced it; it is called
for every watch and put back when the last user stops."""


@contextlib.contextmanager
def unserved_kinds_waited_out(kinds: Iterable[GroupPlural], period_s: float,
                              served_again: Callable[[str, str], None]) -> Iterator[None]:
    """While the ``with`` block runs ``kopf.operator``, a watch of any kind in ``kinds`` that
    gets a 404 tries again every ``period_s``, instead of ending the operator. When the kind is
    listed again, ``served_again(group, plural)`` is called. The kinds and the callback are held in
    a context variable, so they apply only to the watches this operator starts (several
    operators can run in one process)."""
    token = _waiting.set(_Waiting(frozenset(kinds), period_s, served_again))
    _install()
    try:
        yield
    finally:
        _uninstall()
        _waiting.reset(token)


def _install() -> None:
    global _users, _kopfs_watch
    with _lock:
        if _users == 0:
            _kopfs_watch = _watching.infinite_watch
            _watching.infinite_watch = _infinite_watch
        _users += 1


def _uninstall() -> None:
    global _users
    with _lock:
        _users -= 1
        if _users == 0 and _watching.infinite_watch is _infinite_watch:
            _watching.infinite_watch = _kopfs_watch


def _infinite_watch(*, resource: kopf.Resource, **kwargs: Any) -> AsyncIterator[Any]:
    """What kopf's watcher calls instead of ``infinite_watch``. For a kind that the current
    operator did not name, this returns kopf's own generator unchanged."""
    waiting = _waiting.get()
    if waiting is None or (resource.group, resource.plural) not in waiting.kinds:
        return _kopfs_watch(resource=resource, **kwargs)
    return _waited_out(_kopfs_watch, waiting, resource=resource, **kwargs)


async def _waited_out(watch: Callable[..., AsyncIterator[Any]], waiting: _Waiting, *, resource: kopf.Resource,
                      **kwargs: Any) -> AsyncIterator[Any]:
    """``watch(resource=resource, **kwargs)``: on a 404, wait ``waiting.period_s`` and start it
    again. At the first item after a 404 (kopf yields one when it has listed the kind, even if
    the list is empty), call ``waiting.served_again``."""
    unserved = False
    while True:
        try:
            # kopf's is an async generator: closed here when this one is, not left to the collector
            stream = cast(AsyncGenerator[Any, None], watch(resource=resource, **kwargs))
            async with contextlib.aclosing(stream) as events:
                async for event in events:
                    if unserved:
                        unserved = False
                        log.info("%s is served again", resource)
                        waiting.served_again(resource.group, resource.plural)
                    yield event
            return
        except _errors.APINotFoundError:
            if not unserved:
                log.warning("%s is not served (404: its CRD was removed?): asking again every %g s",
                            resource, waiting.period_s)
            unserved = True
            await asyncio.sleep(waiting.period_s)
