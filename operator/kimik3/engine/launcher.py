"""In-pod launcher: turns the rendered group plan and LeaderWorkerSet's env into ``vllm serve``.

Runs inside the engine image with the standard library only (it is shipped in a ConfigMap, so a
stock vLLM image works). Steps:
1. read the plan (JSON, ``KIMIK3_PLAN`` or /etc/kimik3/plan.json) and ``LWS_WORKER_INDEX``,
   ``LWS_GROUP_SIZE``, ``LWS_LEADER_ADDRESS``; wait the plan's ``startDelaySeconds`` (the start
   back-off of a deployment whose groups keep failing: kimik3.controller.recreation);
2. if this rank's arguments need the leader's address, wait until that name resolves, polling
   every ``KIMIK3_POLL_SECONDS`` (2 s) up to the plan's ``leaderAddressTimeoutSeconds``;
3. replace the placeholder by the address and log the command line with secrets redacted
   (``redact``: values of ``--api-key``-like flags and of the variables the plan's ``secretEnv``
   names, which the pod reads from Secrets; failure case F22);
4. a leader or single-node rank execs the command; a headless worker rank runs it as a child
   under the group watchdog (``watch_leader``): SIGTERM and SIGINT are forwarded to it, its exit
   code is the launcher's (128 + N when signal N ended it), and once the leader's endpoint has
   answered, the launcher stops the child and exits 4 naming the endpoint when it stays
   unanswered for the plan's ``leaderLostTimeoutSeconds`` (failure case F20: vLLM's headless
   ranks do not notice a leader that died or froze, vllm#32136; LeaderWorkerSet then recreates
   the group).

The leader's endpoint comes from the worker's own arguments (``leader_endpoint``):
- ``--master-addr``/``--master-port`` (strategy tp): the torch.distributed TCPStore the leader
  hosts for the group's whole life; the probe sends the store's VALIDATE and PING queries and
  expects the PING nonce back (``probe_tcpstore``);
- ``--data-parallel-address`` (tp-dp, dep): the leader's API server, ``GET /health`` on the
  rank's ``--port`` (``probe_health``). Not ``--data-parallel-rpc-port``: vLLM closes that
  start-up handshake socket once the engines have started (``launch_core_engines``).
A probe answers only when the leader's process runs: a dead leader refuses the connection, a
frozen (SIGSTOPped) one accepts it in the kernel and never answers, so the probe times out.

It never starts vLLM with an empty or unresolved address: it exits with code 3 naming what it
waited for (failure case F1), 2 for a plan or env that does not match, 4 for a lost leader.

Two more commands run in the same image, for a pod that goes (``kimik3.render.leaderworkerset``):
- ``launcher.py ready PORT``: the leader's readiness probe (exec): fails once the pod's drain began
  (``DRAIN_MARKER`` exists), else answers as vLLM's ``GET /health`` on 127.0.0.1:PORT (``ready``);
- ``launcher.py drain DEREGISTER_S TIMEOUT_S [PLAN]``: the preStop hook (``drain``). On the leader
  (or a single-node rank) it writes ``DRAIN_MARKER``, so the readiness probe fails and the pod
  leaves the Service's endpoints and the endpoint picker's pool (the picker keeps a terminating
  pod while it is Ready), and waits DEREGISTER_S (the probe's period x failureThreshold, plus the
  time its watchers take to see it); then the kubelet sends SIGTERM and vLLM itself refuses new
  requests and lets those in flight finish for up to ``--shutdown-timeout`` (vLLM 0.33:
  ``VllmConfig.shutdown_timeout``, the drain of its API server and engine core). On a headless
  worker it keeps the rank up while the leader's endpoint still answers, for at most DEREGISTER_S
  + TIMEOUT_S: a multi-node engine that loses a rank fails every request in flight.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

PLACEHOLDER = "${LWS_LEADER_ADDRESS}"
DEFAULT_PLAN = "/etc/kimik3/plan.json"
"""Where the plan is read when neither an argument nor ``KIMIK3_PLAN`` names it."""
EXIT_BAD_INPUT = 2
EXIT_LEADER_UNRESOLVED = 3
EXIT_LEADER_LOST = 4
PROBE_TIMEOUT_S = 3.0
"""Longest one probe of the leader's endpoint waits for its answer (a live TCPStore or /health
answers in milliseconds; a frozen leader never does)."""
STOP_GRACE_S = 10.0
"""How long the child has to exit after SIGTERM when the leader is lost, before SIGKILL."""
DRAIN_MARKER = "/tmp/kimik3-draining"
"""Written by the leader's preStop (``drain``); while it exists, ``ready`` fails."""
SECRET_FLAG_SUFFIXES = ("-key", "-token", "-secret", "-password")
"""A flag whose name ends so (``--api-key``, ``--hf-token``) has its value redacted in the log."""
REDACTED = "<redacted>"


