"""Tests for tfx_transformer.training.trainer.Trainer: the skeleton both applications train with."""

import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfx_transformer.training.callbacks import NonFiniteLossError
from tfx_transformer.training.run import RunOptions
from tfx_transformer.training.trainer import Trainer
from tfx_transformer.training.workdir import read_metrics, read_state

X = np.arange(48, dtype="float32").reshape(12, 4) / 48.0
Y = X.sum(axis=1, keepdims=True)


def _data():
    return tf.data.Dataset.from_tensor_slices((X, Y)).batch(4)  # 3 steps per epoch


def _model():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    return model


class Events(keras.callbacks.Callback):
    def __init__(self, log, name):
        super().__init__()
        self.log, self.name = log, name

    def on_train_begin(self, logs=None):
        self.log.append(f"{self.name}: begin")

    def on_train_end(self, logs=None):
        self.log.append(f"{self.name}: end")


def test_train_fits_exports_evaluates_and_writes_once(tmp_path):
    events = []
    trainer = Trainer(tmp_path, RunOptions(max_steps=4, seed=3), log=events.append)
    assert trainer.replicas == 1 and trainer.workdir.checkpoints.is_dir()
    with trainer.strategy.scope():
        model = _model()

    def evaluate():
        events.append("evaluate")
        loss = model.evaluate(X, Y, verbose=0)
        return {"valid": {"loss": loss}, "data": {"n": 12}}

    scores = trainer.train(
        model, _data(), _data(), default_epochs=50, steps_per_epoch=3,
        export=lambda path: events.append(f"export to {path.name}"), evaluate=evaluate,
        first_callbacks=[Events(events, "first")], callbacks=[Events(events, "last")],
        checks=[lambda: events.append("check")])
    assert int(model.optimizer.iterations) == 4  # max_steps, over 2 planned epochs of 3
    assert events == ["first: begin", "last: begin", "first: end", "last: end", "check",
                      "export to export", f"export: {tmp_path / 'export'} (4 steps)",
                      "evaluate", "check"]
    assert scores == {"loss": pytest.approx(float(np.mean((model.predict(X, verbose=0) - Y)
                                                          ** 2)), rel=1e-5)}
    metrics = read_metrics(tmp_path)
    assert metrics["valid"] == scores and metrics["data"] == {"n": 12}
    assert metrics["train"]["stopped_by"] == "max_steps=4 reached"
    assert [e["epoch"] for e in metrics["history"]] == [1, 2]
    assert "val_loss" in metrics["history"][0] and metrics["train_seconds"] >= 0
    state = json.loads((tmp_path / "run.json").read_text())
    assert (state["phase"], state["epochs"], state["steps"], state["export_steps"]) == (
        "finished", 2, 4, 4)


def test_seed_and_precision_are_set_before_the_model_is_built(tmp_path):
    weights = []
    for _ in range(2):
        Trainer(tmp_path / "a", RunOptions(seed=7, mixed_precision="bfloat16"))
        assert keras.config.dtype_policy().name == "mixed_bfloat16"
        weights.append(_model().get_weights()[0])
    np.testing.assert_array_equal(*weights)
    Trainer(tmp_path / "b", RunOptions(seed=8))
    assert keras.config.dtype_policy().name == "float32"
    assert not np.array_equal(_model().get_weights()[0], weights[0])


def test_a_failed_check_stops_before_export(tmp_path):
    trainer = Trainer(tmp_path, RunOptions(epochs=1))
    exported = []

    def check():
        raise ValueError("image 7 has too many objects")

    with pytest.raises(ValueError, match="image 7"):
        trainer.train(_model(), _data(), default_epochs=1, export=exported.append,
                      evaluate=lambda: {"valid": {}}, checks=[check])
    assert exported == [] and "valid" not in read_metrics(tmp_path)


