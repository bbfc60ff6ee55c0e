"""``kimik3 dev status``: racks, groups, where each group landed, and each CR's status.

``gather(rest, state_dir)`` reads the cluster (nodes, pods, KimiK3Deployments) and where the engine
simulator's stand-in for each CR's Service listens (``<state>/sim/services.json``, matched to the
CR's ``status.endpoint``: ``kimik3_dev.sim.services``); ``render(overview)`` turns it into text. Both are
plain data in, plain data out; the shape of ``gather``'s result:

- ``racks``: ``[{name, clique, nodes, ready, gpus, gpus_used, gpus_free}]`` (GPUs = count of
  ``nvidia.com/gpu``; used = requests of the non-terminated pods bound to the rack's nodes);
- ``groups``: ``[{namespace, deployment, lws, group, racks, trays, pods: [{name, node, rack,
  worker, ready, phase, uid, waiting}], ready, size}]`` (``racks`` lists every rack the group's
  scheduled pods are on: one rack is the healthy case);
- ``deployments``: ``[{namespace, name, replicas, groups, ready, endpoint, sim_endpoint,
  conditions: [{type, status, reason, message}]}]``;
- with Kueue: each group's ``admission`` (``Admitted``, or ``Waiting (<why>): <Kueue's message>``;
  None without a Workload) and ``queues``: ``[{name, gpus, gpus_used, pending, admitted}]`` per
  ClusterQueue (nominal ``nvidia.com/gpu`` quota, reserved GPUs, Workloads pending / admitted).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from kimik3.kube import nodes as knodes
from kimik3.kube import pods as kpods
from kimik3.kube import workloads as kworkloads
from kimik3.kube.kinds import KIMIK3_DEPLOYMENT, NODE, POD, WORKLOAD
from kimik3.kube.labels import CLIQUE_LABEL, DEPLOYMENT_LABEL, GPU_RESOURCE, LWS_NAME_LABEL
from kimik3_dev.devcluster import kueue
from kimik3_dev.devcluster.racks import RACK_LABEL
from kimik3_dev.devcluster.rest import Rest
from kimik3_dev.sim import services

__all__ = ["gather", "render"]


def _waiting(pod: dict[str, Any]) -> str:
    return kpods.scheduling_problem(pod) or ("" if kpods.is_ready(pod) else kpods.phase(pod) or "Pending")


def _sim_url(state_dir: Path | None, endpoint: str | None) -> str | None:
    """The base URL of the simulator's stand-in for the Service ``endpoint`` names, None without one."""
    if state_dir is None or not endpoint:
        return None
    try:
        return services.service_address(state_dir, endpoint)
    except ValueError:
        return None


def _rack_of(node: dict[str, Any]) -> tuple[str, str]:
    labels = node["metadata"].get("labels", {})
    clique = labels.get(CLIQUE_LABEL, "")
    return labels.get(RACK_LABEL) or clique or "unracked", clique


def _admission(workload: dict[str, Any]) -> str:
    wait = kworkloads.waiting(workload)
    return "Admitted" if wait is None else f"Waiting ({wait.why}): {wait.message}"


def _queues(rest: Rest) -> list[dict[str, Any]]:
    """Each ClusterQueue's GPU quota and use (status.flavorsReservation), [] without Kueue."""
    out = []
    for cq in rest.items(f"/apis/{kueue.API_VERSION}/clusterqueues"):
        spec, status = cq.get("spec") or {}, cq.get("status") or {}
        gpus = sum(int(r.get("nominalQuota", 0)) for g in spec.get("resourceGroups", []) for f in g.get("flavors", [])
                   for r in f.get("resources", []) if r.get("name") == GPU_RESOURCE)
        used = sum(int(r.get("total", 0)) for f in status.get("flavorsReservation", []) or []
                   for r in f.get("resources", []) if r.get("name") == GPU_RESOURCE)
        out.append({"name": cq["metadata"]["name"], "gpus": gpus, "gpus_used": used,
                    "pending": status.get("pendingWorkloads", 0), "admitted": status.get("admittedWorkloads", 0)})
    return sorted(out, key=lambda q: q["name"])


