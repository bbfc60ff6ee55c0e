"""What a new user's mistakes on the command line give: one line naming the file or field and the
fix, exit 1, never a traceback (a new user's trial of `kimik3`, 2026-12-05: each case below printed
a Python traceback or a regular expression before)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from kimik3.admission import admit
from kimik3.api.errors import SpecErrors
from kimik3.cli import main
from kimik3_dev.benchmark.simulate import benchmark_traces, simulate_command

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "recipes" / "gb300-tp8-megakernel-dspark.yaml"


def run(args: list[str], stdin: str | None = None) -> str:
    """The command's output; asserts it failed with a click error, not an exception."""
    result = CliRunner().invoke(main, args, input=stdin)
    assert result.exit_code in (1, 2) and isinstance(result.exception, SystemExit), result.output
    return result.output.strip()


@pytest.mark.parametrize("verb", ["validate", "render", "doctor"])
def test_a_recipe_that_is_missing_not_yaml_or_not_an_object_is_named_with_the_fix(verb, tmp_path):
    missing = tmp_path / "nope.yaml"
    assert run([verb, "-f", str(missing)]) == f"Error: {missing}: cannot read it: No such file or directory"
    assert run([verb, "-f", "-"], "spec: [\n") == (
        "Error: -: not valid YAML: while parsing a flow node expected the node content, but found '<stream end>' "
        'in "<stdin>", line 2, column 1')
    assert run([verb, "-f", "-"], "kind: KimiK3Deployment\n---\n- a\n") == (
        "Error: -: document 2 is not a Kubernetes object (a mapping with apiVersion, kind, metadata and spec) "
        "but \"['a']\"")


def test_simulate_checks_its_recipe_before_it_runs():
    result = CliRunner().invoke(simulate_command, ["-f", "/nonexistent.yaml", "--trace", "steady"])
    assert (result.exit_code, result.output.strip()) == (
        1, "Error: /nonexistent.yaml: cannot read it: No such file or directory")
    bad = yaml.safe_load(RECIPE.read_text())
    bad["spec"]["topology"]["tensorParallelSize"] = 6
    result = CliRunner().invoke(simulate_command, ["-f", "-", "--trace", "steady"], input=yaml.safe_dump(bad))
    assert result.exit_code == 1 and result.output.startswith(
        "Error: -: spec.topology.tensorParallelSize: TP x PP = 6 GPUs neither fits"), result.output


def test_simulate_names_every_trace_it_has():
    result = CliRunner().invoke(simulate_command, ["--trace", "nope"])
    names = [t.name for t in benchmark_traces()]
    assert result.exit_code == 2
    assert f"Invalid value for --trace: no trace named nope: the traces are {', '.join(names)}" in result.output
    trace_help = next(p for p in simulate_command.params if p.name == "trace_names").help
    assert trace_help == f"Only these traces (repeatable): {', '.join(names)}."


@pytest.mark.parametrize(("field", "value", "message"), [
    (("idle", "stopAfter"), "soon",
     "'soon' is not a duration: numbers with units ms, s, m or h, e.g. 500ms, 90s, 60m or 1h30m"),
    (("probes", "loadTimeout"), "90 minutes",
     "'90 minutes' is not a duration: numbers with units ms, s, m or h, e.g. 500ms, 90s, 60m or 1h30m"),
    (("engine", "kvOffload", "size"), "lots", "'lots' is not a size in whole Gi or Ti, e.g. 200Gi or 2Ti"),
    (("engine", "resources", "memory"), "800GB",
     "'800GB' is not a memory quantity: bytes, or whole Ki, Mi, Gi or Ti, e.g. 800Gi"),
    (("autoscaling", "metricsSource", "prometheusUrl"), "prometheus:9090",
     "'prometheus:9090' is not an http:// or https:// URL, e.g. http://prometheus-operated.monitoring:9090"),
])
def test_a_bad_duration_or_size_is_explained_not_quoted_as_a_regex(field, value, message):
    spec = yaml.safe_load(RECIPE.read_text())["spec"]
    spec.setdefault("autoscaling", {})["metricsSource"] = {"type": "podScrape"}  # what idle reads
    at = spec
    for key in field[:-1]:
        at = at.setdefault(key, {})
    at[field[-1]] = value
    with pytest.raises(SpecErrors) as refused:
        admit(spec)
    assert [(e.path, e.message) for e in refused.value.errors] == [("spec." + ".".join(field), message)]


