"""Two placement modes on one node pool (controller/placementmix.py): a kueue deployment and an
exclusive one (LeaderWorkerSet's exclusive topology) whose node pools overlap are named to each
other, with their racks; other pairs are not. Pure functions over admitted recipes."""

from __future__ import annotations

from kimik3.admission import admit
from kimik3.controller.placementmix import (Placements, clashes, event_message, names, overlap, placement, status_racks,
                                           verdict)
from support.recipes import recipe

KUEUE = {"placement": {"mode": "kueue", "queueName": "inference"}}
POOL = "nvidia.com/gpu.product=NVIDIA-GB300, kubernetes.io/arch=arm64"


def placed(name: str, racks: tuple[str, ...] = (), file: str = "gb300-tp8-megakernel-dspark.yaml", **spec):
    return placement("team", name, admit(recipe(file, **spec)["spec"]), racks)


def test_a_kueue_and_an_exclusive_deployment_on_one_pool_clash_both_ways() -> None:
    packed = placed("packed", ("clique-0",), scheduling=KUEUE)
    alone = placed("alone", ("clique-0", "clique-1"))
    assert (packed.mode, packed.repels, alone.mode, alone.repels) == ("kueue", False, "exclusive", True)
    assert clashes(packed, [alone, packed]) == [alone] and clashes(alone, [packed]) == [packed]
    said = verdict(packed, [alone])
    assert (said.status, said.reason) == ("True", "PlacementModesMixed")
    assert said.message.startswith(
        "placement kueue on the node pool kubernetes.io/arch=arm64, nvidia.com/gpu.product=NVIDIA-GB300 shared with "
        "team/alone (placement exclusive) has groups in racks clique-0, clique-1 (clique-0 also holding this "
        "deployment's): an exclusive group repels every other group from its rack and Kueue does not see it, so Kueue may "
        "admit this deployment's groups into racks they cannot enter")
    assert said.message.endswith("Use placement kueue for every deployment of this node pool, or give the two modes "
                                 "disjoint node pools (spec.scheduling.nodeSelector on a label that splits the racks)")
    assert verdict(alone, [packed]).message.split(": an exclusive")[0] == (
        "placement exclusive on the node pool kubernetes.io/arch=arm64, nvidia.com/gpu.product=NVIDIA-GB300 shared "
        "with team/packed (placement kueue) has groups in racks clique-0 (clique-0 also holding this deployment's)")
    assert event_message(alone, [packed]) == (
        "placement exclusive shares its node pool with team/packed (placement kueue): an exclusive group repels "
        "Kueue's groups from its racks; use one placement mode per node pool (the PlacementConflict condition says "
        "more)")
    assert (verdict(packed, []).status, verdict(packed, []).reason) == ("False", "OnePlacementMode")


def test_no_clash_within_one_mode_across_pools_or_without_exclusive_topology() -> None:
    packed = placed("packed", scheduling=KUEUE)
    assert clashes(packed, [placed("other", scheduling=KUEUE)]) == []  # both kueue
    assert clashes(placed("a"), [placed("b")]) == []  # both exclusive: the scheduler sees both
    # another GPU product: another pool
    assert clashes(packed, [placed("gb200", file="gb200-tp16-megakernel-dspark.yaml")]) == []
    # a nodeSelector that splits the racks
    apart = placed("apart", scheduling={"nodeSelector": {"pool": "exclusive"}})
    assert clashes(placed("k", scheduling={**KUEUE, "nodeSelector": {"pool": "kueue"}}), [apart]) == []
    assert clashes(packed, [apart]) != []  # no pool label on the kueue side: it may land on any tray
    assert overlap({"a": "1"}, {"b": "2"}) and not overlap({"a": "1"}, {"a": "2"})
    # single-node groups render no exclusive topology: they repel nothing
    single = placed("b300", file="b300-tp8-single-node.yaml")
    assert not single.repels
    assert clashes(placed("k", file="b300-tp8-single-node.yaml", scheduling=KUEUE), [single]) == []


def test_placements_are_derived_once_per_generation_with_racks_from_the_status() -> None:
    cr = recipe(namespace="team", uid="u1", scheduling=KUEUE)
    cr["metadata"]["generation"] = 1
    cr["status"] = {"groups": [{"index": 0, "rack": "clique-0", "racks": ["clique-0"]},
                               {"index": 1, "racks": ["clique-1", "clique-2"]}, {"index": 2}]}
    assert status_racks(cr) == {"clique-0", "clique-1", "clique-2"}
    kept = Placements()
    first = kept.of(cr)
    assert first is not None and (first.ref, first.mode, first.racks) == ("team/k3-latency", "kueue",
                                                                          {"clique-0", "clique-1", "clique-2"})
    cr["spec"]["scheduling"] = {}  # changed without a new generation: the kept placement stands
    assert (kept.of(cr) or first).mode == "kueue"
    cr["metadata"]["generation"] = 2
    assert (kept.of(cr) or first).mode == "exclusive"
    cr["spec"]["replicas"] = -1  # refused by admission: no placement
    cr["metadata"]["generation"] = 3
    assert kept.of(cr) is None
    kept.forget([])  # deleted: what was kept goes, so the same generation is derived again
    cr["spec"]["replicas"] = 1
    assert (kept.of(cr) or first).mode == "exclusive"


def test_a_cr_names_another_only_when_its_true_condition_says_so() -> None:
    """What decides whether the other deployment of a clash is reconciled at once (steps.collide)."""
    packed, alone = placed("packed", scheduling=KUEUE), placed("alone")
    said = verdict(alone, [packed])
    cr = {"status": {"conditions": [{"type": "PlacementConflict", "status": said.status, "message": said.message}]}}
    assert names(cr, packed) and not names(cr, alone)
    cr["status"]["conditions"][0]["status"] = "False"
    assert not names(cr, packed) and not names({}, packed)
