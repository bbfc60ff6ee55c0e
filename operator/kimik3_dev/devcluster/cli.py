"""``kimik3 dev``: a whole simulated GB300 NVL72 cluster on this machine.

  kimik3 dev up [--state-dir .state/dev] [--racks 2] [--trays-per-rack 18] [--profile gb300] [--load-time 20s] [--readiness-probes]
  kimik3 dev apply -f RECIPE       apply KimiK3Deployments (with stand-in weight volumes)
  kimik3 dev status [--json]       racks, groups and where they landed, each CR's status
  kimik3 dev down                  stop everything ``up`` started
  kimik3 dev fault ...             inject a fault: a tray NotReady, an engine pod crashed, a component down
  kimik3 dev gateway NS/POOL       the endpoint picker and Envoy in front of an InferencePool
  kimik3 dev stagers               staging-Job pods as local processes (started by ``up``)
  kimik3 dev gateways              a gateway for every InferencePool the operator renders (started by ``up``)
  kimik3 dev config-reloader       the Prometheus Operator's Secret -> Prometheus' config file (started by ``up``)
  kimik3 dev dra-driver            NVIDIA's ComputeDomain DRA driver, simulated (started by ``up`` on NVL72 racks)
  kimik3 dev sim / dev load        the engine simulator and its load generator (kimik3_dev.sim.cli)

Heavy imports happen inside the commands, so ``kimik3 --help`` stays fast. The engine
simulator's ``kimik3 dev sim`` is attached from ``kimik3_dev.sim.cli`` (attribute ``sim``) when
that module exists.
"""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from kimik3_dev import command

DEFAULT_STATE_DIR = ".state/dev"
_state_dir_option = click.option("--state-dir", default=DEFAULT_STATE_DIR, show_default=True,
                                 type=click.Path(file_okay=False), help="Where pidfiles, logs, certs and data live.")


@click.group()
def dev() -> None:
    """A local Kubernetes 1.35 control plane with simulated GPU racks, LeaderWorkerSet, the operator,
    Prometheus and the engine simulator."""


def _mib(n: int) -> str:
    return f"{n / 2**20:.0f} MiB"


@dev.command()
@_state_dir_option
@click.option("--racks", default=2, show_default=True, type=click.IntRange(1, 64), help="Racks (NVLink cliques).")
@click.option("--trays-per-rack", default=18, show_default=True, type=click.IntRange(1, 72),
              help="Trays (nodes) per rack; an NVL72 rack holds at most 18.")
@click.option("--profile", default="gb300", show_default=True,
              type=click.Choice(["gb300", "gb200", "b300", "b200", "h200"]),
              help="Accelerator profile of every node (kimik3.kube.accelerators).")
@click.option("--load-time", default="20s", show_default=True,
              help="Model load time of each simulated engine before /health turns 200.")
@click.option("--timeout", "timeout_s", default=120.0, show_default=True, help="Bound on each readiness wait, s.")
@click.option("--sim/--no-sim", default=True, show_default=True, help="Start the engine simulator if present.")
@click.option("--prometheus/--no-prometheus", default=True, show_default=True)
@click.option("--tenant", "tenants", multiple=True, metavar="NAME=GPUS[:PRIORITY]",
              help="A tenant namespace with its own Kueue ClusterQueue of GPUS (in one Cohort that lends idle "
                   "quota), its LocalQueue 'default' and, with PRIORITY, the WorkloadPriorityClass NAME "
                   "(placement.priorityClass: NAME; higher preempts lower). Repeatable.")
@click.option("--compute-domains/--no-compute-domains", default=None,
              help="Run the simulated NVIDIA DRA driver and the operator with ComputeDomains (default: on for the "
                   "NVL72 profiles gb300 and gb200, off otherwise).")
@click.option("--readiness-probes", is_flag=True,
              help="Group leaders turn Ready only once their simulated engine has loaded (as on GPUs), not at once: "
                   "rehearse rollouts with it.")
