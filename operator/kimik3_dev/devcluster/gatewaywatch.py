"""``kimik3 dev gateways``: a gateway for every InferencePool the operator renders (started by ``dev up``).

A cluster with an inference Gateway controller programs a data plane for each InferencePool and runs
the pool's endpoint picker as the Deployment the operator rendered (``kimik3.render.routing``). kwok
runs no containers, so in the dev cluster this loop (every ``POLL_S``) stands in for both, for each
InferencePool labelled ``app.kubernetes.io/managed-by=kimik3-operator``:

- it starts the pool's gateway (``gateway.start``): the real picker with the config file of the
  rendered ``<name>-epp`` ConfigMap and the args and env of the rendered Deployment's container
  (``gateway.picker_for``; what a host process changes is listed in ``gateway.host_argv``), and
  Envoy in front of it. The picker calls the API server as the rendered ServiceAccount
  ``<name>-epp`` (a TokenRequest token, ``TOKEN_LIFETIME_S``), so the rendered Role is what it
  may read, as in a pod;
- it restarts them when the rendered config file or args change (a spec change), or when either
  process died, and stops them when the pool goes (routing turned off, the deployment deleted);
- it follows the pool's HTTPRoute (named like the pool, as the operator renders it): while its
  backendRef is the operator's wake Service (``wake``: a stopped deployment, ``kimik3.render.wake``),
  Envoy sends every request to the operator's activator with the headers the rule's
  ``RequestHeaderModifier`` sets, and to the pool again once the route names the pool
  (``gateway.write_routes``: Envoy reloads its routes, the listener and connections stay);
- it keeps ``<state>/gateway/gateways.json`` (``kimik3_dev.sim.services.write_gateways``): each
  pool's Envoy listener, which ``dev status`` prints and ``dev load --via-gateway`` targets;
- the picker's pod: kwok makes it Running and Ready at once, so the Deployment is available and
  the CR's RoutingReady follows; with ``dev up --readiness-probes`` (kwok leaves a pod with a
  readinessProbe unready) this loop plays the kubelet's prober for it: Ready once the gateway started
  (the picker answered Envoy's gRPC health check), as the probe on its health port would say.

The processes die with this one (``die_with_parent``) and ``dev down`` stops them too (pidfiles
``gateway-epp-<ns>-<pool>``, ``gateway-envoy-<ns>-<pool>``).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client

from kimik3.controller.kube import ApiError
from kimik3.kube import pods as kpods
from kimik3.kube.kinds import DEPLOYMENT, HTTP_ROUTE, INFERENCE_POOL, POD, SERVICE
from kimik3.kube.labels import MANAGED_BY, MANAGED_BY_LABEL
from kimik3.kube.times import rfc3339
from kimik3.render.wake import WakeEndpoint
from kimik3_dev.devcluster import gateway, processes
from kimik3_dev.devcluster.rbac import request_token, write_token_kubeconfig
from kimik3_dev.devcluster.readiness import ComponentError
from kimik3_dev.devcluster.rest import Rest
from kimik3_dev.sim import services

__all__ = ["GatewayWatcher"]

POLL_S = 1.0
TOKEN_LIFETIME_S = 7 * 24 * 3600
"""The picker's ServiceAccount token, seconds (a week: longer than a dev session; a kubelet rotates
a projected token instead)."""
log = logging.getLogger("kimik3.dev.gateways")


@dataclass(frozen=True)
class _Running:
    started: gateway.Gateway
    picker: gateway.Picker
    deployment: str


def wake_route(route: dict[str, Any] | None, wake: WakeEndpoint, address: tuple[str, int]) -> gateway.WakeRoute | None:
    """The ``WakeRoute`` to ``address`` (the activator) when a rule of HTTPRoute ``route`` has the
    wake Service ``wake`` as its backendRef (its namespace, else the route's), with the headers its
    ``RequestHeaderModifier`` filter sets; None otherwise (the route goes to the pool, or is absent)."""
    if route is None:
        return None
    here = route["metadata"]["namespace"]
    for rule in (route.get("spec") or {}).get("rules") or []:
        for ref in rule.get("backendRefs") or []:
            if (ref.get("group", SERVICE.group), ref.get("kind", SERVICE.kind)) == (SERVICE.group, SERVICE.kind) \
                    and (ref.get("namespace") or here, ref.get("name"), ref.get("port")) \
                    == (wake.namespace, wake.service, wake.port):
                headers = tuple((h["name"], h["value"]) for f in rule.get("filters") or []
                                if f.get("type") == "RequestHeaderModifier"
                                for h in (f.get("requestHeaderModifier") or {}).get("set") or [])
                return gateway.WakeRoute(address, headers)
    return None


class GatewayWatcher:
    """Runs a gateway for each operator-rendered InferencePool of the cluster behind ``api``
    (module docstring); ``server`` and ``ca_file``: the API server's URL and CA for the pickers'
    kubeconfigs; ``binaries``: where the EPP and Envoy binaries are (default ``bin_dir()``);
    ``wake``: the operator's wake Service (``kimik3 run --wake-service``) and the ``(ip, port)`` its
    activator listens on (``--wake-port``), None: routes to the wake Service are not followed."""

    def __init__(self, api: client.ApiClient, state_dir: Path, server: str, ca_file: Path,
                 binaries: Path | None = None, wake: tuple[WakeEndpoint, tuple[str, int]] | None = None) -> None:
        self.api, self.rest = api, Rest(api)
        self.state_dir, self.server, self.ca_file, self.binaries = state_dir, server, ca_file, binaries
        self.wake = wake
        self.running: dict[str, _Running] = {}
        self.routes: dict[str, gateway.WakeRoute | None] = {}
        """What each running gateway's Envoy routes to now (None: the pool)."""
        self.listeners: dict[str, str] | None = None

    def step(self) -> None:
        pools = {f"{p['metadata']['namespace']}/{p['metadata']['name']}": p
                 for p in self.rest.items(INFERENCE_POOL.path(), f"{MANAGED_BY_LABEL}={MANAGED_BY}")
                 if not p["metadata"].get("deletionTimestamp")}
        for key, run in list(self.running.items()):
            why = self._stale(run, pools.get(key))
            if why:
                log.info("stopping the gateway of %s: %s", key, why)
                gateway.stop(self.state_dir, run.started)
                del self.running[key]
                self.routes.pop(key, None)
        for key, pool in pools.items():
            if key not in self.running:
                self._start(pool)
        for key, run in self.running.items():
            self._probe(run)
            self._follow_route(key, run)
        listeners = {key: run.started.url for key, run in self.running.items()}
        if listeners != self.listeners:
            services.write_gateways(self.state_dir, listeners)
            self.listeners = listeners

    def _stale(self, run: _Running, pool: dict[str, Any] | None) -> str | None:
        if pool is None:
            return "the InferencePool is gone"
        dead = [r.name for r in (run.started.epp, run.started.envoy) if not r.alive]
        if dead:
            return f"{', '.join(dead)} exited (logs: {', '.join(str(processes.log_path(self.state_dir, d)) for d in dead)})"
        try:
            now = gateway.picker_for(self.rest, pool)
        except ValueError as exc:
            return str(exc)
        if (now.config, now.args) != (run.picker.config, run.picker.args):
            return "its picker's rendered config file or args changed"
        return None

    def _start(self, pool: dict[str, Any]) -> None:
        namespace, name = pool["metadata"]["namespace"], pool["metadata"]["name"]
        deployment = ((pool.get("spec") or {}).get("endpointPickerRef") or {}).get("name") or ""
        rendered = self.rest.get(DEPLOYMENT.path(namespace, deployment)) if deployment else None
        if rendered is None:  # the operator applies the pool before its picker: the next step starts it
            log.info("InferencePool %s/%s: no picker Deployment %r yet", namespace, name, deployment)
            return
        try:
            picker = gateway.picker_for(self.rest, pool)
            account = rendered["spec"]["template"]["spec"].get("serviceAccountName") or "default"
            token, _ = request_token(self.api, namespace, account, TOKEN_LIFETIME_S)
            kubeconfig = write_token_kubeconfig(self.state_dir / "gateway" / f"{namespace}-{name}" / "kubeconfig",
                                                self.server, self.ca_file, f"{namespace}-{account}", token)
            started = gateway.start(self.state_dir, kubeconfig, self.rest, namespace, name, picker,
                                    die_with_parent=True, binaries=self.binaries,
                                    wake=None if self.wake is None else self.wake[1])
        except (ValueError, ApiError, ComponentError) as exc:
            log.warning("no gateway for InferencePool %s/%s yet: %s", namespace, name, exc)
            for kind in ("envoy", "epp"):  # what a failed start left running
                processes.stop(self.state_dir, f"gateway-{kind}-{namespace}-{name}", kill=True)
            return
        log.info("InferencePool %s/%s: gateway %s (picker metrics %s, started in %s)", namespace, name,
                 started.url, started.epp_metrics_url, {k: round(v, 1) for k, v in started.start_s.items()})
        self.running[f"{namespace}/{name}"] = _Running(started, picker, deployment)

    def _follow_route(self, key: str, run: _Running) -> None:
        """Envoy's routes as the pool's HTTPRoute says (module docstring), rewritten when that changes."""
        if self.wake is None or run.started.routes_file is None:
            return
        route = self.rest.get(HTTP_ROUTE.path(run.started.namespace, run.started.pool))
        wanted = wake_route(route, *self.wake)
        if key in self.routes and self.routes[key] == wanted:
            return
        version = str(int(time.time() * 1000))
        gateway.write_routes(run.started.routes_file, gateway.route_config(run.started.failure_mode, wanted), version)
        log.info("InferencePool %s: Envoy routes to %s (HTTPRoute %s)", key,
                 "the pool" if wanted is None else f"the wake endpoint {self.wake[0]}", "absent" if route is None
                 else "resource version " + str(route["metadata"].get("resourceVersion")))
        self.routes[key] = wanted

    def _probe(self, run: _Running) -> None:
        """The picker's pods Ready while its gateway runs (module docstring)."""
        namespace = run.started.namespace
        deployment = self.rest.get(DEPLOYMENT.path(namespace, run.deployment))
        if deployment is None:
            return
        labels = deployment["spec"]["selector"].get("matchLabels") or {}
        for pod in self.rest.items(POD.path(namespace), ",".join(f"{k}={v}" for k, v in sorted(labels.items()))):
            status = pod.get("status") or {}
            if status.get("phase") != "Running" or kpods.is_ready(pod) or kpods.is_terminating(pod):
                continue
            now = rfc3339()
            containers = [{"name": c["name"], "ready": True} for c in pod["spec"]["containers"]]
            body = {"status": {"conditions": [{"type": t, "status": "True", "lastTransitionTime": now}
                                              for t in ("Ready", "ContainersReady")],
                               "containerStatuses": containers}}
            try:  # a strategic merge patch, as a kubelet writes: conditions and containers merged by type and name
                self.rest.call("PATCH", POD.path(namespace, pod["metadata"]["name"]) + "/status", body,
                               content_type="application/strategic-merge-patch+json")
            except ApiError as exc:
                log.warning("could not mark picker pod %s/%s Ready: %s", namespace, pod["metadata"]["name"], exc)

    def run_forever(self) -> None:
        while True:
            try:
                self.step()
            except Exception:  # noqa: BLE001 - a dev stand-in keeps going, the log says why
                log.exception("gateway watcher step failed")
            time.sleep(POLL_S)
