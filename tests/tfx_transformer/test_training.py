"""Tests for tfx_transformer.training: strategy, workdir, callbacks, metrics, CLI plumbing."""

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfx_transformer import training

X = np.arange(32, dtype="float32").reshape(8, 4) / 32.0
Y = X.sum(axis=1, keepdims=True)  # 8 examples, batch 4 -> 2 steps per epoch


def tiny_model():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    return model


class Recorder(keras.callbacks.Callback):
    """Records epochs and train steps seen, and the weights when training begins."""

    def __init__(self, fail_at_epoch=None, tick=None):
        super().__init__()
        self.epochs, self.steps, self.fail_at_epoch, self.tick = [], 0, fail_at_epoch, tick

    def on_train_begin(self, logs=None):
        self.initial_weights = [w.copy() for w in self.model.get_weights()]

    def on_epoch_begin(self, epoch, logs=None):
        if epoch == self.fail_at_epoch:
            raise RuntimeError("killed")
        self.epochs.append(epoch)

    def on_epoch_end(self, epoch, logs=None):
        self.weights = [w.copy() for w in self.model.get_weights()]

    def on_train_batch_end(self, batch, logs=None):
        self.steps += 1
        if self.tick:
            self.tick()


def test_time_budget_stops_at_batch_end_with_injected_clock(tmp_path):
    now = [0.0]
    tick = Recorder(tick=lambda: now.__setitem__(0, now[0] + 1.0))  # 1 s per step
    budget = training.TimeBudget(minutes=3.0 / 60.0, clock=lambda: now[0])  # 3 s
    model = tiny_model()
    history = model.fit(X, Y, batch_size=4, epochs=5, verbose=0, callbacks=[tick, budget])
    assert tick.steps == 3  # stopped after the 3rd of 10 steps, in epoch 2
    assert len(history.history["loss"]) == 2
    assert budget.stopped and "time budget of 0.05 min" in budget.reason
    assert int(model.optimizer.iterations) == 3


def test_time_budget_not_spent_does_not_stop():
    budget = training.TimeBudget(minutes=60.0)
    tiny_model().fit(X, Y, batch_size=4, epochs=2, verbose=0, callbacks=[budget])
    assert not budget.stopped and budget.reason is None


@pytest.mark.parametrize("minutes", [0, -1.0])
def test_time_budget_must_be_positive(minutes):
    with pytest.raises(ValueError, match=f"Received: {minutes}"):
        training.TimeBudget(minutes)


def test_backup_and_restore_resumes_from_next_epoch(tmp_path):
    killer = Recorder(fail_at_epoch=1)
    first = tiny_model()
    with pytest.raises(RuntimeError, match="killed"):
        first.fit(X, Y, batch_size=4, epochs=3, verbose=0,
                  callbacks=training.standard_callbacks(tmp_path) + [killer])
    assert killer.epochs == [0]
    assert (tmp_path / "backup" / "latest.weights.h5").exists()

    recorder = Recorder()
    second = tiny_model()  # fresh weights: only the backup can bring epoch 1's weights back
    callbacks = training.standard_callbacks(tmp_path, max_steps=100)
    history = second.fit(X, Y, batch_size=4, epochs=3, verbose=0,
                         callbacks=callbacks + [recorder])
    assert recorder.epochs == [1, 2]
    assert len(history.history["loss"]) == 2
    for restored, saved in zip(recorder.initial_weights, killer.weights):
        np.testing.assert_array_equal(restored, saved)
    assert int(second.optimizer.iterations) == 6  # optimizer state restored too: 2 + 4 steps
    assert callbacks[-2].steps == 6  # MaxSteps counts from the restored iteration
    assert not (tmp_path / "backup").exists()  # a finished fit removes its backup
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == [f"epoch-00{i}.weights.h5" for i in (1, 2, 3)]
    assert training.Workdir(tmp_path).latest_checkpoint().name == "epoch-003.weights.h5"
    metrics = training.read_metrics(tmp_path)
    assert [e["epoch"] for e in metrics["history"]] == [1, 2, 3]
    assert metrics["train"]["last_epoch"] == 3 and metrics["train"]["stopped_by"] is None
    if importlib.util.find_spec("tensorboard"):
        assert any((tmp_path / "logs").rglob("*tfevents*"))


