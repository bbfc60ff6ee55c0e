"""The test tiers: every test carries exactly one tier marker, given at collection by
tests/conftest.py from where the test lives and which fixtures it uses, so a new test is tiered
without anyone remembering. Select with ``-m``: ``tools/test -m unit``, ``-m "unit or process"``,
``-m "not conformance"``.

The tiers, cheapest first; a test's tier is the most expensive thing it starts:

==============  ==================================================================================
``unit``        starts nothing: no process, no API server, no vLLM (``ProcessGuard`` fails a unit
                test that starts a process)
``process``     starts local processes (the CLI, the in-pod launcher, mypy, bash, Prometheus) but
                no API server
``apiserver``   a real etcd + kube-apiserver: the session's ``control_plane`` (through ``admin_api``,
                ``kube``, ``namespace``, ``operator``) or a ``ControlPlane`` of the test's own
``chaos``       tests/chaos: a control plane of its own with faults (compaction, cut watches, killed
                operators, fault proxies)
``chart``       helm: tests/chart (a control plane of its own, the operator as a process under the
                chart's RBAC)
``e2e``         a dev cluster (``kimik3 dev up``): ``dev_env``, or a module's own in tests/e2e
``conformance`` real vLLM: tests/conformance (the tools/vllm-envs.sh venvs)
==============  ==================================================================================

How a test gets its tier (``tier_of``):

1. the most expensive of its directory's tier (``DIRECTORY_TIERS``) and of the tiers of the
   fixtures it uses, directly or through other fixtures (``FIXTURE_TIERS``; pytest's fixture
   closure, so ``kube`` and ``namespace`` count as the ``admin_api`` they build on);
2. unless it declares one: ``@pytest.mark.tier("process")`` on the test, its class or its module
   (``pytestmark``); the closest declaration wins. A test that starts something no fixture says
   (a subprocess, its own ``ControlPlane``) declares it; a unit test in one of the directories
   above (tests/e2e/test_devcluster_units.py) declares ``unit``. A declaration cheaper than the
   fixtures used is refused at collection.

A test left ``unit`` that starts a process fails, naming the call (``ProcessGuard``, on in every
run). The tier markers themselves (``pytest.mark.unit``...) are written by the hook only; a test
that carries one is refused, so each test has exactly one.
"""

from __future__ import annotations

import _posixsubprocess
import os
import subprocess
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import PurePosixPath
from typing import Any

import pytest

TIERS = ("unit", "process", "apiserver", "chaos", "chart", "e2e", "conformance")
"""Cheapest first (the order only decides which of two counts: the more expensive)."""

DIRECTORY_TIERS = {
    "tests/chaos/": "chaos",
    "tests/chart/": "chart",
    "tests/e2e/": "e2e",
    "tests/conformance/": "conformance",
}

FIXTURE_TIERS = {
    "control_plane": "apiserver",   # tests/conftest.py; admin_api, operator_api, kube, namespace, operator build on it
    "admin_api": "apiserver",       # overridden in tests/chaos and tests/chart with their own control planes
    "operator_api": "apiserver",
    "own_control_plane": "apiserver",  # tests/conftest.py: one test module's own
    "chaos_cp": "chaos",
    "chart_cp": "chart",
    "helm": "chart",
    "helm_offline": "chart",
    "dev_env": "e2e",
    "parser_venv": "conformance",
    "cpu_venv": "conformance",
}


def _rank(tier: str) -> int:
    return TIERS.index(tier)


def _most_expensive(tiers: Iterator[str] | list[str]) -> str:
    return max(tiers, key=_rank, default="unit")


def tier_of(item: pytest.Item, path: str) -> str:
    """The tier of ``item`` (``path``: its file relative to the repository, POSIX)."""
    raw = sorted({m.name for m in item.iter_markers() if m.name in TIERS})
    if raw:
        raise pytest.UsageError(f"{item.nodeid}: carries the tier marker(s) {raw} itself; declare "
                                f'@pytest.mark.tier("...") instead (tests/support/tiers.py)')
    used = _most_expensive([FIXTURE_TIERS[f] for f in getattr(item, "fixturenames", ()) if f in FIXTURE_TIERS])
    declared = next(iter(item.iter_markers("tier")), None)  # the closest: test, class, module
    if declared is None:
        where = _most_expensive([t for prefix, t in DIRECTORY_TIERS.items() if path.startswith(prefix)])
        return _most_expensive([used, where])
    if len(declared.args) != 1 or declared.args[0] not in TIERS:
        raise pytest.UsageError(f"{item.nodeid}: pytest.mark.tier takes one of {', '.join(TIERS)}, "
                                f"not {declared.args}")
    tier: str = declared.args[0]
    if _rank(tier) < _rank(used):
        fixtures = sorted(f for f in getattr(item, "fixturenames", ()) if FIXTURE_TIERS.get(f) == used)
        raise pytest.UsageError(f"{item.nodeid}: declared tier {tier!r}, but its fixtures {fixtures} make it {used!r}")
    return tier


