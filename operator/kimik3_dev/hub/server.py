"""A local stand-in for the Hugging Face hub's file API, on 127.0.0.1, for the stager's tests.

It serves exactly what ``huggingface_hub`` 2.4.0 asks for when it stages a model (read in its
``hf_api.py``, ``file_download.py`` and ``_snapshot_download.py``), answering as the hub does:

- ``GET /api/models/<repo>[/revision/<rev>]`` (``?blobs=true``: ``HfApi.model_info(...,
  files_metadata=True)``): ``{"id", "modelId", "sha", "siblings": [{"rfilename", "size",
  "blobId", "lfs": {"sha256", "size", "pointerSize"}}], ...}``;
- ``GET /api/models/<repo>/tree/<rev>[/<path>]?recursive=...`` (``list_repo_tree``, one page):
  ``[{"type": "file", "path", "size", "oid", "lfs": {"oid", "size", "pointerSize"}}]``;
- ``HEAD``/``GET /<repo>/resolve/<rev>/<path>``: a file stored in git answers 200 with
  ``ETag: "<git blob sha1>"``, ``X-Repo-Commit`` and ``Content-Length``; an LFS file answers
  ``302`` to its content-addressed location ``<cdn>/lfs/<sha256>`` with ``X-Linked-Etag:
  "<sha256>"``, ``X-Linked-Size`` and ``X-Repo-Commit`` (the hub's redirect to its CDN: another
  origin, a second port on 127.0.0.1, so that huggingface_hub reads the metadata off the
  redirect and sends no token there, as with the real CDN);
- ``GET /lfs/<sha256>``: the bytes, honouring ``Range: bytes=N-`` with ``206`` and
  ``Content-Range`` (how huggingface_hub resumes a partial file);
- errors as the hub gives them: an unknown revision ``404`` with ``X-Error-Code:
  RevisionNotFound``, an unknown repository ``401`` with ``X-Error-Code: RepoNotFound``, an
  unknown file ``404`` with ``X-Error-Code: EntryNotFound``.

Faults (``Fault``), each for a number of requests: a status code (e.g. 500) on paths starting
with a prefix, or a connection cut at a byte offset of a file (the client sees a short body).
``FakeHub.requests`` records every request as ``(method, path, range header)``.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".msgpack", ".h5", ".onnx")
"""Files the hub's default ``.gitattributes`` puts in LFS (a sample of its list)."""
CHUNK = 1 << 20


@dataclass
class HubFile:
    """One file of a commit: its content on local disk (served from there, never held in memory)."""

    path: str
    source: Path
    size: int
    git_sha1: str
    sha256: str | None
    """Set for LFS files."""

    @classmethod
    def of(cls, path: str, source: Path) -> HubFile:
        data_size = source.stat().st_size
        g, s = hashlib.sha1(f"blob {data_size}\0".encode()), hashlib.sha256()
        with source.open("rb") as fh:
            while chunk := fh.read(CHUNK):
                g.update(chunk)
                s.update(chunk)
        lfs = path.endswith(LFS_SUFFIXES) or data_size > 10 * CHUNK
        return cls(path, source, data_size, g.hexdigest(), s.hexdigest() if lfs else None)

    @property
    def pointer_size(self) -> int:
        """Bytes of the LFS pointer file git holds instead of the content (``version``/``oid``/``size`` lines)."""
        return len(f"version https://git-lfs.github.com/spec/v1\noid sha256:{self.sha256}\nsize {self.size}\n")


@dataclass
class Fault:
    """Fail ``times`` requests: with ``status`` on paths starting with ``prefix``, or (``cut_at``
    set) by closing the connection once a file body under ``prefix`` reaches that byte offset of
    the file (a resumed request starting past it is cut at once)."""

    prefix: str
    status: int | None = None
    cut_at: int | None = None
    times: int = 1


@dataclass
class Repo:
    commits: dict[str, dict[str, HubFile]] = field(default_factory=dict)
    refs: dict[str, str] = field(default_factory=dict)


