"""The README's training commands, SIGKILLed and run again: one real kill per application.

The kill is real (``TFX_TRANSFORMER_FAULT=export``, the trainer's testing hook, makes the
process SIGKILL itself when its export starts); the rerun is the same command. The commands are
the README's with their default flags (``--vocab-size`` included), ``--max-steps`` for their
time budget and ``--eval-limit`` for a shorter evaluation. Every other phase, a finished run
rerun, a longer run, a NaN loss and broken work directory files: in process,
tests/tfx_transformer/test_trainer.py and test_callbacks.py; bad input:
tests/scripts/test_cli_battery.py.
"""

import json
import signal

import pytest

NMT_README = ("--data", "embedded", "--preset", "tiny")  # README: train_nmt.py, --time-budget
NMT_MAX_STEPS = 3
DETR_MAX_STEPS = 2  # DETR_MAX_STEPS of tests/conftest.py, which runs the DETR command


def _snapshot(*paths):
    """Bytes of every file under ``paths`` (directories)."""
    return {str(f): f.read_bytes() for path in paths for f in sorted(path.rglob("*"))
            if f.is_file()}


def _state(work):
    return json.loads((work / "run.json").read_text())


def _killed_at_export(process, state, max_steps):
    assert process.returncode == -signal.SIGKILL, process.stderr[-3000:]
    assert (state["phase"], state["steps"]) == ("trained", max_steps)


def _resumed(process, state, max_steps):
    assert process.returncode == 0, process.stderr[-3000:]
    assert f"resume: training finished earlier ({max_steps} steps), exporting now" in \
        process.stdout
    assert "Traceback" not in process.stderr
    assert state["phase"] == "finished"
    assert state["steps"] == state["export_steps"] == max_steps  # no step taken on the rerun


@pytest.mark.slow
def test_nmt_readme_command_killed_at_its_export_resumes_there(tmp_path, run_script):
    work = tmp_path / "work"
    command = ("train_nmt.py", *NMT_README, "--workdir", work, "--max-steps", NMT_MAX_STEPS,
               "--eval-limit", 100)  # 100 of the 1,000 held-out pairs beam-searched
    killed = run_script(*command, fault="export")
    _killed_at_export(killed, _state(work), NMT_MAX_STEPS)
    assert sorted(p.name for p in (work / "checkpoints").iterdir()) == ["epoch-001.weights.h5"]
    assert not (work / "export").exists()
    trained = _snapshot(work / "checkpoints")

    done = run_script(*command)  # the tokenizer, the data and the checkpoint are reused
    _resumed(done, _state(work), NMT_MAX_STEPS)
    assert done.stderr == ""  # quiet start: no TensorFlow or Keras lines
    assert _snapshot(work / "checkpoints") == trained
    metrics = json.loads((work / "metrics.json").read_text())
    assert "held-out: bleu" in done.stdout and metrics["valid"]["n"] > 0
    assert metrics["config"]["vocab_size"] == 2000  # the tiny preset's, no flag
    assert (work / "export" / "saved_model.pb").exists()


@pytest.mark.slow
@pytest.mark.xdist_group("detr_workdir")  # with the other tests of the shared DETR run
def test_detr_readme_command_killed_at_its_export_resumes_there(detr_workdir):
    work, runs = detr_workdir  # tests/conftest.py: the two processes and what each left
    (killed, killed_state, trained), (done, state, after) = runs["killed"], runs["done"]
    _killed_at_export(killed, killed_state, DETR_MAX_STEPS)
    assert list(trained) == ["epoch-001.weights.h5"]

    _resumed(done, state, DETR_MAX_STEPS)
    assert done.stderr == ""  # quiet start: no TensorFlow or Keras lines
    assert after == trained
    metrics = json.loads((work / "metrics.json").read_text())
    assert metrics["train"]["stopped_by"] == f"max_steps={DETR_MAX_STEPS} reached"
    assert "validation: AP" in done.stdout
