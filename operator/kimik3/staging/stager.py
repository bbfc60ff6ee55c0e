"""``stage()``: one hub repository at one revision into ``<root>/<repo id>/<revision>/``, verified.

Steps (each report is a ``Progress``):
1. resolve: ``HfApi.model_info(repo, revision, files_metadata=True)`` gives the commit (``sha``)
   and every file's size, git blob id and, for LFS files, sha256 (the hub's
   ``/api/models/<repo>/revision/<rev>?blobs=true``);
2. download: ``snapshot_download`` pinned to that commit (so a branch moving meanwhile changes
   nothing), only the files vLLM loads (``kimik3.staging.files``), ``max_workers`` files at a
   time. Resuming: within a run, huggingface_hub resumes a file whose connection was cut with an
   HTTP Range request from the last whole 10 MiB chunk (five tries while data flows); across runs
   (a killed pod, a retried Job) every file already complete for the commit is kept and not
   fetched again, while files that were partial restart (huggingface_hub 2.4.0 writes each
   download to a process-unique temporary file and removes it on failure, its PR #4228; a killed
   process cannot, so a run first removes the partial files an earlier one left: no run resumes
   them, and each would hold up to a shard's size on the volume and count as progress);
3. verify: every file's size, and its sha256 (LFS files) or git blob SHA-1 (the others) against
   the hub's metadata, ``max_workers`` files at a time;
4. the completion manifest (``kimik3.engine.weights.MANIFEST``), written last and atomically:
   an engine folder with a manifest is complete and verified.
A folder whose manifest names the same commit is not downloaded again. Every failure raises
``StagingError`` with the hub's or the storage's own message.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kimik3.engine.weights import MANIFEST, Artifact
from kimik3.kube.times import rfc3339
from kimik3.staging.files import loaded
from kimik3.staging.progress import REPORT_INTERVAL_S, Progress, Reporter

HASH_CHUNK = 8 << 20
"""Bytes read per hashing step."""
DOWNLOAD_CACHE = ".cache"
"""huggingface_hub's bookkeeping folder inside a ``local_dir`` (partial files, per-file metadata)."""


class StagingError(RuntimeError):
    """Staging failed; the message quotes the hub's or the storage's error."""


