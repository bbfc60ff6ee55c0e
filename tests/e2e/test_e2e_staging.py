"""On ``dev up``: a recipe whose model cache is staged from the hub shows ``WeightsReady=False
Staging`` with rising progress, then True, and only then engine pods; a stager killed mid-download
is named in the condition, and the Job controller's next pod completes the download.

The hub is the kit's fake (``kimik3_dev.hub``, on 127.0.0.1, sending each file at 512 KiB/s so the
download can be watched) with a tiny target and drafter made here. Everything else is real: the
operator (as the chart's ServiceAccount) creates the claim and one Job per artifact; the Job
controller creates their pods; ``kimik3 dev stagers`` provisions the claim on a host folder and
runs each pod's ``kimik3 stage`` as a local process with the pod's ServiceAccount token, which
reports into its Job's annotation; the operator turns that into the condition, and creates the
LeaderWorkerSet once both Jobs completed.
"""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path

from devenv import WAIT_S, DevEnv

from kimik3_dev.devcluster.rollout import Recorder
from kimik3.engine.weights import MANIFEST
from kimik3_dev.hub.checkpoint import write_checkpoint
from kimik3_dev.hub.server import FakeHub
from support.recipes import recipe
from support.waiting import wait_for

TRAYS_TP8 = 2


def test_weights_staged_with_rising_progress_before_any_engine_pod(dev_env: DevEnv, ns: str, tmp_path: Path) -> None:
    hub = FakeHub(bytes_per_second=1 << 18)  # slow enough for several progress samples (at 1 << 19 a run saw one)
    write_checkpoint(tmp_path / "k3", shards=2, shard_bytes=10 << 20)
    write_checkpoint(tmp_path / "dspark", shards=1, shard_bytes=2 << 20, seed=1)
    target_commit = hub.add("moonshotai/Kimi-K3", tmp_path / "k3")
    hub.add("Inferact/Kimi-K3-DSpark", tmp_path / "dspark")
    hub.start()
    try:
        cr = recipe(name="k3", namespace=ns)
        cr["spec"]["model"]["source"] = {"cache": {"claimName": "kimi-k3-cache", "create": {"size": "10Gi"},
                                                   "hub": {"endpoint": hub.url}}}

        def sample() -> tuple[str, str, int, int] | None:
            weights = dev_env.condition(ns, "WeightsReady")
            if weights is None:
                return None
            share = re.search(r"\((\d+)%\)", weights["message"])
            return weights["status"], weights["reason"], int(share.group(1)) if share else -1, len(dev_env.pods(ns))

        with Recorder(sample, period_s=0.2) as seen:
            dev_env.apply(cr)
            wait_for(lambda: dev_env.ready_groups(ns, TRAYS_TP8, 1), WAIT_S, "the engine group after staging")
        staging = [v for v in seen.values if v[1] == "Staging"]
        assert all(pods == 0 for _, _, _, pods in staging), seen.values  # no engine pod while staging
        shares = [share for _, _, share, _ in staging if share >= 0]
        assert len(set(shares)) >= 2 and shares == sorted(shares) and shares[0] < 100, seen.values
        staged = next(i for i, v in enumerate(seen.values) if v[:2] == ("True", "Staged"))
        assert all(v[3] == 0 for v in seen.values[:staged]), seen.values  # pods only after True
        message = dev_env.condition(ns, "WeightsReady")["message"]
        assert f"moonshotai/Kimi-K3@main (commit {target_commit[:12]}" in message
        assert "Inferact/Kimi-K3-DSpark@main" in message
        folder = dev_env.cluster.state_dir / "volumes" / ns / "kimi-k3-cache"
        manifest = json.loads((folder / "moonshotai/Kimi-K3/main" / MANIFEST).read_text())
        assert manifest["commit"] == target_commit and len(manifest["files"]) == 7
        assert (folder / "Inferact/Kimi-K3-DSpark/main" / MANIFEST).is_file()
    finally:
        hub.stop()
        dev_env.rest.delete(dev_env.cr_path(ns))  # first: the operator would re-create a deleted Job
        wait_for(lambda: dev_env.get_cr(ns) is None, WAIT_S, "the deployment's teardown")
        for job in dev_env.rest.items(f"/apis/batch/v1/namespaces/{ns}/jobs"):  # not owned by the CR
            dev_env.rest.call("DELETE", f"/apis/batch/v1/namespaces/{ns}/jobs/{job['metadata']['name']}",
                              body={"propagationPolicy": "Background"})


