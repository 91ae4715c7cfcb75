"""Tests for the budget-aware schedule: the formula, the time share, resumed runs."""

import keras
import numpy as np
import pytest

from tfx_transformer import BudgetSchedule
from tfx_transformer.training.callbacks import RunClock, ScheduleProgress
from tfx_transformer.training.saving import Backup
from tfx_transformer.training.workdir import Workdir

PEAK = 2e-3


def formula(p, warmup, peak=PEAK):
    """The docstring's formula, written out."""
    if p < warmup:
        return peak * p / warmup
    return peak * max(0.0, 1.0 - p) / (1.0 - warmup)


def lr(schedule, step):
    return float(keras.ops.convert_to_numpy(schedule(step)))


@pytest.mark.parametrize("step", [0, 1, 9, 19, 20, 50, 99, 150])
def test_step_bound_values_equal_formula(step):
    schedule = BudgetSchedule(PEAK, total_steps=100, warmup_share=0.2)
    np.testing.assert_allclose(lr(schedule, step), formula((step + 1) / 100, 0.2), rtol=1e-6,
                               atol=1e-12)


def test_start_peak_end_of_a_step_bound():
    schedule = BudgetSchedule(PEAK, total_steps=1000, warmup_share=0.1)
    assert lr(schedule, 0) == pytest.approx(PEAK / 100)  # p = 1/1000 of a 10% warm-up
    assert lr(schedule, 99) == pytest.approx(PEAK)  # p = 0.1: the peak
    assert lr(schedule, 98) < PEAK and lr(schedule, 100) < PEAK
    assert lr(schedule, 999) == 0.0  # the last step of the run
    assert lr(schedule, 549) == pytest.approx(PEAK * 0.5, rel=1e-5)  # half-way down


def test_time_share_takes_over_when_it_is_ahead():
    schedule = BudgetSchedule(PEAK, total_steps=10_000, warmup_share=0.1)
    schedule.progress.assign(0.55)
    assert lr(schedule, 0) == pytest.approx(formula(0.55, 0.1), rel=1e-6)
    schedule.progress.assign(1.0)
    assert lr(schedule, 5) == 0.0
    timed = BudgetSchedule(PEAK, total_steps=None, warmup_share=0.0)
    timed.progress.assign(0.25)
    assert lr(timed, 123) == pytest.approx(PEAK * 0.75, rel=1e-6)


class _Holder:
    """Stands for the model: the callback only needs its optimizer."""

    def __init__(self, optimizer):
        self.optimizer = optimizer


def test_schedule_progress_counts_earlier_training_time_and_the_epoch():
    schedule = BudgetSchedule(PEAK, total_steps=None, warmup_share=0.1)
    now = [100.0]
    clock = RunClock(offset_seconds=120.0, clock=lambda: now[0])  # the run's, driven by fit
    progress = ScheduleProgress(schedule, minutes=10.0, clock=clock)
    holder = _Holder(keras.optimizers.Adam(schedule))
    for callback in (clock, progress):
        callback.set_model(holder)
        callback.on_train_begin()
    assert float(schedule.progress.numpy()) == pytest.approx(0.2)  # 2 of 10 minutes
    now[0] += 60.0
    progress.on_train_batch_begin(0)
    assert float(schedule.progress.numpy()) == pytest.approx(0.3)
    now[0] += 1e6
    progress.on_train_batch_begin(1)
    assert float(schedule.progress.numpy()) == 1.0
    progress.on_epoch_begin(4)
    assert int(schedule.epoch.numpy()) == 4
    logs = {}
    progress.on_epoch_end(4, logs)  # the rate at share 1.0: the end of the decay
    assert logs["learning_rate"] == 0.0
    # A plain rate is left alone and still recorded.
    plain = ScheduleProgress(minutes=10.0)
    plain.set_model(_Holder(keras.optimizers.Adam(3e-4)))
    plain.on_train_begin()
    logs = {}
    plain.on_epoch_end(0, logs)
    assert logs["learning_rate"] == pytest.approx(3e-4)


