"""The Keras callbacks of every `fit`: one clock, the stop rules, the progress line, the logs.

`RunClock` is the run's one clock and one step count: training time counts the earlier
processes of a resumed run (``run.json``'s ``training_seconds``), steps count from the
optimizer's restored ``iterations``. `TimeBudget` and `MaxSteps` stop `fit` cleanly by it (the
trainer still exports and evaluates), `ScheduleProgress` feeds it to a
`tfx_transformer.schedules.RunSchedule`, `Progress` prints it and `MetricsLogger` records it.
`tfx_transformer.training.fit_callbacks.standard_callbacks` puts them in order.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable, Iterable

import keras

from tfx_transformer.training.distribute import is_chief
from tfx_transformer.training.workdir import (
    Workdir,
    read_metrics,
    to_json,
    write_metrics,
    write_state,
)

__all__ = ["MaxSteps", "MetricsLogger", "Progress", "RunClock",
           "ScheduleProgress", "StopRule", "TimeBudget", "plan_epochs", "steps_taken"]

def steps_taken(model) -> int:
    """The optimizer steps the model has taken (restored with its state on a resume; 0 before
    it is compiled): the one step count of the trainer, its callbacks and the fault hook."""
    optimizer = getattr(model, "optimizer", None)
    return int(keras.ops.convert_to_numpy(optimizer.iterations)) if optimizer else 0


class RunClock(keras.callbacks.Callback):
    """The run's training time and optimizer steps, for every callback that needs them.

    Args:
        offset_seconds: training time earlier processes of the run spent (>= 0).
        clock: seconds as a float; injectable for tests. Defaults to `time.monotonic`.
    """

    def __init__(self, offset_seconds: float = 0.0, clock: Callable[[], float] = time.monotonic):
        super().__init__()
        self.offset_seconds, self.clock = max(0.0, float(offset_seconds)), clock
        self.start, self.steps, self._epoch_start = None, 0, 0

    def training_seconds(self) -> float:
        """Seconds of training of the run, earlier processes included (the offset before
        `fit`)."""
        return self.offset_seconds + (0.0 if self.start is None else self.clock() - self.start)

    def on_train_begin(self, logs=None):  # after `Backup`: it restores ``iterations``
        self.start = self.clock()
        self.steps = self._epoch_start = steps_taken(self.model)

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_start = self.steps

    def on_train_batch_end(self, batch, logs=None):
        self.steps = self._epoch_start + batch + 1  # `batch`: the epoch's last step index


class _Timed(keras.callbacks.Callback):
    """A callback reading a `RunClock`: the run's (given, and earlier in the callbacks), or
    its own (None), which it then drives itself."""

    def __init__(self, clock: RunClock | None = None):
        super().__init__()
        self.own = clock is None
        self.clock = RunClock() if clock is None else clock

    def set_model(self, model):
        super().set_model(model)
        if self.own:
            self.clock.set_model(model)

    def on_train_begin(self, logs=None):
        if self.own:
            self.clock.on_train_begin(logs)

    def on_epoch_begin(self, epoch, logs=None):
        if self.own:
            self.clock.on_epoch_begin(epoch, logs)

    def on_train_batch_end(self, batch, logs=None):
        if self.own:
            self.clock.on_train_batch_end(batch, logs)


class StopRule(keras.callbacks.Callback):
    """A callback that may end `fit` early: once it does, ``stopped`` is True and ``reason``
    says why (`MetricsLogger` records it)."""

    stopped: bool = False
    reason: str | None = None

    def stop(self, reason: str) -> None:
        self.model.stop_training = self.stopped = True
        self.reason = reason


class TimeBudget(StopRule, _Timed):
    """Stops `fit` at the first batch end once the run's training time reaches ``minutes``
    (a resumed run gets what is left of the budget, not a new one)."""

    def __init__(self, minutes: float, clock: RunClock | None = None):
        if not minutes > 0:
            raise ValueError(f"`time_budget` must be > 0 minutes. Received: {minutes!r}")
        _Timed.__init__(self, clock)
        self.minutes, self.stopped, self.reason = float(minutes), False, None

    def on_train_batch_end(self, batch, logs=None):
        super().on_train_batch_end(batch, logs)
        elapsed = self.clock.training_seconds()
        if elapsed >= 60.0 * self.minutes and not self.stopped:
            self.stop(f"time budget of {self.minutes:g} min spent ({elapsed:.1f} s)")


class MaxSteps(StopRule, _Timed):
    """Stops `fit` once the optimizer has taken ``max_steps`` steps in total (counted over
    resumes). ``bound`` names the bound in ``reason`` (default ``max_steps=N``; the trainer
    says ``epochs=N`` when an epoch bound is met in steps)."""

    def __init__(self, max_steps: int, bound: str | None = None, clock: RunClock | None = None):
        if not (isinstance(max_steps, int) and max_steps > 0):
            raise ValueError(f"`max_steps` must be a positive int. Received: {max_steps!r}")
        _Timed.__init__(self, clock)
        self.max_steps, self.stopped, self.reason = max_steps, False, None
        self.bound = bound or f"max_steps={max_steps}"

    @property
    def steps(self) -> int:
        return self.clock.steps

    def on_train_batch_end(self, batch, logs=None):
        super().on_train_batch_end(batch, logs)
        if self.clock.steps >= self.max_steps and not self.stopped:
            self.stop(f"{self.bound} reached")


def plan_epochs(epochs: int, total_steps: int | None, steps_per_epoch: int | None,
                done_epochs: int = 0, done_steps: int = 0) -> int:
    """Epochs to pass to `fit` so that the run reaches ``total_steps`` optimizer steps.

    A run continues from its backup: ``done_epochs`` epochs (as Keras counts them: an epoch
    cut short by a bound counts as done) holding ``done_steps`` steps; `fit` needs those plus
    enough whole epochs for the steps left, and `MaxSteps` stops it at the exact step.
    Without a step bound or a known epoch length, ``epochs`` is the answer.
    """
    if total_steps is None or not steps_per_epoch or steps_per_epoch < 0:
        return epochs
    left = max(0, total_steps - done_steps)
    return max(1, done_epochs + math.ceil(left / steps_per_epoch))


class ScheduleProgress(_Timed):
    """Tells a `tfx_transformer.schedules.RunSchedule` learning rate where the run is: its
    ``epoch`` at each epoch's start (as `fit` counts, over resumes) and, with a time budget of
    ``minutes``, its ``progress`` before every step (the share of the budget spent). Puts the
    optimizer's rate into each epoch's logs as ``learning_rate``.

    Args:
        schedule: the schedule the model was compiled with (a task's ``schedule``, what its
            compile step returns). None, or any other schedule: nothing is told.
        minutes: the run's time budget, or None.
        clock: the run's `RunClock` (None: a new one).
    """

    def __init__(self, schedule=None, minutes: float | None = None,
                 clock: RunClock | None = None):
        from tfx_transformer.schedules import RunSchedule

        super().__init__(clock)
        self.schedule = schedule if isinstance(schedule, RunSchedule) else None
        self.minutes = minutes

    def on_train_begin(self, logs=None):
        super().on_train_begin(logs)
        self.on_train_batch_begin(0)

    def on_epoch_begin(self, epoch, logs=None):
        super().on_epoch_begin(epoch, logs)
        if self.schedule is not None:
            self.schedule.epoch.assign(int(epoch))

    def on_train_batch_begin(self, batch, logs=None):
        if self.minutes is not None and self.schedule is not None:
            share = min(1.0, self.clock.training_seconds() / (60.0 * self.minutes))
            self.schedule.progress.assign(share)

    def on_epoch_end(self, epoch, logs=None):
        optimizer = getattr(self.model, "optimizer", None)
        if logs is not None and optimizer is not None:
            logs["learning_rate"] = float(keras.ops.convert_to_numpy(optimizer.learning_rate))


def _clock_text(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


class Progress(_Timed):
    """The run's progress line, in place of Keras's per-epoch bar (give `fit` ``verbose=0``):
    ``epoch 3 · step 340/1000 · 5:12 left of 8:00 · loss 3.2140 · val_loss 3.0021 · lr
    1.2e-03`` at each epoch's end, and kept up to date in place on a terminal (every
    ``interval`` seconds). ``total_steps``, ``time_budget`` (minutes) and ``epochs`` are the
    run's bounds (None: not shown). Only the chief prints, to ``stream`` (default stdout)."""

    def __init__(self, total_steps: int | None = None, time_budget: float | None = None,
                 epochs: int | None = None, stream=None, clock: RunClock | None = None,
                 interval: float = 1.0):
        super().__init__(clock)
        self.total_steps, self.time_budget, self.epochs = total_steps, time_budget, epochs
        self.stream, self.interval, self.write = stream, interval, is_chief()
        self.epoch, self.last = 0, -math.inf

    def _stream(self):
        return self.stream if self.stream is not None else sys.stdout

    def on_epoch_begin(self, epoch, logs=None):
        super().on_epoch_begin(epoch, logs)
        self.epoch = epoch

    def line(self, logs=None) -> str:
        """The progress line for the current state and ``logs``."""
        parts = [f"epoch {self.epoch + 1}" + (f"/{self.epochs}" if self.epochs else "")]
        parts.append(f"step {self.clock.steps}" + (
            f"/{self.total_steps}" if self.total_steps else ""))
        if self.time_budget is not None:
            left = 60.0 * self.time_budget - self.clock.training_seconds()
            parts.append(f"{_clock_text(left)} left of {_clock_text(60.0 * self.time_budget)}")
        for key, value in (logs or {}).items():
            try:
                parts += [] if key == "learning_rate" else [f"{key} {float(value):.4f}"]
            except (TypeError, ValueError):
                continue
        try:
            rate = float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate))
            parts.append(f"lr {rate:.2e}")
        except Exception:  # no optimizer, or a rate that cannot be read here
            pass
        return " · ".join(parts)

    def on_train_batch_end(self, batch, logs=None):
        super().on_train_batch_end(batch, logs)
        stream = self._stream()
        if not (self.write and getattr(stream, "isatty", lambda: False)()):
            return
        now = self.clock.clock()
        if now - self.last >= self.interval:
            self.last = now
            stream.write("\r\033[K" + self.line(logs))
            stream.flush()

    def on_epoch_end(self, epoch, logs=None):
        if self.write:
            stream = self._stream()
            prefix = "\r\033[K" if getattr(stream, "isatty", lambda: False)() else ""
            stream.write(prefix + self.line(logs) + "\n")
            stream.flush()