def stager_pid(namespace: str) -> int | None:
    """The pid of the local process ``kimik3 dev stagers`` runs for a staging pod of ``namespace``."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"kimik3.cli" in argv and b"stage" in argv and any(a.startswith(f"{namespace}/".encode()) for a in argv):
            return int(entry.name)
    return None


def test_a_stager_killed_mid_download_is_named_then_the_jobs_next_pod_completes(dev_env: DevEnv, ns: str,
                                                                                 tmp_path: Path) -> None:
    hub = FakeHub(bytes_per_second=2 << 20)  # 12 s a shard: the kill lands mid-download
    write_checkpoint(tmp_path / "k3", shards=2, shard_bytes=24 << 20)
    hub.add("moonshotai/Kimi-K3", tmp_path / "k3")
    hub.start()
    try:
        cr = recipe(name="k3", namespace=ns, speculativeDecoding={"method": "none"})
        cr["spec"]["model"]["source"] = {"cache": {"claimName": "kimi-k3-cache", "create": {"size": "10Gi"},
                                                   "hub": {"endpoint": hub.url}}}
        dev_env.apply(cr)

        def share() -> int:
            weights = dev_env.condition(ns, "WeightsReady") or {}
            found = re.search(r"\((\d+)%\)", weights.get("message", ""))
            return int(found.group(1)) if weights.get("reason") == "Staging" and found else 0
        wait_for(lambda: share() > 0, WAIT_S, "the stager's first shard bytes in WeightsReady")
        pid = stager_pid(ns)
        assert pid is not None
        os.kill(pid, signal.SIGKILL)  # the process the dev cluster's stager kubelet started for the pod

        def killed() -> dict | None:
            weights = dev_env.condition(ns, "WeightsReady") or {}
            return weights if "attempt 1 was killed at " in weights.get("message", "") else None
        weights = wait_for(killed, WAIT_S, "WeightsReady naming the killed attempt")
        assert (weights["status"], weights["reason"]) == ("False", "StagingFailed")
        assert dev_env.pods(ns) == []
        hub.bytes_per_second = None
        wait_for(lambda: dev_env.ready_groups(ns, TRAYS_TP8, 1), WAIT_S, "the engine group after the Job's retry")
        assert (dev_env.condition(ns, "WeightsReady") or {})["reason"] == "Staged"
        job = next(iter(dev_env.rest.items(f"/apis/batch/v1/namespaces/{ns}/jobs")))
        assert job["status"]["failed"] == 1 and job["status"]["succeeded"] == 1
        pods = dev_env.rest.items(f"/api/v1/namespaces/{ns}/pods", f"job-name={job['metadata']['name']}")
        assert sorted((p["status"]["phase"], p["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"])
                      for p in pods) == [("Failed", 137), ("Succeeded", 0)]  # SIGKILL, as a kubelet reports it
        folder = dev_env.cluster.state_dir / "volumes" / ns / "kimi-k3-cache" / "moonshotai/Kimi-K3/main"
        assert (folder / MANIFEST).is_file() and not list(folder.rglob("*.incomplete"))
    finally:
        hub.stop()
        dev_env.rest.delete(dev_env.cr_path(ns))
        wait_for(lambda: dev_env.get_cr(ns) is None, WAIT_S, "the deployment's teardown")
        for job in dev_env.rest.items(f"/apis/batch/v1/namespaces/{ns}/jobs"):
            dev_env.rest.call("DELETE", f"/apis/batch/v1/namespaces/{ns}/jobs/{job['metadata']['name']}",
                              body={"propagationPolicy": "Background"})