def test_config_round_trip_and_bad_values():
    schedule = BudgetSchedule(PEAK, total_steps=7, warmup_share=0.25)
    again = BudgetSchedule.from_config(schedule.get_config())
    assert [lr(again, s) for s in range(7)] == [lr(schedule, s) for s in range(7)]
    for kwargs in ({"peak": 0}, {"peak": 1.0, "total_steps": 0},
                   {"peak": 1.0, "warmup_share": 1.0}, {"peak": 1.0, "warmup_share": -0.1}):
        with pytest.raises(ValueError):
            BudgetSchedule(**kwargs)


X = np.linspace(0, 1, 32, dtype="float32").reshape(8, 4)
Y = X.sum(axis=1, keepdims=True)  # batch 4: 2 steps per epoch


class RateLog(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.rates = []

    def on_train_batch_begin(self, batch, logs=None):
        self.rates.append(float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate)))


class StopAfter(keras.callbacks.Callback):
    """Ends the process's fit after `epochs` epochs, as a kill after the epoch's backup."""

    def __init__(self, epochs):
        super().__init__()
        self.epochs = epochs

    def on_epoch_end(self, epoch, logs=None):
        if epoch + 1 == self.epochs:
            raise KeyboardInterrupt


def _model(total):
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.Adam(BudgetSchedule(PEAK, total, 0.25)),
                  loss="mse")
    return model


def test_resumed_run_continues_the_schedule(tmp_path):
    """A run killed after 2 of 5 epochs resumes at step 4 of 10: no second warm-up."""
    whole = RateLog()
    _model(10).fit(X, Y, batch_size=4, epochs=5, verbose=0, shuffle=False, callbacks=[whole])
    first, second = RateLog(), RateLog()
    workdir = Workdir(tmp_path)
    with pytest.raises(KeyboardInterrupt):
        _model(10).fit(X, Y, batch_size=4, epochs=5, verbose=0, shuffle=False,
                       callbacks=[Backup(workdir), StopAfter(2), first])
    _model(10).fit(X, Y, batch_size=4, epochs=5, verbose=0, shuffle=False,
                   callbacks=[Backup(workdir), second])
    assert len(first.rates) == 4 and len(second.rates) == 6
    np.testing.assert_allclose(first.rates + second.rates, whole.rates, rtol=1e-6)
    np.testing.assert_allclose(whole.rates, [formula((s + 1) / 10, 0.25) for s in range(10)],
                               rtol=1e-5, atol=1e-12)


def test_the_trainer_tells_the_task_s_schedule_where_the_run_is(tmp_path):
    """The schedule a task's `build_model` compiled with (its ``schedule``) is what the
    trainer's `ScheduleProgress` feeds: DETR's step drop after epoch 1 shows in the history."""
    import tensorflow as tf

    from tfx_transformer.schedules import StepDropSchedule
    from tfx_transformer.training.run import RunOptions
    from tfx_transformer.training.trainer import Task, TaskData, Trainer

    x = np.arange(24, dtype="float32").reshape(6, 4) / 24.0

    class Toy(Task):
        data, default_epochs = "embedded", 3

        def load_data(self, context):
            data = tf.data.Dataset.from_tensor_slices((x, x.sum(axis=1))).batch(3)
            return TaskData(data, data, 2)

        def build_model(self, context, data):
            self.schedule = StepDropSchedule(0.1, drop_epoch=1)
            model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
            model.compile(optimizer=keras.optimizers.SGD(self.schedule), loss="mse")
            return model

        def export(self, model, path):
            path.mkdir()

        def evaluate(self, model):
            return {"valid": {}}

    Trainer(tmp_path, RunOptions(seed=1), log=lambda *_: None).fit(Toy())
    from tfx_transformer.training.workdir import read_metrics

    history = read_metrics(tmp_path)["history"]
    assert [e["learning_rate"] for e in history] == pytest.approx([0.1, 0.01, 0.01])
