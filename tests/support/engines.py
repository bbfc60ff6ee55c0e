"""Simulated engines (``kimik3_dev.sim.engine.SimEngine``) served from an event loop of their own
in a thread, for tests whose code under test is synchronous (the operator's reconcile)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from kimik3_dev.sim.engine import EngineConfig, SimEngine


class SimEngines:
    """``start(config)`` an engine on a free loopback port; ``close()`` stops every one. A context manager."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="sim-engines", daemon=True)
        self.thread.start()
        self.engines: list[SimEngine] = []

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=30)

    def start(self, config: EngineConfig) -> SimEngine:
        async def make() -> SimEngine:
            engine = SimEngine(config)  # its asyncio objects belong to this loop
            await engine.start()
            return engine
        engine: SimEngine = self._run(make())
        self.engines.append(engine)
        return engine

    def close(self) -> None:
        for engine in self.engines:
            self._run(engine.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)

    def __enter__(self) -> SimEngines:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