def git_blob_sha1(path: Path) -> str:
    """The git object id of a file's content (``sha1("blob <size>\\0" + content)``): the hub's
    ``blobId`` of a file not stored in LFS."""
    h = hashlib.sha1(f"blob {path.stat().st_size}\0".encode())
    with path.open("rb") as fh:
        while chunk := fh.read(HASH_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(HASH_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def read_manifest(folder: Path) -> dict[str, Any] | None:
    """The completion manifest of a staged folder, or None when it has none (or an unreadable one)."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) else None


def _bytes_on_disk(folder: Path, files: dict[str, int]) -> tuple[int, int]:
    """(bytes, complete files) of ``files`` ({path: size}) under ``folder``: finished files, plus
    huggingface_hub's partial ``*.incomplete`` copies."""
    done = complete = 0
    for name, size in files.items():
        try:
            if (folder / name).stat().st_size == size:
                done, complete = done + size, complete + 1
        except OSError:
            pass
    partial_dir = folder / DOWNLOAD_CACHE
    if partial_dir.is_dir():
        for p in partial_dir.rglob("*.incomplete"):
            try:
                done += p.stat().st_size
            except OSError:
                pass
    return done, complete


def remove_orphaned_partials(folder: Path) -> int:
    """Remove huggingface_hub's partial downloads (``<name>.<8 hex>.incomplete``) under ``folder``,
    left by a run that was killed (a live run removes its own on failure). Call before a download
    starts; returns the bytes freed."""
    freed = 0
    partial_dir = folder / DOWNLOAD_CACHE
    for p in partial_dir.rglob("*.incomplete") if partial_dir.is_dir() else ():
        try:
            freed += p.stat().st_size
            p.unlink()
        except OSError:
            pass
    return freed


def _describe(exc: BaseException) -> str:
    """One line naming the error as the hub or the storage said it."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}"[:1000]


def stage(artifact: Artifact, root: Path, *, endpoint: str | None = None, token: str | None = None,
          max_workers: int = 8, report: Reporter = lambda p: None,
          report_interval_s: float = REPORT_INTERVAL_S) -> Progress:
    """Stage ``artifact`` into ``root / artifact.folder``; returns the final ``Progress`` (phase
    ``complete``, with the manifest's file list). ``endpoint``: the hub's base URL (default
    ``$HF_ENDPOINT``, else huggingface.co); ``token``: an HF token (default ``$HF_TOKEN``).
    Raises ``StagingError`` (after reporting phase ``failed`` with the error)."""
    from huggingface_hub import HfApi, snapshot_download

    folder = root / artifact.folder
    progress = Progress(artifact.repo_id, artifact.revision, updated_at=rfc3339())
    report(progress)
    try:
        info = HfApi(endpoint=endpoint, token=token).model_info(artifact.repo_id, revision=artifact.revision,
                                                                files_metadata=True)
        commit = info.sha or ""
        wanted = {s.rfilename: s for s in info.siblings or [] if loaded(s.rfilename)}
        if not wanted:
            raise StagingError(f"{artifact.repo_id}@{artifact.revision} has no file vLLM loads (no safetensors, "
                               "no config.json)")
        sizes = {name: int(s.size or 0) for name, s in wanted.items()}
        progress = progress.with_(phase="downloading", commit=commit, bytes_total=sum(sizes.values()),
                                  files_total=len(sizes), updated_at=rfc3339())
        manifest = read_manifest(folder)
        if manifest is not None and manifest.get("commit") == commit:
            done = progress.with_(phase="complete", bytes_done=progress.bytes_total, files_done=len(sizes),
                                  files=manifest.get("files", []), updated_at=manifest.get("verifiedAt", rfc3339()))
            report(done)
            return done
        folder.mkdir(parents=True, exist_ok=True)
        remove_orphaned_partials(folder)
        (folder / MANIFEST).unlink(missing_ok=True)
        progress = _download(progress, folder, sizes, report, report_interval_s, lambda: snapshot_download(
            artifact.repo_id, revision=commit, local_dir=folder, allow_patterns=sorted(wanted),
            max_workers=max_workers, endpoint=endpoint, token=token))
        report(progress := progress.with_(phase="verifying", updated_at=rfc3339()))
        files = _verify(folder, wanted, max_workers)
        verified_at = rfc3339()
        doc = {"repoId": artifact.repo_id, "revision": artifact.revision, "commit": commit,
               "bytes": progress.bytes_total, "files": files, "verifiedAt": verified_at}
        tmp = folder / f"{MANIFEST}.tmp"
        tmp.write_text(json.dumps(doc, indent=1, sort_keys=True), encoding="utf-8")
        os.replace(tmp, folder / MANIFEST)
    except Exception as exc:  # noqa: BLE001 - every failure is reported, then raised as StagingError
        failed = progress.with_(phase="failed", error=_describe(exc), updated_at=rfc3339(), eta_seconds=None)
        report(failed)
        raise StagingError(failed.error) from exc
    done = progress.with_(phase="complete", files_done=len(files), bytes_done=progress.bytes_total, eta_seconds=0.0,
                          files=files, updated_at=verified_at)
    report(done)
    return done


def _download(progress: Progress, folder: Path, sizes: dict[str, int], report: Reporter, interval_s: float,
              download: Callable[[], object]) -> Progress:
    """Run ``download`` while a thread reports the bytes on disk every ``interval_s`` seconds.
    The bytes reported never go down: a file moved from its partial copy to its place between the
    two looks of ``_bytes_on_disk`` is briefly in neither."""
    start_bytes, _ = _bytes_on_disk(folder, sizes)
    start = time.monotonic()
    stop = threading.Event()
    latest = [progress]

    def measure() -> Progress:
        done, complete = _bytes_on_disk(folder, sizes)
        done, complete = max(done, latest[0].bytes_done), max(complete, latest[0].files_done)
        elapsed = time.monotonic() - start
        rate = (done - start_bytes) / elapsed if elapsed > 0 and done > start_bytes else None
        eta = (progress.bytes_total - done) / rate if rate else None
        return progress.with_(bytes_done=min(done, progress.bytes_total), files_done=complete,
                              rate_bytes_per_second=rate, eta_seconds=eta, updated_at=rfc3339())

    def loop() -> None:
        while not stop.wait(interval_s):
            latest[0] = measure()
            report(latest[0])

    reporter = threading.Thread(target=loop, name="kimik3-stage-progress", daemon=True)
    reporter.start()
    try:
        download()
    finally:
        stop.set()
        reporter.join()
    final = measure()
    report(final)
    return final


def _verify(folder: Path, wanted: dict[str, Any], max_workers: int) -> list[dict[str, Any]]:
    """Every file's size and hash against the hub's metadata; raises StagingError naming each
    mismatch."""

    def check(name: str) -> tuple[dict[str, Any], str | None]:
        sibling, path = wanted[name], folder / name
        size = path.stat().st_size
        if sibling.size is not None and size != sibling.size:
            return {}, f"{name}: {size} bytes on the volume, the hub says {sibling.size}"
        if sibling.lfs is not None:
            digest = sha256(path)
            entry = {"path": name, "size": size, "sha256": digest}
            return entry, None if digest == sibling.lfs.sha256 else f"{name}: sha256 {digest}, the hub says " \
                                                                     f"{sibling.lfs.sha256}"
        blob = git_blob_sha1(path)
        entry = {"path": name, "size": size, "gitBlobSha1": blob}
        return entry, None if sibling.blob_id in (None, blob) else f"{name}: git blob {blob}, the hub says " \
                                                                   f"{sibling.blob_id}"

    with ThreadPoolExecutor(max_workers=max(1, max_workers)) as pool:
        results = list(pool.map(check, sorted(wanted)))
    problems = [p for _, p in results if p]
    if problems:
        for name in (p.split(":", 1)[0] for p in problems):  # a corrupt file is downloaded again next run
            (folder / name).unlink(missing_ok=True)
        raise StagingError("verification failed: " + "; ".join(problems))
    return [entry for entry, _ in results]
