"""The idle decision of spec.idle.stopAfter from readings (``kimik3.autoscaler.idle``), and its
admission rules: a reading with any request, a partial or unreadable one, or a gap restarts the
clock; only back-to-back quiet readings let it reach the stop time (at exactly it, it stops)."""

from __future__ import annotations

import pytest

from kimik3.admission import admit
from kimik3.api.errors import SpecErrors
from kimik3.autoscaler.histogram import Histogram
from kimik3.autoscaler.idle import IdleClock, quiet
from kimik3.autoscaler.observation import DecodeObservation
from kimik3.controller.idle import IdleStep
from support.recipes import recipe

WINDOW = 60.0


def reading(at: float, groups: set[str] = frozenset({"0"}), covered: set[str] | None = None, **counts: float
            ) -> DecodeObservation:
    """A reading over WINDOW seconds ending at ``at``: ``groups`` reported, ``covered`` (default:
    all of them) cover the window, and ``counts`` (running, waiting, requests_finished...) seen."""
    return DecodeObservation(at=at, window_s=WINDOW, itl=Histogram({}), itl_metric="vllm:inter_token_latency_seconds",
                             groups=frozenset(groups), covered=frozenset(groups if covered is None else covered),
                             **counts)


@pytest.mark.parametrize("counts", [{"running": 1}, {"waiting": 1}, {"requests_finished": 1}, {"prompt_tokens": 12},
                                    {"generation_tokens": 3}])
def test_any_request_in_the_window_is_not_quiet(counts):
    assert quiet(reading(0), {"0"})
    assert not quiet(reading(0, **counts), {"0"})


def test_a_serving_group_missing_or_partial_is_not_quiet():
    assert not quiet(reading(0, groups={"0"}), {"0", "1"})  # group 1 gave no metrics
    assert not quiet(reading(0, groups={"0", "1"}, covered={"0"}), {"0", "1"})  # group 1's counters reset
    assert quiet(reading(0, groups={"0", "1"}), {"0", "1"})


def test_stops_at_exactly_stop_after_of_quiet_readings():
    clock = IdleClock(active_at=0.0)
    for t in range(0, 601, 30):
        clock.read(t, reading(t), {"0"})
    # the first reading only starts the back-to-back series: idle from 0, the start of the clock
    assert clock.active_at == 0.0
    assert clock.idle_for(600) == 600
    assert not clock.due(599.9, 600)
    assert clock.due(600, 600)


def test_a_request_restarts_the_clock_at_its_reading():
    clock = IdleClock(active_at=0.0)
    for t in range(0, 301, 30):
        clock.read(t, reading(t), {"0"})
    clock.read(330, reading(330, requests_finished=1), {"0"})
    for t in range(360, 931, 30):
        clock.read(t, reading(t), {"0"})
    assert clock.active_at == 330
    assert not clock.due(929, 600)
    assert clock.due(930, 600)


def test_an_unreadable_source_never_stops_anything():
    clock = IdleClock(active_at=0.0)
    for t in range(0, 7201, 30):
        clock.read(t, None, {"0"})
    assert clock.idle_for(7200) == 0
    assert not clock.due(7200, 60)


def test_a_gap_longer_than_the_window_restarts_the_clock():
    clock = IdleClock(active_at=0.0)
    clock.read(0, reading(0), {"0"})
    clock.read(60, reading(60), {"0"})  # exactly the window: back to back
    assert clock.active_at == 0.0
    clock.read(121, reading(121), {"0"})  # 61 s after: what came between is unknown
    assert clock.active_at == 121


def test_a_wake_restarts_the_clock_never_back():
    clock = IdleClock(active_at=100.0)
    clock.restart(500.0)
    assert clock.active_at == 500.0
    clock.restart(200.0)  # an older wake request moves nothing
    assert clock.active_at == 500.0


def test_replicas_while_stopped_and_after_a_wake():
    assert IdleStep(stopped=True).replicas(4) == 0
    assert IdleStep(stopped=True).replicas(None) == 0
    assert IdleStep(floor=2).replicas(0) == 2  # autoscaled, just woken: minReplicas (at least 1)
    assert IdleStep(floor=2).replicas(3) == 3
    assert IdleStep().replicas(None) is None  # spec.replicas


def spec(**idle_and_source) -> dict:
    body = recipe()["spec"]
    body.update(idle_and_source)
    return body


def test_admission_names_the_field_and_the_fix():
    with pytest.raises(SpecErrors) as refused:
        admit(spec(idle={"stopAfter": "59s"}, autoscaling={"metricsSource": {"type": "podScrape"}}))
    assert [(e.path, e.message) for e in refused.value.errors] == [
        ("spec.idle.stopAfter", "idle.stopAfter must be at least 1m (e.g. 60m), or unset to never stop")]
    with pytest.raises(SpecErrors) as refused:
        admit(spec(idle={"stopAfter": "1h"}))
    assert [e.path for e in refused.value.errors] == ["spec.autoscaling.metricsSource.prometheusUrl"]
    assert "set autoscaling.metricsSource.type: podScrape" in refused.value.errors[0].message
    admitted = admit(spec(idle={"stopAfter": "1m"}, autoscaling={"metricsSource": {"type": "podScrape"}}))
    assert admitted.seconds.idle_stop_after == 60.0
    assert admit(spec()).seconds.idle_stop_after is None


def test_kimik3_wake_without_a_cluster_to_talk_to_says_what_to_pass(tmp_path, monkeypatch):
    """No --kubeconfig, no KUBECONFIG, not in a pod and no ~/.kube/config: a one-line error, no
    traceback (a new user's first try, 2026-12-05)."""
    from click.testing import CliRunner

    from kimik3.cli import main

    for var in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    out = CliRunner().invoke(main, ["wake", "k3", "-n", "tenant-a"])
    assert out.exit_code == 1, out.output
    assert out.output.strip() == ("Error: no cluster to talk to: not in a pod (no in-cluster service account) and no "
                                  "~/.kube/config; pass --kubeconfig or set KUBECONFIG")
