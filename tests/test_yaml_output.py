"""YAML written for people and tools has no anchors or aliases (``&id001`` / ``*id001``):
``kimik3 render``, ``kimik3 crd`` and the dev cluster's files all go through
``kimik3.api.documents.dump_yaml`` / ``dump_yaml_all``."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from click.testing import CliRunner

from kimik3.api.documents import dump_yaml, dump_yaml_all, load_deployments
from kimik3.cli import main
from support.rendering import render_cr

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "recipes" / "gb300-tp8-megakernel-dspark.yaml"
ALIAS = re.compile(r"[&*]id\d+")


def test_a_shared_sub_dict_is_written_out_at_each_place():
    probe = {"httpGet": {"path": "/health", "port": "http"}}
    obj = {"startupProbe": probe, "livenessProbe": probe, "list": [probe["httpGet"], probe["httpGet"]]}
    assert ALIAS.search(yaml.safe_dump(obj))  # what PyYAML's own SafeDumper does with it
    text = dump_yaml(obj)
    assert not ALIAS.search(text), text
    assert text.count("path: /health") == 4
    assert yaml.safe_load(text) == obj


def test_a_string_go_yaml_reads_as_a_number_is_quoted():
    """Found by bench/scale.py: one of 500 rendered deployments had a hash annotation of digits
    with one ``e`` (PyYAML writes it plain, go-yaml reads a float, kubectl refused the manifest)."""
    obj = {"metadata": {"annotations": {"hash": "6115e40129", "plain": "585ebf0c59e2", "int": "42", "dot": "1.5"}}}
    text = dump_yaml(obj)
    assert "hash: '6115e40129'" in text and "plain: 585ebf0c59e2" in text
    assert "int: '42'" in text and "dot: '1.5'" in text
    assert yaml.safe_load(text) == obj


def test_the_stream_keeps_key_order_and_separates_documents():
    shared = {"b": 1, "a": 2}
    text = dump_yaml_all([{"z": shared, "y": shared}, {"kind": "Second"}])
    assert text == "z:\n  b: 1\n  a: 2\ny:\n  b: 1\n  a: 2\n---\nkind: Second\n"


def test_render_prints_the_children_without_anchors():
    """The latency recipe's probes share one httpGet dict: the shape that used to print &id001."""
    result = CliRunner().invoke(main, ["render", "-f", str(RECIPE)])
    assert result.exit_code == 0, result.output
    assert not ALIAS.search(result.output), ALIAS.findall(result.output)
    expected = [o for d in load_deployments(str(RECIPE)) for o in render_cr(d).objects]
    assert list(yaml.safe_load_all(result.output)) == expected
    assert ALIAS.search(yaml.safe_dump_all(expected)), "the recipe no longer shares a sub-dict: pick one that does"


def test_crd_files_are_written_without_anchors(tmp_path):
    result = CliRunner().invoke(main, ["crd", "-o", str(tmp_path / "crds")])
    assert result.exit_code == 0, result.output
    written = sorted((tmp_path / "crds").glob("*.yaml"))
    assert len(written) == 2
    for path in written:
        assert not ALIAS.search(path.read_text()), path


def test_no_module_dumps_yaml_past_the_no_anchor_dumper():
    """Every YAML the operator, the kit and the benchmarks write goes through dump_yaml(_all)."""
    dumping = re.compile(r"\byaml\.(safe_)?dump(_all)?\(")
    sources = [*sorted((REPO / "operator").rglob("*.py")), *sorted((REPO / "bench").glob("*.py"))]
    found = [str(p.relative_to(REPO)) for p in sources
             if p.name != "documents.py" and dumping.search(p.read_text(encoding="utf-8"))]
    assert not found, f"use kimik3.api.documents.dump_yaml / dump_yaml_all in {found}"
