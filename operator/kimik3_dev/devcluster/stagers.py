"""``kimik3 dev stagers``: the kubelet of staging-Job pods, and the provisioner of model-cache claims.

kwok runs no containers, so in the dev cluster this loop (every ``POLL_S``) stands in for the two
cluster parts a staging Job needs:

- a provisioner: a PersistentVolumeClaim the operator created (label
  ``app.kubernetes.io/managed-by=kimik3-operator``) and still Pending gets a PersistentVolume
  ``kimik3-dev-<namespace>-<claim>`` (hostPath ``<state>/volumes/<namespace>/<claim>``, the
  claim's size and access modes, bound to it by ``claimRef``); the controller-manager binds them;
- a kubelet for pods labelled ``inference.kimik3.io/stager=true`` (kwok's pod stages leave them
  alone: ``kwok.stages``) once kube-scheduler bound them: it runs the container for real as a
  local process, ``python -m kimik3.cli <the container's args>``, with the container's env as
  a kubelet builds it (``kimik3_dev.sim.podenv``), every argument under a volume's ``mountPath``
  moved to that claim's host folder, and ``KUBECONFIG`` holding a token of the pod's own
  ServiceAccount (TokenRequest), so its progress reports pass the RBAC the operator granted. It
  writes the pod's status as a kubelet does: Running, then Succeeded or Failed with the exit code
  and the log's last lines as the container's termination message; the real Job controller then
  completes the Job or retries it with its back-off. A stager pod deleted while it runs has its
  process killed (SIGKILL: what a node failure does to a download).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from kubernetes import client

from kimik3.controller.kube import Conflict, Kube, NotFound
from kimik3.kube.kinds import PERSISTENT_VOLUME_CLAIM, POD
from kimik3.kube.labels import MANAGED_BY, MANAGED_BY_LABEL, STAGER_LABEL
from kimik3.kube.times import rfc3339
from kimik3_dev.devcluster.rbac import request_token, write_token_kubeconfig
from kimik3_dev.sim import podenv

POLL_S = 0.5
TAIL_LINES = 5
log = logging.getLogger("kimik3.dev.stagers")


class StagerRunner:
    """Runs staging pods of the cluster behind ``api`` as local processes under ``state_dir``."""

    def __init__(self, api: client.ApiClient, state_dir: Path, server: str, ca_file: Path):
        self.api, self.kube = api, Kube(api)
        self.state_dir, self.server, self.ca_file = state_dir, server, ca_file
        self.running: dict[str, tuple[subprocess.Popen[bytes], dict[str, Any], Path, str]] = {}

    # -- the provisioner -------------------------------------------------------------------
    def provision(self) -> None:
        for pvc in self.kube.list(*PERSISTENT_VOLUME_CLAIM.type_meta, "", f"{MANAGED_BY_LABEL}={MANAGED_BY}"):
            spec = pvc["spec"]
            if (pvc.get("status") or {}).get("phase") != "Pending" or spec.get("volumeName"):
                continue
            ns, name = pvc["metadata"]["namespace"], pvc["metadata"]["name"]
            folder = self.state_dir / "volumes" / ns / name
            folder.mkdir(parents=True, exist_ok=True)
            pv = {"apiVersion": "v1", "kind": "PersistentVolume",
                  "metadata": {"name": f"kimik3-dev-{ns}-{name}"[:253],
                               "labels": {"app.kubernetes.io/managed-by": "kimik3-devcluster"}},
                  "spec": {"capacity": {"storage": spec["resources"]["requests"]["storage"]},
                           "accessModes": spec.get("accessModes"), "persistentVolumeReclaimPolicy": "Retain",
                           "storageClassName": spec.get("storageClassName") or "",
                           "claimRef": {"namespace": ns, "name": name},
                           "hostPath": {"path": str(folder), "type": "DirectoryOrCreate"}}}
            try:
                self.kube.request("POST", "/api/v1/persistentvolumes", pv)
                log.info("provisioned %s for claim %s/%s", folder, ns, name)
            except Conflict:  # AlreadyExists
                pass

    def host_folder(self, namespace: str, claim: str) -> Path:
        """The host folder behind a bound claim (its PersistentVolume's hostPath)."""
        pvc = self.kube.get(*PERSISTENT_VOLUME_CLAIM.type_meta, namespace, claim) or {}
        volume = (pvc.get("spec") or {}).get("volumeName")
        if not volume:
            raise RuntimeError(f"claim {namespace}/{claim} is not bound")
        pv = self.kube.request("GET", f"/api/v1/persistentvolumes/{volume}")
        return Path(pv["spec"]["hostPath"]["path"])

    # -- the kubelet -----------------------------------------------------------------------
    def step(self) -> None:
        self.provision()
        pods = self.kube.list(*POD.type_meta, "", f"{STAGER_LABEL}=true")
        live = {p["metadata"]["uid"]: p for p in pods}
        for uid, (proc, pod, log_path, started) in list(self.running.items()):
            if uid not in live or live[uid]["metadata"].get("deletionTimestamp"):
                proc.kill()
                proc.wait()
                del self.running[uid]
                continue
            if proc.poll() is not None:  # killed by signal N: exit code 128 + N, as a container runtime says
                code = proc.returncode if proc.returncode >= 0 else 128 - proc.returncode
                self._finish(pod, code, log_path, started)
                del self.running[uid]
        for uid, pod in live.items():
            status = pod.get("status") or {}
            if (uid in self.running or status.get("phase") != "Pending" or not pod["spec"].get("nodeName")
                    or pod["metadata"].get("deletionTimestamp")):
                continue
            self._start(pod)

    def _start(self, pod: dict[str, Any]) -> None:
        meta, spec = pod["metadata"], pod["spec"]
        ns = meta["namespace"]
        container = spec["containers"][0]
        claims = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in spec.get("volumes") or []
                  if "persistentVolumeClaim" in v}
        mounts = {m["mountPath"]: self.host_folder(ns, claims[m["name"]]) for m in container.get("volumeMounts") or []
                  if m["name"] in claims}

        def on_host(arg: str) -> str:
            for mount, folder in mounts.items():
                if arg == mount or arg.startswith(mount.rstrip("/") + "/"):
                    return str(folder) + arg[len(mount):]
            return arg

        def read_secret(name: str) -> dict[str, Any] | None:
            try:
                return self.kube.request("GET", f"/api/v1/namespaces/{ns}/secrets/{name}")
            except NotFound:
                return None

        env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "KUBECONFIG"))}
        try:
            for entry in container.get("env") or []:
                value = podenv.resolve(entry, ns, read_secret, meta)
                if value is not None:
                    env[entry["name"]] = value
        except podenv.EnvUnresolved as exc:
            self._patch(pod, {"phase": "Pending", "containerStatuses": [{
                "name": container["name"], "ready": False, "restartCount": 0, "image": container["image"],
                "imageID": "", "state": {"waiting": {"reason": "CreateContainerConfigError", "message": str(exc)}}}]})
            return
        token, _ = request_token(self.api, ns, spec.get("serviceAccountName") or "default")
        kubeconfig = write_token_kubeconfig(self.state_dir / "stagers" / f"{meta['uid']}.kubeconfig", self.server,
                                            self.ca_file, f"{ns}-{spec.get('serviceAccountName')}", token)
        env["KUBECONFIG"] = str(kubeconfig)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        log_path = self.state_dir / "logs" / f"stager-{ns}-{meta['name']}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", "kimik3.cli", *map(on_host, container.get("args") or [])]
        with log_path.open("ab") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=self.state_dir)
        started = rfc3339()
        self.running[meta["uid"]] = (proc, pod, log_path, started)
        self._patch(pod, {"phase": "Running", "startTime": started, "conditions": [
            {"type": t, "status": "True", "lastTransitionTime": started}
            for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")],
            "containerStatuses": [{"name": container["name"], "ready": True, "started": True, "restartCount": 0,
                                   "image": container["image"], "imageID": "",
                                   "state": {"running": {"startedAt": started}}}]})
        log.info("started %s/%s: %s", ns, meta["name"], " ".join(argv[3:]))

    def _finish(self, pod: dict[str, Any], code: int, log_path: Path, started: str) -> None:
        container = pod["spec"]["containers"][0]
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-TAIL_LINES:])
        finished = rfc3339()
        self._patch(pod, {"phase": "Succeeded" if code == 0 else "Failed", "conditions": [
            {"type": t, "status": "False", "lastTransitionTime": finished, "reason": "PodCompleted"}
            for t in ("ContainersReady", "Ready")],
            "containerStatuses": [{"name": container["name"], "ready": False, "started": False, "restartCount": 0,
                                   "image": container["image"], "imageID": "", "state": {"terminated": {
                                       "exitCode": code, "reason": "Completed" if code == 0 else "Error",
                                       "message": tail[-4096:], "startedAt": started, "finishedAt": finished}}}]})
        log.info("%s/%s exited %d", pod["metadata"]["namespace"], pod["metadata"]["name"], code)

    def _patch(self, pod: dict[str, Any], status: dict[str, Any]) -> None:
        meta = pod["metadata"]
        try:
            self.kube.patch_merge(*POD.type_meta, meta["namespace"], meta["name"], {"status": status}, "status")
        except NotFound:
            pass

    def run_forever(self) -> None:
        while True:
            try:
                self.step()
            except Exception:  # noqa: BLE001 - a dev stand-in keeps going, the log says why
                log.exception("stager runner step failed")
            time.sleep(POLL_S)
