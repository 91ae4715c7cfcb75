"""How long a run trains and what it says as it goes: the stop rules and the progress line.

`TimeBudget` and `MaxSteps` stop `fit` cleanly (the trainer still exports and evaluates);
`ScheduleProgress` tells a `tfx_transformer.training.schedules.RunSchedule` the share of the
run done and the epoch; `Progress` prints the steps done of the run's bound and the time left;
`plan_epochs` sizes `fit` for a step limit. `tfx_transformer.training.callbacks.standard_callbacks`
puts them in order.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable

import keras

from tfx_transformer.training.distribute import is_chief

__all__ = ["MaxSteps", "Progress", "ScheduleProgress", "StopRule", "TimeBudget", "plan_epochs"]


class StopRule(keras.callbacks.Callback):
    """A callback that may end `fit` early: once it does, ``stopped`` is True and ``reason``
    says why (`tfx_transformer.training.callbacks.MetricsLogger` records it)."""

    stopped: bool = False
    reason: str | None = None


class TimeBudget(StopRule):
    """Stops `fit` cleanly at the first batch end once ``minutes`` of training are spent.

    The clock starts at ``on_train_begin``; ``offset_seconds`` is the training time that
    earlier processes of the same run already spent (``run.json``'s ``fit_seconds``: a
    resumed run gets what is left of the budget, not a new one). After a stop, ``stopped``
    is True and ``reason`` says why; the caller still evaluates and exports.

    Args:
        minutes: the budget, > 0.
        clock: seconds as a float; injectable for tests. Defaults to `time.monotonic`.
        offset_seconds: training time already spent, >= 0.
    """

    def __init__(self, minutes: float, clock: Callable[[], float] = time.monotonic,
                 offset_seconds: float = 0.0):
        super().__init__()
        if not minutes > 0:
            raise ValueError(f"`time_budget` must be > 0 minutes. Received: {minutes!r}")
        self.minutes, self.clock = float(minutes), clock
        self.offset_seconds = max(0.0, float(offset_seconds))
        self.stopped, self.reason, self.start = False, None, None

    def elapsed(self) -> float:
        """Seconds of training spent, earlier processes included (0 before `fit`)."""
        return self.offset_seconds + (0.0 if self.start is None else self.clock() - self.start)

    def on_train_begin(self, logs=None):
        self.start, self.stopped, self.reason = self.clock(), False, None

    def on_train_batch_end(self, batch, logs=None):
        elapsed = self.elapsed()
        if elapsed >= 60.0 * self.minutes and not self.stopped:
            self.model.stop_training = self.stopped = True
            self.reason = f"time budget of {self.minutes:g} min spent ({elapsed:.1f} s)"


class ScheduleProgress(keras.callbacks.Callback):
    """Tells the optimizer's learning rate where the run is, and records the rate.

    The trainer puts it first in every `fit`. When the optimizer's rate is a
    `tfx_transformer.training.schedules.RunSchedule`, it sets the schedule's ``epoch`` at each
    epoch's start (the epoch `fit` reports, which counts the epochs of earlier processes of a
    resumed run) and, when the run has a time budget, its ``progress`` before every step: the
    share of the budget spent, counting the training time of earlier processes
    (``offset_seconds``). Any other rate is left alone. At each epoch's end it puts the rate
    into the logs as ``learning_rate`` (for the history and TensorBoard).

    Args:
        minutes: the run's time budget (None: no budget).
        offset_seconds: training time earlier processes of the run spent (as `TimeBudget`).
        clock: seconds as a float; injectable for tests.
    """

    def __init__(self, minutes: float | None = None, offset_seconds: float = 0.0,
                 clock: Callable[[], float] = time.monotonic):
        super().__init__()
        self.budget = None if minutes is None else TimeBudget(
            minutes, clock=clock, offset_seconds=offset_seconds)

    @property
    def schedule(self):
        """The optimizer's `RunSchedule`, or None."""
        from tfx_transformer.training.schedules import RunSchedule

        # Keras keeps the schedule object there; `optimizer.learning_rate` is its value.
        rate = getattr(getattr(self.model, "optimizer", None), "_learning_rate", None)
        return rate if isinstance(rate, RunSchedule) else None

    def on_train_begin(self, logs=None):
        if self.budget is not None:
            self.budget.start = self.budget.clock()
        self.on_train_batch_begin(0)

    def on_epoch_begin(self, epoch, logs=None):
        if self.schedule is not None:
            self.schedule.epoch.assign(int(epoch))

    def on_train_batch_begin(self, batch, logs=None):
        if self.budget is not None and self.schedule is not None:
            share = min(1.0, self.budget.elapsed() / (60.0 * self.budget.minutes))
            self.schedule.progress.assign(share)

    def on_epoch_end(self, epoch, logs=None):
        optimizer = getattr(self.model, "optimizer", None)
        if logs is not None and optimizer is not None:
            logs["learning_rate"] = float(keras.ops.convert_to_numpy(optimizer.learning_rate))


