"""The Keras callbacks every trainer passes to `fit`: resume, checkpoints, logs, stop rules.

`standard_callbacks` assembles them, with the stop rules of `tfx_transformer.training.bounds`
(`TimeBudget` and `MaxSteps` stop a run cleanly: the trainer still exports and evaluates).
`RunGuard` stops it with an error (a NaN loss, an epoch
without batches) before anything of that epoch is saved, `tfx_transformer.training.saving.Backup`
writes each epoch's checkpoint and backup (refusing NaN weights and a full disk),
`MetricsLogger` writes the history to ``metrics.json``.

Testing hook: ``TFX_TRANSFORMER_FAULT`` makes a run fail on purpose (`FaultInjection`,
`inject_fault`): ``step:N`` (SIGKILL just before optimizer step N, 1-based), ``epoch:N``
(SIGKILL just before the first step of epoch N), ``nan:N`` (the weights become NaN just before
step N, so its loss is NaN), ``update:N`` (the weights become NaN just after step N, as after
an update that overflowed: its loss is finite), ``export`` or ``evaluate`` (SIGKILL when that
phase starts).
Unset in normal use.
"""

from __future__ import annotations

import importlib.util
import logging
import math
import os
import signal
import time
from collections.abc import Callable, Iterable

import keras

from tfx_transformer.training.bounds import MaxSteps, Progress, TimeBudget
from tfx_transformer.training.checkpoints import Averaging
from tfx_transformer.training.distribute import is_chief
from tfx_transformer.training.saving import Backup
from tfx_transformer.training.workdir import (
    Workdir,
    read_metrics,
    to_json,
    write_metrics,
    write_state,
)

__all__ = ["FaultInjection", "MetricsLogger", "NonFiniteLossError", "RunGuard",
           "inject_fault", "standard_callbacks"]

FAULT_ENV = "TFX_TRANSFORMER_FAULT"


class NonFiniteLossError(ValueError):
    """The loss became NaN or infinite; ``step`` is the optimizer step, ``epoch`` 1-based."""

    def __init__(self, message: str, step: int, epoch: int):
        super().__init__(message)
        self.step, self.epoch = step, epoch


class RunGuard(keras.callbacks.Callback):
    """Ends `fit` with an error, before that epoch's checkpoint and backup are written.

    A NaN or infinite loss raises `NonFiniteLossError` at the end of its step (no epoch end
    follows, so nothing with those weights is saved and the backup keeps the last good epoch;
    Keras's ``TerminateOnNaN`` only stops, and the epoch's checkpoint then holds NaN weights).
    An epoch without a single batch raises `ValueError`: training on no data would loop over
    empty epochs for ever. Put it before `tfx_transformer.training.saving.Backup`.

    Args:
        workdir: the work directory (named in the messages).
    """

    def __init__(self, workdir: Workdir | str | os.PathLike):
        super().__init__()
        self.workdir = workdir if isinstance(workdir, Workdir) else Workdir(workdir)
        self.batches, self._epoch = 0, 0

    def on_epoch_begin(self, epoch, logs=None):
        self.batches, self._epoch = 0, epoch

    def on_train_batch_end(self, batch, logs=None):
        self.batches += 1
        loss = (logs or {}).get("loss")
        if loss is not None and not math.isfinite(float(keras.ops.convert_to_numpy(loss))):
            step = int(keras.ops.convert_to_numpy(self.model.optimizer.iterations))
            last = self.workdir.latest_checkpoint()
            kept = f"{last} and {self.workdir.backup}" if last else "nothing (first epoch)"
            raise NonFiniteLossError(
                f"the training loss is {float(keras.ops.convert_to_numpy(loss))} at step {step} "
                f"(epoch {self._epoch + 1}): training stopped, nothing of this epoch was saved "
                f"and nothing exported; the last good state is {kept}. Lower the learning rate "
                "or check the data; a rerun resumes from the last good epoch", step,
                self._epoch + 1)

    def on_epoch_end(self, epoch, logs=None):
        if self.batches == 0:
            raise ValueError(f"epoch {epoch + 1} had no training batches: the training data is "
                             "empty (every example was dropped?)")


