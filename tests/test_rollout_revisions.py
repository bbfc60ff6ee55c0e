"""What restarts engine groups (``render.revision.RESTARTS``), and golden group templates per recipe.

LeaderWorkerSet v0.9.0 rolls every group whenever ``spec.leaderWorkerTemplate`` changes byte for
byte. Each row of the table is exercised: the field is changed to another valid value and the
rendered template must change exactly when the row says it restarts groups. The golden files
(tests/golden/<recipe>.json) freeze the leader and worker templates of every shipped recipe, so
an unintended template change (a new default, a reordered env, an added label) fails here before
it restarts every group of every deployment on an operator upgrade. Regenerate them, after
checking the diff is wanted, with ``KIMIK3_UPDATE_GOLDEN=1``.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from kimik3.api.v1alpha1 import KimiK3DeploymentSpec, ServiceSpec
from kimik3.render.revision import RESTARTS
from support.recipes import RECIPE_FILES, REPO, merge, recipe
from support.rendering import by_kind, render_cr

UID = "7a1c2b9e-0000-4000-8000-000000000012"
GOLDEN = REPO / "tests" / "golden"

CHANGES: dict[str, dict[str, Any]] = {
    "model": {"spec": {"model": {"maxModelLen": 65536}}},
    "engine": {"spec": {"engine": {"image": "vllm/vllm-openai:v0.33.1"}}},
    "speculativeDecoding": {"spec": {"speculativeDecoding": {"numSpeculativeTokens": 5}}},
    "topology": {"spec": {"topology": {"tensorParallelSize": 16}}},
    "scheduling": {"spec": {"scheduling": {"nodeSelector": {"pool": "latency"}}}},
    "probes": {"spec": {"probes": {"loadTimeout": "120m"}}},
    "service.port": {"spec": {"service": {"port": 8080}}},
    "service.apiKeySecret": {"spec": {"service": {"apiKeySecret": {"name": "k3-key", "key": "key"}}}},
    "service.type": {"spec": {"service": {"type": "LoadBalancer"}}},
    "service.annotations": {"spec": {"service": {"annotations": {"lb.example.com/internal": "true"}}}},
    "service.httpRoute": {"spec": {"service": {"httpRoute": {"parentRefs": [{"name": "gateway"}]}}}},
    "replicas": {"spec": {"replicas": 5}},
    "autoscaling": {"spec": {"autoscaling": {"enabled": True, "minReplicas": 1, "maxReplicas": 4,
                                             "target": {"value": "4ms", "percentile": 95},
                                             "metricsSource": {"type": "podScrape"}}}},
    "monitoring": {"spec": {"monitoring": {"interval": "30s", "labels": {"release": "prometheus"}}}},
    "disruptionBudget": {"spec": {"disruptionBudget": {"minAvailable": 1}}},
    "rollout": {"spec": {"rollout": {"maxSurge": 2, "maxUnavailable": 1, "canary": {"groups": 2}, "paused": True}}},
    "routing": {"spec": {"routing": {"enabled": True, "endpointPicker": {"failureMode": "FailClose"}}}},
    "idle": {"spec": {"idle": {"stopAfter": "30m"}, "autoscaling": {"metricsSource": {"type": "podScrape"}}}},
    "metadata.labels": {"metadata": {"labels": {"team": "inference", "cost-center": "42"}}},
    "metadata.annotations": {"metadata": {"annotations": {"note": "edited", "kubectl.kubernetes.io/x": "y"}}},
}
"""A valid change of each row of RESTARTS (merged into the latency recipe at replicas 2)."""


def group_template(cr: dict[str, Any]) -> dict[str, Any]:
    return by_kind(render_cr(cr).objects, "LeaderWorkerSet")["spec"]["leaderWorkerTemplate"]


def test_the_table_names_every_spec_field():
    spec_fields = {f.alias or n for n, f in KimiK3DeploymentSpec.model_fields.items()}
    service_fields = {f"service.{f.alias or n}" for n, f in ServiceSpec.model_fields.items()}
    assert set(RESTARTS) - {"metadata.labels", "metadata.annotations"} == (spec_fields - {"service"}) | service_fields
    assert set(CHANGES) == set(RESTARTS)


@pytest.mark.parametrize("field", list(RESTARTS))
def test_a_change_restarts_groups_exactly_when_the_table_says(field):
    base = recipe(uid=UID, replicas=2)
    changed = merge(base, CHANGES[field])
    assert changed != base
    restarts, why = RESTARTS[field]
    assert (group_template(changed) != group_template(base)) == restarts, f"{field}: {why}"


@pytest.mark.parametrize("path", RECIPE_FILES, ids=lambda p: p.stem)
def test_group_templates_match_the_golden_file(path):
    rendered = json.dumps(group_template(recipe(path, uid=UID)), indent=2, sort_keys=True) + "\n"
    golden = GOLDEN / f"{path.stem}.json"
    if os.environ.get("KIMIK3_UPDATE_GOLDEN") == "1":
        golden.write_text(rendered, encoding="utf-8")
    assert golden.exists(), f"{golden.relative_to(REPO)} missing: run with KIMIK3_UPDATE_GOLDEN=1 and commit it"
    assert rendered == golden.read_text(encoding="utf-8"), (
        f"the group templates of recipes/{path.name} changed: every running group of such a deployment "
        f"would restart. If that is intended, regenerate {golden.relative_to(REPO)} with KIMIK3_UPDATE_GOLDEN=1")
