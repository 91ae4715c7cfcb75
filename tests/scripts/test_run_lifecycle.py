"""The README's detector command, SIGKILLed when its export starts and run again.

The kill is real (``TFX_TRANSFORMER_FAULT=export``, the trainer's testing hook, makes the
process SIGKILL itself); the rerun is the same command: the README's with its default flags,
``--max-steps`` for its time budget and ``--eval-limit`` for a shorter evaluation. One kill per
level: the translation command's (killed mid-epoch, a fine-tuning run) is
tests/nlp/pretrained/test_marian_finetune.py's, the multi-worker one tests/test_multi_worker.py's.
Every other phase, a finished run rerun, a longer run, a NaN loss and broken work directory
files: in process, tests/tfx_transformer/training/test_trainer.py and test_callbacks.py; bad input:
tests/scripts/test_cli_battery.py.
"""

import json
import signal

import pytest

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