def test_usage_refuses_a_prometheus_that_is_not_a_url():
    out = run(["usage", "--prometheus", "prometheus:9090"])
    assert out.endswith("Error: Invalid value for '--prometheus' (env var: 'KIMIK3_PROMETHEUS_URL'): "
                        "'prometheus:9090' is not an http:// or https:// URL (e.g. http://prometheus.monitoring:9090)")


def test_wake_with_a_missing_or_empty_kubeconfig_names_it(tmp_path):
    missing = tmp_path / "missing"
    assert run(["wake", "k3", "-n", "a", "--kubeconfig", str(missing)]) == (
        f"Error: kubeconfig {missing}: no such file; pass --kubeconfig (or set KUBECONFIG) to a kubeconfig file "
        "with a current context")
    empty = tmp_path / "empty"
    empty.write_text("")
    out = run(["wake", "k3", "-n", "a", "--kubeconfig", str(empty)])
    assert out.startswith(f"Error: kubeconfig {empty}: Invalid kube-config. "), out
    assert out.endswith("is empty; pass --kubeconfig (or set KUBECONFIG) to a kubeconfig file with a current context")


def closed_port_kubeconfig(path: Path, port: int) -> Path:
    """A kubeconfig for an API server at 127.0.0.1:``port``."""
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": f"https://127.0.0.1:{port}"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
    return path


def test_wake_with_no_api_server_listening_says_so(tmp_path):
    with socket.socket() as s:  # a loopback port nothing listens on (bound, never listened)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        kubeconfig = closed_port_kubeconfig(tmp_path / "kubeconfig", port)
        out = run(["wake", "k3", "-n", "a", "--kubeconfig", str(kubeconfig)])
    assert out.startswith(f"Error: cannot reach the Kubernetes API server at https://127.0.0.1:{port}: "), out
    assert "Connection refused" in out
    assert out.endswith("is the cluster up and the kubeconfig the right one (`kubectl get nodes` with it)?")


@pytest.mark.parametrize(("placement", "message"), [
    ({"queueName": "inference"},
     "queueName applies to mode kueue only (the mode is exclusive, the default): set mode kueue, or remove it"),
    ({"mode": "exclusive", "priorityClass": "high", "burstPriorityClass": "low"},
     "priorityClass, burstPriorityClass apply to mode kueue only (the mode is exclusive, the default): set mode "
     "kueue, or remove them"),
])
def test_kueue_settings_under_exclusive_placement_say_which_mode_is_set(placement, message):
    spec = yaml.safe_load(RECIPE.read_text())["spec"]
    spec["scheduling"] = {"placement": placement}
    with pytest.raises(SpecErrors) as refused:
        admit(spec)
    assert [e.message for e in refused.value.errors] == [message]


def test_render_refuses_a_spec_as_validate_does():
    """render printed the problems bare ("Error: spec.x: ...\\nspec.y: ..."), without the deployment
    or the count validate gives."""
    bad = yaml.safe_load(RECIPE.read_text())
    bad["spec"]["topology"]["tensorParallelSize"] = 6
    text = yaml.safe_dump(bad)
    validated = CliRunner().invoke(main, ["validate", "-f", "-"], input=text).output.strip()
    assert validated.startswith("k3-latency: 2 problem(s)\n  spec.topology.tensorParallelSize: "), validated
    assert run(["render", "-f", "-"], text) == "Error: " + validated


def test_doctor_says_what_it_waits_for_before_the_parser_starts(monkeypatch, tmp_path):
    """`kimik3 doctor` sat ~10 s silent while vLLM's parser (a subprocess) read the arguments."""
    import kimik3_dev.doctor as doctor

    events: list[str] = []
    venv = doctor.VllmVenv(doctor.VLLM_VERSION, tmp_path / "venv")
    monkeypatch.setattr(doctor, "parser_venv", lambda version=None: venv)

    def parse(argvs, v):
        events.append(f"parsed {len(argvs)}")
        return doctor.VLLM_VERSION, [{"ok": True}] * len(argvs)
    monkeypatch.setattr(doctor, "parse_argvs", parse)
    lines, ok = doctor.doctor_report([yaml.safe_load(RECIPE.read_text())], waiting=events.append)
    assert ok and events == [f"# waiting for vLLM's own argument parser ({venv.path}) to read 2 rank(s)' arguments",
                             "parsed 2"]