def assign(config: pytest.Config, items: list[pytest.Item], root: os.PathLike[str]) -> None:
    """Gives each item its one tier marker (registered in pyproject.toml, ``markers``)."""
    registered = {line.split(":", 1)[0].split("(", 1)[0].strip() for line in config.getini("markers")}
    if missing := [t for t in (*TIERS, "tier") if t not in registered]:
        raise pytest.UsageError(f"tier markers {missing} are not registered in pyproject.toml [tool.pytest.ini_options]")
    for item in items:
        path = PurePosixPath(os.path.relpath(item.path, root)).as_posix()
        item.add_marker(getattr(pytest.mark, tier_of(item, path)))


def is_unit(item: pytest.Item) -> bool:
    return item.get_closest_marker("unit") is not None


def guard(item: pytest.Item, all_threads: bool) -> AbstractContextManager[None]:
    """``ProcessGuard`` for a unit test; nothing for the others."""
    return ProcessGuard(item.nodeid, all_threads).active() if is_unit(item) else nullcontext()


HINT = ('declare its tier (@pytest.mark.tier("process"), or "apiserver" for a ControlPlane of its own: '
        "tests/support/tiers.py), or make it start nothing")


class ProcessStarted(RuntimeError):
    """A unit test started (or tried to start) a process."""


class ProcessGuard:
    """While a unit test sets up and runs, every way Python starts a process raises
    ``ProcessStarted`` instead, and the test fails naming the call even if the code under test
    caught the error. Guarded: ``subprocess.Popen`` (hence ``subprocess.run``, asyncio's
    subprocesses, ``os.popen``), ``_posixsubprocess.fork_exec`` (multiprocessing), ``os.fork``,
    ``os.forkpty``, ``os.posix_spawn[p]``, ``os.system``.

    ``all_threads``: guard every thread (a run of unit tests only); else only the thread running
    the test, so that a dev cluster or operator thread a previous test module left running on this
    worker keeps working."""

    def __init__(self, nodeid: str, all_threads: bool):
        self.nodeid = nodeid
        self.all_threads = all_threads
        self.thread = threading.get_ident()
        self.started: list[str] = []

    def _guarded(self, what: str, original: Callable[..., Any], skip: int = 0) -> Callable[..., Any]:
        """``original`` refusing the test's thread (every thread with ``all_threads``); ``skip``:
        leading arguments not worth showing (Popen's self)."""
        def refuse(*args: Any, **kwargs: Any) -> Any:
            if not self.all_threads and threading.get_ident() != self.thread:
                return original(*args, **kwargs)
            call = f"{what}({repr(args[skip])[:300] if len(args) > skip else ''})"
            self.started.append(call)
            raise ProcessStarted(f"{self.nodeid} is a unit test and started a process: {call}; {HINT}")
        return refuse

    @contextmanager
    def active(self) -> Iterator[None]:
        targets: list[tuple[Any, str, str, int]] = [
            (subprocess.Popen, "_execute_child", "subprocess.Popen", 1),
            (_posixsubprocess, "fork_exec", "_posixsubprocess.fork_exec", 0),
            *((os, name, f"os.{name}", 0) for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system")),
        ]
        saved = [(owner, name, getattr(owner, name)) for owner, name, _, _ in targets if hasattr(owner, name)]
        for owner, name, what, skip in targets:
            if hasattr(owner, name):
                setattr(owner, name, self._guarded(what, getattr(owner, name), skip))
        try:
            yield
        except BaseException:
            if self.started:  # the code under test may have turned the refusal into another error
                self._fail()
            raise
        finally:
            for owner, name, original in saved:
                setattr(owner, name, original)
        if self.started:  # or swallowed it
            self._fail()

    def _fail(self) -> None:
        pytest.fail(f"{self.nodeid} is a unit test and started a process: {'; '.join(self.started)}; {HINT}",
                    pytrace=False)
