"""The operator's identity as the Helm chart defines it, on a cluster the chart is not installed in.

``kimik3 dev up`` and the fault-injection suite (``tests/chaos``) run the operator as the chart's
ServiceAccount with the chart's RBAC, not as admin. ``install_operator_identity`` does it:

1. renders ``charts/kimik3-operator`` with the real ``helm template`` (``HELM_VERSION`` of ``kimik3_dev.versions``,
   built by ``tools/build-binaries.sh helm``) as release ``kimik3-operator`` in ``kimik3-system`` -- the
   release the chart tests install -- and keeps its ServiceAccount, ClusterRole(s),
   ClusterRoleBinding(s), Role(s) and RoleBinding(s), exactly as rendered (no copy of the rules
   lives anywhere else);
2. creates the namespace and server-side applies those objects as the caller (an admin client);
3. asks the TokenRequest API for a token of that ServiceAccount (default lifetime 24 h; the
   apiserver of ``ControlPlane`` signs and verifies them with ``--service-account-signing-key-file``
   / ``--service-account-key-file``);
4. writes a kubeconfig for the token (the caller's server, its CA embedded), checks with a
   SelfSubjectReview that the API server sees ``system:serviceaccount:kimik3-system:kimik3-operator``
   and waits until every rendered rule is in force (SelfSubjectAccessReviews, bounded).

The chart tests use the same rendering (``render_chart``), token and kubeconfig code.
"""

from __future__ import annotations

import base64
import os
import subprocess
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes import config as k8s_config

from kimik3.api.documents import dump_yaml
from kimik3.controller.kube import Kube
from kimik3_dev.devcluster.controlplane import OPERATOR_NAMESPACE, OPERATOR_SERVICE_ACCOUNT, bin_dir
from kimik3_dev.versions import HELM_VERSION, KUBERNETES_VERSION

__all__ = [
    "CHART_DIR",
    "HELM_KUBE_VERSION",
    "RBAC_KINDS",
    "RELEASE",
    "RELEASE_NAMESPACE",
    "TOKEN_LIFETIME_S",
    "HelmMissingError",
    "OperatorIdentity",
    "chart_rbac",
    "helm_binary",
    "helm_env",
    "install_operator_identity",
    "render_chart",
    "request_token",
    "whoami",
    "write_token_kubeconfig",
]

REPO_ROOT = Path(__file__).resolve().parents[3]
CHART_DIR = REPO_ROOT / "charts" / "kimik3-operator"
HELM_KUBE_VERSION = KUBERNETES_VERSION.removeprefix("v")
"""``--kube-version`` for ``helm template`` (a ``go install``ed helm defaults to v1.20.0, below the
chart's ``kubeVersion: >=1.34``)."""
RELEASE = OPERATOR_SERVICE_ACCOUNT
"""Release name; the chart names its ServiceAccount after it (``kimik3-operator``)."""
RELEASE_NAMESPACE = OPERATOR_NAMESPACE
RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
"""Kinds of the rendered chart that make up the operator's identity and permissions."""
TOKEN_LIFETIME_S = 24 * 3600
"""Lifetime asked of the TokenRequest API, seconds: a dev cluster older than this needs a new
``kimik3 dev up`` (the operator's requests are then refused with 401)."""
HELM_TIMEOUT_S = 60.0
"""Bound on one ``helm template`` run, seconds (~0.2 s measured here)."""
AUTHORIZED_TIMEOUT_S = 30.0
"""Bound on waiting for freshly applied RBAC to be in force, seconds (the authorizer's informers
see a new binding within a second)."""
FIELD_MANAGER = "kimik3-devcluster"

_PATHS = {  # kind -> (API prefix, plural, namespaced)
    "Namespace": ("/api/v1", "namespaces", False),
    "ServiceAccount": ("/api/v1", "serviceaccounts", True),
    "ClusterRole": ("/apis/rbac.authorization.k8s.io/v1", "clusterroles", False),
    "ClusterRoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "clusterrolebindings", False),
    "Role": ("/apis/rbac.authorization.k8s.io/v1", "roles", True),
    "RoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "rolebindings", True),
}


