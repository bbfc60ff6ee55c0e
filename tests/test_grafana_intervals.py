"""tests/support/grafana.py's reading of Grafana's query semantics (the e2e dashboard test runs the
shipped dashboard's queries through it): intervals and their formats, variables, legends."""

from __future__ import annotations

import pytest

from support.grafana import (format_interval, go_duration, interval, label_values_query, legend_labels, rate_interval,
                             regex_escape, round_interval, substitute)


@pytest.mark.parametrize(("seconds", "rounded"), [(7.2, 5), (7.6, 10), (17.4, 15), (86.4, 60), (0.98, 1), (400, 300)])
def test_round_interval_takes_grafanas_steps(seconds, rounded):
    assert round_interval(seconds) == rounded


def test_interval_is_the_range_over_the_points_rounded_never_under_the_scrape_interval():
    three_hours = 3 * 3600
    assert interval(three_hours, 5, 1920) == 5  # 5.6 s
    assert interval(three_hours, 5, 640) == 15  # 16.9 s
    assert interval(three_hours, 15, 1920) == 15  # 5.6 s is under the scrape interval
    # 30 days on 100,000 points would be 26 s (30 s); Prometheus takes 11,000 points: 236 s (300 s)
    assert interval(30 * 86400, 15, 100000) == 300


def test_rate_interval_is_interval_plus_scrape_at_least_four_scrapes():
    assert rate_interval(5, 5) == 20
    assert rate_interval(60, 15) == 75
    assert (go_duration(20), go_duration(75), go_duration(3600), go_duration(0.5)) == ("20s", "1m15s", "1h0m0s", "500ms")
    assert (format_interval(5), format_interval(90), format_interval(0.2)) == ("5s", "1m", "200ms")


def test_variables_substitute_in_each_syntax_and_leave_unknown_ones():
    values = {"namespace": "team-a", "__rate_interval": "20s"}
    assert (substitute('x{namespace=~"$namespace"}[$__rate_interval] ${namespace} [[namespace]] $other', values)
            == 'x{namespace=~"team-a"}[20s] team-a team-a $other')
    assert regex_escape("a.b(c)") == "a\\\\.b\\\\(c\\\\)"  # as PromQL string text: a\\.b\\(c\\)


def test_label_values_takes_a_promql_selector_and_a_label():
    assert label_values_query('label_values(up{job="a", namespace=~"b"}, deployment)') == (
        'up{job="a",namespace=~"b"}', "deployment")  # the parser's rendering of the selector
    assert label_values_query("label_values(namespace)") == (None, "namespace")
    with pytest.raises(ValueError, match="not a series selector"):
        label_values_query("label_values(sum(up), namespace)")
    with pytest.raises(ValueError, match="only label_values"):
        label_values_query("query_result(up)")


def test_legend_labels_are_the_double_braced_names():
    assert legend_labels("{{namespace}}/{{ deployment }} P{{percentile}}") == ["namespace", "deployment", "percentile"]
    assert legend_labels("p90") == []
