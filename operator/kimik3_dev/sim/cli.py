"""Click commands of the simulator: ``sim_command`` (``kimik3 dev sim``) and ``load_command``
(``kimik3 dev load``). The ``dev`` group registers them; they stand alone too."""

from __future__ import annotations

import asyncio
import logging
import math
import os
import random
import signal
import sys
from pathlib import Path
from typing import Any

import click


def _duration(value: str, what: str) -> float:
    from kimik3.api.v1alpha1 import duration_seconds

    try:
        return duration_seconds(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint=what) from None


def _workload(value: str | None) -> str | float | None:
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        return value


@click.command("sim")
@click.option("--kubeconfig", required=True, envvar="KUBECONFIG", type=click.Path(exists=True, dir_okay=False),
              help="Kubeconfig of the cluster to watch.")
@click.option("--state-dir", required=True, type=click.Path(file_okay=False),
              help="Writes <state-dir>/sim/services.json (where each Service's stand-in listens).")
@click.option("--load-time", default="20s", show_default=True, envvar="KIMIK3_SIM_LOAD_TIME",
              help="Simulated model load time of a new group before /health turns 200 (e.g. 20s, 35m).")
@click.option("--poll-interval", default="2s", show_default=True, help="Time between two looks at the cluster.")
@click.option("--workload", default="chat", show_default=True,
              help="Speculative acceptance workload: code, chat, creative, blog, news, or an acceptance length.")
@click.option("--seed", type=int, default=None, help="Seed of the simulated acceptance (default: random).")
@click.option("--readiness-probes", is_flag=True,
              help="Play the kubelet's readiness prober: a leader pod is Ready only while its engine's /health is 200 "
                   "(kwok leaves probed pods unready: dev up --readiness-probes).")
@click.option("-v", "--verbose", is_flag=True)
def sim_command(kubeconfig: str, state_dir: str, load_time: str, poll_interval: str, workload: str,
                seed: int | None, readiness_probes: bool, verbose: bool) -> None:
    """Run one simulated vLLM engine (on its leader pod's IP and port) per running engine group of
    every KimiK3Deployment, and a stand-in for each Service, until SIGTERM or Ctrl-C."""
    from kimik3_dev.sim.supervisor import run_supervisor

    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    load_s, poll_s = _duration(load_time, "--load-time"), _duration(poll_interval, "--poll-interval")

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await run_supervisor(kubeconfig, Path(state_dir), load_time_s=load_s, poll_interval_s=poll_s,
                             workload=_workload(workload) or "chat", seed=seed, readiness_probes=readiness_probes,
                             stop=stop)

    asyncio.run(main())


@click.command("load")
@click.argument("deployment", required=False)
@click.option("-n", "--namespace", default=None, help="Namespace of DEPLOYMENT (or write namespace/name).")
@click.option("--state-dir", default=".state/dev", show_default=True, type=click.Path(file_okay=False),
              help="The dev cluster's state dir (`kimik3 dev sim` writes sim/services.json there).")
@click.option("--kubeconfig", default=None, type=click.Path(exists=True, dir_okay=False),
              help="Kubeconfig to read DEPLOYMENT's status.endpoint with [default: <state-dir>/admin.kubeconfig].")
@click.option("--url", default=None, help="Base URL to load instead of a deployment (e.g. http://127.0.0.1:8000).")
@click.option("--via-gateway", is_flag=True,
              help="Send to DEPLOYMENT's InferencePool through the dev cluster's gateway (its endpoint picker chooses "
                   "the leader; needs spec.routing.enabled) instead of its Service.")
@click.option("--model", default=None, help="Model name to send (default: the deployment's served name).")
@click.option("--shape", type=click.Choice(["steady", "step", "burst"]), default="steady", show_default=True,
              help="Built-in load shape: steady; step (x4 halfway); burst (x8 for a tenth of the time).")
@click.option("--phases", "phases_file", default=None, type=click.Path(exists=True, dir_okay=False),
              help="YAML/JSON list of phases ({duration, rate|concurrency, promptTokens, outputTokens}).")
@click.option("--trace-file", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="Replay a recorded trace instead of phases: CSV (Azure, BurstGPT) or Mooncake JSON Lines, whose "
                   "hash_ids become shared prompt text (sim/tracefile.py, sim/load.py).")
@click.option("--time-compression", default=1.0, show_default=True, type=click.FloatRange(min=0, min_open=True),
              help="With --trace-file: play the recording this many times faster.")
@click.option("--copies", default=1, show_default=True, type=click.IntRange(min=1),
              help="With --trace-file: superpose this many copies, each shifted by a seeded offset and "
                   "wrapped around the recording's span, with prefixes of their own.")