def log(message: str) -> None:
    print(f"[kimik3-launcher] {message}", file=sys.stderr, flush=True)


class LaunchError(Exception):
    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


def _int_env(env: dict[str, str], name: str, default: int | None = None) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        if default is None:
            raise LaunchError(EXIT_BAD_INPUT, f"{name} is not set (LeaderWorkerSet sets it in every pod)")
        return default
    try:
        return int(raw)
    except ValueError:
        raise LaunchError(EXIT_BAD_INPUT, f"{name}={raw!r} is not an integer") from None


def resolve(name: str) -> str | None:
    """First address of ``name``, or None while it does not resolve."""
    try:
        infos = socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)
    except (socket.gaierror, UnicodeError):
        return None
    return str(infos[0][4][0]) if infos else None


def wait_for_leader(name: str, timeout_s: float, poll_s: float) -> str:
    """Block until ``name`` resolves; return its address. Raises LaunchError after ``timeout_s``."""
    if not name:
        raise LaunchError(EXIT_LEADER_UNRESOLVED,
                          "LWS_LEADER_ADDRESS is empty: refusing to start vLLM without the leader's address")
    deadline = time.monotonic() + timeout_s
    start = time.monotonic()
    last_report = -1.0
    while True:
        address = resolve(name)
        if address:
            log(f"leader address {name} resolved to {address} after {time.monotonic() - start:.1f} s")
            return address
        now = time.monotonic()
        if now >= deadline:
            raise LaunchError(EXIT_LEADER_UNRESOLVED,
                              f"leader address {name} (LWS_LEADER_ADDRESS) did not resolve within {timeout_s:g} s "
                              "(probes.leaderAddressTimeout); exiting without starting vLLM")
        if now - last_report >= 30 or last_report < 0:
            log(f"waiting for leader address {name} to resolve ({now - start:.0f}/{timeout_s:g} s)")
            last_report = now
        time.sleep(min(poll_s, max(0.0, deadline - now)))


def _flag_name(arg: str) -> str:
    return arg.split("=", 1)[0].replace("_", "-") if arg.startswith("--") else ""