class HelmMissingError(RuntimeError):
    """helm has not been built into ``bin_dir()``; the message names the command that builds it."""


def helm_binary(directory: Path | None = None) -> Path:
    """Path of ``helm-<HELM_VERSION>`` in ``directory`` (default ``bin_dir()``: ``$KIMIK3_BIN_DIR`` or
    ``~/.cache/kimik3/bin``). Raises ``HelmMissingError`` naming ``tools/build-binaries.sh helm``
    when it is absent or not executable."""
    path = (directory or bin_dir()) / f"helm-{HELM_VERSION}"
    if not os.access(path, os.X_OK):
        raise HelmMissingError(
            f"helm {HELM_VERSION} not found at {path}: build it once with `tools/build-binaries.sh helm` "
            f"(tools/env.sh, sourced by tools/kimik3 and tools/test, does it; set KIMIK3_BIN_DIR for another directory)")
    return path


def helm_env(home: Path) -> dict[str, str]:
    """The environment for helm with its cache, config and data directories under ``home``
    (nothing written under ``~``)."""
    return {**os.environ, "HELM_CACHE_HOME": str(home / "cache"), "HELM_CONFIG_HOME": str(home / "config"),
            "HELM_DATA_HOME": str(home / "data")}


def render_chart(*helm_args: str, chart: Path = CHART_DIR, helm_home: Path | None = None,
                 release: str = RELEASE, namespace: str = RELEASE_NAMESPACE) -> list[dict[str, Any]]:
    """``helm template <release> <chart> --namespace <namespace> --kube-version 1.35.4 <helm_args>``:
    the rendered documents, in order, empty ones dropped. ``helm_args`` are extra flags, e.g.
    ``("--set", "watchNamespaces={a,b}")``. ``helm_home`` holds helm's own directories (default: a
    temporary one). Raises ``HelmMissingError`` without helm, ``RuntimeError`` (with helm's output)
    when helm exits non-zero or takes over ``HELM_TIMEOUT_S`` seconds."""
    binary = helm_binary()
    argv = [str(binary), "template", release, str(chart), "--namespace", namespace,
            "--kube-version", HELM_KUBE_VERSION, *helm_args]
    with tempfile.TemporaryDirectory(prefix="kimik3-helm-") as tmp:
        home = helm_home or Path(tmp)
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, env=helm_env(home), timeout=HELM_TIMEOUT_S,
                                  check=False, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as exc:
            raise RuntimeError(f"{' '.join(argv)} took over {HELM_TIMEOUT_S:g} s") from exc
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def chart_rbac(*helm_args: str) -> list[dict[str, Any]]:
    """The ServiceAccount and RBAC documents (``RBAC_KINDS``) of ``render_chart(*helm_args)``, in
    rendered order, each with ``metadata.namespace`` set when its kind is namespaced. Raises
    ``RuntimeError`` when the rendering has no ServiceAccount (``serviceAccount.create=false``)."""
    docs = [d for d in render_chart(*helm_args) if d.get("kind") in RBAC_KINDS]
    for doc in docs:
        if _PATHS[doc["kind"]][2]:
            doc["metadata"].setdefault("namespace", RELEASE_NAMESPACE)
    if not any(d["kind"] == "ServiceAccount" for d in docs):
        raise RuntimeError(f"the chart rendered no ServiceAccount with {list(helm_args)}")
    return docs


def _object_path(doc: dict[str, Any]) -> str:
    prefix, plural, namespaced = _PATHS[doc["kind"]]
    meta = doc["metadata"]
    ns = f"/namespaces/{meta['namespace']}" if namespaced else ""
    return f"{prefix}{ns}/{plural}/{meta['name']}"


def _label(doc: dict[str, Any]) -> str:
    meta = doc["metadata"]
    return "/".join([doc["kind"], *([meta["namespace"]] if meta.get("namespace") else []), meta["name"]])


