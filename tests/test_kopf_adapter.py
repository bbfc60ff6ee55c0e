"""kopf at arm's length (controller/kopfadapter.py): what the adapter relies on in kopf's private
modules is checked here, so that a kopf upgrade that changes it fails by name instead of quietly
breaking the late-API handling; the adapter's watch replacement stays narrow; and no other module
imports kopf's private modules (the import contract in pyproject.toml).

No API server: the behaviour against a real kube-apiserver is proved by tests/test_late_apis.py.
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import importlib
import inspect
import os
import pkgutil
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import kopf
import pytest

REPO = Path(__file__).resolve().parents[1]
ADAPTER = "operator/kimik3/controller/kopfadapter.py"

WATCHING = "kopf._cogs.clients.watching"
ERRORS = "kopf._cogs.clients.errors"
REFERENCES = "kopf._cogs.structs.references"
OBSERVATION = "kopf._core.reactor.observation"
QUEUEING = "kopf._core.reactor.queueing"


def _get(dotted: str) -> Any:
    module, _, attr = dotted.rpartition(".")
    return getattr(importlib.import_module(module), attr)


def _takes(fn: Callable[..., Any], names: set[str]) -> str | None:
    """None if ``fn`` takes each of ``names`` by keyword and needs no other argument; else why not."""
    params = inspect.signature(fn).parameters
    missing = sorted(n for n in names if n not in params or params[n].kind not in
                     (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD))
    required = sorted(n for n, p in params.items() if n not in names and p.default is inspect.Parameter.empty
                      and p.kind not in (inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL))
    lost = [f"no keyword {missing}"] if missing else []
    lost += [f"new required {required}"] if required else []
    return f"signature is now {inspect.signature(fn)} ({'; '.join(lost)})" if lost else None


def _infinite_watch() -> str | None:
    fn = _get(f"{WATCHING}.infinite_watch")
    if not inspect.isasyncgenfunction(fn):
        return f"is no longer an async generator function: {fn!r}"
    params = inspect.signature(fn).parameters
    if any(p.kind is not inspect.Parameter.KEYWORD_ONLY for p in params.values()):
        return f"takes positional arguments now: {inspect.signature(fn)}"
    return None if "resource" in params else f"has no keyword 'resource': {inspect.signature(fn)}"


def _watcher_calls_through_the_module() -> str | None:
    queueing, watching = importlib.import_module(QUEUEING), importlib.import_module(WATCHING)
    if getattr(queueing, "watching", None) is not watching:
        return f"{QUEUEING} no longer imports {WATCHING} as 'watching'"
    if "infinite_watch" not in queueing.watcher.__code__.co_names:
        return f"{QUEUEING}.watcher no longer looks up 'infinite_watch' on the module"
    return None


def _nobody_holds_the_function() -> str | None:
    """A module that imported ``infinite_watch`` by name would call kopf's own, past the adapter."""
    for info in pkgutil.walk_packages(kopf.__path__, "kopf."):
        try:
            importlib.import_module(info.name)
        except ImportError:  # an optional extra (webhook tunnels) not installed
            continue
    original = importlib.import_module(WATCHING).infinite_watch
    holders = sorted(name for name, module in sys.modules.items() if name.startswith("kopf") and name != WATCHING
                     and any(value is original for value in vars(module).values()))
    return f"imported by name in {holders}: those calls would not reach the adapter" if holders else None


def _not_found_error() -> str | None:
    errors = importlib.import_module(ERRORS)
    cls = getattr(errors, "APINotFoundError", None)
    if not (isinstance(cls, type) and issubclass(cls, errors.APIError)):
        return f"APINotFoundError is not an APIError class any more: {cls!r}"
    return None


def _insights() -> str | None:
    references = importlib.import_module(REFERENCES)
    if kopf.Resource is not references.Resource:
        return f"kopf.Resource is not {REFERENCES}.Resource any more"
    fields = {"group", "plural"} - set(inspect.signature(references.Resource).parameters)
    if fields:
        return f"kopf.Resource has no {sorted(fields)}"
    insights = references.Insights()
    if not isinstance(getattr(insights, "watched_resources", None), set):
        return f"Insights() has no set 'watched_resources' (attributes: {sorted(vars(insights))})"
    problem = _takes(kopf.operator, {"insights"})
    return f"kopf.operator: {problem}" if problem else None


