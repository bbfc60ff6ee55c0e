"""Scale benchmark: N KimiK3Deployments across M namespaces on a real kube-apiserver.

    source tools/env.sh && python bench/scale.py [--crs 500] [--namespaces 50] [--idle-seconds 60]

1. Floor: the same children the operator would create, rendered up front and applied with
   ``kubectl apply --server-side`` (one multi-document file), timed.
2. Operator: ``kimik3 run`` as its own process; the N CRs are created (8 client threads) and the
   clock runs until every CR reports ``status.observedGeneration == metadata.generation`` with
   ``Degraded=False`` and every LeaderWorkerSet exists.
3. Then the operator idles: its CPU share over ``--idle-seconds`` and its peak RSS (VmHWM).
4. API requests per second: the increase of kube-apiserver's ``apiserver_request_total`` during
   convergence, divided by the convergence time.

Writes ``bench/results/scale.json``: ``{crs, converge_s, floor_s, rss_mb, idle_cpu_pct, api_rps}``.
Goals (issue 6): converge_s <= 1.5 x floor_s; rss_mb < 250; idle_cpu_pct < 5.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests
import yaml

from kimik3.api.documents import dump_yaml_all
from kimik3.controller.kube import Kube
from kimik3.api.conditions import ConditionType
from kimik3.kube.kinds import KIMIK3_DEPLOYMENT, LEADER_WORKER_SET
from kimik3.kube.objects import condition
from kimik3_dev.devcluster.controlplane import ControlPlane
from kimik3_dev.devcluster.processes import free_port
from kimik3_dev.devcluster.install import install_apis
from kimik3.admission import admit
from kimik3.render.children import render
from kimik3.render.meta import Owner

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "recipes" / "gb300-tp8-megakernel-dspark.yaml"
CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def api_requests(cp: ControlPlane) -> float:
    text = requests.get(f"{cp.server}/metrics", headers={"Authorization": f"Bearer {cp.admin_token}"},
                        verify=str(cp.ca_file), timeout=30).text
    from prometheus_client.parser import text_string_to_metric_families
    return sum(s.value for f in text_string_to_metric_families(text) if f.name == "apiserver_request"
               for s in f.samples if s.name == "apiserver_request_total")


def deployments(n: int, namespaces: int, prefix: str) -> list[dict]:
    base = yaml.safe_load(RECIPE.read_text())
    out = []
    for i in range(n):
        cr = copy.deepcopy(base)
        cr["metadata"] = {"name": f"k3-{i:04d}", "namespace": f"{prefix}-{i % namespaces:03d}"}
        out.append(cr)
    return out


def make_namespaces(kube: Kube, names: set[str]) -> None:
    for ns in sorted(names):
        kube.request("POST", "/api/v1/namespaces", body={"metadata": {"name": ns}})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--crs", type=int, default=500)
    ap.add_argument("--namespaces", type=int, default=50)
    ap.add_argument("--idle-seconds", type=float, default=60.0)
    ap.add_argument("--timeout", type=float, default=900.0)
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "scale.json"))
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="kimik3-scale-") as tmp, ControlPlane(Path(tmp) / "cp") as cp:
        install_apis(cp)
        with cp.api_client("admin") as api:
            kube = Kube(api)
            # -- floor: the rendered children applied directly ---------------------------------
            floor_crs = deployments(args.crs, args.namespaces, "floor")
            make_namespaces(kube, {c["metadata"]["namespace"] for c in floor_crs})
            docs = []
            for cr in floor_crs:
                cr["metadata"]["uid"] = "00000000-0000-0000-0000-000000000000"
                for child in render(admit(cr["spec"]), Owner.from_object(cr)).objects:
                    child["metadata"].pop("ownerReferences", None)  # no owner exists on this path
                    docs.append(child)
            manifest = Path(tmp) / "floor.yaml"
            manifest.write_text(dump_yaml_all(docs))
            t0 = time.monotonic()
            done = subprocess.run(["kubectl", "--kubeconfig", str(cp.admin_kubeconfig), "apply", "--server-side",
                                   "--field-manager", "floor", "-f", str(manifest)], capture_output=True, text=True)
            if done.returncode:
                raise SystemExit(f"kubectl apply failed: {done.stderr[-2000:]}")
            floor_s = time.monotonic() - t0
            print(f"floor: kubectl apply --server-side of {len(docs)} children: {floor_s:.1f} s", flush=True)

            # -- operator ------------------------------------------------------------------------
            crs = deployments(args.crs, args.namespaces, "k3")
            make_namespaces(kube, {c["metadata"]["namespace"] for c in crs})
            log = open(Path(tmp) / "operator.log", "w")
            op = subprocess.Popen([sys.executable, "-m", "kimik3.cli", "run", "--kubeconfig",
                                   str(cp.admin_kubeconfig), "--health-port", str(free_port()),
                                   "--health-host", "127.0.0.1"], stdout=log, stderr=subprocess.STDOUT)
            try:
                time.sleep(3)  # kopf lists and starts watching
                before = api_requests(cp)
                t0 = time.monotonic()
                with ThreadPoolExecutor(8) as pool:
                    list(pool.map(lambda cr: kube.apply(cr, force=False), crs))
                created_s = time.monotonic() - t0
                while time.monotonic() - t0 < args.timeout:
                    items = kube.request("GET", KIMIK3_DEPLOYMENT.path())["items"]
                    done = sum(1 for o in items
                               if (o.get("status") or {}).get("observedGeneration") == o["metadata"]["generation"]
                               and (condition(o, ConditionType.DEGRADED) or {}).get("status") == "False")
                    if done == args.crs:
                        break
                    time.sleep(0.5)
                else:
                    print(f"did not converge within {args.timeout} s ({done}/{args.crs})")
                    return 1
                converge_s = time.monotonic() - t0
                rps = (api_requests(cp) - before) / converge_s
                lws = kube.request("GET", LEADER_WORKER_SET.path())["items"]
                lws_ours = sum(1 for x in lws if x["metadata"]["namespace"].startswith("k3-"))
                assert lws_ours == args.crs, f"{lws_ours} LeaderWorkerSets for {args.crs} CRs"
                print(f"operator: {args.crs} CRs created in {created_s:.1f} s, all converged in {converge_s:.1f} s "
                      f"({rps:.0f} API requests/s)", flush=True)
                time.sleep(5)
                c0, w0 = cpu_seconds(op.pid), time.monotonic()
                time.sleep(args.idle_seconds)
                idle_pct = 100 * (cpu_seconds(op.pid) - c0) / (time.monotonic() - w0)
                rss = peak_rss_mb(op.pid)
            finally:
                op.terminate()
                op.wait(30)
    result = {"crs": args.crs, "converge_s": round(converge_s, 1), "floor_s": round(floor_s, 1),
              "rss_mb": round(rss, 1), "idle_cpu_pct": round(idle_pct, 2), "api_rps": round(rps, 1)}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))
    goals = {"converge <= 1.5 x floor": converge_s <= 1.5 * floor_s, "rss < 250 MB": rss < 250,
             "idle CPU < 5%": idle_pct < 5}
    for goal, ok in goals.items():
        print(f"{'met   ' if ok else 'MISSED'} {goal}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
