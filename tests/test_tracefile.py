"""Recorded traces: ``kimik3 simulate --trace-file`` replays a CSV's or a Mooncake file's arrivals, lengths
and prefix blocks."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from click.testing import CliRunner

from kimik3_dev.sim.tracefile import TraceFileError, read, replay_seconds, reuse_ceiling, superpose
from kimik3_dev.benchmark.simulate import simulate_command
from kimik3_dev.benchmark.traces import Request, recorded

AZURE = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:50.6805900,374,44
2023-11-16 18:15:46.6805900,4808,10
2023-11-16 18:16:06.1805900,3662,0
"""
"""The Azure LLM inference trace's columns, rows out of order, a 7-digit fraction of a second, an
output of 0 tokens (a failed request in the recording)."""


def test_an_azure_trace_replays_its_arrivals_and_lengths(tmp_path: Path) -> None:
    path = tmp_path / "azure_conv.csv"
    path.write_text(AZURE)
    trace = recorded(path, compression=2.0)
    expected = [Request(0.0, 4808, 10), Request(2.0, 374, 44), Request(9.75, 3662, 1)]
    assert trace.name == "azure_conv"
    assert [(round(r.arrival_s, 6), r.prompt_tokens, r.output_tokens) for r in trace.requests(0)] == \
        [(r.arrival_s, r.prompt_tokens, r.output_tokens) for r in expected]
    assert trace.requests(3) == trace.requests(0)  # one copy: every seed replays the same requests
    assert trace.duration_s == 10 + 60 and trace.rate(2) == 1.0 and trace.jumps == ()


def test_copies_superpose_shifted_replays_placed_by_the_seed(tmp_path: Path) -> None:
    path = tmp_path / "burstgpt.csv"
    path.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                    + "".join(f"{5 * i},ChatGPT,{100 + i},{20 + i},{120 + 2 * i},Conversation log\n" for i in range(12)))
    trace = recorded(path, copies=3)
    a, b = trace.requests(0), trace.requests(1)
    assert len(a) == len(b) == 36
    assert sorted((r.prompt_tokens, r.output_tokens) for r in a) == sorted(
        (100 + i, 20 + i) for i in range(12) for _ in range(3))
    assert {r.arrival_s for r in a} >= {5.0 * i for i in range(12)}  # copy 0 as recorded
    assert all(0 <= r.arrival_s < trace.duration_s for r in a) and a != b


@pytest.mark.parametrize("text,message", [
    ("when,prompt,output\n1,2,3\n", "no arrival column; the header has when, prompt, output, accepted names are "
                                    "timestamp, arrival, arrival_s, time (case and spaces ignored)"),
    ("arrival_s,prompt_tokens,output_tokens\n1,2,3\nsoon,2,3\n", "line 3: Invalid isoformat string: 'soon'"),
    ("arrival_s,prompt_tokens,output_tokens\n", "no requests after the header"),
    ("arrival_s,prompt_tokens,output_tokens\n1,2,3\n2,-4,3\n", "line 3: prompt tokens -4 is negative"),
    ('{"timestamp": 0, "input_length": 5, "output_length": -1}\n', "line 1: output tokens -1 is negative"),
])
def test_a_bad_trace_file_names_the_problem(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(TraceFileError) as refused:
        recorded(path)
    assert message in str(refused.value)


@pytest.mark.tier("process")  # `git describe` for the results
def test_simulate_replays_a_trace_file_through_the_policies_asked_for(tmp_path: Path) -> None:
    path = tmp_path / "small.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens\n"
                    + "".join(f"{0.25 * i:.2f},{1500 + i % 7 * 100},{300 + i % 5 * 40}\n" for i in range(1600)))
    out = tmp_path / "out"
    result = CliRunner().invoke(simulate_command, ["--trace-file", str(path), "--time-compression", "2",
                                                   "-o", str(out), "--no-plots", "--seed", "0",
                                                   "--policy", "kimik3", "--policy", "static-peak"])
    assert result.exit_code == 0, result.output
    data = json.loads((out / "autoscaler.json").read_text())
    assert set(data["traces"]) == {"small"} and set(data["traces"]["small"]) == {"kimik3", "static-peak", "optimal"}
    assert data["run"]["seeds"] == [0] and set(data["traces"]["small"]["kimik3"]["seeds"]) == {"0"}
    assert "1600 requests" in result.output
    refused = CliRunner().invoke(simulate_command, ["--trace-file", str(path), "--trace", "steady"])
    assert refused.exit_code == 2 and "give --trace or --trace-file, not both" in refused.output


MOONCAKE = """{"timestamp": 0, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, 48, 49]}
{"timestamp": 2500, "input_length": 71, "output_length": 380}

{"timestamp": 1250, "input_length": 31243, "output_length": 7}
"""
"""Mooncake's JSON Lines: ``timestamp`` in ms, ``hash_ids`` (prefix blocks) ignored, out of order,
a blank line."""


