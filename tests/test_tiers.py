"""The test tiers (tests/support/tiers.py): registered in pyproject.toml cheapest first, exactly one
per test, given by directory, fixtures and declarations; and the unit tier's guard refuses every
way Python starts a process, even when the code under test swallows the refusal."""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import subprocess
import sys
import threading
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from support import tiers

REPO = Path(__file__).resolve().parents[1]


class Item:
    """What ``tier_of`` reads of a ``pytest.Item``: its fixture closure and its marks, closest first."""

    def __init__(self, fixtures: tuple[str, ...] = (), marks: tuple[pytest.MarkDecorator, ...] = ()):
        self.nodeid = "tests/x.py::test_x"
        self.fixturenames = list(fixtures)
        self.marks = [m.mark for m in marks]

    def iter_markers(self, name: str | None = None) -> Iterator[pytest.Mark]:
        return (m for m in self.marks if name is None or m.name == name)


def tier(item: Item, path: str = "tests/test_x.py") -> str:
    return tiers.tier_of(item, path)  # type: ignore[arg-type]  # a stand-in, not a pytest.Item


def test_the_tiers_are_registered_cheapest_first() -> None:
    markers = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["markers"]
    assert [m.split(":", 1)[0] for m in markers if m.split(":", 2)[1:2] == [" tier"]] == list(tiers.TIERS)


def test_this_test_has_one_tier_unit(request: pytest.FixtureRequest) -> None:
    assert [m.name for m in request.node.iter_markers() if m.name in tiers.TIERS] == ["unit"]


def test_the_fixtures_used_give_the_tier() -> None:
    assert tier(Item()) == "unit"
    assert tier(Item(("tmp_path", "monkeypatch"))) == "unit"
    assert tier(Item(("kube", "admin_api", "control_plane", "tmp_path_factory"))) == "apiserver"
    assert tier(Item(("dev_env", "ns"))) == "e2e"
    assert tier(Item(("helm_offline",))) == "chart"


def test_the_directory_gives_the_tier_and_the_dearer_of_the_two_counts() -> None:
    assert tier(Item(), "tests/e2e/test_e2e_rollout.py") == "e2e"  # its own cluster, module fixtures
    assert tier(Item(), "tests/conformance/test_doctor.py") == "conformance"
    assert tier(Item(("kube", "admin_api", "chaos_cp")), "tests/chaos/test_lost_watch.py") == "chaos"
    assert tier(Item(("admin_api", "chart_cp")), "tests/chart/test_helm_chart.py") == "chart"
    assert tier(Item(("control_plane",)), "tests/conformance/test_x.py") == "conformance"


def test_the_closest_declaration_wins_unless_cheaper_than_the_fixtures() -> None:
    assert tier(Item(marks=(pytest.mark.tier("process"),))) == "process"
    assert tier(Item(marks=(pytest.mark.tier("unit"), pytest.mark.tier("process")))) == "unit"
    assert tier(Item(marks=(pytest.mark.tier("unit"),)), "tests/e2e/test_devcluster_units.py") == "unit"
    assert tier(Item(("control_plane",), (pytest.mark.tier("e2e"),))) == "e2e"
    with pytest.raises(pytest.UsageError, match=r"declared tier 'unit', but its fixtures \['admin_api'\] make it 'apiserver'"):
        tier(Item(("kube", "admin_api"), (pytest.mark.tier("unit"),)))


@pytest.mark.parametrize("marks, refusal", [
    ((pytest.mark.unit,), r"carries the tier marker\(s\) \['unit'\] itself"),
    ((pytest.mark.tier("fast"),), "pytest.mark.tier takes one of unit, process"),
    ((pytest.mark.tier(),), "pytest.mark.tier takes one of"),
])
def test_a_tier_marker_by_hand_or_an_unknown_tier_is_refused(marks: tuple[pytest.MarkDecorator, ...],
                                                              refusal: str) -> None:
    with pytest.raises(pytest.UsageError, match=refusal):
        tier(Item(marks=marks))


def _asyncio_subprocess() -> None:
    async def run() -> None:
        await asyncio.create_subprocess_exec("true")
    asyncio.run(run())


