"""Tests for tfx_transformer.trainer.Trainer: the skeleton both applications train with."""

import json

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfx_transformer.run import RunOptions
from tfx_transformer.trainer import Trainer
from tfx_transformer.workdir import read_metrics

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
                      "export to export", f"export: {tmp_path / 'export'}", "evaluate",
                      "check"]
    assert scores == {"loss": pytest.approx(float(np.mean((model.predict(X, verbose=0) - Y)
                                                          ** 2)), rel=1e-5)}
    metrics = read_metrics(tmp_path)
    assert metrics["valid"] == scores and metrics["data"] == {"n": 12}
    assert metrics["train"]["stopped_by"] == "max_steps=4 reached"
    assert [e["epoch"] for e in metrics["history"]] == [1, 2]
    assert "val_loss" in metrics["history"][0] and metrics["train_seconds"] >= 0


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