def test_non_chief_workers_fit_but_neither_export_nor_evaluate(tmp_path, monkeypatch):
    trainer = Trainer(tmp_path, RunOptions(epochs=2))  # strategy before TF_CONFIG is read
    config = {"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 1}}
    monkeypatch.setenv("TF_CONFIG", json.dumps(config))
    model = _model()
    done = trainer.train(model, _data(), default_epochs=1, export=pytest.fail,
                         evaluate=pytest.fail)
    assert done == {} and int(model.optimizer.iterations) == 6  # run.epochs wins: 2 x 3
    assert not (tmp_path / "metrics.json").exists()


def test_run_must_be_run_options(tmp_path):
    with pytest.raises(TypeError, match="RunOptions"):
        Trainer(tmp_path, {"epochs": 1})


class Crash(Exception):
    """Stands for a kill: nothing of the trainer runs after it."""


def _snapshot(root):
    """Every file's bytes, but TensorBoard's (a fit that fails still writes its events)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.relative_to(root).parts[0] != "logs"}


def _run(workdir, events, crash_in=None, data="embedded", **options):
    """One run of the skeleton, as a script would do it; the export records the steps."""
    trainer = Trainer(workdir, RunOptions(**options), log=events.append)
    trainer.check_data(data)
    done = trainer.finished(default_epochs=2)
    if done is not None:
        return done
    with trainer.strategy.scope():
        model = _model()

    def export(path):
        events.append("export")
        if crash_in == "export":
            raise Crash
        path.mkdir(exist_ok=True)
        (path / "steps").write_text(str(int(model.optimizer.iterations)))

    def evaluate():
        events.append("evaluate")
        if crash_in == "evaluate":
            raise Crash
        return {"valid": {"steps": int(model.optimizer.iterations)}}

    class Steps(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            events.append("step")
            if crash_in == "training" and int(self.model.optimizer.iterations) == 4:
                raise Crash

    return trainer.train(model, _data(), default_epochs=2, steps_per_epoch=3, export=export,
                         evaluate=evaluate, callbacks=[Steps()])


@pytest.mark.parametrize("phase", ["training", "export", "evaluate"])
def test_a_run_killed_in_any_phase_resumes_there(tmp_path, phase):
    events = []
    with pytest.raises(Crash):
        _run(tmp_path, events, crash_in=phase)
    crashed_steps = events.count("step")
    events.clear()
    assert _run(tmp_path, events) == {"steps": 6}  # the lineage of an uninterrupted run
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
    assert _run(tmp_path, events) == {"steps": 6}
    before = _snapshot(tmp_path)
    events.clear()
    assert _run(tmp_path, events) == {"steps": 6}
    assert _snapshot(tmp_path) == before
    assert len(events) == 1 and "finished earlier (2 epochs, 6 steps)" in events[0]
    assert _run(tmp_path, events, max_steps=5) == {"steps": 6}  # 6 >= 5: nothing to add
    assert _snapshot(tmp_path) == before
    events.clear()
    assert _run(tmp_path, events, epochs=3) == {"steps": 9}  # epoch 3 only
    assert events.count("step") == 3 and (tmp_path / "export" / "steps").read_text() == "9"
    names = sorted(os.listdir(tmp_path / "checkpoints"))
    assert names == [f"epoch-00{i}.weights.h5" for i in (1, 2, 3)]
    assert before["checkpoints/epoch-001.weights.h5"] == (
        tmp_path / "checkpoints" / "epoch-001.weights.h5").read_bytes()


def test_restart_moves_the_earlier_run_aside_and_keeps_its_export(tmp_path):
    events = []
    _run(tmp_path, events)
    (tmp_path / "tokenizer.model").write_text("old")
    old_metrics = (tmp_path / "metrics.json").read_bytes()
    events.clear()
    trainer = Trainer(tmp_path, RunOptions(restart=True), log=events.append,
                      state_files=("tokenizer.model",))
    logs = "logs, " if (tmp_path / "previous-1" / "logs").exists() else ""  # TensorBoard's
    assert events == [f"restart: moved the earlier run's checkpoints, backup, {logs}"
                      f"metrics.json, run.json, tokenizer.model to {tmp_path / 'previous-1'} "
                      "(export/ stays until the new export replaces it)"]
    assert (tmp_path / "previous-1" / "metrics.json").read_bytes() == old_metrics
    assert (tmp_path / "export" / "steps").read_text() == "6"
    assert trainer.finished(2) is None and not (tmp_path / "run.json").exists()
    assert sorted(os.listdir(tmp_path)) == ["checkpoints", "export", "logs", "previous-1"]


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
    trainer = Trainer(tmp_path, RunOptions(max_steps=3))
    with pytest.raises(ValueError, match="no training batches"):
        trainer.train(_model(), _data(), default_epochs=1, steps_per_epoch=0,
                      export=pytest.fail, evaluate=pytest.fail)
    assert not any((tmp_path / "checkpoints").iterdir()) and not (tmp_path / "run.json").exists()


@pytest.mark.parametrize("name, text, message", [
    ("metrics.json", "[]", "metrics.json must hold a JSON object, not list"),
    ("metrics.json", "{", "metrics.json is not valid JSON"),
    ("run.json", '{"phase": "done"}', "run.json: unknown phase 'done'"),
    ("backup/latest.weights.h5", "cut", "latest.weights.h5 is truncated or corrupt"),
])
def test_a_broken_workdir_file_is_named_before_anything_runs(tmp_path, name, text, message):
    (tmp_path / name).parent.mkdir(exist_ok=True)
    (tmp_path / name).write_text(text)
    with pytest.raises(ValueError, match=message) as info:
        Trainer(tmp_path, RunOptions())
    assert str(tmp_path / name) in str(info.value) and "--restart" in str(info.value)
    assert (tmp_path / name).read_text() == text


def test_a_workdir_is_continued_only_on_its_own_data(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "one.tsv").write_text("a\tb\n")
    work, events = tmp_path / "work", []
    assert _run(work, events, data="tsv:one.tsv") == {"steps": 6}
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
    assert _run(work, events, data=f"tsv:{tmp_path / 'one.tsv'}") == {"steps": 6}
    assert "finished earlier" in events[0] and _snapshot(work) == before
    assert _run(work, events, data="tsv:two.tsv", restart=True) == {"steps": 6}
    assert read_state(work)["data"] == "tsv:two.tsv"