def request_token(api: client.ApiClient, namespace: str, service_account: str,
                  lifetime_s: int = TOKEN_LIFETIME_S) -> tuple[str, str]:
    """A token of ServiceAccount ``namespace/service_account`` from the TokenRequest API, valid for
    ``lifetime_s`` seconds (the API server's minimum is 600) for the API server's default
    audiences. Returns (token, expirationTimestamp in RFC 3339). ``ApiError`` when refused
    (404: no such ServiceAccount)."""
    answer = Kube(api).request("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{service_account}/token",
                               {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                                "spec": {"expirationSeconds": int(lifetime_s)}})
    return answer["status"]["token"], answer["status"]["expirationTimestamp"]


def write_token_kubeconfig(path: Path, server: str, ca_file: Path | str, user: str, token: str) -> Path:
    """Write (mode 0600) a kubeconfig for bearer ``token`` on ``server`` (``https://host:port``), the
    CA of ``ca_file`` embedded as ``certificate-authority-data``, one context named ``user``.
    Returns ``path``."""
    ca_data = base64.b64encode(Path(ca_file).read_bytes()).decode()
    config = {
        "apiVersion": "v1", "kind": "Config", "current-context": user, "preferences": {},
        "clusters": [{"name": "kimik3", "cluster": {"server": server, "certificate-authority-data": ca_data}}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": user, "context": {"cluster": "kimik3", "user": user}}],
    }
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(dump_yaml(config))
    return path


def whoami(api: client.ApiClient) -> dict[str, Any]:
    """Who the API server authenticates ``api``'s credentials as (a SelfSubjectReview,
    authentication.k8s.io/v1): its ``userInfo``, ``{"username": str, "uid": str, "groups": [str],
    "extra": {str: [str]}}``. A TokenRequest token of a ServiceAccount has the ServiceAccount
    object's UID as ``uid`` and ``extra["authentication.kubernetes.io/credential-id"] == ["JTI=..."]``."""
    review = Kube(api).request("POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews",
                               {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
    info = review["status"]["userInfo"]
    return {"username": info["username"], "uid": info.get("uid", ""), "groups": list(info.get("groups") or []),
            "extra": dict(info.get("extra") or {})}


def _denied(api: client.ApiClient, checks: Iterable[dict[str, str]]) -> list[dict[str, str]]:
    out = []
    for attrs in checks:
        review = Kube(api).request("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
                                   {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                                    "spec": {"resourceAttributes": attrs}})
        if not (review.get("status") or {}).get("allowed"):
            out.append(attrs)
    return out


def _granted(docs: Sequence[dict[str, Any]]) -> list[dict[str, str]]:
    """Resource attributes of every (rule, verb, resource name) the rendered roles grant, in the
    namespace where they apply (a ClusterRole's bound cluster-wide is probed in the release namespace)."""
    out = []
    for doc in docs:
        if doc["kind"] not in ("ClusterRole", "Role"):
            continue
        namespace = doc["metadata"].get("namespace") or RELEASE_NAMESPACE
        for rule in doc.get("rules") or []:
            for group in rule.get("apiGroups") or [""]:
                for resource in rule.get("resources") or []:
                    plural, _, sub = resource.partition("/")
                    for verb in rule.get("verbs") or []:
                        for name in rule.get("resourceNames") or [None]:
                            out.append({"namespace": namespace, "group": group, "resource": plural,
                                        "subresource": sub, "verb": verb, **({"name": name} if name else {})})
    return out


@dataclass(frozen=True)
class OperatorIdentity:
    """The operator's identity as installed by ``install_operator_identity``."""

    user: str
    """Username the API server authenticates the token as (SelfSubjectReview), e.g.
    ``system:serviceaccount:kimik3-system:kimik3-operator``."""
    uid: str
    """The ServiceAccount object's ``metadata.uid``, which the token authenticates with."""
    groups: tuple[str, ...]
    kubeconfig: Path
    """Kubeconfig with the token (mode 0600), the admin's server and CA."""
    expires: str
    """When the token stops working (RFC 3339, from the TokenRequest answer)."""
    objects: tuple[str, ...]
    """What was applied, ``Kind/[namespace/]name`` in order, e.g. ``ClusterRole/kimik3-operator``."""

    def as_state(self) -> dict[str, Any]:
        """JSON-ready form (``cluster.json``'s ``operator_identity``)."""
        return {"user": self.user, "uid": self.uid, "groups": list(self.groups), "kubeconfig": str(self.kubeconfig),
                "token_expires": self.expires, "rbac": list(self.objects),
                "source": f"helm template {RELEASE} {CHART_DIR.relative_to(REPO_ROOT)} -n {RELEASE_NAMESPACE}"}


def install_operator_identity(api: client.ApiClient, kubeconfig: Path, *, helm_args: Sequence[str] = (),
                              lifetime_s: int = TOKEN_LIFETIME_S,
                              timeout_s: float = AUTHORIZED_TIMEOUT_S) -> OperatorIdentity:
    """Install the chart's ServiceAccount and RBAC with ``api`` (an admin ``ApiClient``: it must be
    allowed to create namespaces and RBAC), mint a token of that ServiceAccount for ``lifetime_s``
    seconds and write a kubeconfig for it to ``kubeconfig`` (server and CA those of ``api``).
    ``helm_args`` go to ``helm template`` (e.g. ``--set watchNamespaces={a}``). Idempotent:
    applying again keeps the objects and mints a new token.

    Returns once the API server authenticates the token as the chart's ServiceAccount and grants
    every rendered rule (bounded by ``timeout_s`` seconds, else ``RuntimeError`` naming what is
    still denied). Raises ``HelmMissingError`` without helm, ``RuntimeError`` when helm fails or
    the identity is not the ServiceAccount's, ``ApiError`` when the API server refuses a
    write."""
    docs = chart_rbac(*helm_args)
    (sa,) = [d for d in docs if d["kind"] == "ServiceAccount"]
    sa_namespace, sa_name = sa["metadata"]["namespace"], sa["metadata"]["name"]
    query = [("fieldManager", FIELD_MANAGER), ("fieldValidation", "Strict"), ("force", "true")]
    namespaces = dict.fromkeys([sa_namespace, *(d["metadata"]["namespace"] for d in docs if _PATHS[d["kind"]][2])])
    kube = Kube(api)
    for ns in namespaces:
        kube.request("PATCH", f"/api/v1/namespaces/{ns}", {"apiVersion": "v1", "kind": "Namespace",
                                                           "metadata": {"name": ns}},
                     query, "application/apply-patch+yaml")
    applied = {_label(doc): kube.request("PATCH", _object_path(doc), doc, query, "application/apply-patch+yaml")
               for doc in docs}
    sa_uid = applied[_label(sa)]["metadata"]["uid"]

    token, expires = request_token(api, sa_namespace, sa_name, lifetime_s)
    user = f"system:serviceaccount:{sa_namespace}:{sa_name}"
    ca_file = api.configuration.ssl_ca_cert
    if not ca_file:
        raise RuntimeError("the admin client has no CA file: cannot write a verifying kubeconfig")
    path = write_token_kubeconfig(kubeconfig, api.configuration.host, ca_file, user, token)

    with k8s_config.new_client_from_config(config_file=str(path)) as op_api:
        seen = whoami(op_api)
        if (seen["username"], seen["uid"]) != (user, sa_uid):
            raise RuntimeError(f"the token of {sa_namespace}/{sa_name} authenticates as {seen['username']!r} "
                               f"(uid {seen['uid']!r}), not {user!r} (uid {sa_uid!r})")
        checks = _granted(docs)
        deadline = time.monotonic() + timeout_s
        while True:
            denied = _denied(op_api, checks)
            if not denied:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{user}: still denied after {timeout_s:g} s: {denied}")
            checks = denied
            time.sleep(0.2)
    return OperatorIdentity(user=user, uid=sa_uid, groups=tuple(seen["groups"]), kubeconfig=path, expires=expires,
                            objects=tuple(_label(d) for d in docs))
