"""The benchmark harness: alternation, medians and ratios against values written out by hand,
the README's tables against the JSON results, and the command line's refusals."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import harness  # noqa: E402


def test_alternate_rotates_the_first_contender_and_warms_each_up():
    calls = []
    contenders = {name: (lambda name=name: calls.append(name)) for name in "abc"}
    times = harness.alternate(contenders, repeats=4, warmup=1)
    assert calls[:3] == ["a", "b", "c"]  # the warm-up round, untimed
    assert calls[3:] == ["a", "b", "c", "b", "c", "a", "c", "a", "b", "a", "b", "c"]
    assert {name: len(t) for name, t in times.items()} == {"a": 4, "b": 4, "c": 4}


def test_a_contender_s_own_seconds_are_its_time():
    reported = iter([0.5, 2.0, 0.25, 1.0])
    times = harness.alternate({"ours": lambda: next(reported), "peer": lambda: next(reported)},
                              repeats=2, warmup=0)
    # Round 0: ours, peer; round 1: peer, ours.
    assert times == {"ours": [0.5, 1.0], "peer": [2.0, 0.25]}


def test_compare_takes_medians_and_the_median_of_the_per_round_ratios():
    times = {"ours": [1.0, 3.0, 2.0], "keras": [2.0, 2.0, 8.0]}
    row = harness.compare("step", times, unit="ms")
    # Per-round ratios 0.5, 1.5, 0.25: their median is 0.5; the ratio of the medians would be
    # 2 / 2 = 1.
    assert row.ratio == 0.5
    assert (row.ours, row.peer, row.peer_name, row.repeats) == (2000.0, 2000.0, "keras", 3)
    assert row.times == times
    with pytest.raises(ValueError, match="name the peer"):
        harness.compare("x", {"ours": [1.0], "a": [1.0], "b": [1.0]})


def _result(name, rows):
    return {"case": name, "description": "d", "size": "tiny", "settings": {}, "date": "2026-12-07",
            "machine": harness.machine(), "load_after": [0.0, 0.0, 0.0], "seconds": 1.0,
            "rows": [row.to_json() for row in rows]}


def test_the_readme_tables_are_made_from_the_results(tmp_path):
    row = harness.compare("train step", {"ours": [0.002, 0.004], "peer": [0.004, 0.004]})
    (tmp_path / "layers.json").write_text(json.dumps(_result("layers", [row])))
    text = ("intro\n<!-- case:layers -->\nold table\n<!-- /case:layers -->\nmiddle\n"
            "<!-- case:nmt -->\nold\n<!-- /case:nmt -->\nend\n")
    out = harness.render_readme(text, tmp_path)
    assert "old" not in out
    assert out.startswith("intro\n<!-- case:layers -->\n")
    # No nmt.json: its part says so.
    assert out.endswith("middle\n<!-- case:nmt -->\nNo standard run recorded yet: "
                        "`python benchmarks/harness.py --cases nmt`.\n<!-- /case:nmt -->\nend\n")
    line = next(x for x in out.splitlines() if x.startswith("| train step"))
    # Medians 3 ms and 4 ms, per-round ratios 0.5 and 1.0.
    assert line == "| train step | 3 ms | 4 ms | peer | **0.75** | 2 |"


def test_the_committed_readme_shows_the_committed_results():
    text = harness.README.read_text()
    for name in harness.CASES:
        assert f"<!-- case:{name} -->" in text, f"benchmarks/README.md has no table for {name}"
    assert harness.render_readme(text, harness.RESULTS) == text, (
        "benchmarks/README.md's tables differ from benchmarks/results: "
        "run python benchmarks/harness.py --readme")


@pytest.mark.parametrize("argv, message", [
    (["--cases", "layers,nope"], "--cases: no case 'nope'"),
    (["--cases", "layers", "--size", "tiny"], "--size tiny: give --out DIR"),
])
def test_bad_command_lines_are_refused_with_exit_code_2(argv, message):
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "harness.py"), *argv],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr
