"""What the stager reports while it runs, and where the operator reads it.

A staging Job's pod patches one annotation of its own Job, ``PROGRESS_ANNOTATION``, with a JSON
``Progress`` (every ``REPORT_INTERVAL_S`` seconds while it downloads, then once complete or
failed). Why there: the operator already watches and reads Jobs, a Job outlives its pods (a
retried pod continues the same record), and the pod needs one narrow grant for it (``get`` and
``patch`` of that one Job by name: ``kimik3.render.staging``). The alternatives a real cluster
offers are worse: the operator cannot mount the volume to read a progress file there; a pod's
termination message exists only once it ended; reading pod logs needs the kubelet's log endpoint
and parsing free text; patching its own Pod would need a grant on every pod of the namespace (a
Job's pod name is not known in advance).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from pydantic.alias_generators import to_camel, to_snake

PROGRESS_ANNOTATION = "inference.kimik3.io/staging-progress"
REPORT_INTERVAL_S = 2.0
"""Seconds between two progress reports while files download."""

Phase = Literal["resolving", "downloading", "verifying", "complete", "failed"]


@dataclass(frozen=True)
class Progress:
    """One report of one staging run (sizes in bytes, times RFC 3339)."""

    repo_id: str
    revision: str
    phase: Phase = "resolving"
    commit: str | None = None
    """The commit the revision resolved to (the hub's ``sha``)."""
    bytes_done: int = 0
    """Bytes of the loaded files on the volume, partial downloads included."""
    bytes_total: int = 0
    files_done: int = 0
    """Files complete on the volume (verified once phase is complete)."""
    files_total: int = 0
    rate_bytes_per_second: float | None = None
    """Download rate of this run (bytes resumed from an earlier run not counted)."""
    eta_seconds: float | None = None
    """Seconds left at that rate."""
    updated_at: str = ""
    error: str | None = None
    """The hub's or the storage's error, quoted, when phase is failed."""
    files: list[dict[str, Any]] = field(default_factory=list)
    """Once complete: every file with its size and hash (the completion manifest's list)."""

    def with_(self, **changes: Any) -> Progress:
        return replace(self, **changes)

    def to_json(self, with_files: bool = False) -> str:
        """The annotation's value (camelCase keys; the file list only when asked: annotations
        hold 256 KiB in all, a 96-shard list fits, but the operator does not need it)."""
        doc = {to_camel(k): v for k, v in asdict(self).items() if v is not None and (with_files or k != "files")}
        return json.dumps(doc, sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Progress:
        """Parse an annotation value. Raises ValueError when it is not a progress document."""
        try:
            doc = json.loads(text)
            return cls(**{to_snake(k): v for k, v in doc.items()})
        except (TypeError, json.JSONDecodeError) as exc:
            raise ValueError(f"not a staging progress document: {text[:200]!r}") from exc


Reporter = Callable[[Progress], None]
"""Where a stager sends each report."""


def job_reporter(patch_job: Callable[[dict[str, Any]], object], job: str) -> Reporter:
    """Reports into ``PROGRESS_ANNOTATION`` of the Job named ``job`` through ``patch_job`` (a merge
    patch of that Job: ``kimik3 stage`` passes ``controller.kube.Kube.patch_merge`` with the pod's
    ServiceAccount). A failed patch is logged to stderr and the download goes on (a report is not
    worth a lost download)."""

    def report(progress: Progress) -> None:
        body = {"metadata": {"annotations": {PROGRESS_ANNOTATION: progress.to_json()}}}
        try:
            patch_job(body)
        except Exception as exc:  # noqa: BLE001 - reported, never fatal
            print(f"kimik3 stage: progress report to Job {job} failed: {exc}", flush=True)

    return report
