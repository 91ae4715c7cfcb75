"""Every benchmark case runs at its tiny size, as ``make bench`` runs it at the standard size
(``python benchmarks/harness.py --cases NAME``), so that none rots: each writes its JSON, every
row's medians and ratio are those of its own rounds, and each case compares with a peer."""

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import harness  # noqa: E402


@pytest.mark.slow
@pytest.mark.parametrize("name", harness.CASES)
def test_the_case_runs_at_its_tiny_size(name, tmp_path):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "harness.py"), "--cases", name, "--size",
         "tiny", "--out", str(tmp_path / "out"), "--workdir", str(tmp_path / "work")],
        capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads((tmp_path / "out" / f"{name}.json").read_text())
    case = harness.load_case(name)
    assert (result["case"], result["size"]) == (name, "tiny")
    assert result["settings"] == json.loads(json.dumps(case.SIZES["tiny"]))
    assert result["machine"]["cores"] >= 1 and result["machine"]["cpu"]
    rows = result["rows"]
    measures = [row["measure"] for row in rows]
    assert len(set(measures)) == len(measures), f"a measure twice: {measures}"
    compared = [row for row in rows if row["ratio"] is not None]
    assert compared, f"{name}: no row compares with a peer"
    for row in compared:
        if not row["times"]:  # a measure, not a timing (a size, a memory): ratio of the two
            assert row["ratio"] == pytest.approx(row["ours"] / row["peer"])
            continue
        ours_name = next(key for key in row["times"] if key != row["peer_name"])
        ours, peer = row["times"][ours_name], row["times"][row["peer_name"]]
        scale = harness.UNITS[row["unit"]]
        assert len(ours) == len(peer) == row["repeats"] >= 1
        assert min(ours + peer) > 0
        assert row["ours"] == pytest.approx(statistics.median(ours) * scale)
        assert row["peer"] == pytest.approx(statistics.median(peer) * scale)
        assert row["ratio"] == pytest.approx(statistics.median(
            o / p for o, p in zip(ours, peer)))
    # The table the README would show has one line per row.
    table = harness.table(result)
    assert [line.split(" | ")[0][2:] for line in table.splitlines()[4:]] == measures
