"""Placement benchmark: 50 TP8 engine groups on the dev cluster (kwok GB300 NVL72 racks, the real
LeaderWorkerSet and Kueue managers at their pinned versions), ``exclusive`` against ``kueue`` in one run.

    source tools/env.sh && python bench/placement.py [--groups 50] [--racks 6] [--step 10]

1. ``DevCluster.up``: ``--racks`` racks of 18 GB300 trays (4 GPUs each), no engine simulator,
   no Prometheus, ``die_with_parent``.
2. For each mode in turn (``exclusive`` first, then ``kueue``; the first is deleted, and its pods
   gone, before the second starts: the two must not share racks, docs/dev-cluster.md), one
   KimiK3Deployment from ``recipes/gb300-tp8-megakernel-dspark.yaml`` (TP8 = 2 trays per group)
   at replicas 0, then scaled up by ``--step`` groups at a time (a merge patch of
   ``spec.replicas``, as ``kubectl scale`` does) to ``--groups``. After each edit the clock runs
   until every new group that can be placed has all its pods bound to a node (``spec.nodeName``):
   in ``exclusive`` mode at most one group per rack (LeaderWorkerSet's exclusive topology), the
   others stay Unschedulable; in ``kueue`` mode every group fits (9 per rack) while trays last.
3. Measured per mode, from pod listings every ``POLL_S`` s: groups placed per rack at the end,
   and for each placed group the seconds from the replicas edit to its last pod bound (p50, p90,
   max), which covers the operator's reconcile, LeaderWorkerSet's pod creation and, under Kueue,
   the Workload's admission and the pods' ungating.

Prints both modes and the ratios kueue / exclusive; writes ``bench/results/placement.json``:
``{measured, commit, versions: {leaderworkerset, kueue}, groups, racks, step, modes: {mode: {placed,
per_rack: {rack: groups}, groups_per_rack,
bind_s: {p50, p90, max}, wall_s}}, ratios: {groups_per_rack, bind_p50, bind_p90}}``.
Not part of the test suite (a run takes ~3-5 min on the 2-core project machine).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import click
import yaml

from kimik3.kube import pods as kpods
from kimik3.kube.kinds import GROUP, PLURAL, VERSION
from kimik3.kube.labels import CLIQUE_LABEL
from kimik3_dev.benchmark.provenance import checkout_commit
from kimik3_dev.devcluster import kueue
from kimik3_dev.devcluster.cluster import DevCluster, UpOptions
from kimik3_dev.devcluster.racks import RackShape
from kimik3_dev.devcluster.rest import Rest
from kimik3_dev.devcluster.workloads import apply_deployment
from kimik3_dev.versions import KUEUE_VERSION, LWS_VERSION

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "recipes" / "gb300-tp8-megakernel-dspark.yaml"
TRAYS_PER_RACK = 18
TRAYS_PER_GROUP = 2
"""TP8 over 4-GPU GB300 trays."""
POLL_S = 0.2
MODES = ("exclusive", "kueue")


def deployment(mode: str, namespace: str) -> dict[str, Any]:
    cr = yaml.safe_load(RECIPE.read_text())
    cr["metadata"] = {"name": "k3", "namespace": namespace}
    cr["spec"]["replicas"] = 0
    if mode == "kueue":
        cr["spec"].setdefault("scheduling", {})["placement"] = {"mode": "kueue", "queueName": kueue.LOCAL_QUEUE}
    return cr


def cr_path(namespace: str) -> str:
    return f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}/k3"


def bound_groups(rest: Rest, namespace: str) -> dict[int, list[str]]:
    """Group index -> its pods' nodes, for the groups whose every pod is bound (live pods only)."""
    members: dict[int, list[dict[str, Any]]] = {}
    for pod in rest.items(f"/api/v1/namespaces/{namespace}/pods"):
        index = kpods.group_index(pod)
        if index is not None and not kpods.is_terminating(pod):
            members.setdefault(int(index), []).append(pod)
    return {i: [kpods.node_name(p) for p in pods] for i, pods in members.items()
            if len(pods) == TRAYS_PER_GROUP and all(kpods.node_name(p) for p in pods)}


def run_mode(rest: Rest, mode: str, groups: int, racks: int, step: int, timeout_s: float,
             clique_of: dict[str, str]) -> dict[str, Any]:
    namespace = f"placement-{mode}"
    t_mode = time.monotonic()
    apply_deployment(rest, deployment(mode, namespace))
    capacity = racks if mode == "exclusive" else racks * (TRAYS_PER_RACK // TRAYS_PER_GROUP)
    bind_s: list[float] = []
    placed: dict[int, list[str]] = {}
    for replicas in range(step, groups + 1, step):
        before, first = set(placed), len(bind_s)
        rest.call("PATCH", cr_path(namespace), body={"spec": {"replicas": replicas}},
                  content_type="application/merge-patch+json")
        edited = time.monotonic()
        want = min(replicas, capacity)
        while True:
            now = time.monotonic()
            placed = bound_groups(rest, namespace)
            for index in sorted(set(placed) - before):
                bind_s.append(now - edited)
                before.add(index)
            if len(placed) >= want:
                break
            if now - edited > timeout_s:
                raise SystemExit(f"{mode}: {len(placed)}/{want} groups bound {timeout_s:.0f} s after replicas "
                                 f"{replicas}")
            time.sleep(POLL_S)
        new = bind_s[first:]
        print(f"  {mode}: replicas {replicas}: {len(placed)} groups bound, {len(new)} new"
              + (f", the last {max(new):.1f} s after the edit" if new else ""), flush=True)
    per_rack: dict[str, int] = {}
    for nodes in placed.values():
        (rack,) = {clique_of[n] for n in nodes}  # a group never spans racks
        per_rack[rack] = per_rack.get(rack, 0) + 1
    wall = time.monotonic() - t_mode
    rest.delete(cr_path(namespace))
    deadline = time.monotonic() + timeout_s
    while rest.items(f"/api/v1/namespaces/{namespace}/pods") and time.monotonic() < deadline:
        time.sleep(0.5)
    ordered = sorted(bind_s)
    return {"placed": len(placed), "per_rack": dict(sorted(per_rack.items())),
            "groups_per_rack": round(len(placed) / len(per_rack), 2) if per_rack else 0.0,
            "bind_s": {"p50": round(statistics.median(ordered), 2),
                       "p90": round(ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))], 2),
                       "max": round(ordered[-1], 2)},
            "wall_s": round(wall, 1)}


@click.command(help=__doc__.split("\n\n")[0])
@click.option("--groups", type=click.IntRange(1, 64), default=50, show_default=True, help="Groups to scale to.")
@click.option("--racks", type=click.IntRange(1), default=6, show_default=True,
              help="GB300 NVL72 racks of 18 trays (6 hold 54 TP8 groups under Kueue).")
@click.option("--step", type=click.IntRange(1), default=10, show_default=True, help="Groups added per replicas edit.")
@click.option("--timeout", "timeout_s", type=float, default=180.0, show_default=True,
              help="Bound on each wait for the new groups to be bound, s.")
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path), default=REPO / ".state" / "placement",
              show_default=True)
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path),
              default=REPO / "bench" / "results" / "placement.json", show_default=True)
def main(groups: int, racks: int, step: int, timeout_s: float, state_dir: Path, out: Path) -> None:
    if groups > racks * (TRAYS_PER_RACK // TRAYS_PER_GROUP):
        raise click.BadParameter(f"{groups} TP8 groups need {-(-groups // 9)} racks of 18 trays", param_hint="--racks")
    cluster = DevCluster(state_dir)
    t_up = time.monotonic()
    cluster.up(UpOptions(shape=RackShape(profile="gb300", racks=racks, trays_per_rack=TRAYS_PER_RACK), sim=False,
                         prometheus=False, die_with_parent=True, wait_timeout_s=180.0))
    print(f"dev up: {racks} racks x {TRAYS_PER_RACK} GB300 trays in {time.monotonic() - t_up:.1f} s", flush=True)
    try:
        with cluster.api_client() as api:
            rest = Rest(api)
            clique_of = {n["metadata"]["name"]: n["metadata"]["labels"][CLIQUE_LABEL]
                         for n in rest.items("/api/v1/nodes")}
            modes = {mode: run_mode(rest, mode, groups, racks, step, timeout_s, clique_of) for mode in MODES}
    finally:
        cluster.down()
    ex, ku = modes["exclusive"], modes["kueue"]
    ratios = {"groups_per_rack": round(ku["groups_per_rack"] / ex["groups_per_rack"], 2),
              "bind_p50": round(ku["bind_s"]["p50"] / ex["bind_s"]["p50"], 2),
              "bind_p90": round(ku["bind_s"]["p90"] / ex["bind_s"]["p90"], 2)}
    result = {"measured": time.strftime("%Y-%m-%d", time.gmtime()), "commit": checkout_commit(REPO),
              "versions": {"leaderworkerset": LWS_VERSION, "kueue": KUEUE_VERSION},
              "groups": groups, "racks": racks, "step": step, "modes": modes, "ratios": ratios}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print()
    print(f"{'mode':<10} {'placed':>6} {'per rack':>9} {'bind p50':>9} {'bind p90':>9} {'bind max':>9}")
    for mode, m in modes.items():
        print(f"{mode:<10} {m['placed']:>6} {m['groups_per_rack']:>9} {m['bind_s']['p50']:>8}s "
              f"{m['bind_s']['p90']:>8}s {m['bind_s']['max']:>8}s")
    print(f"kueue / exclusive: {ratios['groups_per_rack']}x groups per rack, time to bound "
          f"{ratios['bind_p50']}x (p50), {ratios['bind_p90']}x (p90)")
    print(f"wrote {out}")


if __name__ == "__main__":
    sys.exit(main())