def test_max_steps_stops_and_is_reported(tmp_path):
    stale = {"history": [{"epoch": e, "loss": 9.0} for e in (1, 2, 3, 4)], "eval": {"bleu": 1}}
    training.write_metrics(tmp_path, stale)  # left by an earlier run in the same workdir
    recorder = Recorder()
    model = tiny_model()
    callbacks = training.standard_callbacks(tmp_path, time_budget_minutes=60, max_steps=3,
                                            keep_backup=True, tensorboard=False)
    model.fit(X, Y, batch_size=4, epochs=5, verbose=0, callbacks=callbacks + [recorder])
    assert recorder.steps == 3 and int(model.optimizer.iterations) == 3
    assert (tmp_path / "backup" / "latest.weights.h5").exists()  # keep_backup=True
    metrics = training.read_metrics(tmp_path)
    assert [e["epoch"] for e in metrics["history"]] == [1, 2]  # this run's epochs replace
    assert all(e["loss"] != 9.0 for e in metrics["history"]) and metrics["eval"] == {"bleu": 1}
    train = metrics["train"]
    assert train["stopped_by"] == "max_steps=3 reached" and train["last_epoch"] == 2


def test_plan_epochs():
    assert training.plan_epochs(10, None, 5) == 10
    assert training.plan_epochs(10, 12, 5) == 3
    assert training.plan_epochs(2, 100, 5) == 2
    assert training.plan_epochs(10, 12, None) == 10
    with pytest.raises(ValueError, match="max_steps"):
        training.MaxSteps(0)


def test_write_metrics_merges_and_converts(tmp_path):
    (tmp_path / "notes.txt").write_text("keep me")
    training.write_metrics(tmp_path, {"a": 1, "eval": {"bleu": 20.5}})
    merged = training.write_metrics(tmp_path, {
        "b": np.float32(0.5), "eval": {"chrf": np.float64(40.0)}, "n": np.int64(7),
        "arr": np.arange(3), "nan": float("nan"), "t": tf.constant(2.0)})
    on_disk = json.loads((tmp_path / "metrics.json").read_text())
    assert on_disk == merged == {"a": 1, "b": 0.5, "eval": {"bleu": 20.5, "chrf": 40.0},
                                 "n": 7, "arr": [0, 1, 2], "nan": None, "t": 2.0}
    assert type(on_disk["n"]) is int
    assert sorted(os.listdir(tmp_path)) == ["metrics.json", "notes.txt"]  # no temp file left
    (tmp_path / "metrics.json").write_text("{broken")
    with pytest.raises(ValueError, match="metrics.json is not valid JSON"):
        training.write_metrics(tmp_path, {"c": 1})
    assert (tmp_path / "metrics.json").read_text() == "{broken"


def test_workdir_keeps_existing_files(tmp_path):
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "old.weights.h5").write_text("x")
    (tmp_path / "tokenizer.model").write_text("y")
    workdir = training.Workdir(tmp_path)
    assert (tmp_path / "checkpoints" / "old.weights.h5").read_text() == "x"
    assert (tmp_path / "tokenizer.model").read_text() == "y"
    assert workdir.logs.is_dir() and workdir.checkpoints == tmp_path / "checkpoints"
    assert workdir.metrics == tmp_path / "metrics.json"
    assert (workdir.export, workdir.backup) == (tmp_path / "export", tmp_path / "backup")
    training.Workdir(tmp_path / "new" / "dir")
    assert (tmp_path / "new" / "dir" / "checkpoints").is_dir()
    with pytest.raises(ValueError, match="tokenizer.model"):
        training.Workdir(tmp_path / "tokenizer.model")


def test_strategy_names(monkeypatch):
    assert training.get_strategy("auto").num_replicas_in_sync == 1
    expected = r"one of \('auto', 'mirrored', 'multi_worker'\)\. Received: strategy='tpu'"
    with pytest.raises(ValueError, match=expected):
        training.get_strategy("tpu")
    monkeypatch.delenv("TF_CONFIG", raising=False)
    with pytest.raises(ValueError, match="TF_CONFIG"):
        training.get_strategy("multi_worker")
    monkeypatch.setenv("TF_CONFIG", "{not json")
    with pytest.raises(ValueError, match="TF_CONFIG is not valid JSON"):
        training.get_strategy("multi_worker")


