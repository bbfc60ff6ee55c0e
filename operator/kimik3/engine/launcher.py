"""In-pod launcher: turns the rendered group plan and LeaderWorkerSet's env into ``vllm serve``.

Runs inside the engine image with the standard library only (it is shipped in a ConfigMap, so a
stock vLLM image works). Steps:
1. read the plan (JSON, ``KIMIK3_PLAN`` or /etc/kimik3/plan.json) and ``LWS_WORKER_INDEX``,
   ``LWS_GROUP_SIZE``, ``LWS_LEADER_ADDRESS``;
2. if this rank's arguments need the leader's address, wait until that name resolves, polling
   every ``KIMIK3_POLL_SECONDS`` (2 s) up to the plan's ``leaderAddressTimeoutSeconds``;
3. replace the placeholder by the address and exec the plan's command with the rank's arguments.

It never starts vLLM with an empty or unresolved address: it exits with code 3 naming what it
waited for (failure case F1), 2 for a plan or env that does not match.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time

PLACEHOLDER = "${LWS_LEADER_ADDRESS}"
DEFAULT_PLAN = "/etc/kimik3/plan.json"
"""Where the plan is read when neither an argument nor ``KIMIK3_PLAN`` names it."""
EXIT_BAD_INPUT = 2
EXIT_LEADER_UNRESOLVED = 3


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


def build_argv(plan: dict, env: dict[str, str], wait: bool = True) -> list[str]:
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


def main(argv: list[str] | None = None) -> int:
    path = plan_path(argv or sys.argv[1:], dict(os.environ))
    try:
        try:
            with open(path, encoding="utf-8") as fh:
                plan = json.load(fh)
        except (OSError, ValueError) as exc:
            raise LaunchError(EXIT_BAD_INPUT, f"cannot read plan {path}: {exc}") from None
        exec_argv = build_argv(plan, dict(os.environ))
    except LaunchError as exc:
        log(f"error: {exc}")
        return exc.code
    log("exec: " + " ".join(exec_argv))
    os.execvp(exec_argv[0], exec_argv)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
