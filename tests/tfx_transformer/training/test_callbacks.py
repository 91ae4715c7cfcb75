"""Tests for tfx_transformer.training.callbacks: resume, checkpoints, stop rules, history."""

import importlib.util
import json
import pathlib
import tempfile

import keras
import numpy as np
import pytest

from tfx_transformer.training.callbacks import (
    MaxSteps,
    MetricsLogger,
    RunClock,
    TimeBudget,
    plan_epochs,
    steps_taken,
)
from tfx_transformer.training.faults import FaultHook
from tfx_transformer.training.fit_callbacks import standard_callbacks
from tfx_transformer.training.saving import NonFiniteLossError
from tfx_transformer.training.workdir import Workdir, read_metrics, write_metrics

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


def test_time_budget_stops_at_batch_end_with_injected_clock():
    now = [0.0]
    tick = Recorder(tick=lambda: now.__setitem__(0, now[0] + 1.0))  # 1 s per step
    budget = TimeBudget(minutes=3.0 / 60.0, clock=RunClock(clock=lambda: now[0]))  # 3 s
    model = tiny_model()
    history = model.fit(X, Y, batch_size=4, epochs=5, verbose=0,
                        callbacks=[budget.clock, tick, budget])
    assert tick.steps == 3  # stopped after the 3rd of 10 steps, in epoch 2
    assert len(history.history["loss"]) == 2
    assert budget.stopped and "time budget of 0.05 min" in budget.reason
    assert int(model.optimizer.iterations) == 3


def test_time_budget_not_spent_does_not_stop():
    budget = TimeBudget(minutes=60.0)
    tiny_model().fit(X, Y, batch_size=4, epochs=2, verbose=0, callbacks=[budget])
    assert not budget.stopped and budget.reason is None


@pytest.mark.parametrize("minutes", [0, -1.0])
def test_time_budget_must_be_positive(minutes):
    with pytest.raises(ValueError, match=f"Received: {minutes}"):
        TimeBudget(minutes)


def test_backup_and_restore_resumes_from_next_epoch(tmp_path):
    killer = Recorder(fail_at_epoch=1)
    first = tiny_model()
    with pytest.raises(RuntimeError, match="killed"):
        first.fit(X, Y, batch_size=4, epochs=3, verbose=0,
                  callbacks=standard_callbacks(tmp_path) + [killer])
    assert killer.epochs == [0]
    assert (tmp_path / "backup" / "latest.weights.h5").exists()

    recorder = Recorder()
    second = tiny_model()  # fresh weights: only the backup can bring epoch 1's weights back
    callbacks = standard_callbacks(tmp_path, max_steps=100)
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
    assert names == ["epoch-003.weights.h5"]  # by default the last epoch's alone is kept
    assert Workdir(tmp_path).latest_checkpoint().name == "epoch-003.weights.h5"
    metrics = read_metrics(tmp_path)
    assert [e["epoch"] for e in metrics["history"]] == [1, 2, 3]
    assert metrics["train"]["last_epoch"] == 3 and metrics["train"]["stopped_by"] is None
    if importlib.util.find_spec("tensorboard"):
        assert any((tmp_path / "logs").rglob("*tfevents*"))


def test_max_steps_stops_and_is_reported(tmp_path):
    stale = {"history": [{"epoch": e, "loss": 9.0} for e in (1, 2, 3, 4)], "eval": {"bleu": 1}}
    write_metrics(tmp_path, stale)  # left by an earlier run in the same workdir
    recorder = Recorder()
    model = tiny_model()
    callbacks = standard_callbacks(tmp_path, time_budget_minutes=60, max_steps=3,
                                   keep_backup=True, tensorboard=False)
    assert [type(c).__name__ for c in callbacks] == [
        "RunGuard", "Backup", "RunClock", "TimeBudget", "MaxSteps", "MetricsLogger"]
    history = model.fit(X, Y, batch_size=4, epochs=5, verbose=0,
                        callbacks=callbacks + [recorder])
    assert recorder.steps == 3 and int(model.optimizer.iterations) == 3
    assert (tmp_path / "backup" / "latest.weights.h5").exists()  # keep_backup=True
    metrics = read_metrics(tmp_path)
    assert [e["epoch"] for e in metrics["history"]] == [1, 2]  # this run's epochs replace
    assert [e["loss"] for e in metrics["history"]] == pytest.approx(history.history["loss"])
    seconds = [e["training_seconds"] for e in metrics["history"]]  # the run's one clock
    recorded = json.loads((tmp_path / "run.json").read_text())["training_seconds"]
    assert 0 < seconds[0] <= seconds[1] == recorded
    assert metrics["eval"] == {"bleu": 1}
    train = metrics["train"]
    assert train["stopped_by"] == "max_steps=3 reached" and train["last_epoch"] == 2