def up(state_dir: str, racks: int, trays_per_rack: int, profile: str, load_time: str, timeout_s: float,
       sim: bool, prometheus: bool, tenants: tuple[str, ...], compute_domains: bool | None,
       readiness_probes: bool) -> None:
    """Start etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok with the racks,
    the LeaderWorkerSet manager, the operator, Prometheus and the engine simulator."""
    from kimik3_dev.devcluster.cluster import DevCluster, UpOptions
    from kimik3_dev.devcluster.progress import Progress
    from kimik3_dev.devcluster.racks import RackShape
    from kimik3_dev.devcluster.readiness import ComponentError
    from kimik3_dev.devcluster.kueue import Tenant
    try:
        shape = RackShape(profile=profile, racks=racks, trays_per_rack=trays_per_rack)
        parsed = tuple(Tenant.parse(t) for t in tenants)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    cluster = DevCluster(state_dir)
    try:
        state = cluster.up(UpOptions(shape=shape, load_time=load_time, sim=sim, prometheus=prometheus,
                                     readiness_probes=readiness_probes, wait_timeout_s=timeout_s,
                                     tenants=parsed, compute_domains=compute_domains), Progress())
    except ComponentError as exc:
        click.echo(f"\ndev up failed: {exc}", err=True)
        sys.exit(1)
    rss = state["rss_bytes"]
    click.echo(f"\nup in {state['timings_s']['total']:.1f} s; {len(rss)} processes, {_mib(sum(rss.values()))} resident")
    click.echo(f"  export KUBECONFIG={cluster.kubeconfig}")
    for name, url in state["urls"].items():
        click.echo(f"  {name:<24} {url}")
    for note in state["notes"]:
        click.echo(f"  note: {note}")
    click.echo(f"next: tools/kimik3 dev apply -f recipes/gb300-tp8-megakernel-dspark.yaml --state-dir {state_dir}; "
               f"tools/kimik3 dev status --state-dir {state_dir}")


@dev.command()
@_state_dir_option
def down(state_dir: str) -> None:
    """Stop everything `dev up` started in STATE_DIR (logs are kept)."""
    from kimik3_dev.devcluster.cluster import DevCluster
    from kimik3_dev.devcluster.progress import Progress
    stopped = DevCluster(state_dir).down(Progress())
    click.echo(f"stopped {len(stopped)} process(es)" if stopped else "nothing was running")


@dev.command()
@_state_dir_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def status(state_dir: str, as_json: bool) -> None:
    """Show racks (trays per clique, GPUs used/free), groups and the rack each landed in, and
    each KimiK3Deployment's conditions and endpoint."""
    from kimik3_dev.devcluster import overview
    from kimik3_dev.devcluster.cluster import DevCluster
    from kimik3_dev.devcluster.rest import Rest
    from kimik3_dev.sim import services
    cluster = DevCluster(state_dir)
    state = cluster.state()
    if state is None:
        raise click.ClickException(f"no dev cluster in {cluster.state_dir}: run `{command()} dev up --state-dir {state_dir}`")
    rss = cluster.rss_bytes()
    components = [{"name": r.name, "pid": r.pid, "alive": r.alive, "rss_bytes": rss.get(r.name, 0), "log": r.log}
                  for r in cluster.components()]
    try:
        with cluster.api_client() as api:
            data = overview.gather(Rest(api), cluster.state_dir)
    except Exception as exc:  # noqa: BLE001 - show what still works, then fail
        click.echo(overview.render({"racks": [], "groups": [], "deployments": []}, components))
        raise click.ClickException(f"API server {state.get('server')} not answering: {exc}") from None
    gateways = services.read_gateways(cluster.state_dir)
    if as_json:
        click.echo(json.dumps({"state": state, "components": components, "gateways": gateways, **data}, indent=2))
        return
    header = f"dev cluster {state.get('server')}   KUBECONFIG={cluster.kubeconfig}"
    urls = "   ".join([*(f"{k} {v}" for k, v in state.get("urls", {}).items() if k in ("prometheus", "operator")),
                       *(f"gateway {pool} {url}" for pool, url in sorted(gateways.items()))])
    click.echo(overview.render(data, components, header + (f"\n{urls}" if urls else "")))