def _clock_text(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


class Progress(keras.callbacks.Callback):
    """What `fit`'s progress bar should say: steps done of the run's bound, time left of its
    budget, the losses and the learning rate; in place of Keras's per-epoch bar (give `fit`
    ``verbose=0``), which counts epochs of ``LONG_RUN_EPOCHS`` in a bounded run.

    One line per epoch end (``epoch 3 · step 340/1000 · 5:12 left of 8:00 · loss 3.2140 ·
    val_loss 3.0021 · lr 1.2e-03``); on a terminal, the same line is also kept up to date in
    place during the epoch. Only the chief prints.

    Args:
        total_steps: the run's step bound (None: unknown; bounded by time only).
        time_budget: minutes (None: no budget).
        offset_seconds: training time earlier processes of the run spent.
        epochs: epochs of the run when they bound it (None: not shown as a bound).
        stream: where lines go (default: standard output).
        clock: seconds as a float; injectable for tests.
        interval: seconds between in-place updates on a terminal.
    """

    def __init__(self, total_steps: int | None = None, time_budget: float | None = None,
                 offset_seconds: float = 0.0, epochs: int | None = None, stream=None,
                 clock: Callable[[], float] = time.monotonic, interval: float = 1.0):
        super().__init__()
        self.total_steps, self.time_budget, self.epochs = total_steps, time_budget, epochs
        self.offset_seconds, self.stream, self.clock = float(offset_seconds), stream, clock
        self.interval, self.write = interval, is_chief()

    def _stream(self):
        return self.stream if self.stream is not None else sys.stdout

    def on_train_begin(self, logs=None):
        self.start, self.last = self.clock(), -math.inf
        optimizer = getattr(self.model, "optimizer", None)
        self.step = int(keras.ops.convert_to_numpy(optimizer.iterations)) if optimizer else 0
        self.epoch = 0

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def line(self, logs=None) -> str:
        """The progress line for the current state and ``logs``."""
        parts = [f"epoch {self.epoch + 1}" + (f"/{self.epochs}" if self.epochs else "")]
        parts.append(f"step {self.step}" + (f"/{self.total_steps}" if self.total_steps else ""))
        if self.time_budget is not None:
            elapsed = self.offset_seconds + self.clock() - self.start
            parts.append(f"{_clock_text(60.0 * self.time_budget - elapsed)} left of "
                         f"{_clock_text(60.0 * self.time_budget)}")
        for key, value in (logs or {}).items():
            if key == "learning_rate":
                continue
            try:
                parts.append(f"{key} {float(value):.4f}")
            except (TypeError, ValueError):
                continue
        optimizer = getattr(self.model, "optimizer", None)
        if optimizer is not None:
            try:
                rate = float(keras.ops.convert_to_numpy(optimizer.learning_rate))
                parts.append(f"lr {rate:.2e}")
            except Exception:  # a rate that cannot be read here is not worth a failure
                pass
        return " · ".join(parts)

    def on_train_batch_end(self, batch, logs=None):
        self.step += 1
        stream = self._stream()
        if not (self.write and getattr(stream, "isatty", lambda: False)()):
            return
        now = self.clock()
        if now - self.last >= self.interval:
            self.last = now
            stream.write("\r\033[K" + self.line(logs))
            stream.flush()

    def on_epoch_end(self, epoch, logs=None):
        if not self.write:
            return
        stream = self._stream()
        prefix = "\r\033[K" if getattr(stream, "isatty", lambda: False)() else ""
        stream.write(prefix + self.line(logs) + "\n")
        stream.flush()


class MaxSteps(StopRule):
    """Stops `fit` once the optimizer has taken ``max_steps`` steps in total.

    Steps count from ``model.optimizer.iterations`` at train begin, so a run resumed by
    `BackupAndRestore` (which restores the optimizer) keeps counting where it stopped.

    Args:
        max_steps: the step bound, > 0.
        bound: what the bound is, for ``reason`` (default ``max_steps=N``; the trainer says
            ``epochs=N`` when an epoch bound is met in steps).
    """

    def __init__(self, max_steps: int, bound: str | None = None):
        super().__init__()
        if not (isinstance(max_steps, int) and max_steps > 0):
            raise ValueError(f"`max_steps` must be a positive int. Received: {max_steps!r}")
        self.max_steps, self.steps, self.stopped, self.reason = max_steps, 0, False, None
        self.bound = bound or f"max_steps={max_steps}"

    def on_train_begin(self, logs=None):
        optimizer = getattr(self.model, "optimizer", None)
        self.steps = int(keras.ops.convert_to_numpy(optimizer.iterations)) if optimizer else 0
        self.stopped, self.reason = False, None
        self._epoch_start = self.steps

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_start = self.steps

    def on_train_batch_end(self, batch, logs=None):
        self.steps = self._epoch_start + batch + 1  # `batch` is the epoch's last step index.
        if self.steps >= self.max_steps and not self.stopped:
            self.model.stop_training = self.stopped = True
            self.reason = f"{self.bound} reached"


def plan_epochs(epochs: int, total_steps: int | None, steps_per_epoch: int | None,
                done_epochs: int = 0, done_steps: int = 0) -> int:
    """Epochs to pass to `fit` so that the run reaches ``total_steps`` optimizer steps.

    A run continues from its backup: ``done_epochs`` epochs (as Keras counts them: an epoch
    that a step limit or a time budget cut short counts as done) holding ``done_steps``
    steps. `fit` then needs the epochs already done plus enough whole epochs for the steps
    left; `MaxSteps` stops it at the exact step. With no step bound or no known epoch length,
    ``epochs`` is the answer.
    """
    if total_steps is None or not steps_per_epoch or steps_per_epoch < 0:
        return epochs
    left = max(0, total_steps - done_steps)
    return max(1, done_epochs + math.ceil(left / steps_per_epoch))
