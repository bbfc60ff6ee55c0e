"""F23 against real vLLM 0.33.0: its SpeculativeConfig takes the rendered drafter folder offline
and refuses the hub id, as the failure case says.

The flagship recipe (target and drafter in a model cache) is rendered by the operator's own code;
the engine container's env (``HF_HUB_OFFLINE=1``) and its ``--speculative-config`` go to vLLM
0.33.0's ``SpeculativeConfig`` (``speculative_offline.py`` in the pinned venv), with the volume
mounted at /models played by a temporary folder: the rendered paths below /models are mapped
onto it, as the pod's mount would. The volume holds a tiny random Llama (``make_tiny_model.py``)
as target and drafter, at the layout the stager writes (``<repo id>/<revision>``). The drafter's
hub id form, in the same process and env, fails with vLLM's "Invalid repository ID or local
directory specified" (what the engine died of on a real cluster).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from kimik3.engine.weights import MODEL_MOUNT
from support.recipes import recipe
from support.rendering import by_kind, render_cr

HERE = Path(__file__).resolve().parent
pytestmark = pytest.mark.timeout(900)


def test_vllm_takes_the_rendered_drafter_folder_offline_and_refuses_the_hub_id(parser_venv, tmp_path):
    if not parser_venv.is_pinned:
        pytest.fail("F23 is checked against vLLM 0.33.0's SpeculativeConfig: run tools/vllm-envs.sh")
    lws = by_kind(render_cr(recipe(), compute_domains=False).objects, "LeaderWorkerSet")
    container = lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]
    pod_env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    assert pod_env["HF_HUB_OFFLINE"] == "1"
    plan = json.loads(by_kind(render_cr(recipe(), compute_domains=False).objects, "ConfigMap")["data"]["plan.json"])
    args = plan["ranks"][0]["args"]
    config = json.loads(args[args.index("--speculative-config") + 1])
    assert args[0] == "/models/moonshotai/Kimi-K3/main"
    assert config["model"] == "/models/Inferact/Kimi-K3-DSpark/main"

    volume = tmp_path / "volume"
    target = volume / "moonshotai/Kimi-K3/main"
    made = subprocess.run([str(parser_venv.python), str(HERE / "make_tiny_model.py"), str(target)],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")})
    assert made.returncode == 0, made.stderr[-3000:]
    shutil.copytree(target, volume / "Inferact/Kimi-K3-DSpark/main")

    def on_volume(path: str) -> str:
        assert path.startswith(MODEL_MOUNT + "/"), path
        return str(volume / path[len(MODEL_MOUNT) + 1:])

    env = {**os.environ, **pod_env, "HF_HOME": str(tmp_path / "hf"), "VLLM_USE_V2_MODEL_RUNNER": "0"}
    env.pop("HF_ENDPOINT", None)
    run = subprocess.run([str(parser_venv.python), str(HERE / "speculative_offline.py"), on_volume(args[0]),
                          json.dumps(config), on_volume(config["model"]), "Inferact/Kimi-K3-DSpark"],
                         capture_output=True, text=True, timeout=900, cwd=tmp_path, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    local, hub_id = (json.loads(line) for line in run.stdout.strip().splitlines()[-2:])
    assert local == {"model": on_volume(config["model"]), "ok": True, "method": "dspark",
                     "draft_model": on_volume(config["model"])}
    assert not hub_id["ok"]
    assert "Invalid repository ID or local directory specified: 'Inferact/Kimi-K3-DSpark'" in hub_id["error"]
