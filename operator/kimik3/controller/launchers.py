"""Which launcher ConfigMaps a deployment keeps, and when the others go.

Each launch plan has its ConfigMap (``render.configmap``), mounted by the group templates of the
revisions rendered from it. One is kept while anything may still start a pod from it:

- the one the spec renders now (applied every reconcile, even while a pause or a rollback holds
  other templates);
- the ones the templates of each of the deployment's LeaderWorkerSets mount (the old sets of a
  rollout, a canary's, a paused or rolled-back set: LWS v0.9.0 recreates a whole group from its
  set's templates when one of its pods fails);
- every one a pod of the deployment mounts (the groups of every revision still running).

The others go only once the rollout has settled (``settled``): one LeaderWorkerSet is left (an
old one being deleted still counts). Before that a group of an old set may be recreated, and for
a moment no pod of it shows which ConfigMap it needs.

Pure functions: no API calls.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from kimik3.controller.fleet import EngineSet
from kimik3.render.configmap import PLAN_KEY, is_launcher, mounted
from kimik3.render.meta import Owner


def template_launchers(template: dict[str, Any]) -> set[str]:
    """The launcher ConfigMaps a ``leaderWorkerTemplate`` mounts (leader and worker templates)."""
    pods = (template.get(key) for key in ("leaderTemplate", "workerTemplate"))
    return {name for pod in pods if pod for name in [mounted(pod.get("spec") or {})] if name}


def launch_plan(engine_set: EngineSet, launchers: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The launch plan (``render.configmap.group_plan_document``) the leader template of
    ``engine_set`` mounts, read from ``launchers`` (the deployment's launcher ConfigMaps); None
    when it is not among them or holds no plan."""
    template = (engine_set.lws.get("spec") or {}).get("leaderWorkerTemplate") or {}
    leader = template.get("leaderTemplate") or template.get("workerTemplate") or {}  # one-node groups: no leaderTemplate
    name = mounted(leader.get("spec") or {})
    found = next((c for c in launchers if c["metadata"]["name"] == name), None)
    text = ((found or {}).get("data") or {}).get(PLAN_KEY)
    return json.loads(text) if text else None


def in_use(rendered: str, sets: list[EngineSet], pods: Iterable[dict[str, Any]]) -> set[str]:
    """The names kept (see the module): ``rendered`` (this spec's ConfigMap), those of the
    templates of every set in ``sets``, and of every pod."""
    keep = {rendered}
    for engine_set in sets:
        keep |= template_launchers(((engine_set.lws.get("spec") or {}).get("leaderWorkerTemplate")) or {})
    keep |= {name for pod in pods for name in [mounted(pod.get("spec") or {})] if name}
    return keep


def settled(sets: list[EngineSet]) -> bool:
    """No rollout can still recreate a group of an older revision: one LeaderWorkerSet is left."""
    return len(sets) == 1


def stale(owner: Owner, configmaps: Iterable[dict[str, Any]], keep: set[str]) -> list[str]:
    """Names of ``owner``'s launcher ConfigMaps (among ``configmaps``) not in ``keep``, sorted."""
    names = (c["metadata"]["name"] for c in configmaps)
    return sorted(n for n in names if is_launcher(owner, n) and n not in keep)