def _rescan() -> str | None:
    fn = _get(f"{OBSERVATION}.process_discovered_resource_event")
    if not inspect.iscoroutinefunction(fn):
        return f"is no longer a coroutine function: {fn!r}"
    return _takes(fn, {"raw_event", "settings", "registry", "insights"})


RELIED_ON: dict[str, tuple[str, Callable[[], str | None]]] = {
    f"{WATCHING}.infinite_watch": (
        "replaced while an operator runs; called with the watcher's keywords (resource among them)", _infinite_watch),
    f"{QUEUEING}.watcher": (
        "finds the replacement: it calls watching.infinite_watch through the module",
        _watcher_calls_through_the_module),
    "kopf.* module globals": ("no module keeps its own reference to kopf's infinite_watch", _nobody_holds_the_function),
    f"{ERRORS}.APINotFoundError": ("what a watch of a kind no longer served raises (404), caught", _not_found_error),
    f"{REFERENCES}.Insights": (
        "given to kopf.operator(insights=); its watched_resources (kopf.Resource) tell what kopf watches", _insights),
    f"{OBSERVATION}.process_discovered_resource_event": (
        "re-scans one group's discovery (rescan_group) with raw_event, settings, registry, insights", _rescan),
}


@pytest.mark.parametrize("name", RELIED_ON)
def test_what_the_adapter_relies_on_is_still_there(name: str) -> None:
    why, check = RELIED_ON[name]
    problem = check()
    assert problem is None, (f"kopf {kopf.__version__} changed {name}: {problem}. {ADAPTER} relies on it: {why}. "
                             f"Rework the adapter (its docstring lists what it needs) before upgrading kopf.")


BEHAVIOUR = {
    f"{WATCHING}.infinite_watch": (
        "624e1e72b2c38dde", "ends only by raising; a 404 of its list or watch request is raised as APINotFoundError"),
    f"{ERRORS}.check_response": ("164dde30443ddc9c", "a 404 response raises APINotFoundError"),
    f"{QUEUEING}.watcher": (
        "16656c04aad54718", "stream = watching.infinite_watch(settings=, resource=, namespace=, operator_paused=), "
        "read with async for; an error out of it ends the watcher"),
    f"{OBSERVATION}.process_discovered_resource_event": (
        "77f50edd53c15698", "skips type None; re-scans raw_event['object']['spec']['group'] and revises "
        "insights.watched_resources, which starts the watches"),
}
"""The source of the kopf functions whose behaviour (not only shape) the adapter relies on, as read
in kopf==1.45.2: ``(sha256 of inspect.getsource, first 16 hex digits; what it does)``."""


@pytest.mark.parametrize("name", BEHAVIOUR)
def test_the_behaviour_the_adapter_relies_on_is_the_one_read(name: str) -> None:
    digest, behaviour = BEHAVIOUR[name]
    now = hashlib.sha256(inspect.getsource(_get(name)).encode()).hexdigest()[:16]
    assert now == digest, (f"kopf {kopf.__version__} changed the source of {name} ({now}, read at {digest}). "
                           f"{ADAPTER} relies on it: {behaviour}. Re-read it; if that still holds, update "
                           f"its digest here, else rework the adapter.")


def _watch_module() -> Any:
    return importlib.import_module(WATCHING)


def test_the_watch_function_is_replaced_only_while_an_operator_runs() -> None:
    """Replaced at the first operator's start, kopf's own put back when the last one stops."""
    from kimik3.controller.kopfadapter import unserved_kinds_waited_out

    watching = _watch_module()
    kopfs = watching.infinite_watch
    with unserved_kinds_waited_out([("gateway.networking.k8s.io", "httproutes")], 5.0, lambda g, p: None):
        assert watching.infinite_watch is not kopfs
        with unserved_kinds_waited_out([("monitoring.coreos.com", "podmonitors")], 5.0, lambda g, p: None):
            pass
        assert watching.infinite_watch is not kopfs, "still replaced: the first operator runs"
    assert watching.infinite_watch is kopfs


