"""The Services of the dev cluster, played as kube-proxy plays them: connections spread over the
Ready pods a Service selects.

No kube-proxy runs in the dev cluster, and no EndpointSlice controller either (the API server
refuses the loopback pod IPs in EndpointSlices: ``kimik3_dev.devcluster.kubecomponents``), and a
ClusterIP is not routed here. So for every Service that kube-proxy would program (a ``selector``,
a ClusterIP that is not ``None``, not ``ExternalName``) and each of its TCP ports, a ``ServicePort``
listens on a free 127.0.0.1 port and forwards each new connection to one endpoint picked at random
with equal chances (kube-proxy's iptables mode), byte for byte: a client's keep-alive connection
stays on the endpoint it was given. Its endpoints are what the EndpointSlice controller would
write, from the API server (``endpoints``): the pods of the Service's namespace its selector
matches that have an IP, are not terminating and are Ready, at its ``targetPort`` (a number, or
the name of a container port of that pod). A connection that arrives while there is none is
closed at once (kube-proxy rejects it).

Where a Service's stand-in listens is the one thing the API server cannot say: ``services.json``
(``write``/``read``) maps ``namespace/name`` and the Service's port to ``127.0.0.1:PORT``.
``service_address(state_dir, endpoint)`` resolves an in-cluster URL such as a CR's
``status.endpoint`` (``http://<name>.<namespace>.svc:<port>/v1``), as cluster DNS and kube-proxy
would, to its stand-in's base URL.

Likewise for the dev cluster's inference gateways (``kimik3_dev.devcluster.gateway``, started for
each InferencePool the operator renders by ``kimik3_dev.devcluster.gatewaywatch``):
``gateways.json`` (``write_gateways``/``read_gateways``/``gateway_address``) maps each pool's ``namespace/name`` to
its Envoy listener, the address a Gateway's would be.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from kimik3.kube import pods as kpods

log = logging.getLogger(__name__)

__all__ = ["ServicePort", "endpoints", "gateway_address", "programmed_ports", "read", "read_gateways",
           "service_address", "write_gateways"]

LOOPBACK = "127.0.0.1"
FILE = "services.json"
"""Under ``<state-dir>/sim/``: ``{"namespace/name": {"<service port>": "127.0.0.1:PORT"}}``."""
GATEWAYS_FILE = "gateway/gateways.json"
"""Under ``<state-dir>``: ``{"namespace/pool": "http://127.0.0.1:PORT"}`` (Envoy's listener per InferencePool)."""
CONNECT_TIMEOUT_S = 5.0
CHUNK = 65536


def programmed_ports(service: dict[str, Any]) -> list[dict[str, Any]]:
    """The TCP ports kube-proxy programs for ``service`` (camelCase), [] for one it leaves alone
    (no selector, headless, ExternalName)."""
    spec = service.get("spec") or {}
    if not spec.get("selector") or spec.get("clusterIP") == "None" or spec.get("type") == "ExternalName":
        return []
    return [p for p in spec.get("ports") or [] if p.get("protocol", "TCP") == "TCP"]


def _target_port(pod: dict[str, Any], target: int | str) -> int | None:
    if isinstance(target, int) or str(target).isdigit():
        return int(target)
    for c in (pod.get("spec") or {}).get("containers") or []:
        for p in c.get("ports") or []:
            if p.get("name") == target and p.get("protocol", "TCP") == "TCP":
                return int(p["containerPort"])
    return None


def endpoints(service: dict[str, Any], port: dict[str, Any], pods: list[dict[str, Any]],
              ready: Any = kpods.is_ready) -> list[tuple[str, int]]:
    """(pod IP, port) of each endpoint kube-proxy would send ``port`` of ``service`` to: the
    Ready (``ready(pod)``), non-terminating pods with an IP in its namespace that its selector
    matches, at ``targetPort`` (default: the port itself) resolved in each pod; sorted."""
    namespace = service["metadata"]["namespace"]
    selector = service["spec"]["selector"]
    target = port.get("targetPort", port["port"])
    out = []
    for pod in pods:
        if pod["metadata"].get("namespace") != namespace or kpods.is_terminating(pod):
            continue
        labels = kpods.labels(pod)
        ip = (pod.get("status") or {}).get("podIP")
        if not ip or any(labels.get(k) != v for k, v in selector.items()) or not ready(pod):
            continue
        number = _target_port(pod, target)
        if number is not None:
            out.append((ip, number))
    return sorted(out)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        pass


@dataclass
class ServicePort:
    """One port of one Service: a listener on 127.0.0.1 spreading connections over ``backends``."""

    namespace: str
    name: str
    port: int
    backends: list[tuple[str, int]] = field(default_factory=list)
    address: str = ""
    """``127.0.0.1:PORT`` once started."""
    rng: random.Random = field(default_factory=random.Random, repr=False)
    _server: asyncio.base_events.Server | None = field(default=None, repr=False)
    _tasks: set[asyncio.Task] = field(default_factory=set, repr=False)

    async def start(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((LOOPBACK, 0))
        self._server = await asyncio.start_server(self._serve, sock=sock)
        self.address = f"{LOOPBACK}:{sock.getsockname()[1]}"
        log.info("service %s/%s port %d: kube-proxy stand-in on %s", self.namespace, self.name, self.port,
                 self.address)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            if not self.backends:
                return  # no endpoint: rejected
            host, port = self.rng.choice(self.backends)
            try:
                up_reader, up_writer = await asyncio.wait_for(asyncio.open_connection(host, port), CONNECT_TIMEOUT_S)
            except (OSError, asyncio.TimeoutError) as exc:
                log.info("service %s/%s: endpoint %s:%d refused the connection (%s)", self.namespace, self.name,
                         host, port, exc)
                return
            try:
                await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
            finally:
                up_writer.close()
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
            self._tasks.discard(task)


def read(state_dir: Path | str) -> dict[str, dict[str, str]]:
    """``services.json`` of the simulator in ``state_dir``, {} when there is none."""
    try:
        return json.loads((Path(state_dir) / "sim" / FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def service_address(state_dir: Path | str, endpoint: str) -> str | None:
    """The base URL (``http://127.0.0.1:PORT``) that reaches the Service named by the in-cluster
    URL ``endpoint`` (``http://<name>.<namespace>.svc[.cluster.local]:<port>[/...]``), None when
    the simulator plays no such Service (yet). Raises ValueError for a URL that names no Service."""
    parts = urlsplit(endpoint)
    labels = (parts.hostname or "").split(".")
    if len(labels) < 3 or labels[2] != "svc" or parts.port is None:
        raise ValueError(f"{endpoint!r} is not a Service URL (http://<name>.<namespace>.svc:<port>)")
    address = read(state_dir).get(f"{labels[1]}/{labels[0]}", {}).get(str(parts.port))
    return f"{parts.scheme or 'http'}://{address}" if address else None


def write_gateways(state_dir: Path | str, listeners: dict[str, str]) -> Path:
    """Replace ``gateways.json`` (``GATEWAYS_FILE``) with ``listeners`` (``namespace/pool`` -> base URL)
    atomically; returns its path."""
    path = Path(state_dir) / GATEWAYS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(listeners, indent=1, sort_keys=True), encoding="utf-8")
    partial.replace(path)
    return path


def read_gateways(state_dir: Path | str) -> dict[str, str]:
    """``gateways.json`` in ``state_dir``: ``namespace/pool`` -> Envoy's base URL; {} when there is none."""
    try:
        return json.loads((Path(state_dir) / GATEWAYS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def gateway_address(state_dir: Path | str, namespace: str, pool: str) -> str | None:
    """The base URL of the gateway in front of InferencePool ``namespace/pool``, None when none runs."""
    return read_gateways(state_dir).get(f"{namespace}/{pool}")
