#!/usr/bin/env python3
"""`kimik3 usage` for 10 tenants over 24 hours against a real Prometheus: its wall time, and its
totals against the figures written.

    python bench/usage.py [--tenants 10] [--hours 24] [--repeats 3]

Writes what the recording rules (``kimik3.usage.rules``) would have recorded at each of the last
``--hours`` hour ends for ``--tenants`` tenants (one deployment each, two revisions: the first
half of the hours on one, the rest on the other; every rule's series with made-up values) as
OpenMetrics, turns it into TSDB blocks with ``promtool tsdb create-blocks-from openmetrics``,
starts Debian's Prometheus 2.42 (the dev Prometheus' release) on them, and runs the real
command (``python -m kimik3.cli usage --hours N --format json``) ``--repeats`` times. Checks
that every row's figures are the ones written, prints the wall times and writes
bench/results/usage.json (with the date and commit).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "operator"))

from kimik3.kube.groups import HELD, RESERVED, SERVING  # noqa: E402
from kimik3.kube.times import rfc3339_seconds  # noqa: E402
from kimik3.usage.report import HOUR_S  # noqa: E402
from kimik3.usage.rules import RULES, SLO_MEASURED, SLO_WITHIN, slo_record  # noqa: E402
from kimik3_dev.devcluster import prometheus  # noqa: E402
from kimik3_dev.devcluster.processes import free_port  # noqa: E402
from kimik3_dev.benchmark.provenance import checkout_commit  # noqa: E402

RESULTS = REPO / "bench" / "results" / "usage.json"


def figures(tenant: int, hour: int) -> dict[str, float]:
    """The made-up usage of tenant ``tenant`` in its ``hour``-th hour (integers: exact in JSON)."""
    base = (tenant + 1) * 1000 + hour
    return {"prompt_tokens": 40 * base, "cached_prompt_tokens": 10 * base, "generation_tokens": 20 * base,
            "requests_stop": base % 97, "requests_error": tenant, "held_s": 16 * 3600, "serving_s": 8 * 3600,
            "within": 45 + tenant, "measured": 60}


def openmetrics(tenants: int, hours: list[float]) -> str:
    """Every recorded series, one sample per hour end (OpenMetrics: seconds, families grouped)."""
    families: dict[str, list[str]] = {}

    def add(name: str, labels: dict[str, str], at: float, value: float) -> None:
        text = ",".join(f'{k}="{v}"' for k, v in labels.items())
        families.setdefault(name, []).append(f"{name}{{{text}}} {value} {int(at)}")
    for t in range(tenants):
        for state_rev in ("r1", "r2"):
            for i, start in enumerate(hours):
                revision = "r1" if i < len(hours) // 2 else "r2"
                if revision != state_rev:
                    continue
                f, end = figures(t, i), start + HOUR_S
                who = {"namespace": f"tenant-{t}", "deployment": "k3", "revision": revision}
                for key in ("prompt_tokens", "cached_prompt_tokens", "generation_tokens"):
                    add(RULES[key].record(), who, end, f[key])
                for reason in ("stop", "error"):
                    add(RULES["requests"].record(), {**who, "finished_reason": reason}, end, f[f"requests_{reason}"])
                for state, key in ((HELD, "held_s"), (SERVING, "serving_s")):
                    add(RULES["gpu_seconds"].record(), {**who, "state": state, "capacity": RESERVED}, end, f[key])
        for i, start in enumerate(hours):
            f, who = figures(t, i), {"namespace": f"tenant-{t}", "deployment": "k3", "target": "latency"}
            add(slo_record(SLO_WITHIN), who, start + HOUR_S, f["within"])
            add(slo_record(SLO_MEASURED), who, start + HOUR_S, f["measured"])
    out = []
    for name, lines in families.items():
        out += [f"# TYPE {name} gauge", *lines]
    return "\n".join(out + ["# EOF"]) + "\n"


def ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/-/ready", timeout=2):
            return True
    except OSError:
        return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tenants", type=int, default=10)
    parser.add_argument("--hours", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    now = time.time()
    hours = [now - now % HOUR_S - (args.hours - i) * HOUR_S for i in range(args.hours)]
    with tempfile.TemporaryDirectory(prefix="kimik3-bench-usage-") as tmp:
        state = Path(tmp)
        config = prometheus.write_config(state, [])
        port = free_port()
        argv = prometheus.argv(prometheus.ensure_installed(), config, state, port)  # empties the data folder
        data = state / "prometheus" / "data"
        data.mkdir(parents=True, exist_ok=True)
        source = state / "usage.om"
        source.write_text(openmetrics(args.tenants, hours))
        subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", str(source), str(data)],
                       check=True, stdout=subprocess.DEVNULL)
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 60
            while not ready(url):
                if time.monotonic() > deadline:
                    raise SystemExit("Prometheus did not get ready in 60 s")
                time.sleep(0.2)
            env = dict(os.environ, PYTHONPATH=str(REPO / "operator"))
            walls, out = [], ""
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                out = subprocess.run([sys.executable, "-m", "kimik3.cli", "usage", "--prometheus", url, "--hours",
                                      str(args.hours), "--format", "json"], env=env, check=True,
                                     capture_output=True, text=True).stdout
                walls.append(time.perf_counter() - t0)
        finally:
            proc.terminate()
            proc.wait(10)
    rows = json.loads(out)["rows"]
    wrong = []
    for row in rows:
        t, i = int(row["namespace"].split("-")[1]), hours.index(rfc3339_seconds(row["hour"]))
        f = figures(t, i)
        got = (row["prompt_tokens"], row["cached_prompt_tokens"], row["generation_tokens"], row["requests_stop"],
               row["requests_error"], row["gpu_hours_held"], row["gpu_hours_serving"], row["latency_minutes_within"],
               row["latency_minutes_measured"])
        want = (f["prompt_tokens"], f["cached_prompt_tokens"], f["generation_tokens"], f["requests_stop"],
                f["requests_error"], f["held_s"] / 3600, f["serving_s"] / 3600, f["within"], f["measured"])
        if got != want:
            wrong.append({"row": row, "want": want})
    commit = checkout_commit(REPO)
    result = {"date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d"), "commit": commit,
              "tenants": args.tenants, "hours": args.hours, "rows": len(rows), "rows_expected": args.tenants * args.hours,
              "rows_wrong": len(wrong), "wall_s": [round(w, 3) for w in walls], "best_wall_s": round(min(walls), 3),
              "prometheus": "Debian prometheus 2.42 on TSDB blocks from promtool"}
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    if wrong:
        raise SystemExit(f"{len(wrong)} rows differ from the figures written, e.g. {wrong[0]}")


if __name__ == "__main__":
    main()