def test_kinds_not_named_and_other_operators_get_kopfs_own_watch() -> None:
    """While replaced, a kind the operator did not name, and any kind of a watch started outside
    it (another operator in the process), get kopf's own generator, not a wrapper."""
    from kimik3.controller.kopfadapter import unserved_kinds_waited_out

    watching = _watch_module()
    kopfs_code = watching.infinite_watch.__code__
    route = kopf.Resource("gateway.networking.k8s.io", "v1", "httproutes", namespaced=True)
    pods = kopf.Resource("", "v1", "pods", namespaced=True)

    def code(resource: kopf.Resource) -> Any:
        stream = watching.infinite_watch(settings=kopf.OperatorSettings(), resource=resource, namespace=None)
        try:
            return stream.ag_code
        finally:
            asyncio.run(stream.aclose())

    with unserved_kinds_waited_out([(route.group, route.plural)], 5.0, lambda g, p: None):
        assert code(pods) is kopfs_code
        assert code(route) is not kopfs_code
        assert contextvars.Context().run(code, route) is kopfs_code


def test_a_404_is_waited_out_and_served_again_is_told(monkeypatch: pytest.MonkeyPatch) -> None:
    """kopf's watch is stood in for by one that raises kopf's 404 error twice, then lists: the
    replacement passes the events on, asks again each period and tells ``served_again`` once."""
    from kimik3.controller.kopfadapter import unserved_kinds_waited_out

    errors, watching = importlib.import_module(ERRORS), _watch_module()
    calls: list[str] = []

    async def kopfs_watch(*, settings: Any, resource: kopf.Resource, namespace: Any) -> AsyncIterator[str]:
        calls.append(resource.plural)
        if len(calls) <= 2:
            raise errors.APINotFoundError("404 page not found", status=404, headers={})
        yield "listed"
        yield "added"

    monkeypatch.setattr(watching, "infinite_watch", kopfs_watch)
    told: list[tuple[str, str]] = []
    route = kopf.Resource("gateway.networking.k8s.io", "v1", "httproutes", namespaced=True)

    async def run() -> list[str]:
        stream = watching.infinite_watch(settings=kopf.OperatorSettings(), resource=route, namespace=None)
        return [event async for event in stream]

    with unserved_kinds_waited_out([(route.group, route.plural)], 0.01, lambda g, p: told.append((g, p))):
        events = asyncio.run(run())
    assert (events, calls, told) == (["listed", "added"], ["httproutes"] * 3, [(route.group, route.plural)])
    assert watching.infinite_watch is kopfs_watch


@pytest.mark.tier("process")  # lint-imports on a copied tree
def test_no_other_module_may_import_kopfs_private_modules(tmp_path: Path) -> None:
    """The import contract is not vacuous: a controller module (or a kit module) importing
    ``kopf._cogs`` or ``kopf._core`` breaks it; kopf's public ``kopf`` stays open to all."""
    tree = tmp_path / "operator"
    subprocess.run(["cp", "-r", str(REPO / "operator"), str(tree)], check=True)
    (tree / "kimik3" / "controller" / "sneaky.py").write_text(
        "import kopf\nfrom kopf._cogs.structs.references import Insights\n")
    (tree / "kimik3_dev" / "sneaky.py").write_text("from kopf._core.reactor import observation\n")
    (tmp_path / "pyproject.toml").write_text((REPO / "pyproject.toml").read_text())
    env = {**os.environ, "PYTHONPATH": str(tree)}
    result = subprocess.run([str(Path(sys.executable).parent / "lint-imports"), "--no-cache"], cwd=tmp_path,
                            env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 1, result.stdout
    assert "kimik3.controller.sneaky -> kopf._cogs.structs.references" in result.stdout
    assert "kimik3_dev.sneaky -> kopf._core.reactor.observation" in result.stdout
    assert "kimik3.controller.kopfadapter ->" not in result.stdout
