"""The in-pod launcher (``kimik3.engine.launcher``), run as a real subprocess.

The plan's ``command`` is a small Python script that prints its argv as JSON and leaves a marker
file, so the launcher's exec is real and "vLLM never started" is observable. Failure case F1: a
worker waits for the leader's address for a bounded time and never starts with an empty or
unresolved address.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kimik3.admission import admit
from kimik3.engine.args import rank_args
from kimik3.render.configmap import group_plan_document, launcher_source

REPO = Path(__file__).resolve().parents[1]
LAUNCHER = REPO / "operator" / "kimik3" / "engine" / "launcher.py"
PLACEHOLDER = "${LWS_LEADER_ADDRESS}"
PVC = {"source": {"pvc": {"claimName": "kimi-k3-weights"}}}

pytestmark = pytest.mark.tier("process")  # the launcher as a subprocess

ECHO = """\
import json, pathlib, sys
pathlib.Path(sys.argv[1]).write_text("ran")
print(json.dumps(sys.argv[2:]))
"""


class Run:
    def __init__(self, proc: subprocess.CompletedProcess, seconds: float, marker: Path):
        self.code, self.stdout, self.stderr = proc.returncode, proc.stdout, proc.stderr
        self.seconds = seconds
        self.engine_ran = marker.exists()

    @property
    def argv(self) -> list[str]:
        assert self.code == 0, f"launcher exited {self.code}: {self.stderr}"
        return json.loads(self.stdout)


@pytest.fixture
def launch(tmp_path: Path):
    """launch(plan_document, **env) -> Run, with the plan's command replaced by the echo script."""
    echo, marker = tmp_path / "echo.py", tmp_path / "engine-ran"
    echo.write_text(ECHO)

    def run(document: dict, timeout_s: float = 15, **env: str) -> Run:
        plan_file = tmp_path / "plan.json"
        plan_file.write_text(json.dumps({**document, "command": [sys.executable, str(echo), str(marker)]}))
        clean = {k: v for k, v in os.environ.items() if not k.startswith(("LWS_", "KIMIK3_"))}
        start = time.monotonic()
        proc = subprocess.run([sys.executable, str(LAUNCHER), str(plan_file)], env={**clean, **env},
                              capture_output=True, text=True, timeout=timeout_s)
        return Run(proc, time.monotonic() - start, marker)

    return run


def document(topology: dict, **spec_fields) -> tuple[dict, list[list[str]]]:
    """The plan document the operator ships, and each rank's arguments."""
    admitted = admit({"model": dict(PVC), "topology": topology, **spec_fields})
    spec, plan = admitted.spec, admitted.plan
    return group_plan_document(admitted), [rank_args(spec, plan, r) for r in range(plan.nodes_per_group)]


TP8 = {"accelerator": "gb300", "tensorParallelSize": 8}
DEP16 = {"accelerator": "gb300", "strategy": "dep", "dataParallelSize": 16}


def with_leader(args: list[str], address: str) -> list[str]:
    return [a.replace(PLACEHOLDER, address) for a in args]


# ---------------------------------------------------------------- starts -------------------

@pytest.mark.parametrize("index", [0, 1])
def test_tp8_rank_args_chosen_by_worker_index_with_resolved_leader(launch, index):
    doc, ranks = document(TP8)
    run = launch(doc, LWS_LEADER_ADDRESS="localhost", LWS_WORKER_INDEX=str(index), LWS_GROUP_SIZE="2")
    assert run.argv == with_leader(ranks[index], "localhost")
    assert run.argv[run.argv.index("--master-addr") + 1] == "localhost"
    assert run.argv[run.argv.index("--node-rank") + 1] == str(index)
    assert ("--headless" in run.argv) is (index > 0)
    assert not any(PLACEHOLDER in a for a in run.argv)


def test_dep16_worker_3_gets_leader_as_dp_address_and_start_rank_12(launch):
    doc, ranks = document(DEP16)
    run = launch(doc, LWS_LEADER_ADDRESS="localhost", LWS_WORKER_INDEX="3", LWS_GROUP_SIZE="4")
    assert run.argv == with_leader(ranks[3], "localhost")
    assert run.argv[run.argv.index("--data-parallel-address") + 1] == "localhost"
    assert run.argv[run.argv.index("--data-parallel-start-rank") + 1] == "12"


