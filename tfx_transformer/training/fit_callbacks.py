"""The whole ordered list of callbacks a run's `fit` gets: `standard_callbacks`.

The order is this module's code, not a convention callers keep:

1. `ScheduleProgress` (when asked): the learning rate knows the epoch and the time share
   before anything else sees the step;
2. the task's callbacks (e.g. NMT's validation BLEU and ``Patience``): they read the epoch's
   logs before the epoch is saved;
3. `saving.RunGuard` (it raises before the epoch is saved), `saving.Backup` (the chief's; it
   restores before the others look), the run's `RunClock`, TensorBoard;
4. the stop rules (`TimeBudget`, `MaxSteps`), then `MetricsLogger`, which reports whichever
   stopped the run (the task's stop rules and the epoch bound among them);
5. the progress line, the testing hook's callback (`faults`);
6. the epoch bound (a `MaxSteps` at the requested epochs' last step), the caller's own
   callbacks, and ``last`` (a multi-worker run's agreement, after the restore and every stop
   rule).
"""

from __future__ import annotations

import importlib.util
import logging
import os
from collections.abc import Iterable

import keras

from tfx_transformer.training.callbacks import (
    MaxSteps,
    MetricsLogger,
    Progress,
    RunClock,
    ScheduleProgress,
    StopRule,
    TimeBudget,
)
from tfx_transformer.training.checkpoints import Averaging
from tfx_transformer.training.distribute import is_chief
from tfx_transformer.training.faults import FaultHook
from tfx_transformer.training.saving import Backup, RunGuard
from tfx_transformer.training.workdir import Workdir, read_metrics

__all__ = ["standard_callbacks"]


def standard_callbacks(workdir: Workdir | str | os.PathLike,
                       time_budget_minutes: float | None = None,
                       max_steps: int | None = None, *, clock: RunClock | None = None,
                       keep_backup: bool = False, tensorboard: bool | None = None,
                       progress: Progress | None = None, averaging: Averaging = Averaging(),
                       stop_rules: Iterable = (), feed_schedule: bool = False, schedule=None,
                       task_callbacks: Iterable = (), epoch_bound: MaxSteps | None = None,
                       extra: Iterable = (), last: Iterable = ()
                       ) -> list[keras.callbacks.Callback]:
    """The callbacks of a run's `fit`, in the order of the module docstring.

    Args:
        workdir: the run's work directory.
        time_budget_minutes, max_steps: the run's bounds (`TimeBudget`, `MaxSteps`), or None.
        clock: the run's `RunClock` (None: a new one).
        keep_backup: keep ``DIR/backup`` after `fit`.
        tensorboard: write ``DIR/logs`` (None: when ``tensorboard`` is installed).
        progress: the progress line, or None.
        averaging: which epoch checkpoints to keep.
        stop_rules: more rules `MetricsLogger` reports (a `StopRule` among ``task_callbacks``
            is reported without being listed here).
        feed_schedule, schedule: put `ScheduleProgress(schedule)` first (the trainer's runs).
        task_callbacks: the task's callbacks.
        epoch_bound: the `MaxSteps` that ends the requested epochs, or None.
        extra: the caller's callbacks.
        last: what must come after everything else.

    Non-chief workers write nothing (they start from the chief's state:
    `tfx_transformer.training.cluster`).
    """
    workdir = workdir if isinstance(workdir, Workdir) else Workdir(workdir)
    clock = RunClock() if clock is None else clock
    task_callbacks = list(task_callbacks)
    bound = [epoch_bound] if epoch_bound is not None else []

    def keep(epoch: int, logs: dict) -> set:
        history = [e for e in read_metrics(workdir).get("history", []) if e["epoch"] < epoch]
        return averaging.needed(history + [{**logs, "epoch": epoch}])

    first = [ScheduleProgress(schedule, time_budget_minutes, clock)] if feed_schedule else []
    callbacks = [RunGuard(workdir)]
    if is_chief():
        callbacks.append(Backup(workdir, delete_checkpoint=not keep_backup, keep=keep))
    callbacks.append(clock)
    if tensorboard is None:
        tensorboard = importlib.util.find_spec("tensorboard") is not None
        if not tensorboard:
            logging.getLogger(__name__).warning("`tensorboard` is not installed: no DIR/logs")
    if tensorboard and is_chief():
        callbacks.append(keras.callbacks.TensorBoard(str(workdir.logs)))
    stoppers = [TimeBudget(time_budget_minutes, clock)] if time_budget_minutes is not None else []
    stoppers += [MaxSteps(max_steps, clock=clock)] if max_steps is not None else []
    fault = FaultHook.from_env().callback()
    faults = [fault] if fault is not None else []
    shown = [progress] if progress is not None else []
    rules = [*bound, *(c for c in task_callbacks if isinstance(c, StopRule)), *stop_rules]
    logger = MetricsLogger(workdir, [*rules, *stoppers], clock)
    return [*first, *task_callbacks, *callbacks, *stoppers, logger, *shown, *faults, *bound,
            *extra, *last]
