"""Which launcher ConfigMaps a deployment keeps, and when the others go.

Each launch plan has its ConfigMap (``render.configmap``), mounted by the group templates of the
revisions rendered from it. One is kept while anything may still start a pod from it:

- the one the spec renders now (applied every reconcile, even while a pause or a rollback holds
  other templates on the LeaderWorkerSet);
- the one the LeaderWorkerSet's templates mount (a pause or a rollback holds older templates);
- the one the templates from before a canary's change mount, while that canary bakes (a rollback
  puts them back: ``status.rollout.canary.previousTemplate``);
- every one a pod of the deployment mounts (the groups of every revision still running).

The others go only once the rollout has settled (``settled``): the LeaderWorkerSet controller has
seen its latest spec, no update is in progress, and every group runs its newest revision (or
there is no group). Before that a group of an old revision may be recreated (LWS v0.9.0
recreates a whole group when one of its pods fails, and recreates groups below the partition
from their own revision), and for a moment no pod of it shows which ConfigMap it needs.

Pure functions: no API calls.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from kimik3.api.v1alpha1 import CanaryStatus, RolloutStatus
from kimik3.controller.rollout import lws_fresh, update_in_progress
from kimik3.render.configmap import is_launcher, mounted
from kimik3.render.meta import Owner


def template_launchers(template: dict[str, Any]) -> set[str]:
    """The launcher ConfigMaps a ``leaderWorkerTemplate`` mounts (leader and worker templates)."""
    pods = (template.get(key) for key in ("leaderTemplate", "workerTemplate"))
    return {name for pod in pods if pod for name in [mounted(pod.get("spec") or {})] if name}


def in_use(rendered: str, lws: dict[str, Any] | None, pods: Iterable[dict[str, Any]],
           canary: CanaryStatus | None) -> set[str]:
    """The names kept (see the module): ``rendered`` (this spec's ConfigMap), those of ``lws``'s
    templates, of the templates before an unpromoted ``canary``, and of every pod."""
    keep = {rendered}
    if lws is not None:
        keep |= template_launchers(((lws.get("spec") or {}).get("leaderWorkerTemplate")) or {})
    if canary is not None and not canary.promoted and canary.previous_template:
        keep |= template_launchers(json.loads(canary.previous_template))
    keep |= {name for pod in pods for name in [mounted(pod.get("spec") or {})] if name}
    return keep


def settled(lws: dict[str, Any] | None, rollout: RolloutStatus | None) -> bool:
    """No rollout can still recreate a group of an older revision: the LeaderWorkerSet exists, its
    controller has seen its latest spec, says no update is in progress, and every group runs its
    newest revision (``status.updatedReplicas`` of them, all of one revision), or there is none."""
    if lws is None or rollout is None or not lws_fresh(lws) or update_in_progress(lws):
        return False
    groups = sum(r.groups for r in rollout.revisions)
    return groups == 0 or (len(rollout.revisions) == 1 and rollout.updated_replicas == groups)


def stale(owner: Owner, configmaps: Iterable[dict[str, Any]], keep: set[str]) -> list[str]:
    """Names of ``owner``'s launcher ConfigMaps (among ``configmaps``) not in ``keep``, sorted."""
    names = (c["metadata"]["name"] for c in configmaps)
    return sorted(n for n in names if is_launcher(owner, n) and n not in keep)
