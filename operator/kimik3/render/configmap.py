"""The launcher ConfigMaps: the stdlib launcher and the group plan it reads in each pod, one per
launch plan.

Each revision of the group templates mounts the ConfigMap named after its own ``plan_hash`` (the
value of the templates' ``inference.kimik3.io/plan-hash`` annotation), so a group of an old
revision that restarts during a rollout, or one kept by a rollback, reads the arguments it was
rendered with, never the new ones. Revisions whose templates differ only outside the plan and
env (e.g. the image) share one: their ConfigMaps would hold the same plan. Which ones are kept
and when the others go: ``kimik3.controller.launchers``.
"""

from __future__ import annotations

import hashlib
import json
from importlib import resources
from typing import Any

from kimik3.admission import Admitted
from kimik3.engine.args import VLLM_VERSION, engine_env, leader_lost_timeout_s, rank_args, secret_env
from kimik3.kube.kinds import CONFIG_MAP
from kimik3.render.meta import Owner

MOUNT_PATH = "/etc/kimik3"
LAUNCHER_KEY = "launcher.py"
PLAN_KEY = "plan.json"
ENGINE_COMMAND = ["vllm", "serve"]


VOLUME = "launcher"
"""The pod volume that mounts the launcher ConfigMap."""
LEGACY_SUFFIX = "-launcher"
"""``<deployment>-launcher``: the one ConfigMap every revision shared before ConfigMaps per plan."""


def plan_hash(admitted: Admitted) -> str:
    """16 hex digits of SHA-256 of the launch plan (start delay 0) and the engine env: a change
    rolls the groups, and names the launcher ConfigMap of their new revision."""
    env = engine_env(admitted.spec, admitted.plan, admitted.seconds.load_timeout)
    doc = {"plan": group_plan_document(admitted), "env": env}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


def configmap_name(owner: Owner, admitted: Admitted) -> str:
    """``<deployment>-launcher-<plan_hash>``: the ConfigMap this spec's group templates mount."""
    return f"{owner.name}{LEGACY_SUFFIX}-{plan_hash(admitted)}"


def is_launcher(owner: Owner, name: str) -> bool:
    """``name`` is one of ``owner``'s launcher ConfigMaps (of any plan, or the legacy shared one)."""
    base = f"{owner.name}{LEGACY_SUFFIX}"
    return name == base or name.startswith(f"{base}-")


def mounted(pod_spec: dict[str, Any]) -> str | None:
    """The launcher ConfigMap a pod spec mounts (its ``launcher`` volume), or None."""
    return next(((v.get("configMap") or {}).get("name") for v in pod_spec.get("volumes") or []
                 if v.get("name") == VOLUME and v.get("configMap")), None)


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
        "metadata": owner.metadata(configmap_name(owner, admitted)),
        "data": {
            LAUNCHER_KEY: launcher_source(),
            PLAN_KEY: json.dumps(group_plan_document(admitted, start_delay_s), indent=2, sort_keys=True),
        },
    }
