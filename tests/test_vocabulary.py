"""The operator's vocabulary is declared once (issue 22), and these tests read the source to keep it so:

- every Event reason the core posts is an ``EventReason`` (``kimik3.api.conditions``), never a
  string: the reason of ``event``/``_event_once`` calls, of ``Event`` and the
  autoscaler's ``Decision``, and of ``("Normal" | "Warning", reason, message)`` tuples, directly
  or through a local name;
- RFC 3339 times are formatted and parsed by ``kimik3.kube.times`` alone (core, kit, bench, tests);
- the engine LeaderWorkerSet's name ``<deployment>-engine`` is spelled by
  ``kimik3.render.meta.engine_set_name`` alone.
A finding names file:line.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

from kimik3.api.conditions import REASONS, ConditionType, EventReason, Reason, event_reason

REPO = Path(__file__).resolve().parents[1]
CORE = REPO / "operator" / "kimik3"
VOCABULARY = CORE / "api" / "conditions.py"
TIMES = CORE / "kube" / "times.py"
NAMES = CORE / "render" / "meta.py"
PYTHON_TREES = (REPO / "operator", REPO / "bench", REPO / "tests", REPO / "tools")

EVENT_CALLS = {"event": 2, "_event_once": 2}
"""Methods that post an Event, and the position of their ``reason`` argument."""
REASON_CONSTRUCTORS = {"Event": 1, "Decision": 1}
"""Values that carry an Event reason, and the position of their ``reason`` argument."""
EVENT_TYPES = {"Normal", "Warning"}


def _sources(*roots: Path) -> Iterator[tuple[Path, ast.Module]]:
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            yield path, ast.parse(path.read_text(encoding="utf-8"), str(path))


def _where(path: Path, node: ast.AST) -> str:
    return f"{path.relative_to(REPO)}:{getattr(node, 'lineno', '?')}"


Bindings = dict[str, list[tuple[int, ast.expr | None]]]
"""name -> where it is bound in a scope: (line, the value assigned, None for a loop target or a parameter)."""


def _literals(node: ast.expr | None, names: Bindings, line: int = 0) -> list[str]:
    """The strings an expression in a reason's place (at ``line``) spells out: a string, both arms
    of ``a if c else b``, and for a local name the value of its last binding above ``line``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.JoinedStr):
        return ["<f-string>"]
    if isinstance(node, ast.IfExp):
        return _literals(node.body, names, line) + _literals(node.orelse, names, line)
    if isinstance(node, ast.Name):
        above = [b for b in names.get(node.id, []) if b[0] <= line]
        value = max(above, key=lambda b: b[0])[1] if above else None
        return _literals(value, {}) if value is not None else []
    return []


FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)


def _scope(node: ast.AST) -> Iterator[ast.AST]:
    """The nodes of one scope: ``node``'s descendants, not those of the functions nested in it."""
    for child in ast.iter_child_nodes(node):
        yield child
        if not isinstance(child, FUNCTIONS):
            yield from _scope(child)


def _assigned(scope: ast.AST, nodes: list[ast.AST]) -> Bindings:
    """Where each name is bound among ``nodes`` (``a, b = x, y`` pairwise) and ``scope``'s parameters."""
    out: Bindings = {}

    def bind(target: ast.expr, value: ast.expr | None, line: int) -> None:
        if isinstance(target, ast.Tuple | ast.List):
            values = value.elts if isinstance(value, ast.Tuple) and len(value.elts) == len(target.elts) else None
            for n, element in enumerate(target.elts):
                bind(element, values[n] if values else None, line)
        elif isinstance(target, ast.Starred):
            bind(target.value, None, line)
        elif isinstance(target, ast.Name):
            out.setdefault(target.id, []).append((line, value))

    if isinstance(scope, FUNCTIONS):
        for arg in ast.walk(scope.args):
            if isinstance(arg, ast.arg):
                out.setdefault(arg.arg, []).append((scope.lineno, None))
    for node in nodes:
        if isinstance(node, ast.Assign):
            for target in node.targets:
                bind(target, node.value, node.lineno)
        elif isinstance(node, ast.AnnAssign | ast.NamedExpr):
            bind(node.target, node.value, node.lineno)
        elif isinstance(node, ast.AugAssign):
            bind(node.target, None, node.lineno)
        elif isinstance(node, ast.For | ast.AsyncFor):
            bind(node.target, None, node.lineno)
        elif isinstance(node, ast.comprehension):
            bind(node.target, None, node.target.lineno)
        elif isinstance(node, ast.withitem) and node.optional_vars is not None:
            bind(node.optional_vars, None, node.optional_vars.lineno)
    return out


def _argument(call: ast.Call, position: int) -> ast.expr | None:
    """The argument at ``position`` (or keyword ``reason``); None behind a ``*args``."""
    keyword = next((k.value for k in call.keywords if k.arg == "reason"), None)
    if keyword is not None:
        return keyword
    for index, arg in enumerate(call.args):
        if isinstance(arg, ast.Starred):
            return None
        if index == position:
            return arg
    return None


def _callee(call: ast.Call) -> str | None:
    func = call.func
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        if isinstance(func.value, ast.Attribute) and func.value.attr == "on":
            return None  # kopf.on.event(...): a handler, not an Event
        return func.attr
    return None


