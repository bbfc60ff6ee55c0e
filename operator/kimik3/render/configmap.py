"""The launcher ConfigMap: the stdlib launcher and the group plan it reads in each pod."""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

from kimik3.admission import Admitted
from kimik3.engine.args import VLLM_VERSION, leader_lost_timeout_s, rank_args, secret_env
from kimik3.kube.kinds import CONFIG_MAP
from kimik3.render.meta import Owner

MOUNT_PATH = "/etc/kimik3"
LAUNCHER_KEY = "launcher.py"
PLAN_KEY = "plan.json"
ENGINE_COMMAND = ["vllm", "serve"]


def configmap_name(owner: Owner) -> str:
    return f"{owner.name}-launcher"


def launcher_source() -> str:
    """Source of kimik3.engine.launcher, shipped verbatim to the pods."""
    return resources.files("kimik3.engine").joinpath("launcher.py").read_text(encoding="utf-8")


def group_plan_document(admitted: Admitted, start_delay_s: float = 0.0) -> dict[str, Any]:
    """What the launcher reads: the command, each rank's arguments, the leader wait and watchdog
    bounds and the start back-off (seconds), and the names of the variables it must not log
    (kimik3.engine.launcher)."""
    spec, plan = admitted.spec, admitted.plan
    return {
        "startDelaySeconds": start_delay_s,
        "vllmVersion": VLLM_VERSION,
        "command": ENGINE_COMMAND,
        "leaderAddressTimeoutSeconds": admitted.seconds.leader_address_timeout,
        "leaderLostTimeoutSeconds": leader_lost_timeout_s(spec),
        "secretEnv": secret_env(spec),
        "ranks": [{"index": i, "args": rank_args(spec, plan, i)} for i in range(plan.nodes_per_group)],
    }


def launcher_configmap(owner: Owner, admitted: Admitted, start_delay_s: float = 0.0) -> dict[str, Any]:
    return {
        "apiVersion": CONFIG_MAP.api_version,
        "kind": CONFIG_MAP.kind,
        "metadata": owner.metadata(configmap_name(owner)),
        "data": {
            LAUNCHER_KEY: launcher_source(),
            PLAN_KEY: json.dumps(group_plan_document(admitted, start_delay_s), indent=2, sort_keys=True),
        },
    }
