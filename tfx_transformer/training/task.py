"""The protocol an application implements for `tfx_transformer.training.trainer.Trainer`,
written once, here.

An application subclasses `Task` and gives what it alone knows; `Trainer.fit` calls, in
this order::

    load_data(context) -> TaskData               # the batches (and whatever evaluate needs)
    build_model(context, data) -> keras.Model    # built and compiled, in the strategy's scope
    callbacks(context, model) -> list            # before the standard ones (default: none)
    final_weights(context, model) -> str | None  # sets the weights to export (default: the last)
    export(model, path)                          # the SavedModel at path
    evaluate(model) -> {"valid": {...}, ...}     # the metrics.json entries

with the attributes ``data`` (the ``--data`` spec, recorded in run.json), ``default_epochs``
(the epochs of a run bounded by nothing else), ``state_files`` (the task's own files in the
work directory, moved aside by ``--restart``) and ``averaging`` (what the export averages, so
which epoch checkpoints the run keeps). ``context`` is a `RunContext`: what a task may know of
the run; never the trainer itself.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import keras

from tfx_transformer.training.checkpoints import Averaging
from tfx_transformer.training.run import LONG_RUN_EPOCHS
from tfx_transformer.training.workdir import Workdir

__all__ = ["RunContext", "Task", "TaskData"]


@dataclasses.dataclass(frozen=True)
class TaskData:
    """What `Task.load_data` returns.

    Attributes:
        train: the training batches (a `tf.data.Dataset`).
        valid: validation batches for `fit`, or None.
        steps_per_epoch: training batches per epoch when known (None: unknown).
    """

    train: Any
    valid: Any = None
    steps_per_epoch: int | None = None


@dataclasses.dataclass(frozen=True)
class RunContext:
    """What a `Task` knows of the run it is in.

    Attributes:
        workdir: the work directory.
        replicas: replicas in sync: the global batch is the per-replica batch times this.
        data_seed: the seed of the training data's shuffle and augmentation (another one for
            each epoch a resumed run starts at, so resumed epochs do not repeat epoch 1's
            order; the split depends on ``--seed`` alone).
        fresh: whether the model trains from new weights (no earlier epoch or finished
            training of this run to start from): a task may set initial weights then.
        epochs: the epochs the run asks for (`LONG_RUN_EPOCHS` when a step limit or a time
            budget bounds it instead).
        max_steps: the run's step limit, or None.
    """

    workdir: Workdir
    replicas: int = 1
    data_seed: int = 0
    fresh: bool = True
    epochs: int = 1
    max_steps: int | None = None

    def total_steps(self, steps_per_epoch: int | None) -> int | None:
        """The run's step bound: ``max_steps``, or the epochs times ``steps_per_epoch``,
        whichever is smaller; None when neither is known (a run bounded by time only)."""
        bounds = [] if self.max_steps is None else [self.max_steps]
        if steps_per_epoch and self.epochs < LONG_RUN_EPOCHS:
            bounds.append(self.epochs * steps_per_epoch)
        return min(bounds) if bounds else None


class Task:
    """An application, as `Trainer.fit` drives it (the module docstring). Subclasses give
    ``data``, ``default_epochs``, `load_data`, `build_model`, `export` and `evaluate`; the
    rest has defaults."""

    data: str
    default_epochs: int
    state_files: tuple[str, ...] = ()
    averaging: Averaging = Averaging()

    def load_data(self, context: RunContext) -> TaskData:
        raise NotImplementedError

    def build_model(self, context: RunContext, data: TaskData) -> keras.Model:
        raise NotImplementedError

    def callbacks(self, context: RunContext, model: keras.Model
                  ) -> Iterable[keras.callbacks.Callback]:
        """Callbacks for `fit`, before the standard ones; a `StopRule` among them is reported
        in ``metrics.json["train"]["stopped_by"]`` when it stops the run."""
        return []

    def final_weights(self, context: RunContext, model: keras.Model) -> str | None:
        """Sets ``model``'s weights to those to export and says which; None (the default)
        keeps the last weights."""
        return None

    def export(self, model: keras.Model, path: Path) -> None:
        raise NotImplementedError

    def evaluate(self, model: keras.Model) -> Mapping[str, Any]:
        """The ``metrics.json`` entries, ``"valid"`` (the held-out scores) among them."""
        raise NotImplementedError