def test_a_mooncake_trace_replays_its_arrivals_and_lengths(tmp_path: Path) -> None:
    path = tmp_path / "mooncake.jsonl"
    path.write_text(MOONCAKE)
    trace = recorded(path, compression=0.5)
    assert [(r.arrival_s, r.prompt_tokens, r.output_tokens) for r in trace.requests(0)] == [
        (0.0, 6955, 52), (2.5, 31243, 7), (5.0, 71, 380)]
    assert trace.duration_s == 5 + 60 and trace.name == "mooncake"
    bad = tmp_path / "bad.txt"
    bad.write_text('{"timestamp": 0, "input_length": 5, "output_length": 1}\n{"timestamp": 9, "input_length": 5}\n')
    with pytest.raises(TraceFileError) as refused:
        recorded(bad)
    assert f"{bad}, line 2: no output_length (want a JSON object with timestamp in ms" in str(refused.value)


@pytest.mark.tier("process")  # `git describe` for the results
def test_simulate_replays_a_jsonl_trace_and_checks_the_goals_on_it(tmp_path: Path) -> None:
    """Issue 23 items 3 and 4: a Mooncake-format trace (5 minutes at 4 requests/s, long prompts)
    replays its arrivals and lengths through ours and the optimum, and the goal check covers it
    (a miss's line: ``test_goals_hold_on_every_trace_recorded_ones_included`` in test_fleet_sim.py)."""
    path = tmp_path / "agent.jsonl"
    path.write_text("".join(json.dumps({"timestamp": 250 * i, "input_length": 4000 + (i % 9) * 3000,
                                        "output_length": 60 + (i % 4) * 40, "hash_ids": [i % 4]}) + "\n"
                            for i in range(1200)))
    trace = recorded(path)
    requests = trace.requests(0)
    assert len(requests) == 1200 and requests[7] == Request(1.75, 4000 + 7 * 3000, 60 + 3 * 40, (3,))
    out = tmp_path / "out"
    result = CliRunner().invoke(simulate_command, ["--trace-file", str(path), "-o", str(out), "--no-plots",
                                                   "--seed", "0", "--policy", "kimik3"])
    assert result.exit_code == 0, result.output
    data = json.loads((out / "autoscaler.json").read_text())
    ours = data["traces"]["agent"]["kimik3"]["seeds"]["0"]
    assert "agent seed 0: 1200 requests" in result.output
    # 1200 blocks of 4 ids: all but the first 4 seen before
    assert "agent: prefix reuse ceiling 99.7% (share of its 512-token blocks seen before in the trace)" in result.output
    # The hindsight optimum holds 2 groups; ours, whose model stretches the decode by the prompts'
    # 43% share of a group's time (policy/model.py), adds a third and keeps the SLO in every minute
    # at 1.46x its GPU-hours: the goal check, run on this recorded trace, says what it missed.
    assert (ours["slo_attainment"], ours["gpu_hours_x_optimum"], ours["scale_events"]) == (1.0, 1.4563, 1)
    assert data["goal_misses"] == ["agent seed 0: kimik3 missed the goal: GPU-hours 1.46x the optimum's, over the goal "
                                   "(<= 1.10x) by 0.36x (met: SLO 100.0%)"]
    assert "goals missed:\n  agent seed 0: kimik3 missed the goal: GPU-hours 1.46x" in result.output


PREFIXED = """{"timestamp": 1000, "input_length": 1800, "output_length": 3, "hash_ids": [1, 2, 3, 7]}
{"timestamp": 0, "input_length": 1536, "output_length": 2, "hash_ids": [1, 2, 3]}
{"timestamp": 2000, "input_length": 700, "output_length": 1, "hash_ids": [9, 10]}
"""
"""Mooncake lines with hash_ids (out of order): the second request shares the first's 3 blocks."""


def test_a_mooncake_trace_with_hash_ids_keeps_its_blocks_and_reuse_ceiling(tmp_path: Path) -> None:
    path = tmp_path / "prefixed.jsonl"
    path.write_text(PREFIXED)
    replay = read(path, compression=2.0)
    assert replay == (Request(0.0, 1536, 2, (1, 2, 3)), Request(0.5, 1800, 3, (1, 2, 3, 7)),
                      Request(1.0, 700, 1, (9, 10)))
    assert reuse_ceiling(replay) == 3 / 9  # 9 blocks, 3 of them seen before (1, 2, 3 again)
    assert recorded(path, compression=2.0).replay == replay
    # copies: shifted, each with ids of its own (ids + copy x 11), so the ceiling stays the recording's
    copies = superpose(replay, 3, replay_seconds(replay), random.Random(0))
    assert len(copies) == 9 and reuse_ceiling(copies) == 3 / 9
    assert sorted(r.hash_ids for r in copies if r.prompt_tokens == 700) == [(9, 10), (20, 21), (31, 32)]
    assert reuse_ceiling([Request(0.0, 10, 1)]) is None  # no hash ids: no ceiling
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": "abc"}\n')
    with pytest.raises(TraceFileError, match='line 1: hash_ids is "abc", not a list of integers'):
        read(bad)
