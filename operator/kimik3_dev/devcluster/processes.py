"""Background processes of the dev cluster: start detached, record a pidfile, stop by pidfile.

Each component runs as its own process (its own session, so a terminal's Ctrl-C does not reach
it) with stdout and stderr in ``<state>/logs/<name>.log`` and a pidfile
``<state>/pids/<name>.json``: ``{"pid": int, "start_ticks": int, "argv": [...], "log": str}``.
``start_ticks`` is field 22 of ``/proc/<pid>/stat`` (process start time in clock ticks since
boot): a pid is only treated as ours while that value still matches, so a recycled pid is never
signalled. Linux only (reads ``/proc``).
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "ProcessRecord",
    "log_path",
    "log_tail",
    "read_record",
    "records",
    "rss_bytes",
    "spawn",
    "stop",
    "tree_rss_bytes",
]

DEFAULT_STOP_GRACE_S = 15.0
"""Seconds between SIGTERM and SIGKILL when stopping one component."""
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class ProcessRecord:
    """A started component, as written in its pidfile."""

    name: str
    pid: int
    start_ticks: int
    argv: list[str]
    log: str

    @property
    def alive(self) -> bool:
        """True while the pid exists, is not a zombie, and is still the process we started."""
        stat = _stat_fields(self.pid)
        return stat is not None and stat[0] != "Z" and int(stat[19]) == self.start_ticks


def _stat_fields(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name (index 0 = state, 19 = starttime)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2:].split()


def _die_with_parent() -> None:  # runs in the child between fork and exec
    # PR_SET_PDEATHSIG (1) = SIGKILL: the kernel kills the child when the starting thread exits.
    ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)


def pid_dir(state_dir: Path) -> Path:
    return Path(state_dir) / "pids"


def log_path(state_dir: Path, name: str) -> Path:
    """``<state>/logs/<name>.log``."""
    return Path(state_dir) / "logs" / f"{name}.log"


def spawn(state_dir: Path, name: str, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
          cwd: Path | None = None, die_with_parent: bool = False) -> ProcessRecord:
    """Start ``argv`` in the background as component ``name``; write its pidfile and return it.

    ``die_with_parent``: SIGKILL the process when the calling thread exits (tests); otherwise it
    outlives the caller (``kimik3 dev up``).
    """
    log = log_path(state_dir, name)
    log.parent.mkdir(parents=True, exist_ok=True)
    pid_dir(state_dir).mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as fh:
        proc = subprocess.Popen(
            list(argv), stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT,
            cwd=str(cwd or state_dir), env=dict(env) if env is not None else None,
            start_new_session=True, preexec_fn=_die_with_parent if die_with_parent else None,
        )
    stat = _stat_fields(proc.pid)
    record = ProcessRecord(name, proc.pid, int(stat[19]) if stat else 0, [str(a) for a in argv], str(log))
    write_record(state_dir, record)
    return record


def write_record(state_dir: Path, record: ProcessRecord) -> None:
    """Write the pidfile of a process started elsewhere (e.g. by ``ControlPlane``)."""
    pid_dir(state_dir).mkdir(parents=True, exist_ok=True)
    if not record.start_ticks:
        stat = _stat_fields(record.pid)
        record = ProcessRecord(record.name, record.pid, int(stat[19]) if stat else 0, record.argv, record.log)
    path = pid_dir(state_dir) / f"{record.name}.json"
    path.write_text(json.dumps({"pid": record.pid, "start_ticks": record.start_ticks, "argv": record.argv,
                                "log": record.log}))


def read_record(state_dir: Path, name: str) -> ProcessRecord | None:
    """The pidfile of ``name``, or None."""
    try:
        data = json.loads((pid_dir(state_dir) / f"{name}.json").read_text())
    except (OSError, ValueError):
        return None
    return ProcessRecord(name, int(data["pid"]), int(data["start_ticks"]), list(data["argv"]), str(data["log"]))


def records(state_dir: Path) -> list[ProcessRecord]:
    """Every pidfile in the state dir, in start order (pidfile modification time)."""
    directory = pid_dir(state_dir)
    if not directory.is_dir():
        return []
    files = sorted(directory.glob("*.json"), key=lambda p: p.stat().st_mtime_ns)
    found = [read_record(state_dir, f.stem) for f in files]
    return [r for r in found if r is not None]


def stop(state_dir: Path, name: str, grace_s: float = DEFAULT_STOP_GRACE_S, kill: bool = False) -> bool:
    """SIGTERM the component (its whole process group), SIGKILL after ``grace_s`` s (``kill``:
    SIGKILL at once), remove its pidfile. Returns True when a live process was stopped."""
    record = read_record(state_dir, name)
    if record is None:
        return False
    was_alive = record.alive
    if was_alive:
        if not kill:
            _signal(record, signal.SIGTERM)
            deadline = time.monotonic() + grace_s
            while record.alive and time.monotonic() < deadline:
                _reap(record.pid)
                time.sleep(0.05)
        if record.alive:
            _signal(record, signal.SIGKILL)
            deadline = time.monotonic() + 5
            while record.alive and time.monotonic() < deadline:
                _reap(record.pid)
                time.sleep(0.05)
    _reap(record.pid)
    (pid_dir(state_dir) / f"{name}.json").unlink(missing_ok=True)
    return was_alive


def _signal(record: ProcessRecord, sig: int) -> None:
    # Each component leads its own session and process group (start_new_session): signal the
    # group so helper children go too, but only while the leader is still the process we started.
    try:
        if os.getpgid(record.pid) == record.pid:
            os.killpg(record.pid, sig)
        else:
            os.kill(record.pid, sig)
    except ProcessLookupError:
        pass


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass  # not our child (started by an earlier `dev up`): init reaps it


def rss_bytes(pid: int) -> int:
    """Resident set size of one process, bytes (``/proc/<pid>/statm`` field 2 x page size); 0 if gone."""
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE_SIZE
    except (OSError, IndexError, ValueError):
        return 0


def _children(pid: int) -> list[int]:
    out: list[int] = []
    task_dir = Path(f"/proc/{pid}/task")
    try:
        tasks = list(task_dir.iterdir())
    except OSError:
        return out
    for task in tasks:
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return out


def tree_rss_bytes(pid: int) -> int:
    """RSS of a process and all its descendants, bytes (shared pages counted once per process)."""
    total, stack, seen = 0, [pid], set()
    while stack:
        p = stack.pop()
        if p in seen:
            continue
        seen.add(p)
        total += rss_bytes(p)
        stack += _children(p)
    return total


def log_tail(path: Path | str, lines: int = 25) -> str:
    """The last ``lines`` lines of a log file (reads at most its last 64 KiB)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 64 * 1024))
            text = fh.read().decode("utf-8", "replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (may race with other processes; components fail loudly then)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
