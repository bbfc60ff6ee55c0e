"""The activator: the operator's wake endpoint, where a sleeping deployment's HTTPRoute sends its
requests (``render.wake``; ``kimik3 run --wake-port``).

Each request is answered at once, never held open while engines load (a load takes minutes):

- 503 with ``Retry-After`` (whole seconds, at least ``MIN_RETRY_AFTER_S``): the time left until the
  wake is expected to serve, from ``status.idle.wakeEstimateSeconds`` (the load time measured before
  the stop) counted from the first wake this process asked for; ``UNKNOWN_ESTIMATE_S`` when no load
  time was measured (or the stop was not seen by this process, e.g. after its restart);
- the deployment is woken by ``controller.idle.request_wake`` (its wake annotation), at most once per
  deployment every ``WAKE_INTERVAL_S`` seconds however many requests arrive: the requests between
  are answered from memory. A wake request while it loads only restarts its idle clock;
- 400 when the request does not name a deployment in ``render.wake.DEPLOYMENT_HEADER`` and
  ``UID_HEADER`` (it did not come through a route the operator rendered), 404 when no
  KimiK3Deployment of that name has that uid (the uid is a precondition of the wake's patch: a
  route of another tenant cannot wake a deployment it cannot read), 503 with ``Retry-After:
  WAKE_INTERVAL_S`` when the API server refused the wake (the body says why).

Bodies are JSON in the OpenAI error shape (``{"error": {"message", "type", "code"}}``), which the
engines' clients already parse. Whoever can reach the gateway can wake a stopped deployment through
its route (as the first request through it should).
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from kimik3.api.v1alpha1 import IdleStatus
from kimik3.controller.kube import ApiError, Invalid, NotFound
from kimik3.render.wake import DEPLOYMENT_HEADER, UID_HEADER

log = logging.getLogger("kimik3.activator")

WAKE_INTERVAL_S = 5.0
"""Fewest seconds between two wake requests (annotation patches) for one deployment."""
MIN_RETRY_AFTER_S = 1
"""Smallest ``Retry-After``, seconds (also once the estimate has passed and the load goes on)."""
UNKNOWN_ESTIMATE_S = 10.0
"""Seconds to ``Retry-After`` when no wake estimate is known (no load time was measured before the stop)."""


@dataclass(frozen=True)
class Answer:
    """One response of the activator: HTTP ``status``, ``Retry-After`` seconds (None: no header) and the message."""

    status: int
    message: str
    retry_after: int | None = None

    def body(self) -> dict[str, Any]:
        """The OpenAI error shape."""
        kind = {400: "BadRequestError", 404: "NotFoundError"}.get(self.status, "ServiceUnavailableError")
        return {"error": {"message": self.message, "type": kind, "code": self.status}}

    def headers(self) -> dict[str, str]:
        return {} if self.retry_after is None else {"Retry-After": str(self.retry_after)}


@dataclass
class _Waking:
    """One deployment's wake as this process asked for it (monotonic clock seconds)."""

    requested_at: float
    """The last wake request (annotation patch)."""
    serves_at: float
    """When the wake is expected to serve: the first request after the stop + the estimate."""
    stopped_at: str | None
    """status.idle.stoppedAt of the stop this wake ends (a later stop starts a new wake)."""


Key = tuple[str, str, str]
"""(namespace, name, uid) of a KimiK3Deployment."""


class Activator:
    """Answers requests for sleeping deployments and wakes them (module docstring). ``wake(namespace,
    name, uid)`` asks for a wake and returns status.idle as the CR holds it (``controller.idle.request_wake``
    bound to a ``Kube``; raises ``NotFound``, ``Conflict`` for another uid, or another ``ApiError``);
    ``clock``: monotonic seconds."""

    def __init__(self, wake: Callable[[str, str, str], IdleStatus], clock: Callable[[], float] = time.monotonic,
                 interval_s: float = WAKE_INTERVAL_S) -> None:
        self.wake, self.clock, self.interval_s = wake, clock, interval_s
        self._waking: dict[Key, _Waking] = {}
        self._locks: dict[Key, threading.Lock] = {}
        self._guard = threading.Lock()

    def answer(self, deployment: str | None, uid: str | None) -> Answer:
        """The answer to a request whose ``DEPLOYMENT_HEADER`` is ``deployment`` (``<namespace>/<name>``)
        and ``UID_HEADER`` ``uid`` (None when absent). Blocks on the API server at most once per
        deployment per ``interval_s``."""
        namespace, _, name = (deployment or "").strip().partition("/")
        uid = (uid or "").strip()
        if not namespace or not name or "/" in name or not uid:
            return Answer(400, f"no deployment named: the {DEPLOYMENT_HEADER} header must be <namespace>/<name> and "
                               f"{UID_HEADER} its uid (got {deployment!r}, {uid!r}); the operator's HTTPRoute sets "
                               "them on routes to the wake endpoint")
        key = (namespace, name, uid)
        with self._guard:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:  # concurrent first requests wait for the one wake request, then answer from it
            now = self.clock()
            waking = self._waking.get(key)
            if waking is None or now - waking.requested_at >= self.interval_s:
                try:
                    idle = self.wake(namespace, name, uid)
                except ApiError as exc:
                    if isinstance(exc, NotFound) or isinstance(exc, Invalid) and "metadata.uid" in exc.message:
                        # none, or another object of that name (its uid is immutable): the same to the client
                        self._waking.pop(key, None)
                        return Answer(404, f"no KimiK3Deployment {namespace}/{name} with uid {uid}")
                    log.warning("wake of %s/%s refused: %s", namespace, name, exc)
                    self._waking[key] = (_Waking(now, waking.serves_at, waking.stopped_at) if waking
                                         else _Waking(now, now, None))
                    return Answer(503, f"KimiK3Deployment {namespace}/{name} is not serving and its wake failed "
                                       f"({exc}); retrying", math.ceil(self.interval_s))
                waking = self._woken(key, idle, waking, now)
            left = max(MIN_RETRY_AFTER_S, math.ceil(waking.serves_at - now))
            return Answer(503, f"KimiK3Deployment {namespace}/{name} is waking from its idle stop: no engine serves "
                               f"yet; retry after {left} s", left)

    def _woken(self, key: Key, idle: IdleStatus, waking: _Waking | None, now: float) -> _Waking:
        """The wake after a request at ``now`` whose answer was ``idle``: a new one when the CR says
        stopped since a stop this process has not woken, else the one under way."""
        if waking is None or idle.stopped_at is not None and idle.stopped_at != waking.stopped_at:
            estimate = idle.wake_estimate_seconds if idle.stopped_at is not None else None
            log.info("waking %s/%s (stopped since %s; estimate %s s)", *key[:2], idle.stopped_at, estimate)
            waking = _Waking(now, now + (UNKNOWN_ESTIMATE_S if estimate is None else estimate), idle.stopped_at)
        else:
            waking.requested_at = now
        self._waking[key] = waking
        return waking


def activator_app(activator: Activator) -> web.Application:
    """The aiohttp application answering every method and path with ``Activator.answer`` (the API
    call runs in a worker thread, off the operator's event loop)."""

    async def handle(request: web.Request) -> web.Response:
        answer = await asyncio.to_thread(activator.answer, request.headers.get(DEPLOYMENT_HEADER),
                                         request.headers.get(UID_HEADER))
        return web.json_response(answer.body(), status=answer.status, headers=answer.headers())

    app = web.Application()
    app.router.add_route("*", "/{path:.*}", handle)
    return app
