"""The layers of design.md are a contract, not a hope: import-linter's contracts (pyproject.toml,
``[tool.importlinter]``: the layers, the one API client, the kopf adapter), mypy on the core
(strict) and the kit, and the operator's process free of the kit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _run(*cmd: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO / "operator")}
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.tier("process")
def test_import_contracts_hold() -> None:
    """Core layers (cli > controller > autoscaler | render > admission > engine > topology > api >
    kube), the kit's layers, the core never importing the kit, no cycles among siblings, and in the
    core only ``controller.kube`` importing the kubernetes package."""
    result = _run(str(BIN / "lint-imports"), "--no-cache")
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "kept, 0 broken." in result.stdout


@pytest.mark.tier("process")
@pytest.mark.parametrize("module,source,broken", [
    ("api/upward.py", "import kimik3.controller.status\n", "kimik3.api.upward -> kimik3.controller.status"),
    ("controller/direct.py", "from kubernetes import client\n", "kimik3.controller.direct -> kubernetes"),
], ids=["upward import", "a second API client"])
def test_import_contracts_catch_a_broken_rule(tmp_path: Path, module: str, source: str, broken: str) -> None:
    """The contracts are not vacuous: an api module importing the controller breaks the layers; a
    controller module importing the kubernetes package breaks the one client (``controller.kube``)."""
    tree = tmp_path / "operator"
    subprocess.run(["cp", "-r", str(REPO / "operator"), str(tree)], check=True)
    (tree / "kimik3" / module).write_text(source)
    (tmp_path / "pyproject.toml").write_text((REPO / "pyproject.toml").read_text())
    env = {**os.environ, "PYTHONPATH": str(tree)}
    result = subprocess.run([str(BIN / "lint-imports"), "--no-cache"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 1
    assert broken in result.stdout


@pytest.mark.tier("process")
def test_core_and_kit_type_check() -> None:
    """mypy (pyproject.toml ``[tool.mypy]``) is clean on operator/kimik3 (strict, but for the packages
    its overrides name) and on operator/kimik3_dev (every function body checked, not strict)."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["mypy"]
    assert config["strict"] is True and set(config["files"]) == {"operator/kimik3", "operator/kimik3_dev"}
    cache = Path(os.environ.get("KIMIK3_CACHE", Path.home() / ".cache" / "kimik3")) / "mypy-cache"
    result = _run(str(BIN / "mypy"), "--cache-dir", str(cache))
    assert result.returncode == 0, result.stdout[-6000:]


@pytest.mark.tier("process")
def test_operator_process_imports_no_kit_module() -> None:
    """``kimik3 run`` loads the CLI, the controller and everything it reaches; not one
    ``kimik3_dev`` module (the operator image ships the core only)."""
    probe = (
        "import sys, json\n"
        "from click.testing import CliRunner\n"
        "from kimik3.cli import main\n"
        "import kimik3.controller.operator\n"
        "CliRunner().invoke(main, ['run', '--help'])\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('kimik3', 'kimik3_dev'))))\n"
    )
    result = _run(sys.executable, "-c", probe)
    assert result.returncode == 0, result.stderr
    loaded = json.loads(result.stdout.splitlines()[-1])
    assert "kimik3.controller.operator" in loaded and "kimik3.autoscaler.policy" in loaded
    assert [m for m in loaded if m.startswith("kimik3_dev")] == []


@pytest.mark.tier("process")
def test_kit_verbs_are_offered_by_the_one_command() -> None:
    """``kimik3 --help`` lists the core's verbs and the kit's (entry points ``kimik3.commands``)."""
    result = _run(str(BIN / "kimik3"), "--help")
    assert result.returncode == 0, result.stderr
    for verb in ("crd", "validate", "render", "run", "demo", "dev", "doctor", "simulate"):
        assert f"  {verb} " in result.stdout, verb


def test_kit_verbs_are_hidden_where_the_kit_is_not_installed(monkeypatch) -> None:
    """In the operator image (core only) an entry point whose package is absent is not offered;
    present ones load only when named."""
    from importlib.metadata import EntryPoint

    from click.testing import CliRunner

    import kimik3.cli as cli
    points = [EntryPoint("ghost", "kimik3_ghost_kit.cli:ghost", cli.PLUGIN_GROUP),
              EntryPoint("demo", "kimik3_dev.cli:demo", cli.PLUGIN_GROUP)]
    monkeypatch.setattr(cli, "entry_points", lambda group: [p for p in points if p.group == group])
    result = CliRunner().invoke(cli.main, ["--help"])
    assert result.exit_code == 0
    assert "  demo " in result.output and "ghost" not in result.output
    assert CliRunner().invoke(cli.main, ["ghost"]).exit_code == 2  # click: no such command
