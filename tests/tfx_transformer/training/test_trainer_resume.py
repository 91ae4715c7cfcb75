"""Tests for tfx_transformer.training.trainer: runs killed, finished, continued, restarted or
broken, and the work directory's own checks (`Trainer(workdir, run).fit(task)` resumes a run
with its own command)."""

import os
import sys

import keras
import pytest

from tfx_transformer.training.run import RunOptions
from tfx_transformer.training.saving import NonFiniteLossError
from tfx_transformer.training.trainer import Trainer
from tfx_transformer.training.workdir import read_metrics, read_state

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from trainer_toys import Crash, ToyTask  # noqa: E402


def _snapshot(root):
    """Every file's bytes, but TensorBoard's (a fit that fails still writes its events)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.relative_to(root).parts[0] != "logs"}


def _run(workdir, events, crash_in=None, data="embedded", **options):
    """One run, as a script would do it; the export records the steps."""
    return Trainer(workdir, RunOptions(**options), log=events.append).fit(
        ToyTask(events, data=data, crash_in=crash_in))


def _steps(scores):
    return {"steps": scores["steps"]} if scores else scores


@pytest.mark.parametrize("phase", ["training", "export", "evaluate"])
def test_a_run_killed_in_any_phase_resumes_there(tmp_path, phase):
    events = []
    with pytest.raises(Crash):
        _run(tmp_path, events, crash_in=phase)
    crashed_steps = events.count("step")
    assert ("fresh", True) in events  # a new model: a task may set its first weights
    events.clear()
    assert _steps(_run(tmp_path, events)) == {"steps": 6}  # the lineage of an uninterrupted run
    assert ("fresh", False) in events  # the run's own state: epoch 1 or its training
    assert (tmp_path / "export" / "steps").read_text() == "6"
    # Training resumes from epoch 2's start; a finished fit is not redone.
    assert events.count("step") == {"training": 3, "export": 0, "evaluate": 0}[phase]
    assert crashed_steps == {"training": 4, "export": 6, "evaluate": 6}[phase]
    assert events.count("export") == (phase != "evaluate")
    assert events.count("evaluate") == 1
    assert read_state(tmp_path)["phase"] == "finished"
    assert [e["epoch"] for e in read_metrics(tmp_path)["history"]] == [1, 2]


def test_a_finished_run_rerun_changes_nothing_and_a_longer_one_continues(tmp_path):
    events = []
    assert _steps(_run(tmp_path, events)) == {"steps": 6}
    before = _snapshot(tmp_path)
    events.clear()
    assert _steps(_run(tmp_path, events)) == {"steps": 6}
    assert _snapshot(tmp_path) == before
    assert len(events) == 1 and "finished earlier (2 epochs, 6 steps)" in events[0]  # no data
    assert _steps(_run(tmp_path, events, max_steps=5)) == {"steps": 6}  # 6 >= 5: nothing to add
    assert _snapshot(tmp_path) == before
    events.clear()
    assert _steps(_run(tmp_path, events, epochs=3)) == {"steps": 9}  # epoch 3 only
    assert events.count("step") == 3 and (tmp_path / "export" / "steps").read_text() == "9"
    names = sorted(os.listdir(tmp_path / "checkpoints"))
    assert names == ["epoch-003.weights.h5"]  # a task without `averaging`: the last epoch's
    assert [n for n in before if n.startswith("checkpoints/")] == [
        "checkpoints/epoch-002.weights.h5"]


class Slow(keras.callbacks.Callback):
    """Makes each step last 40 ms, so that a budget of 0.001 min (60 ms) stops inside the
    first epoch of 3 steps."""

    def on_train_batch_end(self, batch, logs=None):
        import time

        time.sleep(0.04)


@pytest.mark.parametrize("first", [{"max_steps": 2}, {"max_steps": 3}, {"time_budget": 0.001}],
                         ids=["inside-epoch-1", "at-an-epoch-end", "after-a-time-budget"])
@pytest.mark.parametrize("then", [{"max_steps": 7}, {"epochs": 3}], ids=["max-steps", "epochs"])
def test_a_finished_run_continues_to_exactly_the_new_bound(tmp_path, first, then):
    events = []
    Trainer(tmp_path, RunOptions(**first), log=events.append).fit(
        ToyTask(events, extra=[Slow()] if "time_budget" in first else []))
    done = read_state(tmp_path)["steps"]
    assert read_state(tmp_path)["phase"] == "finished" and 1 <= done <= 3
    events.clear()
    bound = then.get("max_steps") or 3 * then["epochs"]  # 3 steps per epoch
    assert _steps(_run(tmp_path, events, **then)) == {"steps": bound}
    assert events.count("step") == bound - done
    assert (tmp_path / "export" / "steps").read_text() == str(bound)
    state = read_state(tmp_path)
    assert (state["phase"], state["steps"]) == ("finished", bound)
    stopped = read_metrics(tmp_path)["train"]["stopped_by"]
    assert stopped == ("max_steps=7 reached" if "max_steps" in then else
                       None if done == 3 else "epochs=3 reached")
    events.clear()  # and the same request again changes nothing
    assert _steps(_run(tmp_path, events, **then)) == {"steps": bound}
    assert "step" not in events and "finished earlier" in events[0]


def test_restart_moves_the_earlier_run_aside_and_keeps_its_export(tmp_path):
    events = []
    _run(tmp_path, events)
    (tmp_path / "tokenizer.model").write_text("old")
    old_metrics = (tmp_path / "metrics.json").read_bytes()
    events.clear()
    with pytest.raises(Crash):  # the restarted run's first export
        _run(tmp_path, events, crash_in="export", restart=True)
    moved = events[0]
    logs = "logs, " if (tmp_path / "previous-1" / "logs").exists() else ""  # TensorBoard's
    assert moved == (f"restart: moved the earlier run's checkpoints, backup, {logs}"
                     f"metrics.json, run.json, tokenizer.model to {tmp_path / 'previous-1'} "
                     "(export/ stays until the new export replaces it)")
    assert (tmp_path / "previous-1" / "metrics.json").read_bytes() == old_metrics
    assert (tmp_path / "previous-1" / "tokenizer.model").read_text() == "old"
    assert (tmp_path / "export" / "steps").read_text() == "6"
    assert read_state(tmp_path)["phase"] == "trained"  # the new run's own run.json
    assert sorted(os.listdir(tmp_path)) == ["backup", "checkpoints", "export", "logs",
                                            "metrics.json", "model.keras", "previous-1",
                                            "run.json"]  # the export and model.keras stay
    assert "valid" not in read_metrics(tmp_path)  # the new run's history only


def test_a_nan_loss_is_an_error_that_exports_nothing(tmp_path, monkeypatch):
    events = []
    _run(tmp_path, events, epochs=1)
    before = _snapshot(tmp_path)
    monkeypatch.setenv("TFX_TRANSFORMER_FAULT", "nan:5")
    with pytest.raises(NonFiniteLossError, match="step 5 .epoch 2."):
        _run(tmp_path, events, epochs=2)
    after = _snapshot(tmp_path)
    assert after.pop("run.json") != before.pop("run.json")  # phase: training again
    assert after == before  # checkpoint, backup, export and metrics.json untouched


def test_empty_training_data_fails_before_fit(tmp_path):
    events = []
    with pytest.raises(ValueError, match="no training batches"):
        Trainer(tmp_path, RunOptions(max_steps=3)).fit(ToyTask(events, steps_per_epoch=0))
    assert events == ["load_data"]
    assert not any((tmp_path / "checkpoints").iterdir())
    assert read_state(tmp_path) == {"phase": "training", "data": "embedded",
                                    "split": {"valid_fraction": 0.05, "seed": 0}}


@pytest.mark.parametrize("name, text, message", [
    ("metrics.json", "[]", "metrics.json must hold a JSON object, not list"),
    ("metrics.json", "{", "metrics.json is not valid JSON"),
    ("run.json", '{"phase": "done"}', "run.json: unknown phase 'done'"),
    ("backup/latest.weights.h5", "cut", "latest.weights.h5 is truncated or corrupt"),
])
def test_a_broken_workdir_file_is_named_before_anything_runs(tmp_path, name, text, message):
    (tmp_path / name).parent.mkdir(exist_ok=True)
    (tmp_path / name).write_text(text)
    events = []
    with pytest.raises(ValueError, match=message) as info:
        Trainer(tmp_path, RunOptions()).fit(ToyTask(events))
    assert events == []
    assert str(tmp_path / name) in str(info.value) and "--restart" in str(info.value)
    assert (tmp_path / name).read_text() == text


def test_a_workdir_is_continued_only_on_its_own_data(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "one.tsv").write_text("a\tb\n")
    work, events = tmp_path / "work", []
    assert _steps(_run(work, events, data="tsv:one.tsv")) == {"steps": 6}
    assert read_state(work)["data"] == f"tsv:{tmp_path / 'one.tsv'}"
    before = _snapshot(work)
    with pytest.raises(ValueError) as error:
        _run(work, events, data="tsv:two.tsv", epochs=3)
    message = str(error.value)
    assert "--data tsv:two.tsv" in message and str(tmp_path / "one.tsv") in message
    assert "--restart" in message
    assert _snapshot(work) == before
    # The same file by another path is the same data: the finished run is left alone.
    events.clear()
    assert _steps(_run(work, events, data=f"tsv:{tmp_path / 'one.tsv'}")) == {"steps": 6}
    assert "finished earlier" in events[0] and _snapshot(work) == before
    assert _steps(_run(work, events, data="tsv:two.tsv", restart=True)) == {"steps": 6}
    assert read_state(work)["data"] == "tsv:two.tsv"


def test_a_second_process_on_a_work_directory_fails_at_once(tmp_path):
    import fcntl

    _run(tmp_path, [], epochs=1)
    before = _snapshot(tmp_path)
    assert ".lock" not in before  # written only while a run holds the directory
    held = os.open(tmp_path, os.O_RDONLY)  # another run holds it
    try:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        (tmp_path / ".lock").write_text("4242")
        events = []
        with pytest.raises(ValueError, match=f"{tmp_path} is in use by process 4242"):
            _run(tmp_path, events, epochs=2)
        assert events == []  # nothing loaded, nothing trained
        assert (tmp_path / ".lock").read_text() == "4242"  # the holder's, left to it
        (tmp_path / ".lock").unlink()
    finally:
        os.close(held)
    assert _snapshot(tmp_path) == before
    assert _steps(_run(tmp_path, [], epochs=2)) == {"steps": 6}  # the lock went with it


class Broken(ToyTask):
    def load_data(self, context):
        raise ValueError("--data tsv:c: line 3: bad line")


def test_the_data_and_its_split_are_recorded_before_the_task_loads_them(tmp_path):
    class Fails(ToyTask):
        def load_data(self, context):  # Ctrl-C once the tokenizer is written
            (context.workdir.root / "tokenizer.model").write_text("trained on tsv:a")
            raise KeyboardInterrupt

    with pytest.raises(ValueError, match="bad line"):  # bad data, nothing written: no record
        Trainer(tmp_path, RunOptions()).fit(Broken([], data="tsv:c"))
    assert not (tmp_path / "run.json").exists()

    with pytest.raises(KeyboardInterrupt):
        Trainer(tmp_path, RunOptions(seed=5, valid_fraction=0.1)).fit(Fails([], data="tsv:a"))
    state = read_state(tmp_path)
    assert (state["data"], state["split"]) == ("tsv:a", {"valid_fraction": 0.1, "seed": 5})
    with pytest.raises(ValueError, match="--data tsv:b: .* holds a run on --data tsv:a"):
        _run(tmp_path, [], data="tsv:b", seed=5, valid_fraction=0.1)
    for options, flag in (({"seed": 6, "valid_fraction": 0.1}, "--seed 6"),
                          ({"seed": 5, "valid_fraction": 0.2}, "--valid-fraction 0.2")):
        with pytest.raises(ValueError, match=f"{flag}: .* holds a run with") as info:
            _run(tmp_path, [], data="tsv:a", **options)
        assert "held-out examples" in str(info.value) and "--restart" in str(info.value)
    assert _steps(_run(tmp_path, [], data="tsv:a", seed=5, valid_fraction=0.1)) == {"steps": 6}