def test_dev_apply_and_load_after_dev_down_say_the_cluster_is_not_up(tmp_path, monkeypatch):
    """After `kimik3 dev down` (the state dir and its kubeconfig stay) both printed urllib3's
    MaxRetryError traceback."""
    monkeypatch.delenv("KIMIK3_COMMAND", raising=False)  # the hints name `kimik3`, not tools/kimik3
    state = tmp_path / "dev"
    state.mkdir()
    assert run(["dev", "apply", "-f", str(RECIPE), "--state-dir", str(state)]) == (
        f"Error: no dev cluster in {state}: run `kimik3 dev up --state-dir {state}`")
    assert run(["dev", "load", "k3-latency", "--state-dir", str(state)]) == (
        f"Error: no kubeconfig {state}/admin.kubeconfig: is the dev cluster up (`kimik3 dev up --state-dir {state}`), "
        "or give --kubeconfig")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        closed_port_kubeconfig(state / "admin.kubeconfig", port)
        out = run(["dev", "load", "k3-latency", "--state-dir", str(state)])
    assert out == (f"Error: the API server of {state}/admin.kubeconfig (https://127.0.0.1:{port}) is not answering: "
                   f"is the dev cluster up (`kimik3 dev status --state-dir {state}`)?")


def test_stage_names_the_hub_it_could_not_reach(tmp_path, monkeypatch):
    """"moonshotai/Kimi-K3@main: ConnectError: ..." did not say which hub (--endpoint, HF_ENDPOINT
    or huggingface.co) was tried."""
    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        hub = f"http://127.0.0.1:{s.getsockname()[1]}"
        out = run(["stage", "--repo", "a/b", "--to", str(tmp_path), "--endpoint", hub])
    assert out.splitlines()[-1].startswith(f"Error: a/b@main from {hub}: ConnectError: "), out  # after progress


def test_run_without_a_kubeconfig_names_it(tmp_path):
    """`kimik3 run --kubeconfig` of a missing file ended in NoCluster's traceback."""
    missing = tmp_path / "missing"
    assert run(["run", "--kubeconfig", str(missing), "--health-port", "0"]) == (
        f"Error: kubeconfig {missing}: no such file; pass --kubeconfig (or set KUBECONFIG) to a kubeconfig file "
        "with a current context")


def test_demo_with_a_missing_recipe_says_so_before_it_starts_anything(tmp_path):
    state = tmp_path / "dev"
    missing = tmp_path / "nope.yaml"
    assert run(["demo", "-f", str(missing), "--state-dir", str(state)]) == (
        f"Error: {missing}: cannot read it: No such file or directory")
    assert not state.exists()


def test_dev_apply_of_a_file_that_is_not_yaml_names_it(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("spec: [\n")
    out = run(["dev", "apply", "-f", str(bad), "--state-dir", str(tmp_path)])
    assert out.startswith(f"Error: {bad}: not valid YAML: while parsing a flow node"), out


def test_every_pattern_of_the_spec_has_a_meaning():
    """A string refused by a pattern is explained (``PATTERN_MEANINGS``), never answered with the
    regular expression: each pattern of the generated CRD's spec schema has a meaning."""
    from kimik3.api.crd import crd_manifest
    from kimik3.api.v1alpha1 import PATTERN_MEANINGS

    def patterns(node):
        if isinstance(node, dict):
            yield from ([node["pattern"]] if isinstance(node.get("pattern"), str) else [])
            for value in node.values():
                yield from patterns(value)
        elif isinstance(node, list):
            for value in node:
                yield from patterns(value)
    schema = crd_manifest()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    found = set(patterns(schema))
    assert len(found) >= 10 and found - set(PATTERN_MEANINGS) == set()