class FaultInjection(keras.callbacks.Callback):
    """Testing hook: ``step:N`` SIGKILLs this process, ``nan:N`` makes the weights NaN, just
    before optimizer step N (1-based, counted over resumes); ``update:N`` makes them NaN just
    after step N; ``epoch:N`` SIGKILLs it before epoch N's first step. See the module
    docstring."""

    def __init__(self, kind: str, step: int):
        super().__init__()
        self.kind, self.step, self._epoch = kind, step, 0

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        if self.kind == "epoch":
            if batch == 0 and self._epoch + 1 == self.step:
                os.kill(os.getpid(), signal.SIGKILL)
            return
        if self.kind == "update" or self._steps() + 1 != self.step:
            return
        if self.kind == "step":
            os.kill(os.getpid(), signal.SIGKILL)
        self._poison()

    def on_train_batch_end(self, batch, logs=None):
        if self.kind == "update" and self._steps() == self.step:
            self._poison()

    def _steps(self) -> int:
        return int(keras.ops.convert_to_numpy(self.model.optimizer.iterations))

    def _poison(self) -> None:
        for variable in self.model.trainable_variables:
            variable.assign(keras.ops.full(variable.shape, float("nan"), variable.dtype))


def _fault() -> tuple[str, int | None] | None:
    value = os.environ.get(FAULT_ENV, "")
    if not value:
        return None
    kind, _, step = value.partition(":")
    if kind in ("export", "evaluate") and not step:
        return kind, None
    if kind in ("step", "epoch", "nan", "update") and step.isdigit() and int(step) > 0:
        return kind, int(step)
    raise ValueError(f"{FAULT_ENV} must be step:N, epoch:N, nan:N, update:N, export or evaluate (a "
                     "testing hook). "
                     f"Received: {value!r}")


def inject_fault(phase: str) -> None:
    """Testing hook: SIGKILLs this process when ``TFX_TRANSFORMER_FAULT`` names ``phase``."""
    if _fault() == (phase, None):
        os.kill(os.getpid(), signal.SIGKILL)


class MetricsLogger(keras.callbacks.Callback):
    """Writes each epoch's logs to ``metrics.json["history"]`` and a ``"train"`` summary.

    History entries are keyed by 1-based ``epoch``; a resumed or restarted run replaces the
    entries from its first epoch on. Each epoch end also records the run's training time so
    far, ``offset_seconds`` included, as ``fit_seconds`` in ``run.json`` (what a resumed run's
    time budget counts from). Only the chief writes.

    Args:
        workdir: the work directory.
        stoppers: callbacks with ``stopped``/``reason`` (`TimeBudget`, `MaxSteps`) to report.
        offset_seconds: training time earlier processes of the run spent.
    """

    def __init__(self, workdir: Workdir | str | os.PathLike, stoppers: Iterable = (),
                 offset_seconds: float = 0.0):
        super().__init__()
        self.workdir, self.stoppers, self.write = workdir, list(stoppers), is_chief()
        self.offset_seconds = float(offset_seconds)

    def on_train_begin(self, logs=None):
        self._start, self.last_epoch = time.monotonic(), None

    def on_epoch_end(self, epoch, logs=None):
        self.last_epoch = epoch + 1
        if not self.write:
            return
        # Keep earlier epochs only: drops a stale entry for this epoch and anything after it.
        old = [e for e in read_metrics(self.workdir).get("history", []) if e["epoch"] <= epoch]
        elapsed = time.monotonic() - self._start
        entry = {"epoch": epoch + 1, "elapsed_s": round(elapsed, 3)}
        write_metrics(self.workdir, {"history": old + [to_json({**entry, **(logs or {})})]})
        write_state(self.workdir, fit_seconds=round(self.offset_seconds + elapsed, 3))

    def on_train_end(self, logs=None):
        reasons = [s.reason for s in self.stoppers if getattr(s, "stopped", False)]
        if self.write and self.last_epoch is not None:  # a resumed fit with nothing left
            write_metrics(self.workdir, {"train": {
                "last_epoch": self.last_epoch, "stopped_by": "; ".join(reasons) or None,
                "elapsed_s": round(time.monotonic() - self._start, 3),
                "final_logs": logs or {}}})


