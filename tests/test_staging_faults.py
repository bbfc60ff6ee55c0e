"""Staging faults end to end: a hub error (500), a missing revision, a full volume and a stager killed
mid-download, each ending in a WeightsReady condition that names the cause, with no engine.

Everything runs for real but the hub and the Job controller: the operator's ``Reconciler`` against a
real kube-apiserver creates the staging Job; the stager runs as the Job's pod runs it, a local
process ``python -m kimik3.cli <the Job container's args>`` (``/cache`` moved to a folder, the
container's ``HF_ENDPOINT``) with a token of the ``kimik3-stager`` ServiceAccount, reporting into
its Job's annotation; the hub is the kit's fake (``kimik3_dev.hub``, a tiny checkpoint made here).
No Job controller runs in this control plane, so the test writes what it would once a pod ended
(``status.failed``/``active``, then ``Complete``); ``kimik3 dev up`` runs the real one
(tests/e2e/test_e2e_staging.py). The full volume is a 4 MiB tmpfs mounted in a user namespace
around the stager process (``unshare --user --map-root-user --mount``: no privilege on the host),
so the kernel itself answers ENOSPC. The spec stages the target only (no drafter): one Job.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from kimik3.api.conditions import Reason
from kimik3.controller.reconcile import Reconciler
from kimik3.engine.weights import MANIFEST
from kimik3.kube.kinds import JOB, LEADER_WORKER_SET
from kimik3.staging.progress import PROGRESS_ANNOTATION, Progress
from kimik3_dev.devcluster.rbac import request_token, write_token_kubeconfig
from kimik3_dev.hub.checkpoint import write_checkpoint
from kimik3_dev.hub.server import FakeHub, Fault
from kimik3.render.meta import engine_set_name
from support.cluster import apply, condition
from support.recipes import recipe
from support.waiting import wait_for

REPO_ID = "moonshotai/Kimi-K3"
SHARD_BYTES = 24 << 20
"""Two shards of 24 MiB (a partial file shows on the volume once huggingface_hub wrote its first
10 MiB chunk), 48 MiB in all: 12 times the full volume's tmpfs."""
FULL_VOLUME = "4m"
CHUNK = 10 << 20
"""huggingface_hub's DOWNLOAD_CHUNK_SIZE: a partial file grows by whole chunks."""
STAGER_TIMEOUT_S = 120


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    src = tmp_path_factory.mktemp("checkpoint")
    write_checkpoint(src, shards=2, shard_bytes=SHARD_BYTES)
    return src


@pytest.fixture
def hub(checkpoint):
    hub = FakeHub()
    hub.add(REPO_ID, checkpoint)
    hub.start()
    yield hub
    hub.stop()