@dev.command()
@_state_dir_option
@click.option("-f", "--filename", required=True, type=click.Path(exists=True, dir_okay=False), help="Recipe (YAML).")
def apply(state_dir: str, filename: str) -> None:
    """Apply the KimiK3Deployments of FILENAME to the dev cluster (creating the namespace and, for
    PVC weight sources, a stand-in PersistentVolume + claim: nothing mounts it here)."""
    import urllib3

    from kimik3.api.documents import BadManifest, load_documents
    from kimik3.controller.kube import ApiError
    from kimik3_dev.devcluster.cluster import DevCluster
    from kimik3_dev.devcluster.rest import Rest
    from kimik3_dev.devcluster.workloads import apply_deployment, deployments
    try:
        docs = deployments(load_documents(filename))
    except BadManifest as exc:
        raise click.ClickException(str(exc)) from None
    if not docs:
        raise click.ClickException(f"{filename}: no KimiK3Deployment in it")
    cluster = DevCluster(state_dir)
    if cluster.state() is None:
        raise click.ClickException(f"no dev cluster in {cluster.state_dir}: run `{command()} dev up --state-dir {state_dir}`")
    with cluster.api_client() as api:
        for cr in docs:
            try:
                obj = apply_deployment(Rest(api), cr)
            except (urllib3.exceptions.HTTPError, OSError):
                raise click.ClickException(f"the dev cluster's API server ({api.configuration.host}) is not answering: "
                                           f"`{command()} dev status --state-dir {state_dir}` shows what runs") from None
            except ApiError as exc:
                # The API server's own message (what kubectl prints), not its Status JSON.
                raise click.ClickException(f"{cr['metadata'].get('name')}: refused by the API server: "
                                           f"{exc.message}") from None
            click.echo(f"applied {obj['kind']} {obj['metadata']['namespace']}/{obj['metadata']['name']} "
                       f"(generation {obj['metadata'].get('generation')})")


@dev.command()
@_state_dir_option
@click.option("--kubeconfig", required=True, type=click.Path(exists=True, dir_okay=False),
              help="An admin kubeconfig of the dev cluster (with the CA's file).")
def stagers(state_dir: str, kubeconfig: str) -> None:
    """Run staging-Job pods as local processes and provision model-cache claims (started by `dev up`)."""
    import logging

    import yaml
    from kubernetes import config as k8s_config

    from kimik3_dev.devcluster.stagers import StagerRunner
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cluster = yaml.safe_load(Path(kubeconfig).read_text())["clusters"][0]["cluster"]
    api = k8s_config.new_client_from_config(config_file=kubeconfig)
    StagerRunner(api, Path(state_dir).resolve(), cluster["server"], Path(cluster["certificate-authority"])).run_forever()


@dev.command()
@_state_dir_option
@click.option("--kubeconfig", required=True, type=click.Path(exists=True, dir_okay=False),
              help="An admin kubeconfig of the dev cluster (with the CA's file).")
@click.option("--wake-service", default=None, metavar="NAMESPACE/SERVICE:PORT",
              help="The operator's wake Service (its `kimik3 run --wake-service`): a route naming it goes to --wake-address.")
