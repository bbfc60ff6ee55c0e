"""A real Kubernetes control plane on loopback: etcd plus kube-apiserver, no kubelet, no Docker.

The binaries are the upstream ones, built from their Go modules by ``tools/build-binaries.sh``
into ``$KIMIK3_BIN_DIR`` (default ``~/.cache/kimik3/bin``). ``ControlPlane`` starts them the
way envtest does (see the flags in ``_apiserver_argv``), with token authentication for two
identities:

* admin: user ``kimik3-admin`` in group ``system:masters`` (everything allowed);
* operator: the operator's service-account user
  ``system:serviceaccount:kimik3-system:kimik3-operator`` with the groups a real service-account
  token carries, so the operator can be run under the chart's real RBAC (RBAC authorization is on).

Without kube-controller-manager there is no garbage collection and no namespace deletion
(namespaces stay ``Terminating``); without a scheduler/kubelet pods never run.
"""

from __future__ import annotations

import atexit
import ctypes
import functools
import json
import os
import secrets
import shutil
import signal
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from kimik3.api.documents import dump_yaml
from kimik3.controller.kube import Kube
from kimik3.kube.objects import is_true
from kimik3_dev.devcluster import certs
from kimik3_dev.devcluster.processes import free_port, log_tail
from kimik3_dev.versions import ETCD_VERSION, KUBERNETES_VERSION

__all__ = [
    "ADMIN_GROUPS",
    "ADMIN_USER",
    "ControlPlane",
    "ControlPlaneError",
    "OPERATOR_GROUPS",
    "OPERATOR_NAMESPACE",
    "OPERATOR_SERVICE_ACCOUNT",
    "OPERATOR_USER",
    "MissingBinaryError",
    "find_binaries",
    "load_yaml_documents",
]

ADMIN_USER = "kimik3-admin"
ADMIN_GROUPS = ("system:masters",)
OPERATOR_NAMESPACE = "kimik3-system"
OPERATOR_SERVICE_ACCOUNT = "kimik3-operator"
OPERATOR_USER = f"system:serviceaccount:{OPERATOR_NAMESPACE}:{OPERATOR_SERVICE_ACCOUNT}"
# The groups the apiserver gives a real service-account token of that account.
OPERATOR_GROUPS = ("system:serviceaccounts", f"system:serviceaccounts:{OPERATOR_NAMESPACE}", "system:authenticated")

SERVICE_CLUSTER_IP_RANGE = "10.0.0.0/16"
"""Service IP range handed to the apiserver (only allocated, never routed or connected to)."""
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"

DEFAULT_START_TIMEOUT_S = 60.0
"""Bound on etcd health + apiserver /readyz, seconds. A start measured 3.1-3.5 s on this
project's 2-core machine when idle and 3.2-3.8 s with both cores kept busy; the margin
covers a parallel Go compile and a slow CI machine."""
DEFAULT_STOP_GRACE_S = 15.0
"""Seconds between SIGTERM and SIGKILL per process (apiserver and etcd exit in ~1 s)."""
DEFAULT_CRD_TIMEOUT_S = 60.0
"""Bound on waiting for all applied CRDs to report Established, seconds."""
CERT_VALIDITY_DAYS = 30
APISERVER_SANS = ("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
                  "kubernetes.default.svc.cluster.local", "127.0.0.1", "::1")
"""The names the API server's serving certificate holds (loopback and the in-cluster Service's)."""
"""Lifetime of the generated CA and serving certificate, days (a dev cluster is short-lived)."""
LOG_TAIL_LINES = 30
"""Lines of a component's log quoted in a start-failure error."""
FIELD_MANAGER = "kimik3-devcluster"
_START_ATTEMPTS = 3  # retries only when a picked port was taken in between (bind race)


class ControlPlaneError(RuntimeError):
    """The control plane could not be started or used."""


class MissingBinaryError(ControlPlaneError):
    """etcd or kube-apiserver has not been built yet."""