def test_non_chief_workers_do_not_write(tmp_path, monkeypatch):
    config = {"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 1}}
    monkeypatch.setenv("TF_CONFIG", json.dumps(config))
    callbacks = standard_callbacks(tmp_path, max_steps=2, tensorboard=True)
    names = [type(c).__name__ for c in callbacks]
    assert "TensorBoard" not in names and names[-1] == "MetricsLogger"
    assert "Backup" not in names  # it starts from the chief's state (cluster.WorkerAgreement)
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    tiny_model().fit(X, Y, batch_size=4, epochs=3, verbose=0, callbacks=callbacks)
    assert not [p for p in tmp_path.rglob("*") if not p.is_dir()]  # not a file anywhere
    assert not any(temp.iterdir())


def test_metrics_logger_reports_every_stopper(tmp_path):
    calls = []  # 0 s when training begins, 61 s at the first batch end

    def clock():
        calls.append(None)
        return 0.0 if len(calls) == 1 else 61.0

    run_clock = RunClock(clock=clock)
    budget, steps = TimeBudget(1.0, run_clock), MaxSteps(1, clock=run_clock)
    logger = MetricsLogger(tmp_path, [budget, steps], run_clock)
    tiny_model().fit(X, Y, batch_size=4, epochs=1, verbose=0,
                     callbacks=[run_clock, budget, steps, logger])
    train = read_metrics(tmp_path)["train"]
    assert train["stopped_by"] == "time budget of 1 min spent (61.0 s); max_steps=1 reached"


def test_the_step_count_is_the_optimizer_s_and_has_one_definition():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    assert steps_taken(model) == 0  # not compiled yet
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    model.fit(X, Y, batch_size=4, epochs=2, verbose=0)  # 2 steps an epoch
    assert steps_taken(model) == 4
    training = pathlib.Path(steps_taken.__code__.co_filename).parent
    readers = sorted(path.name for path in training.glob("*.py")
                     if "optimizer.iterations" in path.read_text())
    assert readers == ["callbacks.py"], f"the step count is read apart in {readers}"


def test_plan_epochs():
    assert plan_epochs(10, None, 5) == 10
    assert plan_epochs(10, 12, 5) == 3
    assert plan_epochs(10, 12, None) == 10
    assert plan_epochs(10, 3, 5) == 1
    # From a backup of 1 epoch cut short at step 3 (of 5): 9 steps left need 2 more epochs.
    assert plan_epochs(10, 12, 5, done_epochs=1, done_steps=3) == 3
    assert plan_epochs(10, 10, 5, done_epochs=2, done_steps=10) == 2  # nothing left
    with pytest.raises(ValueError, match="max_steps"):
        MaxSteps(0)


def _snapshot(root):
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


def test_a_nan_loss_raises_before_its_epoch_is_saved(tmp_path, monkeypatch):
    model = tiny_model()
    model.fit(X, Y, batch_size=4, epochs=1, verbose=0,
              callbacks=standard_callbacks(tmp_path, keep_backup=True, tensorboard=False))
    before = _snapshot(tmp_path)
    assert "backup/latest.weights.h5" in before and "checkpoints/epoch-001.weights.h5" in before
    monkeypatch.setenv("TFX_TRANSFORMER_FAULT", "nan:4")  # epoch 2's second step
    with pytest.raises(NonFiniteLossError, match="loss is nan at step 4 .epoch 2.") as info:
        model.fit(X, Y, batch_size=4, epochs=3, verbose=0,
                  callbacks=standard_callbacks(tmp_path, keep_backup=True, tensorboard=False))
    assert (info.value.step, info.value.epoch) == (4, 2)
    assert "epoch-001.weights.h5" in str(info.value)  # names the last good state
    assert "nothing exported" in str(info.value)
    assert _snapshot(tmp_path) == before  # no NaN checkpoint, backup and history untouched


def test_an_inf_loss_from_the_data_raises_too(tmp_path):
    bad_y = Y.copy()
    bad_y[5] = np.inf  # in the second batch
    with pytest.raises(NonFiniteLossError, match="step 2 .epoch 1."):
        tiny_model().fit(X, bad_y, batch_size=4, epochs=2, verbose=0,
                         callbacks=standard_callbacks(tmp_path, tensorboard=False))
    assert not any((tmp_path / "checkpoints").iterdir())


@pytest.mark.filterwarnings("ignore:Your input ran out of data")  # it did: nothing at all
def test_an_epoch_without_batches_is_an_error_not_an_endless_loop(tmp_path):
    import tensorflow as tf

    empty = tf.data.Dataset.from_tensor_slices((X, Y)).filter(lambda x, y: False).batch(4)
    with pytest.raises(ValueError, match="epoch 1 had no training batches"):
        tiny_model().fit(empty, epochs=1000, verbose=0, shuffle=False,
                         callbacks=standard_callbacks(tmp_path, max_steps=2, tensorboard=False))
    assert not any((tmp_path / "checkpoints").iterdir()) and not (tmp_path / "backup").exists()


def test_a_corrupt_backup_is_named(tmp_path):
    model = tiny_model()
    model.fit(X, Y, batch_size=4, epochs=2, verbose=0,
              callbacks=standard_callbacks(tmp_path, keep_backup=True, tensorboard=False))
    backup = tmp_path / "backup"  # one state (written atomically): no second copy
    assert sorted(p.name for p in backup.iterdir()) == ["latest.weights.h5",
                                                        "training_metadata.json"]
    weights = backup / "latest.weights.h5"
    weights.write_bytes(weights.read_bytes()[:100])  # damaged on the disk
    with pytest.raises(ValueError, match="cannot resume from .*latest.weights.h5.*--restart"):
        tiny_model().fit(X, Y, batch_size=4, epochs=3, verbose=0,
                         callbacks=standard_callbacks(tmp_path, tensorboard=False))


def test_fault_hook_values(monkeypatch, tmp_path):
    monkeypatch.setenv("TFX_TRANSFORMER_FAULT", "sometimes")
    with pytest.raises(ValueError, match="TFX_TRANSFORMER_FAULT must be"):
        FaultHook.from_env()
    monkeypatch.setenv("TFX_TRANSFORMER_FAULT", "evaluate")
    assert FaultHook.from_env() == FaultHook("evaluate") and FaultHook().callback() is None
    FaultHook.from_env().at("export")  # another phase: nothing happens
    assert [type(c).__name__ for c in standard_callbacks(tmp_path, tensorboard=False)][-1] == (
        "MetricsLogger")


def test_progress_line_says_steps_of_the_bound_and_time_left():
    import io

    from tfx_transformer.training.callbacks import Progress

    now, out = [0.0], io.StringIO()
    progress = Progress(total_steps=4, time_budget=2.0, stream=out,
                        clock=RunClock(offset_seconds=30.0, clock=lambda: now[0]))

    class Tick(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            now[0] += 10.0

    model = tiny_model()
    model.fit(X, Y, batch_size=4, epochs=2, verbose=0, shuffle=False,
              callbacks=[progress.clock, Tick(), progress])
    lines = out.getvalue().splitlines()
    # 2 steps an epoch, 10 s a step, 30 s spent before this process: 2:00 - 30 s - 20 s
    assert lines[0].startswith("epoch 1 · step 2/4 · 1:10 left of 2:00 · loss ")
    assert lines[1].startswith("epoch 2 · step 4/4 · 0:50 left of 2:00 · loss ")
    assert lines[1].endswith(" · lr 1.00e-01") and len(lines) == 2  # not a terminal: no \r


def test_the_whole_list_of_a_run_s_fit_is_in_one_order(tmp_path):
    """What the trainer passes to `fit` is `standard_callbacks`' list alone, in its module's
    order: schedule feed, task callbacks, guard, backup, clock, stop rules, logger, progress,
    epoch bound, the caller's callbacks, last; the logger reports every stop rule."""
    from tfx_transformer.training.callbacks import (
        Progress,
        RunClock,
        ScheduleProgress,
        StopRule,
    )

    class Task(keras.callbacks.Callback):
        pass

    class Rule(StopRule):
        reason = "task rule"

    task, rule, mine, final = Task(), Rule(), Task(), Task()
    clock = RunClock()
    bound = MaxSteps(6, bound="epochs=2", clock=clock)
    got = standard_callbacks(tmp_path, 5.0, 9, clock=clock, tensorboard=False,
                             progress=Progress(9, 5.0, clock=clock), feed_schedule=True,
                             task_callbacks=[task, rule], epoch_bound=bound, extra=[mine],
                             last=[final])
    assert [type(c).__name__ for c in got] == [
        "ScheduleProgress", "Task", "Rule", "RunGuard", "Backup", "RunClock", "TimeBudget",
        "MaxSteps", "MetricsLogger", "Progress", "MaxSteps", "Task", "Task"]
    assert got[1] is task and got[-3] is bound and got[-2] is mine and got[-1] is final
    assert isinstance(got[0], ScheduleProgress) and got[5] is clock
    assert got[8].stoppers[:2] == [bound, rule]  # the epoch bound first, then the task's
