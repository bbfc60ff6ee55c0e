"""``kimik3 dev up`` / ``dev down``: a whole simulated GB300 NVL72 cluster on one machine.

``DevCluster(state_dir).up(UpOptions(...))`` starts, each as a background process with a
pidfile (``<state>/pids/``) and a log (``<state>/logs/``, etcd and kube-apiserver log to
``<state>/etcd.log`` / ``kube-apiserver.log``; versions: ``kimik3_dev.versions``):

1. etcd + kube-apiserver (``ControlPlane``, ServiceAccount admission on);
2. kube-controller-manager + kube-scheduler (``kubecomponents``);
3. the CRDs: LeaderWorkerSet (+ DisaggregatedSet), ComputeDomain, PodMonitor, ServiceMonitor,
   Gateway API, InferencePool and InferenceObjective, KimiK3Deployment; with Prometheus, the
   Prometheus Operator's Prometheus, PrometheusRule and Probe;
4. the LeaderWorkerSet manager with its webhooks on 127.0.0.1 (``lws``), then the Kueue
   manager likewise (``kueue``; ``UpOptions.kueue``);
5. ``racks x trays`` Node objects and kwok as their kubelet (``racks``, ``kwok``), pod IPs from a
   127.N.0.0/16 of this cluster's own (``podnet``, recorded as ``cluster.json``'s ``pod_network``); with
   Kueue, its Topology (clique, then node), a ResourceFlavor for the profile and the ClusterQueue
   ``gpus`` holding every GPU of the cluster (tenants get LocalQueues from ``dev apply``); with
   ``UpOptions.tenants`` (``--tenant NAME=GPUS[:PRIORITY]``) a ClusterQueue per tenant in one Cohort,
   its LocalQueue and WorkloadPriorityClass (``kueue.Tenant``);
5b. on NVL72 racks (``UpOptions.compute_domains``), ``kimik3 dev dra-driver``: NVIDIA's ComputeDomain
   DRA driver simulated (``dradriver``: DeviceClasses, per-tray ResourceSlices, claim templates,
   daemons, status); the real scheduler allocates the claims;
6. the operator: ``kimik3 run`` (``--no-compute-domains`` when no driver runs), as the chart's
   ServiceAccount ``kimik3-system/kimik3-operator`` with the chart's RBAC (``rbac``), recorded in
   ``cluster.json``'s ``operator_identity``; its wake endpoint (the activator) on a port of its own,
   named as the chart's wake Service (``WAKE_SERVICE``; ``urls.wake``);
6b. ``kimik3 dev stagers``: staging-Job pods run as local processes, model-cache claims
   provisioned on host folders (``stagers``);
6c. ``kimik3 dev gateways``: the endpoint picker and Envoy for every InferencePool the operator
   renders, run as the rendered picker Deployment says (``gatewaywatch``), following each pool's
   HTTPRoute to the wake endpoint and back, listeners in
   ``<state>/gateway/gateways.json``;
7. the Prometheus Operator (out of cluster, ``promoperator``), a ``Prometheus`` object for it, the
   kit's config-reloader (``kimik3 dev config-reloader``: the operator's generated configuration ->
   a file -> ``/-/reload``) and Prometheus (2.42, built with Kubernetes SD) running that configuration:
   Kubernetes service discovery against the API server, the engines scraped by pod IP;
8. the engine simulator, ``kimik3 dev sim --kubeconfig K --state-dir D``, when this checkout has it.

Every wait is bounded; a failed step stops what was started and raises ``ComponentError``
naming the component, its log and how to retry. ``<state>/cluster.json`` records URLs, ports,
the rack shape, step timings (s) and the resident memory (bytes) of every process.
``DevCluster(state_dir).down()`` stops them all (newest first) by pidfile.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import config as k8s_config

import kimik3
from kimik3.controller.kube import ApiError
from kimik3.kube import nodes as knodes
from kimik3.kube.accelerators import PROFILES
from kimik3.kube.times import rfc3339
from kimik3.render.wake import WakeEndpoint
from kimik3_dev import command
from kimik3_dev.devcluster import (gateway, kubecomponents, kueue, kwok, lws, podnet, processes, prometheus,
                                   promoperator, rbac)
from kimik3_dev.devcluster.controlplane import ControlPlane, ControlPlaneError, bin_dir
from kimik3_dev.devcluster.install import apply_admission_policies, own_manifests
from kimik3_dev.devcluster.kueue import Tenant
from kimik3_dev.devcluster.processes import ProcessRecord, free_port
from kimik3_dev.devcluster.progress import Progress
from kimik3_dev.devcluster.racks import RACK_LABEL, RackShape, node_manifests
from kimik3_dev.devcluster.readiness import ComponentError, http_get, wait_for
from kimik3_dev.devcluster.rest import Rest
from kimik3_dev.devcluster.thirdparty import thirdparty_crd_paths
from kimik3_dev.devcluster.workloads import ensure_namespace
from kimik3_dev.sim import services
from kimik3_dev.versions import (ETCD_VERSION, HELM_VERSION, KUBERNETES_VERSION, KUEUE_VERSION, KWOK_VERSION,
                                 LWS_VERSION, PROMETHEUS_OPERATOR_VERSION, PROMETHEUS_VERSION)

__all__ = ["BINARIES", "DEFAULT_STATE_DIR", "DevCluster", "UpOptions", "sim_command_available"]

REPO_ROOT = Path(__file__).resolve().parents[3]
DEFAULT_STATE_DIR = Path(".state/dev")
BINARIES: dict[str, str] = {
    # build-binaries.sh component -> file in the binaries dir
    "etcd": f"etcd-{ETCD_VERSION}",
    "kube-apiserver": f"kube-apiserver-{KUBERNETES_VERSION}",
    "kube-controller-manager": f"kube-controller-manager-{KUBERNETES_VERSION}",
    "kube-scheduler": f"kube-scheduler-{KUBERNETES_VERSION}",
    "kwok": f"kwok-{KWOK_VERSION}",
    "lws": f"lws-manager-{LWS_VERSION}",
    "kueue": f"kueue-manager-{KUEUE_VERSION}",
    "helm": f"helm-{HELM_VERSION}",  # renders the chart's RBAC for the operator's identity
    "prometheus-operator": f"prometheus-operator-{PROMETHEUS_OPERATOR_VERSION}",
    "prometheus": f"prometheus-{PROMETHEUS_VERSION}",  # with Kubernetes SD, which Debian's package lacks
}
CONTROL_PLANE = ("etcd", "kube-apiserver")
"""Started by ``ControlPlane``, not from a recorded command line: ``stop_component`` refuses them."""
STOP_ORDER = ["sim", "config-reloader", "prometheus", "prometheus-operator", "gateways", "stagers", "operator", "dra-driver",
              "kwok", "kueue-manager", "lws-manager", "kube-scheduler",
              "kube-controller-manager", "kube-apiserver", "etcd"]
"""Components in stop order (the reverse of start order); unknown pidfiles go first."""
BUILD_TIMEOUT_S = 3600.0
"""Bound on building missing binaries (a cold kube-apiserver compile took 189 s here, plus
~2 min of module downloads)."""
SIM_HELP_TIMEOUT_S = 60.0
WAKE_SERVICE = WakeEndpoint(rbac.RELEASE_NAMESPACE, f"{rbac.RELEASE}-wake", 8081)
"""The wake Service as the chart names it (templates/wake.yaml): stopped deployments' HTTPRoutes name it
(``kimik3 run --wake-service``) and ``dev gateways`` sends what they route there to the operator's activator."""
OPERATOR_KUBECONFIG = "operator-sa.kubeconfig"
"""The operator's kubeconfig in the state dir: a TokenRequest token of the chart's ServiceAccount
(``rbac.install_operator_identity``). ``operator.kubeconfig`` is ControlPlane's static-token one."""