def test_is_chief(monkeypatch):
    cluster = {"worker": ["a:1", "b:2"]}
    monkeypatch.delenv("TF_CONFIG", raising=False)
    assert training.is_chief()
    for index, expected in [(0, True), (1, False)]:
        config = {"cluster": cluster, "task": {"type": "worker", "index": index}}
        monkeypatch.setenv("TF_CONFIG", json.dumps(config))
        assert training.is_chief() is expected
    config = {"cluster": {**cluster, "chief": ["c:3"]}, "task": {"type": "worker", "index": 0}}
    monkeypatch.setenv("TF_CONFIG", json.dumps(config))
    assert not training.is_chief()


def test_mirrored_on_two_logical_cpus_matches_single_device():
    code = textwrap.dedent("""
        import numpy as np, tensorflow as tf
        cpu = tf.config.list_physical_devices("CPU")[0]
        two = [tf.config.LogicalDeviceConfiguration()] * 2
        tf.config.set_logical_device_configuration(cpu, two)
        import keras
        from tfx_transformer.training import get_strategy
        x = np.linspace(0, 1, 32, dtype="float32").reshape(8, 4); y = x.sum(1, keepdims=True)
        def one_step(strategy):
            with strategy.scope():
                keras.utils.set_random_seed(1)
                model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
                model.compile(keras.optimizers.SGD(0.1), loss="mse")
            model.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False)
            return model.get_weights()
        mirrored = get_strategy("mirrored")
        assert mirrored.num_replicas_in_sync == 2, mirrored.extended.worker_devices
        for a, b in zip(one_step(mirrored), one_step(tf.distribute.get_strategy())):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
        print("OK", mirrored.num_replicas_in_sync)
    """)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "KERAS_BACKEND": "tensorflow",
           "CUDA_VISIBLE_DEVICES": ""}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    done = subprocess.run([sys.executable, "-c", code], cwd=root, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("OK 2")


def test_set_mixed_precision():
    assert training.set_mixed_precision("bfloat16") == "mixed_bfloat16"
    assert keras.config.dtype_policy().name == "mixed_bfloat16"
    assert training.set_mixed_precision("float16") == "mixed_float16"
    assert training.set_mixed_precision("none") == "float32"
    assert keras.config.dtype_policy().name == "float32"
    with pytest.raises(ValueError, match="Received: 'fp16'"):
        training.set_mixed_precision("fp16")


def test_add_common_arguments():
    parser = argparse.ArgumentParser()
    training.add_common_arguments(parser, default_epochs=3)
    args = parser.parse_args(["--workdir", "w", "--time-budget", "0.5", "--max-steps", "7"])
    assert (args.workdir, args.epochs, args.max_steps, args.time_budget) == ("w", 3, 7, 0.5)
    assert (args.strategy, args.mixed_precision, args.seed) == ("auto", "none", 0)
    for bad in (["--strategy", "tpu"], ["--time-budget", "0"], ["--epochs", "x"], []):
        with pytest.raises(SystemExit) as exit_info:
            parser.parse_args(["--workdir", "w"] * bool(bad) + bad)
        assert exit_info.value.code == 2


def test_run_cli_turns_bad_input_into_one_line_and_exit_2(capsys, monkeypatch):
    monkeypatch.delenv("TFX_TRANSFORMER_DEBUG", raising=False)

    def bad(message):
        raise ValueError(message)

    assert training.run_cli(bad, "unknown `--data` scheme 'ftp'.\nUse one of: embedded") == 2
    assert capsys.readouterr().err == (
        "error: unknown `--data` scheme 'ftp'. Use one of: embedded\n")

    def missing():
        open("/nonexistent/file.tsv")

    assert training.run_cli(missing) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "/nonexistent/file.tsv" in err and err.count("\n") == 1
    assert training.run_cli(lambda: None) == 0 and training.run_cli(lambda: 3) == 3
    with pytest.raises(KeyError):  # a bug keeps its traceback
        training.run_cli(lambda: {}["x"])
    assert training.fail("bad  input") == 2
    assert capsys.readouterr().err == "error: bad input\n"