class Staged:
    """One deployment whose cache is staged from ``hub``, its Job, and its stager runs."""

    def __init__(self, kube, namespace: str, admin_api, control_plane, hub: FakeHub, folder: Path,
                 revision: str = "main"):
        self.kube, self.namespace, self.folder = kube, namespace, folder
        cr = recipe(namespace=namespace, model={"revision": revision}, speculativeDecoding={"method": "none"})
        cr["spec"]["model"]["source"] = {"cache": {"claimName": "kimi-k3-cache", "create": {"size": "4Ti"},
                                                   "hub": {"endpoint": hub.url}}}
        self.name = apply(kube, cr)["metadata"]["name"]
        self.rec = Reconciler(kube, compute_domains=False, stager_image="registry.example/kimik3-operator:1.0")
        self.rec.reconcile(namespace, self.name)
        (job,) = kube.list(*JOB.type_meta, namespace, "inference.kimik3.io/stager=true")
        self.job = job["metadata"]["name"]
        self.container = job["spec"]["template"]["spec"]["containers"][0]
        token, _ = request_token(admin_api, namespace, "kimik3-stager")
        self.kubeconfig = write_token_kubeconfig(folder.parent / f"{namespace}.kubeconfig", control_plane.server,
                                                 control_plane.ca_file, "kimik3-stager", token)
        self.attempts = 0

    def start(self, wrap: list[str] | None = None) -> subprocess.Popen[bytes]:
        """Start the Job's container as its pod would (``wrap``: a command put in front of it)."""
        args = [str(self.folder) if a == "/cache" else a for a in self.container["args"]]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "KUBECONFIG"))}
        env |= {e["name"]: e["value"] for e in self.container["env"] if "value" in e}
        env |= {"KUBECONFIG": str(self.kubeconfig), "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        self.attempts += 1
        self.log = self.folder.parent / f"stager-{self.attempts}.log"
        with self.log.open("wb") as out:
            return subprocess.Popen([*(wrap or []), sys.executable, "-m", "kimik3.cli", *args], stdout=out,
                                    stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def run(self, wrap: list[str] | None = None) -> int:
        proc = self.start(wrap)
        return proc.wait(timeout=STAGER_TIMEOUT_S)

    def progress(self) -> Progress | None:
        job = self.kube.get(*JOB.type_meta, self.namespace, self.job)
        text = (job["metadata"].get("annotations") or {}).get(PROGRESS_ANNOTATION)
        return Progress.from_json(text) if text else None

    def job_controller(self, *, failed: int = 0, complete: bool = False) -> None:
        """What the Job controller writes once a pod ended: ``failed`` pods so far, none active
        (between attempts), or the Job complete."""
        now = "2026-12-01T12:00:00Z"
        status: dict[str, Any] = {"startTime": now, "failed": failed, "active": 0}
        if complete:
            status |= {"succeeded": 1, "completionTime": now, "conditions": [
                {"type": t, "status": "True", "lastTransitionTime": now, "lastProbeTime": now}
                for t in ("SuccessCriteriaMet", "Complete")]}
        self.kube.patch_merge(*JOB.type_meta, self.namespace, self.job, {"status": status}, subresource="status")

    def failed_attempt(self, wrap: list[str] | None = None) -> str:
        """Run the first attempt, which must fail; WeightsReady's message once its pod ended."""
        assert self.run(wrap) == 1, self.log.read_text()
        self.job_controller(failed=1)
        weights = self.weights()
        assert (weights["status"], weights["reason"]) == ("False", Reason.STAGING_FAILED)
        print(f"\n[staging faults] {weights['message']}")
        return str(weights["message"])

    def weights(self) -> dict[str, Any]:
        """WeightsReady after a reconcile; asserts no engine exists unless it is True, and that the
        engines come with the next reconcile once it is (True is written one reconcile before)."""
        self.rec.reconcile(self.namespace, self.name)
        obj = self.kube.get("inference.kimik3.io/v1alpha1", "KimiK3Deployment", self.namespace, self.name)
        weights = condition(obj, "WeightsReady")
        lws = self.kube.get(*LEADER_WORKER_SET.type_meta, self.namespace, engine_set_name(self.name))
        assert lws is None or weights["status"] == "True", weights
        if weights["status"] == "True" and lws is None:
            self.rec.reconcile(self.namespace, self.name)
            assert self.kube.get(*LEADER_WORKER_SET.type_meta, self.namespace, engine_set_name(self.name)) is not None
        return weights


def test_a_hub_500_is_quoted_and_the_retry_completes(kube, namespace, admin_api, control_plane, hub, tmp_path):
    hub.fault(Fault("/api/", status=500))
    staged = Staged(kube, namespace, admin_api, control_plane, hub, tmp_path / "cache")
    message = staged.failed_attempt()
    assert (f"Job {staged.job} staging {REPO_ID}@main: attempt 1 failed: HfHubHTTPError: Server error '500 "
            "Internal Server Error' for url ") in message
    assert "injected fault 500" in message and "the Job retries with back-off" in message
    assert staged.run() == 0  # the Job's next pod
    staged.job_controller(failed=1, complete=True)
    weights = staged.weights()
    assert (weights["status"], weights["reason"]) == ("True", Reason.STAGED)
    assert json.loads((tmp_path / "cache" / REPO_ID / "main" / MANIFEST).read_text())["files"]


def test_a_missing_revision_is_quoted_with_the_hubs_answer(kube, namespace, admin_api, control_plane, hub, tmp_path):
    staged = Staged(kube, namespace, admin_api, control_plane, hub, tmp_path / "cache", revision="v9")
    message = staged.failed_attempt()
    assert f"Job {staged.job} staging {REPO_ID}@v9: attempt 1 failed: RevisionNotFoundError: " in message
    assert "Invalid rev id: v9" in message
    assert not (tmp_path / "cache" / REPO_ID / "v9").exists()


def test_a_full_volume_is_quoted_with_the_storages_error(kube, namespace, admin_api, control_plane, hub, tmp_path):
    if shutil.which("unshare") is None:
        pytest.fail("the full volume is a tmpfs in a user namespace: util-linux's unshare is missing")
    folder = tmp_path / "cache"
    folder.mkdir()
    staged = Staged(kube, namespace, admin_api, control_plane, hub, folder)
    wrap = ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c",
            f'mount -t tmpfs -o size={FULL_VOLUME} tmpfs "$0" && exec "$@"', str(folder)]
    message = staged.failed_attempt(wrap)
    assert f"Job {staged.job} staging {REPO_ID}@main: attempt 1 failed: OSError: [Errno 28] No space left on " \
        "device; the Job retries with back-off" in message


def test_a_killed_stager_is_named_and_the_retry_resumes(kube, namespace, admin_api, control_plane, hub, tmp_path):
    hub.bytes_per_second = 4 << 20  # 6 s a shard: the kill lands mid-download
    staged = Staged(kube, namespace, admin_api, control_plane, hub, tmp_path / "cache")
    proc = staged.start()

    def downloading() -> Progress | None:
        p = staged.progress()
        return p if p is not None and p.phase == "downloading" and CHUNK <= p.bytes_done < p.bytes_total else None
    at_kill = wait_for(downloading, 60, "a report of the first chunk of a shard on the volume", interval=0.1)
    os.killpg(proc.pid, signal.SIGKILL)  # what a node loss or an OOM kill does to the pod
    assert proc.wait(timeout=30) == -signal.SIGKILL
    staged.job_controller(failed=1)
    weights = staged.weights()
    assert (weights["status"], weights["reason"]) == ("False", Reason.STAGING_FAILED)
    assert f"Job {staged.job} staging {REPO_ID}@main: attempt 1 was killed at " in weights["message"]
    assert "it ended without reporting an error" in weights["message"], weights["message"]
    print(f"\n[staging faults] {weights['message']}")
    assert f" of {at_kill.bytes_total / (1 << 20):.1f} MiB" in weights["message"]
    folder = tmp_path / "cache" / REPO_ID / "main"
    complete = {p.name for p in folder.iterdir() if p.is_file()}
    orphans = sum(p.stat().st_size for p in folder.rglob("*.incomplete"))
    assert orphans >= CHUNK  # the killed process's partial shards, which no later run resumes
    hub.bytes_per_second = None
    hub.requests.clear()
    started = time.monotonic()
    assert staged.run() == 0, staged.log.read_text()  # the Job's next pod
    print(f"\n[staging faults] killed at {at_kill.bytes_done} of {at_kill.bytes_total} bytes; the retry took "
          f"{time.monotonic() - started:.1f} s")
    staged.job_controller(failed=1, complete=True)
    assert staged.weights()["reason"] == Reason.STAGED
    fetched = {p.rsplit("/", 1)[-1] for m, p, _ in hub.requests if m == "GET" and "/resolve/" in p}
    assert not fetched & complete, (fetched, complete)  # files complete before the kill are kept
    assert json.loads((folder / MANIFEST).read_text())["bytes"] == at_kill.bytes_total
    assert not list(folder.rglob("*.incomplete"))  # the retry removed the killed run's partial files first