def reason_literals(tree: ast.Module) -> Iterator[tuple[ast.AST, str]]:
    """Each string spelled where an Event reason goes: (the node, the string)."""
    for scope in [tree, *(n for n in ast.walk(tree) if isinstance(n, FUNCTIONS))]:
        nodes = list(_scope(scope))
        names = _assigned(scope, nodes)
        for node in nodes:
            if isinstance(node, ast.Call):
                name = _callee(node)
                position = EVENT_CALLS.get(name or "", REASON_CONSTRUCTORS.get(name or ""))
                if position is not None:
                    for text in _literals(_argument(node, position), names, node.lineno):
                        yield node, text
            elif isinstance(node, ast.Tuple) and len(node.elts) == 3:
                first = node.elts[0]
                if isinstance(first, ast.Constant) and first.value in EVENT_TYPES:
                    for text in _literals(node.elts[1], names, node.lineno):
                        yield node, text


def test_no_event_reason_is_a_string_outside_the_vocabulary() -> None:
    found = [f"{_where(path, node)}: Event reason {text!r} is a string; use EventReason"
             for path, tree in _sources(CORE) if path != VOCABULARY
             for node, text in reason_literals(tree)]
    assert not found, "\n".join(found)


def test_the_check_finds_each_kind_of_reason_literal() -> None:
    """Not vacuous: each place a reason goes is seen, an ``EventReason`` member is not a finding."""
    tree = ast.parse('kube.event(obj, "Warning", "Oops", m)\n'
                     'self._event_once(obj, "Normal", reason="Fine" if ok else "Bad", message=m)\n'
                     'events.append(("Warning", "Tuple", m))\n'
                     'Event("Normal", "Built", m)\n'
                     'Decision(1, "ScaleSideways", m)\n'
                     'kube.event(obj, "Normal", EventReason.APPLIED, m)\n'
                     'Event("Normal", EventReason.DELETED, m)\n'
                     'kopf.on.event("group", "v1", "things")\n'
                     'self._event_once(obj, "Normal", *step)\n'
                     'def post(kube, obj, failed):\n'
                     '    reason, why = "Named", "x"\n'
                     '    kind = "Kind" if failed else EventReason.APPLIED\n'
                     '    kube.event(obj, "Warning", reason, why)\n'
                     '    return ("Warning", kind, why)\n'
                     'def other(kube, obj, reason):\n'
                     '    kube.event(obj, "Warning", reason, "the parameter, not post\'s local")\n')
    assert sorted(text for _, text in reason_literals(tree)) == [
        "Bad", "Built", "Fine", "Kind", "Named", "Oops", "ScaleSideways", "Tuple"]


def test_every_event_reason_has_a_docstring_saying_when_it_is_posted() -> None:
    tree = ast.parse(VOCABULARY.read_text(encoding="utf-8"))
    body = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "EventReason").body
    members = [(i, s) for i, s in enumerate(body) if isinstance(s, ast.Assign)]
    said = {i for i, s in enumerate(body) if isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant)}
    assert len(members) == len(EventReason)
    assert not [ast.unparse(s.targets[0]) for i, s in members if i + 1 not in said]


def test_condition_reasons_posted_as_events_are_event_reasons() -> None:
    """ScalingLimited's reasons (posted as Warnings while the condition is True) and the other
    condition reasons that double as Event reasons keep one spelling."""
    posted = [r for r in REASONS[ConditionType.SCALING_LIMITED]
              if r not in (Reason.ALL_GROUPS_PLACED, Reason.GROUPS_NOT_CREATED, Reason.GROUPS_NOT_PLACED)]  # never True: never posted
    posted += [Reason.INVALID_SPEC, Reason.APPLY_FAILED, Reason.GROUP_CRASH_LOOPING, Reason.ROLLED_BACK,
               Reason.GROUPS_NOT_READY, Reason.SCALED_TO_ZERO]
    assert [event_reason(r) for r in posted] == [r.value for r in posted]
    assert len({r.value for r in EventReason}) == len(EventReason)
    assert all(re.fullmatch(r"(?:[A-Z][a-z0-9]+)+", r.value) for r in EventReason)


RFC3339_FORMAT = re.compile("%Y-%m-%d" + "T")


def test_rfc3339_times_are_written_and_read_in_one_place() -> None:
    """No ``strftime`` format of an RFC 3339 time, ``isoformat()`` or ``"Z" -> "+00:00"`` swap
    outside ``kimik3.kube.times``."""
    found = []
    for path, tree in _sources(*PYTHON_TREES):
        if path in (TIMES, Path(__file__).resolve()):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and RFC3339_FORMAT.search(node.value):
                found.append(f"{_where(path, node)}: an RFC 3339 format; use kimik3.kube.times")
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                spelled = [a.value for a in node.args if isinstance(a, ast.Constant)]
                if node.func.attr == "isoformat" or node.func.attr == "replace" and spelled == ["Z", "+00:00"]:
                    found.append(f"{_where(path, node)}: {node.func.attr}(); use kimik3.kube.times")
    assert not found, "\n".join(found)


def test_the_engine_set_name_is_spelled_in_one_place() -> None:
    """``f"{name}-engine..."`` or ``name + "-engine"`` outside ``render.meta.engine_set_name``."""
    found = []
    for path, tree in _sources(*PYTHON_TREES):
        if path in (NAMES, Path(__file__).resolve()):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.JoinedStr):
                parts = node.values
                if any(isinstance(a, ast.FormattedValue) and isinstance(b, ast.Constant)
                       and str(b.value).startswith("-engine") for a, b in zip(parts, parts[1:])):
                    found.append(f"{_where(path, node)}: use kimik3.render.meta.engine_set_name")
            elif (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add)
                  and isinstance(node.right, ast.Constant) and str(node.right.value).startswith("-engine")):
                found.append(f"{_where(path, node)}: use kimik3.render.meta.engine_set_name")
    assert not found, "\n".join(found)