@click.option("--rate", type=float, default=None, help="Base open-loop rate, requests/s.")
@click.option("--concurrency", type=int, default=None, help="Base closed-loop users (default 1 without --rate).")
@click.option("--duration", default="30s", show_default=True, help="Length of a built-in shape.")
@click.option("--prompt-tokens", type=int, default=512, show_default=True)
@click.option("--output-tokens", type=int, default=256, show_default=True)
@click.option("--stream/--no-stream", default=True, show_default=True)
@click.option("--chat", is_flag=True, help="Use /v1/chat/completions instead of /v1/completions.")
@click.option("--max-requests", type=int, default=10_000, show_default=True, help="Bound on requests sent.")
@click.option("--drain", default="60s", show_default=True, help="Longest wait for in-flight requests at the end.")
@click.option("--workload", default=None, help="Simulator only: acceptance workload of the requests.")
@click.option("--seed", type=int, default=None)
@click.option("--api-key-env", metavar="VAR", default=None,
              help="Send the API key held by environment variable VAR as 'Authorization: Bearer' "
                   "(a deployment with spec.service.apiKeySecret; the key stays off the command line).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary and every request as JSON.")
def load_command(deployment: str | None, namespace: str | None, state_dir: str, kubeconfig: str | None,
                 url: str | None, via_gateway: bool, model: str | None,
                 shape: str, phases_file: str | None, trace_file: Path | None, time_compression: float, copies: int,
                 rate: float | None, concurrency: int | None, duration: str,
                 prompt_tokens: int, output_tokens: int, stream: bool, chat: bool, max_requests: int, drain: str,
                 workload: str | None, seed: int | None, api_key_env: str | None, as_json: bool) -> None:
    """Send a request stream to DEPLOYMENT's endpoint (or --url) and print what users see:
    tokens/s per user, P50/P90 inter-token latency per token, TTFT, errors (with --trace-file:
    and the trace's prefix reuse ceiling)."""
    from kimik3_dev.sim import load, tracefile

    api_key = None
    if api_key_env is not None:
        api_key = os.environ.get(api_key_env)
        if not api_key:
            raise click.UsageError(f"--api-key-env {api_key_env}: that environment variable is unset or empty")
    if url is None:
        if not deployment:
            raise click.UsageError("give a DEPLOYMENT (name or namespace/name) or --url")
        try:
            url, served = load.resolve_url(kubeconfig or Path(state_dir) / "admin.kubeconfig", state_dir, deployment,
                                           namespace, api_key, via_gateway)
        except LookupError as exc:
            raise click.ClickException(str(exc)) from None
        model = model or served
    if rate is not None and concurrency is not None:
        raise click.UsageError("give --rate or --concurrency, not both")
    if trace_file is not None:
        if phases_file or rate is not None or concurrency is not None:
            raise click.UsageError("--trace-file sets the arrivals and lengths: give it without --phases, --rate "
                                   "and --concurrency")
        try:
            replay = tracefile.read(trace_file, time_compression)
        except tracefile.TraceFileError as exc:
            raise click.ClickException(str(exc)) from None
        span_s = max(1, math.ceil(replay[-1].arrival_s))  # copies are shifted within the recording's span
        requests = tracefile.superpose(replay, copies, span_s, random.Random(seed))
        ceiling = tracefile.reuse_ceiling(requests)
        click.echo(f"load: {url} ({'chat' if chat else 'completions'}, {'streaming' if stream else 'not streaming'}); "
                   f"{len(requests)} requests of {trace_file.name} over {requests[-1].arrival_s:.0f} s", err=True)
        results = asyncio.run(load.run_trace(url, requests, model=model, stream=stream, chat=chat,
                                             drain_s=_duration(drain, "--drain"), seed=seed,
                                             workload=_workload(workload), api_key=api_key))
        _report(load, results, None, as_json)
        if ceiling is not None:
            click.echo(f"prefix reuse ceiling: {ceiling:.1%} of the trace's {tracefile.MOONCAKE_BLOCK_TOKENS}-token "
                       "blocks were seen before in it")
        return
    try:
        if phases_file:
            phases = load.load_phases(phases_file, prompt_tokens=prompt_tokens, output_tokens=output_tokens)
        else:
            phases = load.builtin_phases(shape, _duration(duration, "--duration"), rate=rate,
                                         concurrency=concurrency if rate is not None or concurrency else 1,
                                         prompt_tokens=prompt_tokens, output_tokens=output_tokens)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"load: {url} ({'chat' if chat else 'completions'}, {'streaming' if stream else 'not streaming'}); "
               + ", ".join(f"{p.name} {p.duration_s:g}s at "
                           + (f"{p.rate:g} req/s" if p.rate is not None else f"{p.concurrency} users")
                           for p in phases), err=True)
    results = asyncio.run(load.run_load(url, phases, model=model, stream=stream, chat=chat, max_requests=max_requests,
                                        drain_s=_duration(drain, "--drain"), seed=seed, workload=_workload(workload),
                                        api_key=api_key))
    _report(load, results, phases, as_json)


def _report(load: Any, results: list[Any], phases: list[Any] | None, as_json: bool) -> None:
    """Print the summary (a table, or JSON with every request); exit 1 when no request succeeded."""
    summary = load.summarize(results, phases)
    click.echo(load.results_json(results, summary) if as_json else load.format_summary(summary))
    if summary["total"]["ok"] == 0:
        sys.exit(1)


sim = sim_command
"""``kimik3_dev.devcluster.cli`` attaches this as ``kimik3 dev sim``."""
load = load_command
"""To be attached as ``kimik3 dev load``."""