def redact(argv: list[str], secrets: list[str]) -> list[str]:
    """``argv`` for the log: the value of every flag ending in SECRET_FLAG_SUFFIXES (``--f v`` or
    ``--f=v``) and every occurrence of a value in ``secrets`` replaced by REDACTED."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        secret_flag = _flag_name(arg).endswith(SECRET_FLAG_SUFFIXES)
        if secret_flag and "=" in arg:
            out.append(f"{arg.split('=', 1)[0]}={REDACTED}")
            continue
        hide_next = secret_flag
        for value in secrets:
            arg = arg.replace(value, REDACTED)
        out.append(arg)
    return out


def flag_value(argv: list[str], flag: str) -> str | None:
    """The value of ``flag`` in ``argv`` (``--f v`` or ``--f=v``; the last one wins, as in argparse)."""
    value = None
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(flag + "="):
            value = arg[len(flag) + 1:]
    return value


TCPSTORE_VALIDATE, TCPSTORE_PING, TCPSTORE_MAGIC = 0, 13, 0x3C85F7CE
"""torch.distributed TCPStore wire protocol (c10d QueryType VALIDATE and PING, the validation
magic number): a client sends ``<u8 VALIDATE><u32 magic>``, then ``<u8 PING><u32 nonce>``, and the
store answers the nonce (checked against torch 2.13 in tests/test_launcher_liveness.py)."""


def probe_tcpstore(host: str, port: int, timeout_s: float) -> str | None:
    """None when the TCPStore at ``host:port`` answers a PING within ``timeout_s``, else why not."""
    nonce = os.getpid() & 0xFFFFFFFF
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as conn:
            conn.sendall(struct.pack("<BIBI", TCPSTORE_VALIDATE, TCPSTORE_MAGIC, TCPSTORE_PING, nonce))
            answer = b""
            while len(answer) < 4:
                chunk = conn.recv(4 - len(answer))
                if not chunk:
                    return "the connection closed before the PING answer"
                answer += chunk
    except OSError as exc:
        return _why(exc, timeout_s)
    return None if struct.unpack("<I", answer)[0] == nonce else "the PING answer was not the nonce sent"


def probe_health(host: str, port: int, timeout_s: float) -> str | None:
    """None when ``GET /health`` on ``host:port`` answers 200 within ``timeout_s``, else why not."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout_s)
    try:
        conn.request("GET", "/health")
        status = conn.getresponse().status
    except (OSError, http.client.HTTPException) as exc:
        return _why(exc, timeout_s)
    finally:
        conn.close()
    return None if status == 200 else f"/health answered {status}"


def _why(exc: BaseException, timeout_s: float) -> str:
    if isinstance(exc, TimeoutError | socket.timeout):
        return f"no answer within {timeout_s:g} s (the leader process is frozen or unreachable)"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused (nothing listens: the leader process is gone)"
    return f"{type(exc).__name__}: {exc}"


Probe = Callable[[str, int, float], "str | None"]


def leader_endpoint(argv: list[str]) -> tuple[str, str, int, Probe] | None:
    """What a headless worker watches: ``(what, host, port, probe)`` from its argv (module
    docstring), or None for a rank that is not a headless worker."""
    if "--headless" not in argv:
        return None
    host, port = flag_value(argv, "--master-addr"), flag_value(argv, "--master-port")
    if host and port:
        return "the leader's torch.distributed TCPStore", host, int(port), probe_tcpstore
    host = flag_value(argv, "--data-parallel-address")
    if host:
        return "the leader's API server /health", host, int(flag_value(argv, "--port") or 8000), probe_health
    return None


