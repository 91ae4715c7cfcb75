"""A training run through its command line: kills in every phase, NaN, reruns, empty data.

The kills are real (``TFX_TRANSFORMER_FAULT``, the trainer's testing hook, makes the process
SIGKILL itself); each rerun is the same command. Bad-input cases fail before training.
"""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from nlp.data.embedded import generate_pairs

ROOT = Path(__file__).resolve().parents[2]
# No TF_CPP_MIN_LOG_LEVEL here: the scripts' quiet start is under test too.
ENV = {key: value for key, value in os.environ.items()
       if key not in ("TF_CPP_MIN_LOG_LEVEL", "TFX_TRANSFORMER_VERBOSE", "TFX_TRANSFORMER_FAULT",
                      "TFX_TRANSFORMER_DEBUG")}


def _run(script, *args, fault=None):
    env = {**ENV, "TFX_TRANSFORMER_FAULT": fault} if fault else ENV
    return subprocess.run([sys.executable, str(ROOT / "scripts" / script), *map(str, args)],
                          capture_output=True, text=True, env=env, timeout=600)


def _snapshot(*paths):
    """Bytes of every file under ``paths`` (files or directories)."""
    found = {}
    for path in paths:
        for file in [path] if path.is_file() else sorted(path.rglob("*")):
            if file.is_file():
                found[str(file)] = file.read_bytes()
    return found


def _state(work):
    return json.loads((work / "run.json").read_text())


def _one_error(result, *needles):
    """The run failed before training with exit 2 and exactly one stderr line, ``error: ...``."""
    assert result.returncode == 2, result.stderr[-3000:]
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr[-3000:]
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def tsv(tmp_path):
    path = tmp_path / "pairs.tsv"
    path.write_text("".join(f"{s}\t{t}\n" for s, t in generate_pairs(16)), encoding="utf-8")
    return path


@pytest.mark.slow
def test_killed_in_every_phase_resumes_nan_stops_and_a_rerun_changes_nothing(tmp_path, tsv):
    work = tmp_path / "work"
    # 14 training pairs in a few batches (one per length bucket), 2 held out.
    command = ["train_nmt.py", "--data", f"tsv:{tsv}", "--workdir", work, "--epochs", 2,
               "--vocab-size", 100, "--batch-tokens", 4096, "--beam", 1, "--max-length", 48,
               "--valid-fraction", 0.1]

    killed = _run(*command, fault="epoch:2")  # SIGKILL at epoch 2's first step
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert _state(work)["phase"] == "training"
    assert sorted(os.listdir(work / "checkpoints")) == ["epoch-001.weights.h5"]
    first_epoch = _snapshot(work / "checkpoints")

    killed = _run(*command, fault="export")  # epoch 2 from the backup, then killed
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    state = _state(work)
    assert (state["phase"], state["epochs"]) == ("trained", 2) and not (work / "export").exists()
    trained = _snapshot(work / "checkpoints")
    assert first_epoch.items() <= trained.items() and len(trained) == 2  # epoch 1 untouched

    killed = _run(*command, fault="evaluate")  # exports without training, then killed
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert "resume: training finished earlier" in killed.stdout
    assert _state(work)["phase"] == "exported" and (work / "export" / "saved_model.pb").exists()
    assert _snapshot(work / "checkpoints") == trained  # no step taken
    exported = _snapshot(work / "export")

    done = _run(*command)  # evaluates: the export is left as it is
    assert done.returncode == 0, done.stderr[-3000:]
    assert "held-out: bleu" in done.stdout and "Traceback" not in done.stderr
    assert _snapshot(work / "export") == exported
    state, metrics = _state(work), json.loads((work / "metrics.json").read_text())
    assert state["phase"] == "finished"
    # The lineage of an uninterrupted run: 2 epochs of every batch, and the export has them.
    assert state["steps"] == state["export_steps"] == 2 * metrics["data"]["train_batches"]
    assert [e["epoch"] for e in metrics["history"]] == [1, 2]
    assert metrics["data"]["kept"] + metrics["data"]["dropped"] == metrics["data"]["train_pairs"]
    assert metrics["valid"]["n"] == 2 and len(metrics["samples"]) == 2
    assert metrics["config"]["decoding"]["beam_size"] == 1
    assert 0 < metrics["config"]["vocab_size"] <= 100

    finished = _snapshot(work / "export", work / "checkpoints", work / "metrics.json",
                         work / "run.json", work / "backup")
    again = _run(*command)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "this run finished earlier (2 epochs" in again.stdout
    assert again.stderr == ""  # quiet start, no Keras warnings
    assert _snapshot(work / "export", work / "checkpoints", work / "metrics.json",
                     work / "run.json", work / "backup") == finished

    # A longer run continues from the last state, and its loss turns NaN at its 2nd step.
    longer = [*command[:6], 3, *command[7:]]
    nan = _run(*longer, fault=f"nan:{state['steps'] + 1}")
    error = _one_error(nan, "training loss is nan", "epoch 3", "epoch-002.weights.h5")
    assert "nothing exported" in error
    after = _snapshot(work / "export", work / "checkpoints", work / "metrics.json",
                      work / "backup")
    assert after == {k: v for k, v in finished.items() if not k.endswith("run.json")}


def test_nmt_with_every_pair_over_max_length_fails_before_training(tmp_path, tsv):
    work = tmp_path / "work"
    result = _run("train_nmt.py", "--data", f"tsv:{tsv}", "--workdir", work, "--max-length", 2,
                  "--max-steps", 2, "--vocab-size", 100)
    _one_error(result, "training pairs are longer than --max-length 2 tokens",
               "raise `--max-length`")
    # ours, the first lines: the precision `auto` chose, then the data
    first, second = result.stdout.splitlines()[:2]
    assert first.startswith("mixed precision: ") and second.startswith("data: ")
    assert sorted(os.listdir(work)) == ["checkpoints", "logs"]  # no tokenizer, no state
    assert not any((work / "checkpoints").iterdir())


def test_detr_without_training_images_fails_before_training(tmp_path):
    (tmp_path / "ann.json").write_text(json.dumps(
        {"images": [], "annotations": [], "categories": [{"id": 1, "name": "a"}]}))
    work = tmp_path / "work"
    result = _run("train_detr.py", "--data", f"coco:{tmp_path}:{tmp_path / 'ann.json'}",
                  "--workdir", work, "--max-steps", 2)
    line = _one_error(result)
    assert "no training images" in line or "ann.json" in line
    assert not (work / "run.json").exists() and not any((work / "checkpoints").iterdir())


# More broken files, in process: tests/tfx_transformer/test_trainer.py.
@pytest.mark.parametrize("name, text, needle", [
    ("metrics.json", "[]", "metrics.json must hold a JSON object, not list"),
])
def test_a_broken_workdir_file_is_named_before_any_data_is_read(tmp_path, name, text, needle):
    work = tmp_path / "work"
    (work / name).parent.mkdir(parents=True)
    (work / name).write_text(text)
    result = _run("train_nmt.py", "--data", "tsv:/no/such/file.tsv", "--workdir", work)
    _one_error(result, needle, str(work / name), "--restart")
    assert (work / name).read_text() == text and not (work / "tokenizer.model").exists()