class FakeHub:
    """``hub.add(repo_id, folder)`` publishes a folder as a new commit on ``main``; ``hub.start()``
    serves on 127.0.0.1 and returns the base URL (``HF_ENDPOINT``); ``hub.stop()``."""

    def __init__(self, bytes_per_second: float | None = None) -> None:
        self.bytes_per_second = bytes_per_second
        """Each file body is sent at most this fast (None: as fast as the disk), so a test can
        watch a download progress."""
        self.repos: dict[str, Repo] = {}
        self.faults: list[Fault] = []
        self.requests: list[tuple[str, str, str | None]] = []
        self._lock = threading.Lock()
        self._servers: list[ThreadingHTTPServer] = []
        self.url = ""
        """The hub's base URL (``HF_ENDPOINT``)."""
        self.cdn_url = ""
        """Where LFS content is served (the redirect target)."""

    def add(self, repo_id: str, folder: Path, ref: str = "main") -> str:
        """Publish every file below ``folder`` as one commit of ``repo_id`` and point ``ref`` at
        it. Returns the commit id (40 hex digits)."""
        files = {p.relative_to(folder).as_posix(): HubFile.of(p.relative_to(folder).as_posix(), p)
                 for p in sorted(folder.rglob("*")) if p.is_file()}
        commit = hashlib.sha1(json.dumps({k: f.git_sha1 for k, f in files.items()}, sort_keys=True).encode()
                              + repo_id.encode()).hexdigest()
        repo = self.repos.setdefault(repo_id, Repo())
        repo.commits[commit] = files
        repo.refs[ref] = commit
        return commit

    def fault(self, fault: Fault) -> None:
        with self._lock:
            self.faults.append(fault)

    def _take_fault(self, path: str, cut: bool) -> Fault | None:
        with self._lock:
            for f in self.faults:
                if f.times > 0 and path.startswith(f.prefix) and (f.cut_at is not None) == cut:
                    f.times -= 1
                    return f
        return None

    def start(self) -> str:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:  # quiet
                pass

            def do_HEAD(self) -> None:  # noqa: N802 - http.server's naming
                hub._handle(self, head=True)

            def do_GET(self) -> None:  # noqa: N802
                hub._handle(self, head=False)

        for _ in range(2):
            server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
            server.daemon_threads = True
            threading.Thread(target=server.serve_forever, name="fake-hub", daemon=True).start()
            self._servers.append(server)
        self.url, self.cdn_url = (f"http://127.0.0.1:{s.server_address[1]}" for s in self._servers)
        return self.url

    def stop(self) -> None:
        for server in self._servers:
            server.shutdown()
            server.server_close()
        self._servers = []

    # -- requests ------------------------------------------------------------------------
    def _handle(self, h: BaseHTTPRequestHandler, head: bool) -> None:
        url = urlsplit(h.path)
        path, query = unquote(url.path), parse_qs(url.query)
        with self._lock:
            self.requests.append(("HEAD" if head else "GET", path, h.headers.get("Range")))
        fault = self._take_fault(path, cut=False)
        if fault is not None and fault.status is not None:
            return self._error(h, fault.status, None, f"injected fault {fault.status}", head)
        if path.startswith("/api/models/"):
            return self._api(h, path[len("/api/models/"):], query, head)
        if path.startswith("/lfs/"):
            return self._lfs(h, path[len("/lfs/"):], head)
        parts = path.lstrip("/").split("/", 4)
        if len(parts) == 5 and parts[2] == "resolve":
            return self._resolve(h, f"{parts[0]}/{parts[1]}", parts[3], parts[4], head)
        return self._error(h, 404, None, f"no route {path}", head)

    def _commit(self, repo_id: str, revision: str) -> tuple[str, dict[str, HubFile]] | tuple[None, str]:
        repo = self.repos.get(repo_id)
        if repo is None:
            return None, "RepoNotFound"
        commit = repo.refs.get(revision, revision if revision in repo.commits else None)
        if commit is None:
            return None, "RevisionNotFound"
        return commit, repo.commits[commit]

    def _api(self, h: BaseHTTPRequestHandler, rest: str, query: dict[str, list[str]], head: bool) -> None:
        parts = rest.split("/")
        repo_id, tail = "/".join(parts[:2]), parts[2:]
        kind, revision = ("info", "main") if not tail else (tail[0], unquote(tail[1]) if len(tail) > 1 else "main")
        commit, files = self._commit(repo_id, revision)
        if commit is None:
            return self._missing(h, str(files), repo_id, revision, head)
        assert isinstance(files, dict)
        if kind == "revision" or kind == "info":
            blobs = query.get("blobs", ["false"])[0].lower() == "true"
            siblings = []
            for f in files.values():
                entry: dict[str, object] = {"rfilename": f.path}
                if blobs:
                    entry |= {"size": f.size, "blobId": f.git_sha1}
                    if f.sha256:
                        entry["lfs"] = {"sha256": f.sha256, "size": f.size, "pointerSize": f.pointer_size}
                siblings.append(entry)
            body: object = {"_id": commit[:24], "id": repo_id, "modelId": repo_id, "sha": commit, "private": False,
                            "disabled": False, "gated": False, "tags": [], "downloads": 0, "likes": 0,
                            "lastModified": "2026-11-30T00:00:00.000Z", "siblings": siblings}
        elif kind == "tree":
            prefix = "/".join(tail[2:])
            body = [{"type": "file", "oid": f.git_sha1, "size": f.size, "path": f.path,
                     **({"lfs": {"oid": f.sha256, "size": f.size, "pointerSize": f.pointer_size}} if f.sha256 else {})}
                    for f in files.values() if not prefix or f.path.startswith(prefix + "/")]
        else:
            return self._error(h, 404, None, f"no route {kind}", head)
        data = json.dumps(body).encode()
        h.send_response(200)
        h.send_header("Content-Type", "application/json; charset=utf-8")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        if not head:
            h.wfile.write(data)

    def _resolve(self, h: BaseHTTPRequestHandler, repo_id: str, revision: str, name: str, head: bool) -> None:
        commit, files = self._commit(repo_id, unquote(revision))
        if commit is None:
            return self._missing(h, str(files), repo_id, revision, head)
        assert isinstance(files, dict)
        f = files.get(name)
        if f is None:
            return self._error(h, 404, "EntryNotFound", f"{name} does not exist on \"{revision}\"", head)
        if f.sha256:
            h.send_response(302)
            h.send_header("Location", f"{self.cdn_url}/lfs/{f.sha256}")
            h.send_header("X-Repo-Commit", commit)
            h.send_header("X-Linked-Etag", f'"{f.sha256}"')
            h.send_header("X-Linked-Size", str(f.size))
            h.send_header("ETag", f'"{f.git_sha1}"')
            h.send_header("Content-Length", "0")
            h.end_headers()
            return
        self._content(h, f, head, {"X-Repo-Commit": commit, "ETag": f'"{f.git_sha1}"'})

    def _lfs(self, h: BaseHTTPRequestHandler, digest: str, head: bool) -> None:
        f = next((f for r in self.repos.values() for c in r.commits.values() for f in c.values()
                  if f.sha256 == digest), None)
        if f is None:
            return self._error(h, 404, None, "no such object", head)
        self._content(h, f, head, {"ETag": f'"{f.sha256}"'})

    def _content(self, h: BaseHTTPRequestHandler, f: HubFile, head: bool, headers: dict[str, str]) -> None:
        start = 0
        wanted = h.headers.get("Range")
        if wanted and wanted.startswith("bytes="):
            start = int(wanted[len("bytes="):].split("-", 1)[0] or 0)
        if start >= f.size and f.size:
            return self._error(h, 416, None, "range not satisfiable", head)
        h.send_response(206 if start else 200)
        for k, v in headers.items():
            h.send_header(k, v)
        h.send_header("Accept-Ranges", "bytes")
        h.send_header("Content-Length", str(f.size - start))
        if start:
            h.send_header("Content-Range", f"bytes {start}-{f.size - 1}/{f.size}")
        h.end_headers()
        if head:
            return
        cut = self._take_fault(h.path, cut=True) or self._take_fault(f"/{f.path}", cut=True)
        limit = f.size - start if cut is None else max(0, min(f.size, cut.cut_at or 0) - start)
        with f.source.open("rb") as fh:
            fh.seek(start)
            sent = 0
            while sent < limit:
                chunk = fh.read(min(CHUNK, limit - sent))
                if not chunk:
                    break
                try:
                    h.wfile.write(chunk)
                except (BrokenPipeError, ConnectionResetError):  # the client went away (e.g. a killed stager)
                    h.close_connection = True
                    return
                sent += len(chunk)
                if self.bytes_per_second:
                    time.sleep(len(chunk) / self.bytes_per_second)
        if cut is not None:
            h.wfile.flush()
            h.close_connection = True
            h.connection.close()

    def _missing(self, h: BaseHTTPRequestHandler, code: str, repo_id: str, revision: str, head: bool) -> None:
        if code == "RepoNotFound":
            return self._error(h, 401, code, "Repository not found", head)
        return self._error(h, 404, code, f"Invalid rev id: {revision}", head)

    def _error(self, h: BaseHTTPRequestHandler, status: int, code: str | None, message: str, head: bool) -> None:
        data = json.dumps({"error": message}).encode()
        h.send_response(status)
        if code:
            h.send_header("X-Error-Code", code)
        h.send_header("X-Error-Message", message)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        if not head:
            h.wfile.write(data)