@dataclass
class UpOptions:
    """What ``up`` starts. ``wait_timeout_s``: bound on each readiness wait, seconds."""

    shape: RackShape = field(default_factory=RackShape)
    load_time: str = "20s"
    """Model load time the engine simulator waits before /health turns 200 (Go-style duration)."""
    sim: bool = True
    """Start the engine simulator when this checkout has ``kimik3 dev sim``."""
    readiness_probes: bool = False
    """A pod with a readinessProbe (a group leader) turns Ready only once its simulated engine has
    loaded (the simulator plays the kubelet's prober; ``kimik3_dev.devcluster.kwok``), not at once."""
    prometheus: bool = True
    kueue: bool = True
    """Run the Kueue manager (placement ``kueue``: gang admission, packing into racks, quota)."""
    tenants: tuple[Tenant, ...] = ()
    """Tenants with their own GPU quota and priority (``kueue.Tenant``; with ``kueue`` only)."""
    wait_timeout_s: float = 120.0
    compute_domains: bool | None = None
    """Run the simulated DRA driver (``dradriver``) and the operator with ComputeDomains; None: on
    for the profiles with multi-node NVLink (gb300, gb200), off otherwise."""
    die_with_parent: bool = False
    """Kill every process when the calling thread exits (test fixtures); False for ``dev up``."""