STARTS: dict[str, Callable[[], Any]] = {
    "subprocess.run": lambda: subprocess.run(["true"], check=False),
    "os.popen": lambda: os.popen("true").close(),
    "os.system": lambda: os.system("true"),
    "os.fork": lambda: os.fork(),  # looked up when called, as code does
    "os.posix_spawn": lambda: os.posix_spawn("/bin/true", ["true"], os.environ),
    "asyncio": _asyncio_subprocess,
    "multiprocessing fork": lambda: multiprocessing.get_context("fork").Process(target=print).start(),
}


@pytest.mark.parametrize("start", list(STARTS))
def test_the_guard_fails_a_unit_test_that_starts_a_process(start: str) -> None:
    """A guard of its own inside this test's (which refuses first, so nothing reaches the outer one)."""
    guard = tiers.ProcessGuard("tests/x.py::test_x", all_threads=False)
    with pytest.raises(pytest.fail.Exception, match=r"tests/x.py::test_x is a unit test and started a process"):
        with guard.active():
            with contextlib.suppress(tiers.ProcessStarted, RuntimeError, OSError):  # code that swallows it
                STARTS[start]()
    assert guard.started


@pytest.mark.tier("process")
def test_the_guard_spares_other_threads_unless_all_are_guarded() -> None:
    """A dev cluster or operator thread left by an earlier module keeps its processes; a run of unit
    tests only (``all_threads``) guards every thread."""
    def in_a_thread() -> list[BaseException]:
        errors: list[BaseException] = []

        def start() -> None:
            try:
                subprocess.run(["true"], check=True)
            except BaseException as exc:  # noqa: BLE001 - reported to the test
                errors.append(exc)
        thread = threading.Thread(target=start)
        thread.start()
        thread.join()
        return errors

    spared = tiers.ProcessGuard("t", all_threads=False)
    with spared.active():
        assert in_a_thread() == []
    assert spared.started == []
    strict = tiers.ProcessGuard("t", all_threads=True)
    with pytest.raises(pytest.fail.Exception):
        with strict.active():
            assert [type(e) for e in in_a_thread()] == [tiers.ProcessStarted]


PLUGIN = """
import pytest
from support.tiers import TIERS

def pytest_collection_finish(session):
    with open({out!r}, "w") as f:
        for item in session.items:
            f.write(item.nodeid + "\\t" + " ".join(m.name for m in item.iter_markers() if m.name in TIERS) + "\\n")
"""


@pytest.mark.tier("process")
def test_every_collected_test_has_exactly_one_tier(tmp_path: Path) -> None:
    """The real collection (``pytest --collect-only`` of the whole suite, a few seconds)."""
    out = tmp_path / "tiers.txt"
    (tmp_path / "tierdump.py").write_text(PLUGIN.format(out=str(out)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO / "tests"), str(REPO / "operator"),
                                                        os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "tierdump",
                           "-p", "no:cacheprovider"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=240, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    given = dict(line.split("\t") for line in out.read_text().splitlines())
    assert given and all(len(t.split()) == 1 for t in given.values()), \
        [n for n, t in given.items() if len(t.split()) != 1]
    assert set(given.values()) == set(tiers.TIERS)

    def tiers_of(prefix: str) -> set[str]:
        found = {t for n, t in given.items() if n.startswith(prefix)}
        assert found, prefix
        return found
    assert tiers_of("tests/test_plan.py::") == {"unit"}
    assert tiers_of("tests/test_operator.py::") == {"apiserver"}                # operator, kube, namespace
    assert tiers_of("tests/test_autoscaling_controller.py::") == {"apiserver"}  # declared: a ControlPlane of its own
    assert tiers_of("tests/chaos/test_lost_watch.py::") == {"chaos"}
    assert tiers_of("tests/chaos/test_cache_relist.py::") == {"unit"}           # declared
    assert tiers_of("tests/chart/test_images.py::") == {"chart"}
    assert tiers_of("tests/e2e/test_e2e_status.py::") == {"e2e"}                # dev_env
    assert tiers_of("tests/e2e/test_e2e_rollout.py::") == {"e2e"}               # its own cluster: the directory
    assert tiers_of("tests/conformance/") == {"conformance"}
    assert tiers_of("tests/test_launcher.py::test_group_size_mismatch_exits_2") == {"process"}  # the module's
    assert tiers_of("tests/test_launcher.py::test_launcher_imports_only_the_standard_library") == {"unit"}