@click.option("--wake-address", default=None, metavar="IP:PORT", help="Where the operator's activator listens.")
def gateways(state_dir: str, kubeconfig: str, wake_service: str | None, wake_address: str | None) -> None:
    """Run the endpoint picker and Envoy for every InferencePool the operator renders, as the
    rendered picker Deployment says, following each pool's HTTPRoute to the operator's wake
    endpoint and back (kimik3_dev.devcluster.gatewaywatch; started by `dev up`)."""
    import logging

    import yaml
    from kubernetes import config as k8s_config

    from kimik3.render.wake import WakeEndpoint
    from kimik3_dev.devcluster.gatewaywatch import GatewayWatcher
    if (wake_service is None) != (wake_address is None):
        raise click.UsageError("--wake-service and --wake-address go together")
    wake = None
    if wake_service is not None and wake_address is not None:
        host, _, port = wake_address.rpartition(":")
        try:
            wake = (WakeEndpoint.parse(wake_service), (host, int(port)))
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--wake-service/--wake-address") from None
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cluster = yaml.safe_load(Path(kubeconfig).read_text())["clusters"][0]["cluster"]
    api = k8s_config.new_client_from_config(config_file=kubeconfig)
    GatewayWatcher(api, Path(state_dir).resolve(), cluster["server"], Path(cluster["certificate-authority"]),
                   wake=wake).run_forever()


@dev.command("config-reloader")
@_state_dir_option
@click.option("--kubeconfig", required=True, type=click.Path(exists=True, dir_okay=False),
              help="An admin kubeconfig of the dev cluster.")
@click.option("--prometheus-url", required=True, help="Prometheus' base URL, e.g. http://127.0.0.1:9090.")
def config_reloader(state_dir: str, kubeconfig: str, prometheus_url: str) -> None:
    """Write the Prometheus Operator's generated configuration to <state-dir>/prometheus/prometheus.yml
    and reload Prometheus on each change (the config-reloader sidecar's part; started by `dev up`)."""
    import logging

    from kubernetes import config as k8s_config

    from kimik3_dev.devcluster import promoperator
    from kimik3_dev.devcluster.rest import Rest
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    api = k8s_config.new_client_from_config(config_file=kubeconfig)
    promoperator.ConfigReloader(Rest(api), promoperator.config_file(Path(state_dir).resolve()),
                                prometheus_url.rstrip("/")).run_forever()


@dev.command("dra-driver")
@click.option("--kubeconfig", required=True, type=click.Path(exists=True, dir_okay=False),
              help="An admin kubeconfig of the dev cluster.")
def dra_driver(kubeconfig: str) -> None:
    """NVIDIA's ComputeDomain DRA driver as the API sees it: DeviceClasses, per-tray ResourceSlices,
    claim templates, daemons, status (kimik3_dev.devcluster.dradriver; started by `dev up`)."""
    import logging

    from kubernetes import config as k8s_config

    from kimik3_dev.devcluster.dradriver import DraDriver
    from kimik3_dev.devcluster.rest import Rest
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    DraDriver(Rest(k8s_config.new_client_from_config(config_file=kubeconfig))).run_forever()


@dev.command()
@_state_dir_option
@click.argument("pool", metavar="NAMESPACE/POOL")
@click.option("--timeout", "timeout_s", default=60.0, show_default=True, help="Bound on each readiness wait, s.")
def gateway(state_dir: str, pool: str, timeout_s: float) -> None:
    """Start the endpoint picker and Envoy for InferencePool NAMESPACE/POOL (kimik3_dev.devcluster.gateway);
    they run until `dev down` (or `dev fault stop gateway-epp-<ns>-<pool>`)."""
    from kimik3_dev.devcluster.cluster import DevCluster
    from kimik3_dev.devcluster.readiness import ComponentError
    namespace, sep, name = pool.partition("/")
    if not sep or not namespace or not name:
        raise click.BadParameter(f"{pool!r}: give NAMESPACE/POOL, e.g. default/k3", param_hint="POOL")
    try:
        gw = DevCluster(state_dir).start_gateway(namespace, name, timeout_s)
    except (ComponentError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"InferencePool {pool} ({gw.failure_mode}): send completions to {gw.url}/v1/completions\n"
               f"  picker {gw.epp.name} (pid {gw.epp.pid}), metrics {gw.epp_metrics_url}/metrics\n"
               f"  Envoy {gw.envoy.name} (pid {gw.envoy.pid}), admin {gw.envoy_admin_url}")