def test_placeholder_inside_an_argument_is_replaced(launch):
    doc = {"leaderAddressTimeoutSeconds": 5,
           "ranks": [{"index": 0, "args": ["--x", f"tcp://{PLACEHOLDER}:29501"]}]}
    run = launch(doc, LWS_LEADER_ADDRESS="localhost", LWS_WORKER_INDEX="0", LWS_GROUP_SIZE="1")
    assert run.argv == ["--x", "tcp://localhost:29501"]


def test_single_node_plan_needs_no_leader_address(launch):
    doc, ranks = document({"accelerator": "b300", "tensorParallelSize": 8})
    assert not any(PLACEHOLDER in a for a in ranks[0])
    run = launch(doc, LWS_WORKER_INDEX="0", LWS_GROUP_SIZE="1")  # no LWS_LEADER_ADDRESS at all
    assert run.argv == ranks[0]


# ---------------------------------------------------------------- refuses to start (F1) ----

@pytest.mark.parametrize("leader", ["", "   ", None], ids=["empty", "blank", "unset"])
def test_no_leader_address_exits_3_without_starting_the_engine(launch, leader):
    doc, _ = document(TP8)
    env = {"LWS_WORKER_INDEX": "1", "LWS_GROUP_SIZE": "2"}
    if leader is not None:
        env["LWS_LEADER_ADDRESS"] = leader
    run = launch(doc, **env)
    assert run.code == 3
    assert "LWS_LEADER_ADDRESS" in run.stderr
    assert not run.engine_ran and run.stdout == ""


def test_unresolvable_leader_waits_the_bounded_timeout_then_exits_3(launch):
    doc, _ = document(TP8)
    doc["leaderAddressTimeoutSeconds"] = 1
    run = launch(doc, LWS_LEADER_ADDRESS="leader.invalid", LWS_WORKER_INDEX="1", LWS_GROUP_SIZE="2",
                 KIMIK3_POLL_SECONDS="0.2")
    assert run.code == 3, run.stderr
    assert 1.0 <= run.seconds <= 3.5, f"waited {run.seconds:.2f} s for a 1 s bound"
    assert "leader.invalid" in run.stderr and "did not resolve" in run.stderr
    assert not run.engine_ran and run.stdout == ""


def test_group_size_mismatch_exits_2(launch):
    doc, _ = document(TP8)
    run = launch(doc, LWS_LEADER_ADDRESS="localhost", LWS_WORKER_INDEX="1", LWS_GROUP_SIZE="4")
    assert run.code == 2
    assert "LWS_GROUP_SIZE=4" in run.stderr and "2 ranks" in run.stderr
    assert not run.engine_ran


@pytest.mark.parametrize("index", ["2", "-1", "one"])
def test_worker_index_outside_the_plan_exits_2(launch, index):
    doc, _ = document(TP8)
    run = launch(doc, LWS_LEADER_ADDRESS="localhost", LWS_WORKER_INDEX=index, LWS_GROUP_SIZE="2")
    assert run.code == 2
    assert "LWS_WORKER_INDEX" in run.stderr
    assert not run.engine_ran


def test_unreadable_plan_exits_2(tmp_path):
    proc = subprocess.run([sys.executable, str(LAUNCHER), str(tmp_path / "missing.json")],
                          capture_output=True, text=True, timeout=15)
    assert proc.returncode == 2
    assert "missing.json" in proc.stderr


def test_plan_without_ranks_exits_2_naming_the_key(launch):
    run = launch({"leaderAddressTimeoutSeconds": 5}, LWS_LEADER_ADDRESS="localhost", LWS_WORKER_INDEX="0")
    assert run.code == 2
    assert "ranks" in run.stderr and "Traceback" not in run.stderr
    assert not run.engine_ran


# ---------------------------------------------------------------- shipped source -----------

@pytest.mark.tier("unit")
def test_configmap_ships_the_launcher_file_verbatim():
    assert launcher_source() == LAUNCHER.read_text(encoding="utf-8")


@pytest.mark.tier("unit")
def test_launcher_imports_only_the_standard_library():
    tree = ast.parse(LAUNCHER.read_text(encoding="utf-8"))
    modules = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "relative import in the launcher"
            modules.add(node.module.split(".")[0])
    assert modules, "no imports found: is this the launcher?"
    assert modules - {"__future__"} <= sys.stdlib_module_names, modules - sys.stdlib_module_names