def gather(rest: Rest, state_dir: Path | None = None) -> dict[str, Any]:
    """Read the cluster into the plain structure described in the module docstring."""
    nodes = rest.items(NODE.path())
    pods = rest.items(POD.path())
    crs = rest.items(KIMIK3_DEPLOYMENT.path())

    node_rack = {n["metadata"]["name"]: _rack_of(n) for n in nodes}
    used: dict[str, int] = defaultdict(int)
    for pod in pods:
        if kpods.holds_node(pod):
            used[kpods.node_name(pod)] += kpods.gpu_request(pod)
    racks: dict[str, dict[str, Any]] = {}
    for n in nodes:
        name, clique = node_rack[n["metadata"]["name"]]
        r = racks.setdefault(name, {"name": name, "clique": clique, "nodes": 0, "ready": 0, "gpus": 0, "gpus_used": 0})
        r["nodes"] += 1
        r["ready"] += int(knodes.is_ready(n))
        r["gpus"] += int(((n.get("status") or {}).get("allocatable") or {}).get(GPU_RESOURCE, 0) or 0)
        r["gpus_used"] += used.get(n["metadata"]["name"], 0)
    for r in racks.values():
        r["gpus_free"] = r["gpus"] - r["gpus_used"]

    groups: dict[tuple[str, str, str], dict[str, Any]] = {}
    for pod in pods:
        labels = kpods.labels(pod)
        group = kpods.group_index(pod)
        if LWS_NAME_LABEL not in labels or group is None:
            continue
        key = (pod["metadata"]["namespace"], labels[LWS_NAME_LABEL], group)
        g = groups.setdefault(key, {"namespace": key[0], "deployment": labels.get(DEPLOYMENT_LABEL, ""),
                                    "lws": key[1], "group": int(key[2]), "pods": []})
        node = kpods.node_name(pod)
        g["pods"].append({
            "name": pod["metadata"]["name"], "node": node, "rack": node_rack.get(node, ("", ""))[0] if node else "",
            "worker": kpods.worker_index(pod) or 0, "ready": kpods.is_ready(pod),
            "phase": (pod.get("status") or {}).get("phase", ""), "uid": pod["metadata"].get("uid", ""),
            "waiting": _waiting(pod), "terminating": kpods.is_terminating(pod),
        })
    with_kueue = rest.get(f"/apis/{kueue.API_VERSION}") is not None
    admission: dict[tuple[str, str, str], str] = {}
    if with_kueue:
        for w in rest.items(WORKLOAD.path()):
            owner = next((o for o in w["metadata"].get("ownerReferences", []) if o.get("kind") == "LeaderWorkerSet"), None)
            if owner is not None:
                admission[(w["metadata"]["namespace"], owner["name"], kworkloads.group_index(w))] = _admission(w)
    for (ns, lws, group), g in groups.items():
        g["admission"] = admission.get((ns, lws, group))
    for g in groups.values():
        g["pods"].sort(key=lambda p: p["worker"])
        g["racks"] = sorted({p["rack"] for p in g["pods"] if p["rack"]})
        g["trays"] = [p["node"] for p in g["pods"] if p["node"]]
        g["ready"] = sum(p["ready"] for p in g["pods"])
        g["size"] = len(g["pods"])

    deployments = []
    for cr in crs:
        meta, status = cr["metadata"], cr.get("status") or {}
        deployments.append({
            "namespace": meta["namespace"], "name": meta["name"],
            "replicas": (cr.get("spec") or {}).get("replicas"),
            "groups": status.get("replicas"), "ready": status.get("readyReplicas"),
            "endpoint": status.get("endpoint"), "sim_endpoint": _sim_url(state_dir, status.get("endpoint")),
            "conditions": [{k: c.get(k, "") for k in ("type", "status", "reason", "message")}
                           for c in status.get("conditions", [])],
        })
    return {
        "racks": sorted(racks.values(), key=lambda r: r["name"]),
        "groups": sorted(groups.values(), key=lambda g: (g["namespace"], g["lws"], g["group"])),
        "deployments": sorted(deployments, key=lambda d: (d["namespace"], d["name"])),
        "queues": _queues(rest) if with_kueue else [],
    }