class MetricsLogger(_Timed):
    """Writes each epoch's logs and the run's ``training_seconds`` so far to
    ``metrics.json["history"]`` (keyed by 1-based ``epoch``: a resumed run replaces the
    entries from its first epoch on) and to ``run.json`` (what a resumed run's time budget
    counts from); at the end, a ``"train"`` summary with the ``stoppers`` that stopped `fit`
    (callbacks with ``stopped``/``reason``). Only the chief writes."""

    def __init__(self, workdir: Workdir | str | os.PathLike, stoppers: Iterable = (),
                 clock: RunClock | None = None):
        super().__init__(clock)
        self.workdir, self.stoppers, self.write = workdir, list(stoppers), is_chief()
        self.last_epoch = None

    def on_epoch_end(self, epoch, logs=None):
        self.last_epoch = epoch + 1
        if not self.write:
            return
        # Keep earlier epochs only: drops a stale entry for this epoch and anything after it.
        old = [e for e in read_metrics(self.workdir).get("history", []) if e["epoch"] <= epoch]
        seconds = round(self.clock.training_seconds(), 3)
        entry = {**(logs or {}), "epoch": epoch + 1, "training_seconds": seconds}
        write_metrics(self.workdir, {"history": old + [to_json(entry)]})
        write_state(self.workdir, training_seconds=seconds)

    def on_train_end(self, logs=None):
        reasons = [s.reason for s in self.stoppers if getattr(s, "stopped", False)]
        if self.write and self.last_epoch is not None:  # a resumed fit with nothing left
            write_metrics(self.workdir, {"train": {
                "last_epoch": self.last_epoch, "stopped_by": "; ".join(reasons) or None,
                "final_logs": logs or {}}})
