"""ComputeDomains through DRA on ``dev up`` (GB300: the simulated NVIDIA driver runs,
``kimik3_dev.devcluster.dradriver``): the real kube-scheduler allocates each engine pod's IMEX
channel claim, made by the real resource-claim controller from the template the driver created;
``ComputeDomainReady`` reads the status the way the driver writes it, and a tray whose daemon
fails or whose ResourceSlice goes is named in the CR's status."""

from __future__ import annotations

from devenv import WAIT_S, DevEnv

from kimik3.controller.computedomains import DRIVER, SLICES_POLL_S
from kimik3.kube import pods as kpods
from kimik3_dev.devcluster import faults
from support.waiting import wait_for

TRAYS_TP8 = 2


def domain_condition(env: DevEnv, ns: str, reason: str, tray: str | None = None) -> dict | None:
    c = env.condition(ns, "ComputeDomainReady") or {}
    return c if c.get("reason") == reason and (tray is None or tray in c.get("message", "")) else None


def test_engine_pods_hold_allocated_channels_and_a_tray_fault_is_named(dev_env: DevEnv, ns: str) -> None:
    assert dev_env.state["compute_domains"] is True  # on by default for the GB300 profile
    dev_env.apply(dev_env.deployment(ns, replicas=1))
    pods = wait_for(lambda: dev_env.ready_groups(ns, TRAYS_TP8, 1), WAIT_S, "1 ready TP8 group")[0]
    for pod in pods:
        claim = dev_env.channel_claim(dev_env.rest.get(f"/api/v1/namespaces/{ns}/pods/{pod['metadata']['name']}"))
        results = claim["status"]["allocation"]["devices"]["results"]
        # The scheduler allocated the pod's own tray's channel 0 of the ComputeDomain driver.
        assert [(r["driver"], r["pool"], r["device"]) for r in results] == [(DRIVER, kpods.node_name(pod), "channel-0")]
        assert [r["uid"] for r in claim["status"]["reservedFor"]] == [pod["metadata"]["uid"]]

    joined = wait_for(lambda: domain_condition(dev_env, ns, "AllNodesJoined"), WAIT_S, "ComputeDomainReady=True")
    assert joined["status"] == "True" and "NotReady" not in joined["message"], joined
    assert f"(Ready): {TRAYS_TP8}/{TRAYS_TP8} nodes" in joined["message"]

    leader_tray, worker_tray = kpods.node_name(pods[0]), kpods.node_name(pods[1])
    try:
        faults.imex_daemon_failed(dev_env.rest, leader_tray)
        failed = wait_for(lambda: domain_condition(dev_env, ns, "NodesNotReady", leader_tray), WAIT_S,
                          f"NodesNotReady naming {leader_tray}")
        assert failed["status"] == "False" and worker_tray not in failed["message"], failed
        faults.imex_daemon_failed(dev_env.rest, leader_tray, failed=False)
        wait_for(lambda: domain_condition(dev_env, ns, "AllNodesJoined"), WAIT_S, "AllNodesJoined again")

        faults.dra_plugin_stopped(dev_env.rest, worker_tray)
        gone = wait_for(lambda: domain_condition(dev_env, ns, "ResourceSliceMissing", worker_tray),
                        SLICES_POLL_S + WAIT_S, f"ResourceSliceMissing naming {worker_tray}")
        assert gone["status"] == "False" and leader_tray not in gone["message"], gone
        assert dev_env.condition(ns, "Ready")["status"] == "True"  # readiness comes from the groups
    finally:
        faults.imex_daemon_failed(dev_env.rest, leader_tray, failed=False)
        faults.dra_plugin_stopped(dev_env.rest, worker_tray, stopped=False)
    wait_for(lambda: domain_condition(dev_env, ns, "AllNodesJoined"), SLICES_POLL_S + WAIT_S, "AllNodesJoined at the end")
