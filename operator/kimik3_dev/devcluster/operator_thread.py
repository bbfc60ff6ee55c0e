"""The operator run in a background thread of the current process (tests and ``kimik3 demo``)."""

from __future__ import annotations

import asyncio
import threading

from kimik3.controller.operator import OperatorConfig, run_operator
from kimik3_dev.devcluster.processes import free_port


class OperatorThread:
    """``start()`` returns once kopf watches; ``stop()`` ends it. ``health_url`` serves
    /healthz, /readyz and /metrics on loopback."""

    def __init__(self, kubeconfig: str, namespaces: list[str] | None = None, ready_timeout_s: float = 60.0):
        self.config = OperatorConfig(kubeconfig=kubeconfig, namespaces=list(namespaces or []),
                                     health_port=free_port(), health_host="127.0.0.1")
        self.health_url = f"http://127.0.0.1:{self.config.health_port}"
        self.ready_timeout_s = ready_timeout_s
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="kimik3-operator", daemon=True)

    def _main(self) -> None:
        try:
            asyncio.run(run_operator(self.config, stop=self._stop, ready=self._ready))
        except BaseException as exc:  # reported by start()/stop()
            self._error = exc
            self._ready.set()

    def start(self) -> OperatorThread:
        self._thread.start()
        if not self._ready.wait(self.ready_timeout_s):
            raise TimeoutError(f"operator not watching within {self.ready_timeout_s:g} s")
        if self._error:
            raise RuntimeError(f"operator failed to start: {self._error!r}") from self._error
        return self

    @property
    def running(self) -> bool:
        """Whether the operator still runs (False once it stopped, or failed: ``error``)."""
        return self._thread.is_alive()

    @property
    def error(self) -> BaseException | None:
        """What ended the operator, if it failed."""
        return self._error

    def stop(self, timeout_s: float = 30.0) -> None:
        self._stop.set()
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            raise TimeoutError("operator thread did not stop")

    def __enter__(self) -> OperatorThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
