"""The host-memory KV tier (``spec.engine.kvOffload``): vLLM's flags, the engine pods' memory and
/dev/shm, and the refusal of a tier one node cannot hold (``kimik3.admission.memory``).

The flags' meaning to vLLM 0.33's own parser is checked in tests/conformance (``kv_offloading_size``
and ``kv_offloading_backend`` among the parsed fields of every generated spec)."""

from __future__ import annotations

import pytest

from kimik3.admission import admit
from kimik3.api.errors import SpecErrors
from kimik3.engine.args import OWNED_FLAGS, rank_args
from kimik3.engine.kvcache import offload_bytes_per_pod, offload_shm_bytes
from kimik3.kube.quantities import gibibytes, quantity_bytes
from support.recipes import LATENCY, recipe
from support.rendering import by_kind, render_cr

UID = "7a1c2b9e-0000-4000-8000-000000000027"
GIB = 2**30


def pods(cr: dict) -> tuple[dict, dict]:
    """(leader container, worker template spec) of the rendered LeaderWorkerSet."""
    lws = by_kind(render_cr(cr).objects, "LeaderWorkerSet")["spec"]["leaderWorkerTemplate"]
    return lws["leaderTemplate"]["spec"], lws["workerTemplate"]["spec"]


def test_quantities_read_the_forms_nodes_and_specs_use():
    assert quantity_bytes("960G") == 960 * 10**9
    assert quantity_bytes("2Ti") == 2 * 2**40
    assert quantity_bytes("800Gi") == 800 * GIB
    assert quantity_bytes("512") == 512
    assert gibibytes(GIB + 1) == "2Gi" and gibibytes(350 * GIB) == "350Gi"
    for bad in ("1.5Gi", "1e3", "100m", "Gi", "-1Gi"):
        with pytest.raises(ValueError):
            quantity_bytes(bad)


def test_the_tier_becomes_vllms_two_flags_on_every_rank():
    a = admit(recipe(LATENCY, engine={"kvOffload": {"size": "700Gi"}})["spec"])
    for rank in range(a.plan.nodes_per_group):
        argv = rank_args(a.spec, a.plan, rank)
        i = argv.index("--kv-offloading-size")
        assert argv[i:i + 4] == ["--kv-offloading-size", "700", "--kv-offloading-backend", "native"]
    one_ti = admit(recipe(LATENCY, engine={"kvOffload": {"size": "1Ti"}})["spec"])
    assert "1024" in rank_args(one_ti.spec, one_ti.plan, 0)
    off = admit(recipe(LATENCY)["spec"])
    assert not {"--kv-offloading-size", "--kv-offloading-backend"} & set(rank_args(off.spec, off.plan, 0))
    assert {"--kv-offloading-size", "--kv-offloading-backend"} <= OWNED_FLAGS


def test_extra_args_may_not_set_the_tier_behind_the_field():
    with pytest.raises(SpecErrors, match="kv-offloading-size"):
        admit(recipe(LATENCY, engine={"extraArgs": ["--kv-offloading-size=100"]})["spec"])


@pytest.mark.parametrize("topology,size,share_gib", [
    ({"strategy": "tp", "tensorParallelSize": 8}, "700Gi", 350),    # 2 trays: half each
    ({"strategy": "tp", "tensorParallelSize": 16}, "800Gi", 200),   # 4 trays: a quarter each
    ({"strategy": "dep", "dataParallelSize": 16}, "100Gi", 400),    # one engine per GPU, 4 on a tray
    ({"accelerator": "b300", "strategy": "tp-dp", "tensorParallelSize": 8, "dataParallelSize": 2}, "300Gi", 300),
])
def test_each_pod_holds_its_ranks_share(topology, size, share_gib):
    engine = {"kvOffload": {"size": size}, "decodeBackend": "stock", "moeBackend": "auto"}
    cr = recipe(LATENCY, engine=engine, speculativeDecoding={"method": "none"})
    cr["spec"]["topology"] = {"accelerator": "gb300", **topology}
    spec = admit(cr["spec"]).spec
    assert offload_bytes_per_pod(spec) == share_gib * GIB
    assert offload_shm_bytes(spec) == max(quantity_bytes(size), share_gib * GIB)


def test_pods_request_their_share_and_shm_holds_the_region():
    leader, worker = pods(recipe(LATENCY, uid=UID, engine={"kvOffload": {"size": "700Gi"}, "shmSize": "200Gi"}))
    for pod in (leader, worker):
        res = pod["containers"][0]["resources"]
        assert res["requests"]["memory"] == "350Gi" and "memory" not in res["limits"]
        (dshm,) = [v for v in pod["volumes"] if v["name"] == "dshm"]
        assert dshm["emptyDir"]["sizeLimit"] == "900Gi"  # 200Gi + the whole 700Gi region file
    leader, _ = pods(recipe(LATENCY, uid=UID, engine={"kvOffload": {"size": "700Gi"},
                                                      "resources": {"memory": "400Gi"}}))
    res = leader["containers"][0]["resources"]
    assert res["limits"]["memory"] == res["requests"]["memory"] == "750Gi"
    leader, _ = pods(recipe(LATENCY, uid=UID, engine={"resources": {"memory": "400Gi"}}))
    res = leader["containers"][0]["resources"]
    assert res["limits"]["memory"] == "400Gi"
    assert [v for v in leader["volumes"] if v["name"] == "dshm"][0]["emptyDir"]["sizeLimit"] == "200Gi"


def test_a_tier_no_tray_can_hold_is_refused_naming_the_field_and_the_largest_that_fits():
    with pytest.raises(SpecErrors) as e:
        admit(recipe(LATENCY, engine={"kvOffload": {"size": "2Ti"}})["spec"])
    (err,) = e.value.errors
    assert err.path == "spec.engine.kvOffload.size"
    assert "1024Gi on each pod" in err.message and "gb300 node's 960G" in err.message
    assert "<= 1788Gi" in err.message  # 960e9 B x 8 GPUs / 4 per tray = 1788 GiB
    admit(recipe(LATENCY, engine={"kvOffload": {"size": "1788Gi"}})["spec"])
    # Just over: the pod's share as the pod's memory request renders it (rounded up), the node's
    # memory in the same unit (a new user read "894Gi" against "960G" as fitting, 2026-12-05)
    with pytest.raises(SpecErrors) as over:
        admit(recipe(LATENCY, engine={"kvOffload": {"size": "1789Gi"}})["spec"])
    assert "puts 895Gi on each pod" in over.value.errors[0].message
    assert "gb300 node's 960G (894.07Gi) of memory; use kvOffload.size <= 1788Gi" in over.value.errors[0].message
    with pytest.raises(SpecErrors, match=r"plus engine.resources.memory 400Gi.*<= 988Gi or lower"):
        admit(recipe(LATENCY, engine={"kvOffload": {"size": "1Ti"}, "resources": {"memory": "400Gi"}})["spec"])