def bin_dir() -> Path:
    """Directory holding the built binaries: ``$KIMIK3_BIN_DIR`` or ``~/.cache/kimik3/bin``."""
    env = os.environ.get("KIMIK3_BIN_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "kimik3" / "bin"


def find_binaries(directory: Path | None = None) -> dict[str, Path]:
    """Return ``{"etcd": path, "kube-apiserver": path}``; raise ``MissingBinaryError`` if absent."""
    directory = directory or bin_dir()
    wanted = {"etcd": f"etcd-{ETCD_VERSION}", "kube-apiserver": f"kube-apiserver-{KUBERNETES_VERSION}"}
    found = {name: directory / file for name, file in wanted.items()}
    missing = [str(p) for p in found.values() if not os.access(p, os.X_OK)]
    if missing:
        raise MissingBinaryError(
            f"control-plane binaries not found: {', '.join(missing)}. Build them once with "
            f"`tools/build-binaries.sh etcd kube-apiserver` (set KIMIK3_BIN_DIR to use another directory)."
        )
    return found


def load_yaml_documents(path: Path) -> list[dict[str, Any]]:
    """Parse every non-empty YAML document of ``path`` (libyaml's C loader when available: the
    1.3 MB LeaderWorkerSet CRD took 0.1 s with it and 0.8 s without, measured here)."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    with open(path, "rb") as fh:
        return [doc for doc in yaml.load_all(fh, Loader=loader) if doc]


def _die_with_parent(sig: int) -> None:  # runs in the child between fork and exec
    # PR_SET_PDEATHSIG = 1: the kernel sends `sig` to the child when the thread that started it
    # exits, so even a SIGKILLed test run leaves no apiserver/etcd behind.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, int(sig), 0, 0, 0)


def _write_pki(pki: Path) -> None:
    """Write ca.crt, apiserver.crt/.key (127.0.0.1, ::1, localhost, kubernetes.default...) and
    the service-account signing key pair sa.key/sa.pub (RSA 2048) into ``pki``."""
    pki.mkdir(parents=True, exist_ok=True)
    ca_cert, ca_key = certs.new_ca("kimik3-devcluster-ca", CERT_VALIDITY_DAYS)
    cert, key = certs.new_server_cert("kube-apiserver", APISERVER_SANS, ca_cert, ca_key, CERT_VALIDITY_DAYS)
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    (pki / "ca.crt").write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    certs.write_private_key(pki / "ca.key", ca_key)
    (pki / "apiserver.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    certs.write_private_key(pki / "apiserver.key", key)
    certs.write_private_key(pki / "sa.key", sa_key)
    (pki / "sa.pub").write_bytes(
        sa_key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )


class _PortTaken(Exception):
    pass


class ControlPlane:
    """etcd + kube-apiserver on free 127.0.0.1 ports, with all state under ``state_dir``.

    ``start()`` always begins a fresh cluster (new certificates, tokens and etcd data). Files in
    ``state_dir``: ``pki/``, ``tokens.csv``, ``etcd-data/``, ``etcd.log``, ``kube-apiserver.log``,
    ``admin.kubeconfig``, ``operator.kubeconfig``. Use as a context manager or call ``stop()``;
    an ``atexit`` hook and PR_SET_PDEATHSIG (when started from the main thread) stop the
    processes if the caller cannot.

    Attributes set by ``start()``: ``server`` (``https://127.0.0.1:<port>``), ``ca_file``,
    ``admin_token``, ``operator_token``, ``admin_kubeconfig``, ``operator_kubeconfig``.
    """

    def __init__(
        self,
        state_dir: Path,
        *,
        binaries_dir: Path | None = None,
        start_timeout_s: float = DEFAULT_START_TIMEOUT_S,
        stop_grace_s: float = DEFAULT_STOP_GRACE_S,
        disable_admission_plugins: Iterable[str] = ("ServiceAccount",),
        detach: bool = False,
        extra_apiserver_args: Iterable[str] = (),
    ) -> None:
        self.state_dir = Path(state_dir).resolve()
        self.extra_apiserver_args = tuple(extra_apiserver_args)
        """Appended to kube-apiserver's command line (fault tests: ``--etcd-compaction-interval=10s``)."""
        self.disable_admission_plugins = tuple(disable_admission_plugins)
        """Passed to ``--disable-admission-plugins``. The default turns ``ServiceAccount`` off
        because without kube-controller-manager no ``default`` service account exists and the
        plugin would reject every pod; ``kimik3 dev up`` runs the controller-manager and passes ()."""
        self.detach = detach
        """True: the processes outlive this Python process (no parent-death signal, no atexit
        stop); ``kimik3 dev down`` stops them by their pidfiles. False (tests, demo): they die
        with the thread that started them."""
        self.binaries_dir = binaries_dir
        self.start_timeout_s = start_timeout_s
        self.stop_grace_s = stop_grace_s
        self.pki_dir = self.state_dir / "pki"
        self.ca_file = self.pki_dir / "ca.crt"
        self.etcd_log = self.state_dir / "etcd.log"
        self.apiserver_log = self.state_dir / "kube-apiserver.log"
        self.admin_kubeconfig = self.state_dir / "admin.kubeconfig"
        self.operator_kubeconfig = self.state_dir / "operator.kubeconfig"
        self.server = ""
        self.etcd_url = ""
        self.admin_token = ""
        self.operator_token = ""
        self.startup_seconds: float | None = None
        """Wall-clock seconds the last successful ``start()`` took (binaries to /readyz ok)."""
        self._etcd: subprocess.Popen[bytes] | None = None
        self._apiserver: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()

    # -- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> ControlPlane:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        """True while both processes are alive."""
        return all(p is not None and p.poll() is None for p in (self._etcd, self._apiserver))

    @property
    def pids(self) -> dict[str, int]:
        """Process ids of the started components (empty before ``start()``)."""
        out: dict[str, int] = {}
        if self._etcd is not None:
            out["etcd"] = self._etcd.pid
        if self._apiserver is not None:
            out["kube-apiserver"] = self._apiserver.pid
        return out

    def start(self) -> ControlPlane:
        """Start etcd, then kube-apiserver, wait for ``/readyz``, write the kubeconfigs.

        Raises ``MissingBinaryError`` if the binaries are not built, ``ControlPlaneError`` (naming
        the component, its log file and the log's last lines) if a component exits or the
        apiserver is not ready within ``start_timeout_s`` seconds.
        """
        with self._lock:
            if self._etcd is not None or self._apiserver is not None:
                raise ControlPlaneError("control plane already started")
            binaries = find_binaries(self.binaries_dir)
            t0 = time.monotonic()
            self.state_dir.mkdir(parents=True, exist_ok=True)
            _write_pki(self.pki_dir)
            self._write_tokens()
            if not self.detach:
                atexit.register(self.stop)
            try:
                for attempt in range(_START_ATTEMPTS):
                    try:
                        deadline = time.monotonic() + self.start_timeout_s
                        self._start_etcd(binaries["etcd"], deadline)
                        self._start_apiserver(binaries["kube-apiserver"], deadline)
                        break
                    except _PortTaken:
                        self._terminate_all()
                        if attempt == _START_ATTEMPTS - 1:
                            raise ControlPlaneError(
                                f"ports kept being taken by other processes ({_START_ATTEMPTS} attempts); "
                                f"see {self.etcd_log} and {self.apiserver_log}"
                            ) from None
                self._write_kubeconfigs()
            except BaseException:
                self._terminate_all()
                atexit.unregister(self.stop)
                raise
            self.startup_seconds = time.monotonic() - t0
        return self

    def stop(self) -> None:
        """Stop kube-apiserver, then etcd: SIGTERM, SIGKILL after ``stop_grace_s`` s. Idempotent."""
        with self._lock:
            self._terminate_all()
        atexit.unregister(self.stop)

    def _terminate_all(self) -> None:
        for attr in ("_apiserver", "_etcd"):
            proc: subprocess.Popen[bytes] | None = getattr(self, attr)
            if proc is None:
                continue
            if proc.poll() is None:
                try:
                    proc.send_signal(signal.SIGTERM)
                    proc.wait(timeout=self.stop_grace_s)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
                except ProcessLookupError:
                    pass
            setattr(self, attr, None)

    # -- faults (tests/chaos) ----------------------------------------------------------------

    def restart_apiserver(self) -> float:
        """SIGKILL kube-apiserver and start it again on the same port with the same etcd and
        certificates; returns once /readyz is ok. Returns the seconds it was unavailable."""
        with self._lock:
            if self._apiserver is None or self._etcd is None:
                raise ControlPlaneError("control plane not started")
            t0 = time.monotonic()
            self._apiserver.kill()
            self._apiserver.wait()
            port = int(self.server.rsplit(":", 1)[1])
            binary = find_binaries(self.binaries_dir)["kube-apiserver"]
            deadline = time.monotonic() + self.start_timeout_s
            while True:  # the port can stay busy for a moment after the kill
                try:
                    self._apiserver = self._spawn(self._apiserver_argv(binary, port), self.apiserver_log,
                                                  signal.SIGKILL)
                    self._wait_apiserver_ready(deadline)
                    break
                except _PortTaken:
                    if time.monotonic() > deadline:
                        raise ControlPlaneError(f"port {port} stayed taken after the apiserver was killed") from None
                    time.sleep(0.5)
            return time.monotonic() - t0

    def pause_etcd(self) -> None:
        """SIGSTOP etcd (a hung store: connections stay open, nothing answers)."""
        if self._etcd is None:
            raise ControlPlaneError("control plane not started")
        self._etcd.send_signal(signal.SIGSTOP)

    def resume_etcd(self) -> None:
        """SIGCONT etcd after ``pause_etcd()``."""
        if self._etcd is None:
            raise ControlPlaneError("control plane not started")
        self._etcd.send_signal(signal.SIGCONT)

    # -- processes ---------------------------------------------------------------------------

    def _spawn(self, argv: list[str], log_path: Path, parent_death_signal: int) -> subprocess.Popen[bytes]:
        preexec = None
        if not self.detach and threading.current_thread() is threading.main_thread():
            preexec = functools.partial(_die_with_parent, parent_death_signal)
        with open(log_path, "wb") as log:
            return subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.state_dir,
                start_new_session=True,  # a terminal's Ctrl-C reaches us, and we stop them in order
                preexec_fn=preexec,
            )

    def _failure(self, component: str, log_path: Path, what: str) -> Exception:
        tail = log_tail(log_path, LOG_TAIL_LINES)
        if "address already in use" in tail:
            return _PortTaken()
        return ControlPlaneError(f"{component} {what}; log: {log_path}\n--- last lines ---\n{tail}")

    def _start_etcd(self, binary: Path, deadline: float) -> None:
        client_port, peer_port = free_port(), free_port()
        self.etcd_url = f"http://127.0.0.1:{client_port}"
        peer_url = f"http://127.0.0.1:{peer_port}"
        data_dir = self.state_dir / "etcd-data"
        if data_dir.exists():
            shutil.rmtree(data_dir)
        argv = [
            str(binary),
            "--name=kimik3-dev",
            f"--data-dir={data_dir}",
            f"--listen-client-urls={self.etcd_url}",
            f"--advertise-client-urls={self.etcd_url}",
            f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=kimik3-dev={peer_url}",
            "--initial-cluster-state=new",
            "--unsafe-no-fsync",  # test data: skip fsync, as envtest/kind do
            "--log-level=warn",
        ]
        self._etcd = self._spawn(argv, self.etcd_log, signal.SIGTERM)
        while True:
            if self._etcd.poll() is not None:
                raise self._failure("etcd", self.etcd_log, f"exited with code {self._etcd.returncode} during start")
            try:
                with urllib.request.urlopen(f"{self.etcd_url}/health", timeout=2) as resp:
                    if json.loads(resp.read()).get("health") == "true":
                        return
            except (OSError, ValueError):
                pass
            if time.monotonic() > deadline:
                raise self._failure("etcd", self.etcd_log, f"not healthy within {self.start_timeout_s:.0f} s")
            time.sleep(0.1)

    def _apiserver_argv(self, binary: Path, port: int) -> list[str]:
        pki = self.pki_dir
        return [
            str(binary),
            f"--etcd-servers={self.etcd_url}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={port}",
            f"--cert-dir={pki}",
            f"--tls-cert-file={pki / 'apiserver.crt'}",
            f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={pki / 'ca.crt'}",
            "--authorization-mode=RBAC",
            f"--token-auth-file={self.state_dir / 'tokens.csv'}",
            f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
            "--allow-privileged=true",
            "--endpoint-reconciler-type=none",
            "--enable-priority-and-fairness=false",
            *([f"--disable-admission-plugins={','.join(self.disable_admission_plugins)}"]
              if self.disable_admission_plugins else []),
            "--profiling=false",
            *self.extra_apiserver_args,
        ]

    def _start_apiserver(self, binary: Path, deadline: float) -> None:
        port = free_port()
        self.server = f"https://127.0.0.1:{port}"
        # SIGKILL if we die: a SIGTERMed apiserver whose etcd is gone too drains for ~10 s.
        self._apiserver = self._spawn(self._apiserver_argv(binary, port), self.apiserver_log, signal.SIGKILL)
        self._wait_apiserver_ready(deadline)

    def _wait_apiserver_ready(self, deadline: float) -> None:
        assert self._apiserver is not None
        ctx = ssl.create_default_context(cafile=str(self.ca_file))
        request = urllib.request.Request(
            f"{self.server}/readyz", headers={"Authorization": f"Bearer {self.admin_token}"}
        )
        last = "no answer yet"
        while True:
            if self._apiserver.poll() is not None:
                raise self._failure(
                    "kube-apiserver", self.apiserver_log, f"exited with code {self._apiserver.returncode} during start"
                )
            if self._etcd is None or self._etcd.poll() is not None:
                raise self._failure("etcd", self.etcd_log, "exited while kube-apiserver was starting")
            try:
                with urllib.request.urlopen(request, timeout=5, context=ctx) as resp:
                    if resp.status == 200:
                        return
            except urllib.error.HTTPError as exc:
                last = f"HTTP {exc.code}: {exc.read().decode('utf-8', 'replace')[-2000:]}"
            except (OSError, ssl.SSLError) as exc:
                last = str(exc)
            if time.monotonic() > deadline:
                raise self._failure(
                    "kube-apiserver",
                    self.apiserver_log,
                    f"not ready within {self.start_timeout_s:.0f} s (last /readyz answer: {last})",
                )
            time.sleep(0.25)

    # -- identities --------------------------------------------------------------------------

    def _write_tokens(self) -> None:
        self.admin_token = secrets.token_urlsafe(32)
        self.operator_token = secrets.token_urlsafe(32)
        rows = [
            (self.admin_token, ADMIN_USER, ADMIN_USER, ADMIN_GROUPS),
            (self.operator_token, OPERATOR_USER, f"{OPERATOR_SERVICE_ACCOUNT}-uid", OPERATOR_GROUPS),
        ]
        # Static token file format: token,user,uid,"group1,group2"
        text = "".join(f'{tok},{user},{uid},"{",".join(groups)}"\n' for tok, user, uid, groups in rows)
        certs.write_private(self.state_dir / "tokens.csv", text.encode())

    def _write_kubeconfigs(self) -> None:
        for path, user, token in (
            (self.admin_kubeconfig, "admin", self.admin_token),
            (self.operator_kubeconfig, "kimik3-operator", self.operator_token),
        ):
            config = {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {"name": "kimik3-dev", "cluster": {"server": self.server, "certificate-authority": str(self.ca_file)}}
                ],
                "users": [{"name": user, "user": {"token": token}}],
                "contexts": [{"name": f"{user}@kimik3-dev", "context": {"cluster": "kimik3-dev", "user": user}}],
                "current-context": f"{user}@kimik3-dev",
                "preferences": {},
            }
            certs.write_private(path, dump_yaml(config).encode())

    def api_client(self, identity: str = "admin") -> Any:
        """A ``kubernetes.client.ApiClient`` for ``identity`` ("admin" or "operator"), built from
        the kubeconfig file this control plane wrote."""
        from kubernetes import config as k8s_config

        paths = {"admin": self.admin_kubeconfig, "operator": self.operator_kubeconfig}
        if identity not in paths:
            raise ValueError(f"identity must be one of {sorted(paths)}, not {identity!r}")
        if not self.server:
            raise ControlPlaneError("control plane not started")
        return k8s_config.new_client_from_config(config_file=str(paths[identity]))

    # -- CRDs --------------------------------------------------------------------------------

    def apply_crds(
        self,
        paths_or_docs: Iterable[Path | str | Mapping[str, Any]],
        *,
        timeout_s: float = DEFAULT_CRD_TIMEOUT_S,
    ) -> list[str]:
        """Server-side apply CustomResourceDefinitions as admin and wait until each is Established.

        ``paths_or_docs`` holds YAML files (every document in them must be a CRD) and/or already
        parsed CRD dicts. Server-side apply stores no last-applied annotation, so CRDs larger
        than the 256 KiB annotation limit (LeaderWorkerSet's is 1.3 MB) apply fine. Returns the
        CRD names; raises ``ControlPlaneError`` if one is not Established within ``timeout_s``.
        """
        docs: list[Mapping[str, Any]] = []
        for item in paths_or_docs:
            if isinstance(item, Mapping):
                docs.append(item)
            else:
                docs.extend(load_yaml_documents(Path(item)))
        for doc in docs:
            if doc.get("kind") != "CustomResourceDefinition" or doc.get("apiVersion") != "apiextensions.k8s.io/v1":
                raise ControlPlaneError(
                    f"apply_crds takes apiextensions.k8s.io/v1 CustomResourceDefinitions only, got "
                    f"{doc.get('apiVersion')}/{doc.get('kind')} {doc.get('metadata', {}).get('name')!r}"
                )
        names = [str(doc["metadata"]["name"]) for doc in docs]
        crds = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
        with self.api_client("admin") as api_client:
            kube = Kube(api_client)
            for name, doc in zip(names, docs):
                # JSON, not the client's models (no model parsing of a 1.3 MB object); non-2xx raises ApiError.
                kube.request("PATCH", f"{crds}/{name}", dict(doc), [("fieldManager", FIELD_MANAGER), ("force", "true")],
                             "application/apply-patch+yaml")
            deadline = time.monotonic() + timeout_s
            pending = list(names)
            while pending:
                pending = [n for n in pending if not is_true(kube.request("GET", f"{crds}/{n}"), "Established")]
                if pending and time.monotonic() > deadline:
                    raise ControlPlaneError(f"CRDs not Established within {timeout_s:.0f} s: {', '.join(pending)}")
                if pending:
                    time.sleep(0.2)
        return names