def _mib(n: int) -> str:
    return f"{n / 2**20:.0f} MiB"


def render(overview: dict[str, Any], components: list[dict[str, Any]] | None = None,
           header: str = "") -> str:
    """Text for a terminal. ``components``: ``[{name, pid, alive, rss_bytes, log}]``."""
    lines: list[str] = [header] if header else []
    if components is not None:
        total = sum(c["rss_bytes"] for c in components if c["alive"])
        lines += _section(f"Components ({_mib(total)} resident in total)", [_component(c) for c in components])
    lines += _section("Racks", [_rack(r) for r in overview["racks"]])
    lines += _section("Groups", [line for g in overview["groups"] for line in _group(g)])
    if overview.get("queues"):
        lines += _section("Kueue ClusterQueues", [_queue(q) for q in overview["queues"]])
    lines += _section("KimiK3Deployments", [line for d in overview["deployments"] for line in _deployment(d)])
    return "\n".join(lines)


def _section(title: str, rows: list[str]) -> list[str]:
    """A heading and its rows; ``(none)`` when there are none."""
    return [title, *(rows or ["  (none)"])]


def _component(c: dict[str, Any]) -> str:
    state = "running" if c["alive"] else "STOPPED"
    return f"  {c['name']:<24} pid {c['pid']:<8} {state:<8} {_mib(c['rss_bytes']):>9}   log {c['log']}"


def _rack(r: dict[str, Any]) -> str:
    clique = f"clique {r['clique']}" if r["clique"] else "no NVLink clique"
    return (f"  {r['name']:<10} {clique:<48} {r['ready']}/{r['nodes']} trays Ready   "
            f"GPUs {r['gpus_used']} used / {r['gpus_free']} free of {r['gpus']}")


def _group(g: dict[str, Any]) -> list[str]:
    """A group's line (where it runs), then one for each pod that waits or terminates."""
    who = f"{g['namespace']}/{g['deployment'] or g['lws']} group {g['group']}"
    if not g["racks"]:
        where = "not placed"
    elif len(g["racks"]) == 1:
        where = f"rack {g['racks'][0]}"
    else:
        where = f"SPLIT over racks {', '.join(g['racks'])}"
    trays = f" (trays {', '.join(g['trays'])})" if g["trays"] else ""
    kueue_state = f"  Kueue: {g['admission']}" if g.get("admission") else ""
    return [f"  {who}: {where}{trays}  {g['ready']}/{g['size']} pods ready{kueue_state}",
            *(f"      pod {p['name']}: {'Terminating' if p['terminating'] else p['waiting']}"
              for p in g["pods"] if p["waiting"] or p["terminating"])]


def _queue(q: dict[str, Any]) -> str:
    return (f"  {q['name']:<24} GPUs {q['gpus_used']} reserved of {q['gpus']}   "
            f"Workloads {q['admitted']} admitted, {q['pending']} pending")


def _deployment(d: dict[str, Any]) -> list[str]:
    """A deployment's line, its endpoints, then one line for each condition."""
    return [f"  {d['namespace']}/{d['name']}: replicas {d['replicas']}, groups {d['groups']}, ready {d['ready']}",
            f"      endpoint {d['endpoint'] or '-'}   simulator {d['sim_endpoint'] or '-'}",
            *(f"      {c['type']}={c['status']} ({c['reason']}): {c['message']}" for c in d["conditions"])]
