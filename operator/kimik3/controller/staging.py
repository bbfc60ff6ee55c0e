"""The weights gate: a model cache is staged and verified before any engine pod exists.

``Staging.step(obj, admitted)`` makes sure what stages the cache exists (the claim when the spec
creates it, the stager ServiceAccount, one Job per artifact with its Role and RoleBinding:
``kimik3.render.staging``), reads the Jobs and their progress annotations, and returns a
``Weights``: the ``WeightsReady`` verdict and whether engines may start. The reconciler applies
no LeaderWorkerSet (and no ComputeDomain) until ``ready``; a LeaderWorkerSet that already serves
an older revision is left as it is while a new one stages beside it, then rolled.
``weights_verdict`` is the pure part (tests/test_weights_gate.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from kimik3.admission import Admitted
from kimik3.api.conditions import ConditionType, Reason, Verdict
from kimik3.api.v1alpha1 import KimiK3DeploymentStatus
from kimik3.controller.kube import ApiError, Kube
from kimik3.controller.status import set_condition
from kimik3.engine.weights import Artifact
from kimik3.kube.kinds import JOB, PERSISTENT_VOLUME_CLAIM
from kimik3.render.compilecache import compile_cache_claim
from kimik3.render.staging import claim, service_account, staging_jobs
from kimik3.staging.progress import PROGRESS_ANNOTATION, Progress

DEFAULT_STAGER_IMAGE = "kimik3/kimik3-operator:latest"
"""The image staging Jobs run (``kimik3 run --stager-image``; the chart passes its own image)."""
STAGING_POLL_S = 5.0
"""Re-read the staging Jobs this often while they run, seconds (a Job is not owned by the
deployment, so no owner watch brings its changes)."""
log = logging.getLogger("kimik3.staging")


@dataclass(frozen=True)
class Weights:
    verdict: Verdict
    """The WeightsReady condition."""
    ready: bool
    """Engines may start: every artifact is where they load it."""
    requeue_after: float | None = None


def _size(n: int) -> str:
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def _duration(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def _job_condition(job: dict[str, Any], type_: str) -> dict[str, Any] | None:
    return next((c for c in (job.get("status") or {}).get("conditions") or []
                 if c.get("type") == type_ and c.get("status") == "True"), None)


def _progress(job: dict[str, Any] | None) -> Progress | None:
    text = ((job or {}).get("metadata") or {}).get("annotations", {}).get(PROGRESS_ANNOTATION)
    if not text:
        return None
    try:
        return Progress.from_json(text)
    except ValueError:
        return None


def weights_verdict(claim_name: str, jobs: list[tuple[Artifact, str, dict[str, Any] | None]]) -> Weights:
    """The WeightsReady verdict of a cache from its staging Jobs: ``(artifact, Job name, the Job
    or None when not created yet)`` per artifact. Failed (a Job's ``Failed`` condition, or its
    latest attempt while it retries: the error it reported, or, when its pod ended without one
    and no pod runs (Job ``status.failed`` > 0, ``status.active`` 0), a kill) outranks staging,
    which outranks staged."""
    failed, staging, staged = [], [], []
    done = total = files_done = files_total = 0
    eta = 0.0
    for artifact, name, job in jobs:
        label = f"{artifact.repo_id}@{artifact.revision}"
        progress = _progress(job)
        if progress is not None:
            done, total = done + progress.bytes_done, total + progress.bytes_total
            files_done, files_total = files_done + progress.files_done, files_total + progress.files_total
        if job is not None and _job_condition(job, "Complete"):
            commit = (progress.commit or "")[:12] if progress else ""
            size = f", {_size(progress.bytes_total)}, {progress.files_total} files" if progress else ""
            when = f", verified at {progress.updated_at}" if progress and progress.updated_at else ""
            staged.append(f"{label} (commit {commit}{size}{when})")
            continue
        error = progress.error if progress is not None and progress.phase == "failed" else None
        status = (job or {}).get("status") or {}
        attempts, active = int(status.get("failed") or 0), int(status.get("active") or 0)
        gave_up = _job_condition(job, "Failed") if job is not None else None
        if gave_up is not None:
            failed.append(f"Job {name} staging {label} failed ({gave_up.get('reason', 'Failed')}: "
                          f"{gave_up.get('message', '')}): {error or 'no error reported'}; fix the spec "
                          f"(repository, revision, token, claim size) or delete the Job to try again")
        elif error is not None:
            failed.append(f"Job {name} staging {label}: attempt {attempts or 1} failed: {error}; the Job retries "
                          f"with back-off")
        elif attempts and not active:  # a pod that ended without reporting a failure was killed
            at = f" at {_size(progress.bytes_done)} of {_size(progress.bytes_total)}" if progress else ""
            failed.append(f"Job {name} staging {label}: attempt {attempts} was killed{at} (its pod deleted, evicted, "
                          f"OOM-killed or its node lost: it ended without reporting an error); the Job retries with "
                          f"back-off, keeping every file already complete")
        else:
            phase = progress.phase if progress is not None else "starting"
            staging.append(f"{label} {phase}")
            if progress is not None and progress.eta_seconds:
                eta = max(eta, progress.eta_seconds)
    if failed:
        return Weights(Verdict("False", Reason.STAGING_FAILED, "; ".join(failed) + "; no engine pod is created "
                               "before the weights and the drafter are staged"), False, STAGING_POLL_S)
    if staging:
        share = f" ({100 * done / total:.0f}%)" if total else ""
        eta_text = f", ETA {_duration(eta)}" if eta else ""
        return Weights(Verdict("False", Reason.STAGING, (
            f"staging into PVC {claim_name}: {_size(done)} of {_size(total)}{share}, {files_done} of {files_total} "
            f"files{eta_text}; " + ", ".join(staging + [s.split(' (')[0] + ' staged' for s in staged]) +
            "; no engine pod is created before the weights and the drafter are staged")), False, STAGING_POLL_S)
    return Weights(Verdict("True", Reason.STAGED, f"staged in PVC {claim_name}: " + " and ".join(staged)), True)


class Staging:
    """Stages model caches through ``kube`` with the stager image ``image``."""

    def __init__(self, kube: Kube, image: str):
        self.kube = kube
        self.image = image

    def step(self, obj: dict[str, Any], admitted: Admitted) -> Weights:
        compile_claim = compile_cache_claim(admitted, obj["metadata"]["namespace"])
        if compile_claim is not None:
            self._create_claim(compile_claim)
        src = admitted.spec.model.source
        if src.hub is not None:
            return Weights(Verdict("True", Reason.NOT_STAGED, "spec.model.source.hub: every engine downloads the "
                                   "weights at start (nothing is staged; use a cache source to stage once)"), True)
        if src.cache is None or src.cache.hub is None:
            where = (f"PVC {src.pvc.claim_name}" if src.pvc is not None else
                     f"node folder {src.host_path.path}" if src.host_path is not None else
                     f"PVC {src.cache.claim_name if src.cache else '?'} (declaredReady)")
            return Weights(Verdict("True", Reason.DECLARED_READY, f"weights declared in place: {where}; not "
                                   "staged or verified by the operator"), True)
        namespace = obj["metadata"]["namespace"]
        try:
            pvc = claim(admitted, namespace)
            if pvc is not None:
                self._create_claim(pvc)
            jobs = staging_jobs(admitted, namespace, self.image)
            seen: list[tuple[Artifact, str, dict[str, Any] | None]] = []
            for artifact, objects in jobs:
                job = objects[-1]
                name = job["metadata"]["name"]
                current = self.kube.get(*JOB.type_meta, namespace, name)
                if current is None:
                    for o in [service_account(namespace), *objects]:
                        self.kube.apply(o)
                    current = self.kube.get(*JOB.type_meta, namespace, name)
                seen.append((artifact, name, current))
        except ApiError as exc:
            message = f"cannot create what stages the cache: {exc}"
            log.warning("%s/%s: %s", namespace, obj["metadata"]["name"], message)
            return Weights(Verdict("False", Reason.STAGING_FAILED, message), False, STAGING_POLL_S)
        return weights_verdict(src.cache.claim_name, seen)

    def _create_claim(self, pvc: dict[str, Any]) -> None:
        """Create a claim unless it exists (a claim's spec is not changed afterwards: most of it is
        immutable, and its size only grows by the storage class's expansion)."""
        meta = pvc["metadata"]
        if self.kube.get(*PERSISTENT_VOLUME_CLAIM.type_meta, meta["namespace"], meta["name"]) is None:
            self.kube.apply(pvc)


def with_weights(status: KimiK3DeploymentStatus, weights: Weights, generation: int | None,
                 groups_exist: bool) -> KimiK3DeploymentStatus:
    """``status`` with WeightsReady set; while the weights hold the engines back and no group
    exists, Ready and Progressing say that they wait for the weights (what the user waits for)."""
    conditions = set_condition(status.conditions, ConditionType.WEIGHTS_READY, weights.verdict, generation)
    if not weights.ready and not groups_exist:
        waiting = f"waiting for the weights: {weights.verdict.message}"
        conditions = set_condition(conditions, ConditionType.READY,
                                   Verdict("False", Reason.GROUPS_NOT_READY, waiting), generation)
        conditions = set_condition(conditions, ConditionType.PROGRESSING,
                                   Verdict("True", Reason.GROUPS_STARTING, waiting), generation)
    return status.model_copy(update={"conditions": conditions})