def standard_callbacks(
    workdir: Workdir | str | os.PathLike,
    time_budget_minutes: float | None = None,
    max_steps: int | None = None,
    *,
    keep_backup: bool = False,
    tensorboard: bool | None = None,
    clock: Callable[[], float] = time.monotonic,
    offset_seconds: float = 0.0,
    progress: Progress | None = None,
    averaging: Averaging = Averaging(),
    stop_rules: Iterable = (),
) -> list[keras.callbacks.Callback]:
    """The callbacks every trainer passes to `fit`, in order.

    `RunGuard` (first: it raises before the epoch's checkpoint and backup are written),
    `Backup(DIR/backup)` (before the others, so they see the restored state; the model must be
    built before `fit`), which also writes each epoch's weights to
    ``DIR/checkpoints/epoch-NNN.weights.h5`` and keeps those ``averaging`` needs,
    `TensorBoard(DIR/logs)`, `TimeBudget` and
    `MaxSteps` when asked, `MetricsLogger`, ``progress`` when given, and `FaultInjection`
    when the testing hook asks. Non-chief workers write nothing: no backup, checkpoints or
    logs (they start from the chief's state: `tfx_transformer.training.workers`).

    Args:
        workdir: the work directory.
        time_budget_minutes: stop after this much training time (None: no budget).
        max_steps: stop after this many optimizer steps in total (None: no limit).
        keep_backup: keep ``DIR/backup`` after a finished `fit` (Keras deletes it by default).
        tensorboard: include the `TensorBoard` callback; None (default): when the
            ``tensorboard`` package is installed (TensorFlow 2.21 does not depend on it).
        clock: clock for `TimeBudget`.
        offset_seconds: training time earlier processes of this run spent (``run.json``'s
            ``fit_seconds``); the time budget counts it.
        progress: the `Progress` line (give `fit` ``verbose=0``), or None.
        averaging: what the run exports: the epoch checkpoints it needs are kept
            (`Averaging.needed`), the others deleted (default: the last epoch's only).
        stop_rules: more callbacks with ``stopped``/``reason`` (a task's ``Patience``), whose
            stop `MetricsLogger` reports in ``metrics.json["train"]["stopped_by"]``.
    """
    workdir = workdir if isinstance(workdir, Workdir) else Workdir(workdir)
    chief = is_chief()

    def keep(epoch: int, logs: dict) -> set:
        history = [e for e in read_metrics(workdir).get("history", []) if e["epoch"] < epoch]
        return averaging.needed(history + [{**logs, "epoch": epoch}])

    callbacks = [RunGuard(workdir)]
    if chief:
        callbacks.append(Backup(workdir.backup, delete_checkpoint=not keep_backup,
                                checkpoints=workdir.checkpoints, keep=keep))
    if tensorboard is None:
        tensorboard = importlib.util.find_spec("tensorboard") is not None
        if not tensorboard:
            logging.getLogger(__name__).warning("`tensorboard` is not installed: no DIR/logs")
    if tensorboard and chief:
        callbacks.append(keras.callbacks.TensorBoard(str(workdir.logs)))
    stoppers = []
    if time_budget_minutes is not None:
        stoppers.append(TimeBudget(time_budget_minutes, clock=clock,
                                   offset_seconds=offset_seconds))
    if max_steps is not None:
        stoppers.append(MaxSteps(max_steps))
    fault = _fault()
    faults = [FaultInjection(*fault)] if fault and fault[1] is not None else []
    shown = [progress] if progress is not None else []
    logger = MetricsLogger(workdir, [*stop_rules, *stoppers], offset_seconds)
    return callbacks + stoppers + [logger] + shown + faults