@dev.group()
def fault() -> None:
    """Inject a fault into the running dev cluster (kimik3_dev.devcluster.faults), then watch the
    operator recover with `kimik3 dev status`."""


def _rest_call(state_dir: str, fn: Callable[..., Any], *args: str) -> None:
    from kimik3.controller.kube import ApiError
    from kimik3_dev.devcluster.cluster import DevCluster
    from kimik3_dev.devcluster.rest import Rest
    with DevCluster(state_dir).api_client() as api:
        try:
            fn(Rest(api), *args)
        except ApiError as exc:
            raise click.ClickException(str(exc)) from None


@fault.command("tray")
@_state_dir_option
@click.argument("node")
@click.option("--ready", is_flag=True, help="Undo: the tray reports Ready again.")
def fault_tray(state_dir: str, node: str, ready: bool) -> None:
    """Tray NODE reports Ready=False (its pods leave after their not-ready toleration, 300 s by
    default); --ready brings it back."""
    from kimik3_dev.devcluster import faults
    _rest_call(state_dir, faults.tray_ready if ready else faults.tray_not_ready, node)
    click.echo(f"tray {node}: {'Ready again' if ready else 'NotReady'} (kwok applies it within ~2 s)")


@fault.command("pod")
@_state_dir_option
@click.argument("pod", metavar="NAMESPACE/POD")
def fault_pod(state_dir: str, pod: str) -> None:
    """Crash every container of engine pod NAMESPACE/POD (exit code 1, phase Failed)."""
    from kimik3_dev.devcluster import faults
    namespace, sep, name = pod.partition("/")
    if not sep or not namespace or not name:
        raise click.BadParameter(f"{pod!r}: give NAMESPACE/POD, e.g. default/k3-latency-engine-0-1", param_hint="POD")
    _rest_call(state_dir, faults.fail_pod, namespace, name)
    click.echo(f"pod {pod}: containers fail within ~2 s")


def _stop_or_start(state_dir: str, component: str, start: bool, kill: bool = False) -> int:
    """Stop (``kill``: SIGKILL) or start ``component``; returns its pid. A ``ComponentError``
    becomes a CLI error."""
    from kimik3_dev.devcluster.cluster import DevCluster
    from kimik3_dev.devcluster.readiness import ComponentError
    cluster = DevCluster(state_dir)
    try:
        return (cluster.start_component(component) if start else cluster.stop_component(component, kill)).pid
    except ComponentError as exc:
        raise click.ClickException(str(exc)) from None


@fault.command("stop")
@_state_dir_option
@click.argument("component")
@click.option("--kill", is_flag=True, help="SIGKILL at once (a crash), instead of SIGTERM and a graceful stop.")
def fault_stop(state_dir: str, component: str, kill: bool) -> None:
    """Stop COMPONENT (e.g. lws-manager, operator, kwok, sim) until `dev fault start COMPONENT`."""
    pid = _stop_or_start(state_dir, component, start=False, kill=kill)
    click.echo(f"stopped {component} (pid {pid}); start it again: kimik3 dev fault start {component}")


@fault.command("start")
@_state_dir_option
@click.argument("component")
def fault_start(state_dir: str, component: str) -> None:
    """Start COMPONENT again with the command line it had when `dev fault stop` stopped it."""
    click.echo(f"started {component} (pid {_stop_or_start(state_dir, component, start=True)})")


def _attach_sim() -> None:
    """Add ``kimik3 dev sim`` and ``kimik3 dev load`` from the engine simulator's package
    (attributes ``sim`` and ``load`` of ``kimik3_dev.sim.cli``), when it exists."""
    try:
        module = importlib.import_module("kimik3_dev.sim.cli")
    except ModuleNotFoundError as exc:
        if exc.name in ("kimik3_dev.sim", "kimik3_dev.sim.cli"):
            return  # no simulator in this checkout
        raise
    for name in ("sim", "load"):
        command = getattr(module, name, None)
        if isinstance(command, click.Command) and name not in dev.commands:
            dev.add_command(command, name)


_attach_sim()
