"""Bounded waits for components of the dev cluster, and the error that names the failed one.

Every wait has a deadline; every failure says which component failed, where its log is, its
last lines, and how to retry (``ComponentError``). Only 127.0.0.1 URLs are ever requested.
"""

from __future__ import annotations

import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlparse

from kimik3_dev.devcluster.processes import ProcessRecord, log_tail

__all__ = ["ComponentError", "http_get", "wait_for"]

POLL_S = 0.25
"""Seconds between two readiness checks."""


class ComponentError(RuntimeError):
    """A dev-cluster component failed to start or become ready.

    ``component``: its name; ``log``: its log file (or None); ``retry``: a command line that
    retries. ``str()`` gives all three plus the log's last lines.
    """

    def __init__(self, component: str, what: str, log: str | Path | None = None, retry: str = "") -> None:
        self.component, self.what, self.log, self.retry = component, what, log, retry
        text = f"{component}: {what}"
        if log:
            text += f"\n  log: {log}\n  --- last lines ---\n" + "\n".join(
                "  " + line for line in log_tail(log).splitlines())
        if retry:
            text += f"\n  retry: {retry}"
        super().__init__(text)


def http_get(url: str, *, ca_file: Path | None = None, token: str | None = None,
             timeout_s: float = 3.0) -> tuple[int, bytes]:
    """GET a loopback URL; returns (status, body). Refuses any host but 127.0.0.1/localhost.
    HTTPS is verified against ``ca_file``. Raises ``OSError`` when nothing answers."""
    host = urlparse(url).hostname
    if host not in ("127.0.0.1", "localhost"):
        raise ValueError(f"refusing to connect to {host!r}: the dev cluster only talks to 127.0.0.1")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    context = ssl.create_default_context(cafile=str(ca_file)) if url.startswith("https") else None
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout_s,
                                    context=context) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def wait_for(component: str, check: Callable[[], bool | str], timeout_s: float, *,
             process: ProcessRecord | None = None, retry: str = "",
             tick: Callable[[float], None] | None = None) -> None:
    """Call ``check`` until it returns True, at most ``timeout_s`` seconds.

    ``check`` may return a string: the latest "not yet" reason, quoted in the timeout error.
    Exceptions from ``check`` count as "not yet". If ``process`` exits meanwhile, fail at once.
    ``tick(elapsed_s)`` is called after each poll (progress display).
    """
    start = time.monotonic()
    last = "no answer yet"
    while True:
        if process is not None and not process.alive:
            raise ComponentError(component, "exited during start", process.log, retry)
        try:
            result = check()
            if result is True:
                return
            if isinstance(result, str):
                last = result
        except Exception as exc:  # noqa: BLE001 - any failure of a probe means "not ready yet"
            last = f"{type(exc).__name__}: {exc}"
        elapsed = time.monotonic() - start
        if tick is not None:
            tick(elapsed)
        if elapsed > timeout_s:
            raise ComponentError(component, f"not ready within {timeout_s:.0f} s (last check: {last})",
                                 process.log if process else None, retry)
        time.sleep(POLL_S)