def _cli(*args: str) -> list[str]:
    """Command line of this checkout's ``kimik3`` CLI with the running interpreter."""
    return [sys.executable, "-m", "kimik3.cli", *args]


def _cli_env(**extra: str) -> dict[str, str]:
    """Environment for ``_cli`` children: the ``kimik3`` package this process runs first on
    PYTHONPATH, so the operator and simulator run exactly this code (a shared virtualenv's
    editable install may point at another checkout)."""
    package_root = str(Path(kimik3.__file__).resolve().parents[1])
    path = os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, **extra}


def register_webhooks(rest: Rest, configurations: list[dict[str, Any]]) -> None:
    """Server-side apply Mutating/ValidatingWebhookConfigurations (cluster-scoped)."""
    for doc in configurations:
        plural = "mutatingwebhookconfigurations" if doc["kind"].startswith("Mutating") \
            else "validatingwebhookconfigurations"
        rest.apply(f"/apis/admissionregistration.k8s.io/v1/{plural}/{doc['metadata']['name']}", doc)


def sim_command_available() -> tuple[bool, str]:
    """Whether ``kimik3 dev sim`` exists here; returns (available, its --help text)."""
    try:
        proc = subprocess.run(_cli("dev", "sim", "--help"), capture_output=True, text=True, env=_cli_env(),
                              timeout=SIM_HELP_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False, ""
    return proc.returncode == 0, proc.stdout


class DevCluster:
    """The dev cluster whose state lives in ``state_dir`` (see the module docstring)."""

    def __init__(self, state_dir: Path | str = DEFAULT_STATE_DIR) -> None:
        self.state_dir = Path(state_dir).resolve()
        self.state_file = self.state_dir / "cluster.json"
        self.kubeconfig = self.state_dir / "admin.kubeconfig"
        self._die_with_parent = False
        self._control_plane: ControlPlane | None = None  # set by up(): restart_apiserver needs it
        self._retry = f"{command()} dev up --state-dir {self.state_dir}  (a failed up already stopped what it started)"

    # -- queries -----------------------------------------------------------------------------
    def state(self) -> dict[str, Any] | None:
        """Contents of ``cluster.json`` (None when the cluster was never brought up here)."""
        try:
            return json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return None

    def components(self) -> list[ProcessRecord]:
        """Pidfiles of the started components, in start order."""
        return processes.records(self.state_dir)

    def running(self) -> list[ProcessRecord]:
        return [r for r in self.components() if r.alive]

    def rss_bytes(self) -> dict[str, int]:
        """Resident memory of each live component and its children, bytes."""
        return {r.name: processes.tree_rss_bytes(r.pid) for r in self.components() if r.alive}

    def api_client(self) -> Any:
        """A ``kubernetes.client.ApiClient`` as the admin user (``<state>/admin.kubeconfig``)."""
        return k8s_config.new_client_from_config(config_file=str(self.kubeconfig))

    # -- up ----------------------------------------------------------------------------------
    def up(self, options: UpOptions | None = None, progress: Progress | None = None) -> dict[str, Any]:
        """Start everything; returns the recorded state (also written to ``cluster.json``)."""
        opts = options or UpOptions()
        out = progress or Progress(quiet=True)
        self._die_with_parent = opts.die_with_parent
        alive = self.running()
        if alive:
            raise ComponentError("dev cluster", f"already running in {self.state_dir} "
                                 f"({', '.join(r.name for r in alive)})",
                                 retry=f"{command()} dev down --state-dir {self.state_dir}")
        self._clean()
        t0 = time.monotonic()
        state: dict[str, Any] = {"state_dir": str(self.state_dir), "kubeconfig": str(self.kubeconfig),
                                 "shape": asdict(opts.shape), "load_time": opts.load_time,
                                 "started": rfc3339(),
                                 "urls": {}, "notes": []}
        try:
            self._up(opts, out, state)
        except BaseException as exc:
            self.down()  # a retry starts from nothing; the logs stay
            if isinstance(exc, Exception) and not isinstance(exc, ComponentError):
                raise ComponentError(f"step '{out.current or 'dev up'}'", f"{type(exc).__name__}: {exc}",
                                     retry=self._retry) from exc
            raise
        state["timings_s"] = {**out.timings, "total": time.monotonic() - t0}
        state["rss_bytes"] = self.rss_bytes()
        self.state_file.write_text(json.dumps(state, indent=2))
        return state

    def _clean(self) -> None:
        for sub in ("logs", "pids", "sim", "stopped"):
            shutil.rmtree(self.state_dir / sub, ignore_errors=True)
        self.state_file.unlink(missing_ok=True)
        self.state_dir.mkdir(parents=True, exist_ok=True)

    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> ProcessRecord:
        return processes.spawn(self.state_dir, name, argv, env=env, die_with_parent=self._die_with_parent)

    def _wait_http(self, component: str, url: str, record: ProcessRecord, timeout_s: float, out: Progress,
                   ca_file: Path | None = None, token: str | None = None) -> None:
        def check() -> bool | str:
            status, body = http_get(url, ca_file=ca_file, token=token)
            return True if status == 200 else f"HTTP {status}: {body[:200]!r}"
        wait_for(component, check, timeout_s, process=record, retry=self._retry, tick=out.tick)

    def _up(self, opts: UpOptions, out: Progress, state: dict[str, Any]) -> None:
        bins = self._ensure_binaries(out)
        timeout = opts.wait_timeout_s

        with out.step(f"starting etcd {ETCD_VERSION} + kube-apiserver {KUBERNETES_VERSION}"):
            cp = ControlPlane(self.state_dir, binaries_dir=bin_dir(), disable_admission_plugins=(),
                              detach=not opts.die_with_parent, start_timeout_s=timeout)
            try:
                cp.start()
            except ControlPlaneError as exc:
                raise ComponentError("etcd/kube-apiserver", str(exc), retry=self._retry) from exc
            self._control_plane = cp
            self._record_control_plane(cp)
            state["server"] = cp.server
            out.note(f"API server {cp.server}; kubectl --kubeconfig {self.kubeconfig}")
        ca = cp.ca_file
        token = cp.admin_token

        ports = {"kube-controller-manager": free_port(), "kube-scheduler": free_port()}
        kcm = kubecomponents.controller_manager(self.state_dir, bins["kube-controller-manager"],
                                                ports["kube-controller-manager"])
        sched = kubecomponents.scheduler(self.state_dir, bins["kube-scheduler"], ports["kube-scheduler"])
        # The scheduler starts now; the controller-manager once the CRDs exist, so its garbage
        # collector maps KimiK3Deployment owners at once (its discovery refreshes every 30 s).
        started = {sched.name: (sched, self._spawn(sched.name, sched.argv))}

        kueue_ports = (free_port(), free_port())  # webhooks (and CRD conversion), health
        with out.step("installing CRDs (LeaderWorkerSet, ComputeDomain, PodMonitor, HTTPRoute, InferencePool, "
                      "InferenceObjective, KimiK3Deployment"
                      + (", Kueue" if opts.kueue else "") + (", Prometheus" if opts.prometheus else "")
                      + ") and admission policies"):
            own_crds, own_policies = own_manifests()  # crds/: our CRD and ValidatingAdmissionPolicies
            paths: list[Any] = list(dict.fromkeys([*thirdparty_crd_paths().values(), *lws.crd_paths(), *own_crds]))
            if opts.kueue:
                paths += kueue.crd_documents((kueue_ports[0], ca))
            if opts.prometheus:
                paths += promoperator.crd_paths()
            try:
                names = cp.apply_crds(paths, timeout_s=timeout)
                with cp.api_client("admin") as api:
                    apply_admission_policies(api, own_policies)
            except (ControlPlaneError, ApiError) as exc:
                raise ComponentError("kube-apiserver", f"CRDs not installed: {exc}", cp.apiserver_log,
                                     self._retry) from exc
            out.note(f"{len(names)} CRDs Established")
        started[kcm.name] = (kcm, self._spawn(kcm.name, kcm.argv))

        with out.step("starting kube-controller-manager + kube-scheduler"):
            for name, (spec, record) in started.items():
                self._wait_http(name, spec.health_url, record, timeout, out, ca_file=ca, token=token)
                state["urls"][name] = spec.health_url

        api = self.api_client()
        rest = Rest(api)
        with out.step(f"starting the LeaderWorkerSet {LWS_VERSION} manager, webhooks on 127.0.0.1"):
            wh_port, health_port = free_port(), free_port()
            config = lws.write_config(self.state_dir, wh_port, health_port)
            record = self._spawn("lws-manager", lws.argv(bins["lws"], self.kubeconfig, config),
                                 env={**os.environ, "KUBECONFIG": str(self.kubeconfig)})
            self._wait_http("lws-manager", f"http://127.0.0.1:{health_port}/readyz", record, timeout, out)
            register_webhooks(rest, lws.webhook_configurations(wh_port, ca))
            probe = lws.dry_run_probe()

            def webhooks_answer() -> bool:
                rest.create("/apis/leaderworkerset.x-k8s.io/v1/namespaces/default/leaderworkersets", probe,
                            dry_run=True)
                return True
            wait_for("lws-manager", webhooks_answer, timeout, process=record, retry=self._retry, tick=out.tick)
            state["urls"]["lws-webhooks"] = f"https://127.0.0.1:{wh_port}"

        if opts.kueue:
            self._start_kueue(bins["kueue"], kueue_ports, ca, rest, timeout, out, state)

        shape = opts.shape
        with out.step(f"creating {shape.racks} {shape.profile} rack(s) x {shape.trays_per_rack} trays; "
                      f"starting kwok {KWOK_VERSION}"):
            for node in node_manifests(shape):
                rest.create("/api/v1/nodes", node)
            kwok_port = free_port()
            pod_network = str(podnet.claim(self.state_dir))
            state["pod_network"] = pod_network
            config = kwok.write_config(self.state_dir, pod_network, readiness_probes=opts.readiness_probes)
            record = self._spawn("kwok", kwok.argv(bins["kwok"], self.kubeconfig, config, kwok_port))

            def nodes_ready() -> bool | str:
                nodes = rest.items("/api/v1/nodes", RACK_LABEL)
                ready = sum(1 for n in nodes if knodes.is_ready(n))
                return True if ready == shape.nodes else f"{ready}/{shape.nodes} nodes Ready"
            wait_for("kwok", nodes_ready, timeout, process=record, retry=self._retry, tick=out.tick)
            out.note(f"{shape.nodes} nodes Ready, {shape.gpus} GPUs, pod IPs from {pod_network}"
                     + (f", cliques {shape.cluster_uuid}.0..{shape.racks - 1}" if shape.clique(0) else ""))
            if opts.kueue:
                profile = PROFILES[shape.profile]
                for obj in (kueue.topology(), kueue.resource_flavor(profile),
                            kueue.cluster_queue(kueue.CLUSTER_QUEUE, profile.name, shape.gpus)):
                    rest.apply(kueue.object_path(obj), obj)
                out.note(f"Kueue: Topology {kueue.TOPOLOGY_NAME} (clique, node), ResourceFlavor {profile.name}, "
                         f"ClusterQueue {kueue.CLUSTER_QUEUE} with {shape.gpus} GPUs")
                for tenant in opts.tenants:
                    ensure_namespace(rest, tenant.name)
                    for obj in tenant.objects(profile.name):
                        rest.apply(kueue.object_path(obj), obj)
                    priority = f", WorkloadPriorityClass {tenant.name} = {tenant.priority}" \
                        if tenant.priority is not None else ""
                    out.note(f"tenant {tenant.name}: ClusterQueue {tenant.name} with {tenant.gpus} GPUs in Cohort "
                             f"{kueue.COHORT}, LocalQueue {tenant.name}/{kueue.LOCAL_QUEUE}{priority}")

        domains = PROFILES[shape.profile].multi_node_nvlink if opts.compute_domains is None else opts.compute_domains
        state["compute_domains"] = domains
        if domains:
            with out.step("starting the simulated NVIDIA DRA driver for ComputeDomains (kimik3 dev dra-driver)"):
                record = self._spawn("dra-driver", _cli("dev", "dra-driver", "--kubeconfig", str(self.kubeconfig)),
                                     env=_cli_env())

                def slices_published() -> bool | str:
                    found = len(rest.items("/apis/resource.k8s.io/v1/resourceslices"))
                    return True if found >= shape.nodes else f"{found}/{shape.nodes} ResourceSlices"
                wait_for("dra-driver", slices_published, timeout, process=record, retry=self._retry, tick=out.tick)
                out.note(f"DeviceClasses compute-domain-default-channel.nvidia.com, compute-domain-daemon.nvidia.com; "
                         f"{shape.nodes} ResourceSlices (channel-0, daemon-0 per tray)")
        with out.step("starting the operator (kimik3 run" + ("" if domains else " --no-compute-domains")
                      + ") as the chart's ServiceAccount"):
            # The chart's own ServiceAccount and RBAC (`helm template` of charts/kimik3-operator), a
            # TokenRequest token: the operator here has exactly the permissions a Helm install gives it.
            try:
                identity = rbac.install_operator_identity(api, self.state_dir / OPERATOR_KUBECONFIG)
            except rbac.HelmMissingError as exc:
                raise ComponentError("helm", str(exc), retry=f"{REPO_ROOT / 'tools' / 'build-binaries.sh'} helm") \
                    from exc
            state["operator_identity"] = identity.as_state()
            out.note(f"identity {identity.user} (chart RBAC: {', '.join(identity.objects)}; "
                     f"token until {identity.expires}); kubeconfig {identity.kubeconfig}")
            op_port, wake_port = free_port(), free_port()
            record = self._spawn("operator", _cli("run", "--kubeconfig", str(identity.kubeconfig),
                                                  *([] if domains else ["--no-compute-domains"]),
                                                  "--health-port", str(op_port), "--health-host", "127.0.0.1",
                                                  "--wake-port", str(wake_port), "--wake-service", str(WAKE_SERVICE)),
                                 env=_cli_env())
            self._wait_http("operator", f"http://127.0.0.1:{op_port}/readyz", record, timeout, out)
            state["urls"]["operator"] = f"http://127.0.0.1:{op_port}"
            state["urls"]["wake"] = f"http://127.0.0.1:{wake_port}"
        with out.step("starting the staging-Job runner (kimik3 dev stagers)"):
            record = self._spawn("stagers", _cli("dev", "stagers", "--state-dir", str(self.state_dir),
                                                 "--kubeconfig", str(self.kubeconfig)), env=_cli_env())
            deadline = time.monotonic() + 2.0
            while time.monotonic() < deadline and record.alive:
                time.sleep(0.1)
            if not record.alive:
                raise ComponentError("stagers", "exited during start", record.log, self._retry)
        with out.step("starting the gateway watcher (kimik3 dev gateways)"):
            record = self._spawn("gateways", _cli("dev", "gateways", "--state-dir", str(self.state_dir),
                                                  "--kubeconfig", str(self.kubeconfig),
                                                  "--wake-service", str(WAKE_SERVICE),
                                                  "--wake-address", f"127.0.0.1:{wake_port}"), env=_cli_env())
            deadline = time.monotonic() + 2.0
            while time.monotonic() < deadline and record.alive:
                time.sleep(0.1)
            if not record.alive:
                raise ComponentError("gateways", "exited during start", record.log, self._retry)
            state["urls"]["gateways"] = str(self.state_dir / services.GATEWAYS_FILE)
            if not domains:
                out.note("no DRA driver: ComputeDomains are skipped (said in each CR's "
                         "status.plan.computeDomainNote and a Warning event)")

        if opts.prometheus:
            self._start_prometheus(cp, bins, rest, f"127.0.0.1:{op_port}", timeout, out, state)

        if opts.sim:
            with out.step("starting the engine simulator (kimik3 dev sim)"):
                available, help_text = sim_command_available()
                if not available:
                    note = ("engine simulator not started: this checkout has no `kimik3 dev sim` yet; "
                            "Prometheus watches its targets file and picks the engines up once it runs")
                    state["notes"].append(note)
                    out.note(note)
                else:
                    argv = _cli("dev", "sim", "--kubeconfig", str(self.kubeconfig), "--state-dir", str(self.state_dir))
                    if "--load-time" in help_text:
                        argv += ["--load-time", opts.load_time]
                    if opts.readiness_probes:
                        argv += ["--readiness-probes"]
                    record = self._spawn("sim", argv, env=_cli_env(KIMIK3_SIM_LOAD_TIME=opts.load_time))
                    deadline = time.monotonic() + 2.0
                    while time.monotonic() < deadline and record.alive:
                        time.sleep(0.1)
                    if not record.alive:
                        raise ComponentError("sim", "exited during start", record.log, self._retry)
                    state["urls"]["sim-services"] = str(self.state_dir / "sim" / "services.json")

    def _start_prometheus(self, cp: ControlPlane, bins: dict[str, Path], rest: Rest, operator_metrics: str,
                          timeout: float, out: Progress, state: dict[str, Any]) -> None:
        """The Prometheus Operator, its Prometheus object, the config-reloader, then Prometheus on the
        configuration the operator generated (``promoperator``)."""
        with out.step(f"starting the Prometheus Operator {PROMETHEUS_OPERATOR_VERSION} and Prometheus "
                      f"{PROMETHEUS_VERSION}"):
            token_file = self.state_dir / "prometheus" / "apiserver.token"
            promoperator.install_identity(rest, token_file, rbac.TOKEN_LIFETIME_S)
            po_port, prom_port = free_port(), free_port()
            po = self._spawn("prometheus-operator", promoperator.argv(bins["prometheus-operator"], po_port),
                             env={**os.environ, "KUBECONFIG": str(self.kubeconfig)})
            self._wait_http("prometheus-operator", f"http://127.0.0.1:{po_port}/healthz", po, timeout, out)
            state["urls"]["prometheus-operator"] = f"http://127.0.0.1:{po_port}"
            for obj in (promoperator.additional_scrape_configs([promoperator.operator_job(operator_metrics)]),
                        promoperator.prometheus_resource(cp.server, cp.ca_file, token_file, PROMETHEUS_VERSION,
                                                         prometheus.SCRAPE_INTERVAL),
                        promoperator.usage_rule()):
                rest.apply(promoperator.object_path(obj), obj)
            url = f"http://127.0.0.1:{prom_port}"
            config = promoperator.config_file(self.state_dir)
            config.unlink(missing_ok=True)
            reloader = self._spawn("config-reloader", _cli("dev", "config-reloader", "--state-dir", str(self.state_dir),
                                                           "--kubeconfig", str(self.kubeconfig),
                                                           "--prometheus-url", url), env=_cli_env())
            wait_for("prometheus-operator", lambda: config.exists() or
                     f"no configuration in Secret {promoperator.NAMESPACE}/{promoperator.CONFIG_SECRET} yet",
                     timeout, process=po, retry=self._retry, tick=out.tick)
            if not reloader.alive:
                raise ComponentError("config-reloader", "exited during start", reloader.log, self._retry)
            record = self._spawn("prometheus", prometheus.argv(bins["prometheus"], config, self.state_dir, prom_port))
            self._wait_http("prometheus", f"{url}/-/ready", record, timeout, out)
            state["urls"]["prometheus"] = url
            out.note(f"Prometheus {url} runs the configuration the Prometheus Operator generated from "
                     f"Prometheus {promoperator.NAMESPACE}/{promoperator.PROMETHEUS_NAME} (Secret "
                     f"{promoperator.CONFIG_SECRET} -> {config})")

    def _start_kueue(self, binary: Path, ports: tuple[int, int], ca: Path, rest: Rest, timeout: float,
                     out: Progress, state: dict[str, Any]) -> None:
        """The Kueue manager out of cluster (``kueue``), its webhooks registered by URL; returns
        once they answer the API server."""
        with out.step(f"starting the Kueue {KUEUE_VERSION} manager, webhooks on 127.0.0.1"):
            wh_port, health_port = ports
            config = kueue.write_config(self.state_dir, wh_port, health_port)
            try:
                kueue.ensure_metrics_cert(self.state_dir)
            except kueue.MetricsCertError as exc:
                raise ComponentError("kueue-manager", str(exc), retry=self._retry) from exc
            record = self._spawn("kueue-manager", kueue.argv(binary, self.kubeconfig, config),
                                 env={**os.environ, "KUBECONFIG": str(self.kubeconfig)})
            self._wait_http("kueue-manager", f"http://127.0.0.1:{health_port}/readyz", record, timeout, out)
            register_webhooks(rest, kueue.webhook_configurations(wh_port, ca))
            probe = kueue.topology()

            def webhooks_answer() -> bool:
                rest.create("/apis/kueue.x-k8s.io/v1beta2/topologies", probe, dry_run=True)
                rest.create("/apis/kueue.x-k8s.io/v1beta2/clusterqueues",
                            kueue.cluster_queue("kimik3-webhook-probe", "probe", 0), dry_run=True)
                return True
            wait_for("kueue-manager", webhooks_answer, timeout, process=record, retry=self._retry, tick=out.tick)
            state["urls"]["kueue-webhooks"] = f"https://127.0.0.1:{wh_port}"

    def _ensure_binaries(self, out: Progress) -> dict[str, Path]:
        directory = bin_dir()
        missing = [c for c, f in BINARIES.items() if not os.access(directory / f, os.X_OK)]
        if missing:
            script = REPO_ROOT / "tools" / "build-binaries.sh"
            log = processes.log_path(self.state_dir, "build")
            log.parent.mkdir(parents=True, exist_ok=True)
            with out.step(f"building {', '.join(missing)} (first run only; minutes on 2 cores)"):
                with open(log, "ab") as fh:
                    proc = subprocess.Popen(["bash", str(script), *missing], stdout=fh, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL)
                    start = time.monotonic()
                    while proc.poll() is None:
                        if time.monotonic() - start > BUILD_TIMEOUT_S:
                            proc.kill()
                            proc.wait()
                            break
                        out.tick(time.monotonic() - start)
                        time.sleep(1.0)
                if proc.returncode != 0:
                    raise ComponentError("build", f"tools/build-binaries.sh {' '.join(missing)} failed "
                                         f"(exit {proc.returncode})", log,
                                         f"{script} {' '.join(missing)}")
        return {c: directory / f for c, f in BINARIES.items()}

    # -- an inference gateway per InferencePool (gateway.py) ----------------------------------
    def start_gateway(self, namespace: str, pool: str, timeout_s: float = 60.0) -> gateway.Gateway:
        """The endpoint picker and Envoy for InferencePool ``namespace/pool`` (``gateway.start``; the
        operator's pools get theirs from ``dev gateways`` already: this is for a pool made by hand), as
        processes of this cluster (stopped by ``down``; killed with the caller when ``up`` was told
        ``die_with_parent``)."""
        with self.api_client() as api:
            return gateway.start(self.state_dir, self.kubeconfig, Rest(api), namespace, pool, timeout_s=timeout_s,
                                 die_with_parent=self._die_with_parent)

    # -- one component down and up again (faults.py) ------------------------------------------
    def stop_component(self, name: str, kill: bool = False) -> ProcessRecord:
        """Stop component ``name`` (SIGTERM, SIGKILL after 15 s; ``kill``: SIGKILL at once, as a
        crash or an OOM kill, no graceful shutdown) and keep its command line in
        ``<state>/stopped/pids/<name>.json`` for ``start_component``. Raises ``ComponentError`` when it
        is not running."""
        if name in CONTROL_PLANE:
            raise ComponentError(name, "is the control plane itself: `dev fault start` cannot bring it back (use "
                                 "`kimik3 dev down` and `dev up`); the chaos suite covers its faults (tests/chaos)")
        record = processes.read_record(self.state_dir, name)
        if record is None or not record.alive:
            names = ", ".join(r.name for r in self.running() if r.name not in CONTROL_PLANE) or "none"
            raise ComponentError(name, f"is not a running component (running: {names})",
                                 retry=f"{command()} dev status --state-dir {self.state_dir}")
        processes.stop(self.state_dir, name, kill=kill)
        processes.write_record(self.state_dir / "stopped", record)
        return record

    def restart_apiserver(self) -> float:
        """SIGKILL kube-apiserver and start it again on the same port with the same etcd and
        certificates (``ControlPlane.restart_apiserver``), its pidfile rewritten; returns once
        /readyz is ok, the seconds it was unavailable. Only in the process that ran ``up``: the
        control plane is not started again from a recorded command line."""
        if self._control_plane is None:
            raise ComponentError("kube-apiserver", "was not started by this process: only the process that ran "
                                 "`dev up` can restart it (the chaos suite covers its faults, tests/chaos)")
        down_s = self._control_plane.restart_apiserver()
        self._record_control_plane(self._control_plane)
        return down_s

    def _record_control_plane(self, cp: ControlPlane) -> None:
        """The pidfiles of etcd and kube-apiserver (``components``, ``down``)."""
        for name, pid in cp.pids.items():
            log = cp.etcd_log if name == "etcd" else cp.apiserver_log
            processes.write_record(self.state_dir, ProcessRecord(name, pid, 0, [name], str(log)))

    def start_component(self, name: str) -> ProcessRecord:
        """Start again, with the same command line, a component ``stop_component`` stopped."""
        record = processes.read_record(self.state_dir / "stopped", name)
        if record is None:
            running = processes.read_record(self.state_dir, name)
            raise ComponentError(name, "is already running" if running is not None and running.alive else
                                 "was not stopped by `kimik3 dev fault stop`",
                                 retry=f"{command()} dev status --state-dir {self.state_dir}")
        started = self._spawn(name, record.argv, env=_cli_env(KUBECONFIG=str(self.kubeconfig)))
        (processes.pid_dir(self.state_dir / "stopped") / f"{name}.json").unlink(missing_ok=True)
        return started

    # -- down --------------------------------------------------------------------------------
    def down(self, progress: Progress | None = None) -> list[str]:
        """Stop every recorded component (newest first); returns the names that were running."""
        out = progress or Progress(quiet=True)
        records = {r.name: r for r in self.components()}
        order = [n for n in records if n not in STOP_ORDER][::-1] + [n for n in STOP_ORDER if n in records]
        stopped = []
        for name in order:
            if processes.stop(self.state_dir, name):
                stopped.append(name)
                out.note(f"stopped {name}")
        for sub in ("etcd-data", "prometheus/data", "stopped"):
            shutil.rmtree(self.state_dir / sub, ignore_errors=True)
        podnet.release(self.state_dir)
        self.state_file.unlink(missing_ok=True)
        return stopped