def _exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def watch_leader(argv: list[str], endpoint: tuple[str, str, int, Probe], lost_after_s: float,
                 poll_s: float) -> int:
    """Run ``argv`` as a child and watch the leader (module docstring, step 4); returns the exit code."""
    what, host, port, probe = endpoint
    child = subprocess.Popen(argv)
    stopping = False

    def forward(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True
        child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    log(f"watching {what} at {host}:{port}: the group is given up when it stays unanswered for "
        f"{lost_after_s:g} s after it first answered (leaderLostTimeoutSeconds)")
    timeout_s = min(PROBE_TIMEOUT_S, max(0.1, lost_after_s / 3))
    last_answer: float | None = None
    while True:
        try:
            return _exit_code(child.wait(timeout=poll_s))
        except subprocess.TimeoutExpired:
            pass
        if stopping:
            continue
        reason = probe(host, port, timeout_s)
        now = time.monotonic()
        if reason is None:
            if last_answer is None:
                log(f"{what} at {host}:{port} answered: the group started")
            last_answer = now
        elif last_answer is not None and now - last_answer >= lost_after_s:
            log(f"error: lost the leader: {what} at {host}:{port} has not answered for {now - last_answer:.1f} s "
                f"(leaderLostTimeoutSeconds {lost_after_s:g}): {reason}; stopping vLLM so that the "
                "LeaderWorkerSet recreates the group")
            child.terminate()
            try:
                child.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
            return EXIT_LEADER_LOST


def ready(port: int, marker: str = DRAIN_MARKER, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """The leader's readiness: None while it serves (no drain began: ``marker`` absent, and vLLM's
    /health on 127.0.0.1:``port`` answers 200), else why not."""
    if os.path.exists(marker):
        return "draining: the pod is being deleted (its preStop hook began the drain)"
    return probe_health("127.0.0.1", port, timeout_s)


def drain(argv: list[str], deregister_s: float, timeout_s: float, poll_s: float,
          marker: str = DRAIN_MARKER) -> str:
    """The preStop hook of the rank that runs ``argv`` (module docstring); returns what it did."""
    endpoint = leader_endpoint(argv)
    if endpoint is None:
        with open(marker, "w", encoding="utf-8") as fh:
            fh.write(f"{time.time():.3f}\n")
        log(f"drain: readiness fails from now; waiting {deregister_s:g} s for the Service and the endpoint picker "
            "to stop sending here, then SIGTERM: vLLM finishes the requests in flight (--shutdown-timeout)")
        time.sleep(deregister_s)
        return f"left the endpoints for {deregister_s:g} s"
    what, name, port, probe = endpoint
    host = resolve(name) or name  # once: a terminating leader may leave its DNS record before it exits
    bound_s = deregister_s + timeout_s
    start = time.monotonic()
    log(f"drain: keeping this rank up while {what} at {host}:{port} answers (at most {bound_s:g} s)")
    while (waited := time.monotonic() - start) < bound_s:
        reason = probe(host, port, min(PROBE_TIMEOUT_S, max(0.1, bound_s - waited)))
        if reason is not None:
            log(f"drain: {what} stopped answering after {waited:.1f} s ({reason}): this rank stops")
            return f"the leader went after {waited:.1f} s"
        time.sleep(min(poll_s, max(0.0, bound_s - (time.monotonic() - start))))
    log(f"drain: {what} still answers after {bound_s:g} s (the deregistration and probes.drainTimeout): "
        "this rank stops")
    return f"the leader still answered after {bound_s:g} s"


def _check_plan(plan: object) -> None:
    """Raise LaunchError (exit 2) naming what a malformed plan lacks."""
    if not isinstance(plan, dict):
        raise LaunchError(EXIT_BAD_INPUT, "plan is not a JSON object")
    ranks, command = plan.get("ranks"), plan.get("command")
    if not isinstance(command, list) or not command or not all(isinstance(c, str) for c in command):
        raise LaunchError(EXIT_BAD_INPUT, 'plan has no "command" (a non-empty list of strings)')
    if not isinstance(ranks, list) or not ranks:
        raise LaunchError(EXIT_BAD_INPUT, 'plan has no "ranks" (a non-empty list)')
    for i, rank in enumerate(ranks):
        if not isinstance(rank, dict) or not isinstance(rank.get("args"), list):
            raise LaunchError(EXIT_BAD_INPUT, f'plan rank {i} has no "args" list')


def plan_path(args: list[str], env: dict[str, str]) -> str:
    """The plan file the launcher reads: its first argument, else ``KIMIK3_PLAN``, else DEFAULT_PLAN."""
    return (args or [env.get("KIMIK3_PLAN", DEFAULT_PLAN)])[0]


def build_argv(plan: dict[str, Any], env: dict[str, str], wait: bool = True) -> list[str]:
    """The argv to exec for this pod: plan command + rank arguments with the leader address in.
    ``wait=False`` puts the address in without waiting for it to resolve (the kit's engine
    simulator reads the argv of pods that have no DNS)."""
    _check_plan(plan)
    rank = _int_env(env, "LWS_WORKER_INDEX", 0)
    size = _int_env(env, "LWS_GROUP_SIZE", len(plan["ranks"]))
    ranks = plan["ranks"]
    if size != len(ranks):
        raise LaunchError(EXIT_BAD_INPUT,
                          f"LWS_GROUP_SIZE={size} but the plan has {len(ranks)} ranks: the group and plan disagree")
    if not 0 <= rank < len(ranks):
        raise LaunchError(EXIT_BAD_INPUT, f"LWS_WORKER_INDEX={rank} outside the plan's {len(ranks)} ranks")
    args = list(ranks[rank]["args"])
    if any(PLACEHOLDER in a for a in args):
        name = env.get("LWS_LEADER_ADDRESS", "").strip()
        if wait:
            timeout_s = float(plan.get("leaderAddressTimeoutSeconds", 1800))
            poll_s = float(env.get("KIMIK3_POLL_SECONDS", "2"))
            wait_for_leader(name, timeout_s, poll_s)
        args = [a.replace(PLACEHOLDER, name) for a in args]
    return list(plan["command"]) + args


def _read_plan(path: str) -> Any:
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError) as exc:
        raise LaunchError(EXIT_BAD_INPUT, f"cannot read plan {path}: {exc}") from None


def _number(name: str, raw: str) -> float:
    try:
        return float(raw)
    except ValueError:
        raise LaunchError(EXIT_BAD_INPUT, f"{name} {raw!r} is not a number") from None


def command(args: list[str], env: dict[str, str]) -> int:
    """``ready PORT`` and ``drain DEREGISTER_S TIMEOUT_S [PLAN]`` (module docstring): exit codes."""
    try:
        if args[0] == "ready":
            if len(args) != 2 or not args[1].isdigit():
                raise LaunchError(EXIT_BAD_INPUT, "usage: launcher.py ready PORT")
            reason = ready(int(args[1]))
            if reason is not None:
                print(f"not ready: {reason}", file=sys.stderr)
            return 0 if reason is None else 1
        if len(args) not in (3, 4):
            raise LaunchError(EXIT_BAD_INPUT, "usage: launcher.py drain DEREGISTER_S TIMEOUT_S [PLAN]")
        deregister_s, timeout_s = _number("DEREGISTER_S", args[1]), _number("TIMEOUT_S", args[2])
        argv = build_argv(_read_plan(plan_path(args[3:], env)), env, wait=False)
        drain(argv, deregister_s, timeout_s, float(env.get("KIMIK3_POLL_SECONDS", "2")))
        return 0
    except LaunchError as exc:
        log(f"error: {exc}")
        return exc.code


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] in ("ready", "drain"):
        return command(args, dict(os.environ))
    path = plan_path(args, dict(os.environ))
    try:
        plan = _read_plan(path)
        delay_s = float(plan.get("startDelaySeconds") or 0) if isinstance(plan, dict) else 0.0
        if delay_s > 0:
            log(f"start back-off: waiting {delay_s:g} s before starting (startDelaySeconds: this deployment's "
                "groups keep failing, see its Degraded condition and EngineFailed Events)")
            time.sleep(delay_s)
        exec_argv = build_argv(plan, dict(os.environ))
    except LaunchError as exc:
        log(f"error: {exc}")
        return exc.code
    secrets = [v for name in plan.get("secretEnv", []) if (v := os.environ.get(name))]
    log("exec: " + " ".join(redact(exec_argv, secrets)))
    endpoint = leader_endpoint(exec_argv)
    lost_after_s = float(plan.get("leaderLostTimeoutSeconds", 0))
    if endpoint is not None and lost_after_s > 0:
        return watch_leader(exec_argv, endpoint, lost_after_s, float(os.environ.get("KIMIK3_POLL_SECONDS", "2")))
    os.execvp(exec_argv[0], exec_argv)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
