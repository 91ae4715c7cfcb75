"""Tests for tfx_transformer.training.trainer: `Trainer(workdir, run).fit(task)`, the run both
applications train with."""

import json
import os
import sys
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfx_transformer.training.run import RunOptions
from tfx_transformer.training.trainer import TaskData, Trainer
from tfx_transformer.training.workdir import read_metrics

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from trainer_toys import Events, ToyTask, toy_data, toy_model  # noqa: E402


def test_fit_loads_builds_fits_exports_evaluates_and_writes_once(tmp_path):
    events = []
    task = ToyTask(events, default_epochs=50, final=True,
                   extra=[Events(events, "task")])
    scores = Trainer(tmp_path, RunOptions(max_steps=4, seed=3), log=events.append).fit(
        task, callbacks=[Events(events, "last")])
    assert [e for e in events if e != "step"] == [
        "load_data", "build_model in _DefaultDistributionStrategy", ("fresh", True),
        "task: begin",
        "last: begin", "task: end", "last: end", "final_weights",
        "final weights: the last epoch", "export", f"export: {tmp_path / 'export'} (4 steps)",
        "evaluate"]
    assert events.count("step") == 4  # max_steps, over 2 planned epochs of 3
    model_loss = scores.pop("loss")
    assert scores == {"steps": 4} and model_loss >= 0
    metrics = read_metrics(tmp_path)
    assert metrics["valid"]["steps"] == 4 and metrics["data"] == {"n": 12}
    assert metrics["train"]["stopped_by"] == "max_steps=4 reached"
    history = metrics["history"]
    assert [e["epoch"] for e in history] == [1, 2]
    assert "val_loss" in history[0] and metrics["training_seconds"] > 0
    assert [e["learning_rate"] for e in history] == pytest.approx([0.1, 0.1])  # recorded
    state = json.loads((tmp_path / "run.json").read_text())
    assert (state["phase"], state["epochs"], state["steps"], state["export_steps"]) == (
        "finished", 2, 4, 4)
    # Every file written to a temporary name first gets the mode `open` gives (not 0o600).
    umask = os.umask(0)
    os.umask(umask)
    modes = {str(p.relative_to(tmp_path)): oct(p.stat().st_mode & 0o777)
             for p in tmp_path.rglob("*") if p.is_file()}
    assert {"run.json", "metrics.json", "backup/latest.weights.h5"} <= set(modes)
    assert set(modes.values()) == {oct(0o666 & ~umask)}, modes


def test_data_of_unknown_length_trains_whole_epochs_without_a_warning(tmp_path):
    class Unsized(ToyTask):  # a filter: tf.data (and Keras) cannot know the batches up front
        def load_data(self, context):
            data = toy_data().filter(lambda x, y: True)
            assert data.cardinality() == tf.data.UNKNOWN_CARDINALITY
            return TaskData(data, None, 3)

    events = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Trainer(tmp_path, RunOptions(epochs=2), log=events.append).fit(Unsized(events))
    assert events.count("step") == 6
    assert not [w for w in caught if "ran out of data" in str(w.message)]


def test_the_trainer_tells_a_run_schedule_the_share_of_the_time_budget(tmp_path, monkeypatch):
    from tfx_transformer.schedules import BudgetSchedule

    seen = []

    class Scheduled(ToyTask):
        def build_model(self, context, data):
            model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
            self.schedule = BudgetSchedule(0.1, total_steps=None, warmup_share=0.0)
            model.compile(optimizer=keras.optimizers.SGD(self.schedule), loss="mse")
            return model

        def callbacks(self, context, model):
            task = self

            class Watch(keras.callbacks.Callback):
                def on_train_batch_begin(self, batch, logs=None):
                    seen.append(float(task.schedule.progress.numpy()))

            return [Watch()]

    # An earlier process of the run spent 3 of the 10 minutes: progress starts at 0.3.
    (tmp_path / "run.json").write_text(json.dumps({"phase": "training", "training_seconds": 180.0}))
    Trainer(tmp_path, RunOptions(time_budget=10.0, max_steps=3)).fit(Scheduled([]))
    assert len(seen) == 3 and all(0.3 <= share < 0.35 for share in seen), seen


def test_seed_and_precision_are_set_before_the_model_is_built(tmp_path):
    weights = []
    for _ in range(2):
        Trainer(tmp_path / "a", RunOptions(seed=7, mixed_precision="bfloat16"))
        assert keras.config.dtype_policy().name == "mixed_bfloat16"
        weights.append(toy_model().get_weights()[0])
    np.testing.assert_array_equal(*weights)
    Trainer(tmp_path / "b", RunOptions(seed=8))
    assert keras.config.dtype_policy().name == "float32"
    assert not np.array_equal(toy_model().get_weights()[0], weights[0])


def test_a_task_callback_that_raises_stops_before_export(tmp_path):
    class Check(keras.callbacks.Callback):
        def on_train_end(self, logs=None):  # as the detector's object limit does
            raise ValueError("image 7 has too many objects")

    events = []
    with pytest.raises(ValueError, match="image 7"):
        Trainer(tmp_path, RunOptions(epochs=1)).fit(ToyTask(events, extra=[Check()]))
    assert "export" not in events and "valid" not in read_metrics(tmp_path)


def test_non_chief_workers_fit_but_neither_export_nor_evaluate(tmp_path, monkeypatch):
    trainer = Trainer(tmp_path, RunOptions(epochs=2))  # strategy before TF_CONFIG is read
    config = {"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 1}}
    monkeypatch.setenv("TF_CONFIG", json.dumps(config))
    events = []
    assert trainer.fit(ToyTask(events, default_epochs=1, final=True)) == {}
    assert events.count("step") == 6  # run.epochs wins: 2 x 3
    assert not {"final_weights", "export", "evaluate"} & set(events)
    assert not (tmp_path / "metrics.json").exists()


def test_run_must_be_run_options(tmp_path):
    with pytest.raises(TypeError, match="RunOptions"):
        Trainer(tmp_path, {"epochs": 1})
