"""Each admission rule beside its CEL twin (``kimik3.admission``'s tables).

Every CEL rule of the generated CRD is named in exactly one concern's table; every row's example
spec passes the schema and is refused by the row's Python check; on a real kube-apiserver
(server-side dry run) the same example is refused with each CEL twin's message, and an
operator-only row's example is accepted (no CEL rule covers it). Also: ``Admitted.seconds``
holds every duration field of the spec.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import BaseModel

from kimik3.admission import TABLES, Seconds, admit
from kimik3.admission.rules import Candidate, Rule
from kimik3.api.crd import crd_manifest
from kimik3.api.errors import SpecErrors
from kimik3.api.v1alpha1 import CEL_RULES, DURATION_PATTERN, KimiK3DeploymentSpec
from test_admission_properties import dry_run, prop_namespace  # noqa: F401 (a fixture)

ROWS = [pytest.param(table.concern, row, id=f"{table.concern}:{row.name}") for table in TABLES for row in table.rules]


def crd_validations(node: Any) -> Iterator[dict[str, Any]]:
    """Every ``x-kubernetes-validations`` entry anywhere in a schema."""
    if isinstance(node, dict):
        yield from node.get("x-kubernetes-validations", [])
        for value in node.values():
            yield from crd_validations(value)
    elif isinstance(node, list):
        for value in node:
            yield from crd_validations(value)


def test_every_cel_rule_of_the_crd_is_in_exactly_one_table():
    by_text = {entry["rule"]: name for name, entry in CEL_RULES.items()}
    in_crd = [by_text.get(v["rule"]) for v in crd_validations(crd_manifest())]
    assert None not in in_crd, "a CEL rule of the CRD has no name: declare it with rule(name, ...)"
    assert sorted(in_crd) == sorted(CEL_RULES), "each named CEL rule appears once in the CRD"
    tables_of = {name: [t.concern for t in TABLES if any(name in r.cel for r in t.rules)] for name in CEL_RULES}
    assert {n: t for n, t in tables_of.items() if len(t) != 1} == {}, "CEL rules in no table or in several"
    named = {name for t in TABLES for r in t.rules for name in r.cel}
    assert named <= set(CEL_RULES), f"tables name CEL rules that do not exist: {named - set(CEL_RULES)}"


def test_a_row_names_its_cel_twins_or_says_why_it_has_none():
    with pytest.raises(ValueError):
        Rule(lambda c: [], {}, cel=("weights-fit",), operator_only="both")
    with pytest.raises(ValueError):
        Rule(lambda c: [], {})
    assert all(r.operator_only.strip() for t in TABLES for r in t.rules if not r.cel)


@pytest.mark.parametrize("concern,row", ROWS)
def test_each_rule_refuses_its_example(concern, row):
    spec = KimiK3DeploymentSpec.model_validate(row.refuses)  # the schema takes it: the rule refuses it
    found = row.check(Candidate(spec))
    assert found, f"{concern}.{row.name} does not refuse its own example"
    with pytest.raises(SpecErrors) as refused:
        admit(row.refuses)
    assert set(found) <= set(refused.value.errors)


@pytest.mark.parametrize("concern,row", ROWS)
def test_the_api_server_agrees_with_each_rule_on_its_example(kube, prop_namespace, concern, row):
    accepted, body = dry_run(kube, prop_namespace, row.refuses)
    if not row.cel:
        assert accepted, f"operator-only {concern}.{row.name}, yet the API server refuses: {body}"
        return
    assert not accepted, f"the CEL twins {row.cel} accept the example {concern}.{row.name} refuses"
    refusal = json.loads(body)["message"]
    for name in row.cel:
        assert CEL_RULES[name]["message"] in refusal, f"{name} did not refuse {row.refuses}: {refusal}"


def duration_paths(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """camelCase paths of every Duration field under ``model``."""
    for name, info in model.model_fields.items():
        path = (*prefix, info.alias or name)
        inner = [a for a in typing.get_args(info.annotation) if a is not type(None)]  # X | None -> X
        annotation = inner[0] if len(inner) == 1 else info.annotation
        metadata = [*info.metadata, *(n for m in getattr(annotation, "__metadata__", ()) for n in m.metadata)]
        if any(getattr(m, "pattern", None) == DURATION_PATTERN for m in metadata):
            yield path
        elif isinstance(annotation, type) and issubclass(annotation, BaseModel):
            yield from duration_paths(annotation, path)


def test_admitted_seconds_hold_every_duration_of_the_spec():
    paths = list(duration_paths(KimiK3DeploymentSpec))
    spec: dict[str, Any] = {"model": {"source": {"pvc": {"claimName": "w"}}},
                            "autoscaling": {"metricsSource": {"type": "podScrape"}}}  # idle.stopAfter reads it
    for i, path in enumerate(paths, start=1):
        node = spec
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = f"{i}m"  # a different duration in each field
    seconds = dataclasses.asdict(admit(spec).seconds)
    assert len(seconds) == len(paths) == len(dataclasses.fields(Seconds))
    assert sorted(seconds.values()) == [60.0 * i for i in range(1, len(paths) + 1)]
