"""The skeleton both trainers follow, written once.

An application trainer (`nlp.train.train_nmt`, `vision.train.train_detr`) creates a `Trainer`
first thing (strategy, precision, seed, work directory), loads its data, builds and compiles
its model in ``trainer.strategy.scope()``, then hands over to `Trainer.train`: callbacks, fit,
the chief guard, export, evaluation and ``metrics.json``. Only the parts that differ come in
as arguments: the application's own callbacks, checks, and export and evaluation functions.

Example:
    >>> trainer = Trainer(workdir, run)
    >>> with trainer.strategy.scope():
    ...     model = build_and_compile()
    >>> scores = trainer.train(model, train_ds, valid_ds, default_epochs=10,
    ...                        export=save, evaluate=score)
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import keras
import tensorflow as tf

from tfx_transformer.callbacks import plan_epochs, standard_callbacks
from tfx_transformer.distribute import get_strategy, is_chief
from tfx_transformer.precision import set_mixed_precision
from tfx_transformer.run import RunOptions
from tfx_transformer.workdir import Workdir, write_metrics

__all__ = ["Trainer"]


class Trainer:
    """Sets a run up and, once the model is built, trains, exports, evaluates and reports.

    Creating it gets the `tf.distribute` strategy (before any other TensorFlow work, as
    ``multi_worker`` requires), sets the dtype policy and the random seed, and creates the
    work directory (nothing in it is deleted). The clock of ``train_seconds`` starts here.

    Args:
        workdir: the work directory.
        run: the run options.
        log: where progress lines go.

    Attributes:
        strategy: the `tf.distribute.Strategy` to build the model under.
        workdir: the `Workdir`.
        run: the `RunOptions`.
    """

    def __init__(self, workdir: str | os.PathLike, run: RunOptions,
                 log: Callable[..., None] = print):
        if not isinstance(run, RunOptions):
            raise TypeError(f"`run` must be a RunOptions. Received: {type(run).__name__}")
        self.started = time.monotonic()
        self.strategy: tf.distribute.Strategy = get_strategy(run.strategy)
        set_mixed_precision(run.mixed_precision)
        keras.utils.set_random_seed(run.seed)
        self.run, self.workdir, self.log = run, Workdir(workdir), log

    @property
    def replicas(self) -> int:
        """Replicas in sync: the global batch is the per-replica batch times this."""
        return self.strategy.num_replicas_in_sync

    def train(
        self,
        model: keras.Model,
        train_data: Any,
        valid_data: Any = None,
        *,
        default_epochs: int,
        export: Callable[[Path], Any],
        evaluate: Callable[[], Mapping[str, Any]],
        steps_per_epoch: int | None = None,
        first_callbacks: Iterable[keras.callbacks.Callback] = (),
        callbacks: Iterable[keras.callbacks.Callback] = (),
        checks: Iterable[Callable[[], None]] = (),
    ) -> dict:
        """Fits ``model``; then, on the chief only, exports, evaluates, writes metrics.json.

        1. `fit` for ``run.fit_epochs(default_epochs)`` epochs (no more than ``max_steps``
           needs when ``steps_per_epoch`` is known) with ``first_callbacks``, the
           `standard_callbacks` (resume, checkpoints, logs, time budget, step limit, history)
           and ``callbacks``, in that order.
        2. ``checks`` run (each raises if the data broke a rule during `fit`).
        3. Non-chief workers stop here and return ``{}``: only the chief writes.
        4. ``export(workdir.export)`` writes the SavedModel.
        5. ``evaluate()`` returns the ``metrics.json`` entries of the run, ``"valid"`` (the
           scores) among them; ``checks`` run again.
        6. Those entries and ``train_seconds`` are merged into ``metrics.json``.

        Args:
            model: the built, compiled model.
            train_data: the training batches (a `tf.data.Dataset`).
            valid_data: validation batches for `fit`, or None.
            default_epochs: epochs when ``run.epochs`` is None and the run is not bounded.
            export: writes the export to the path given.
            evaluate: scores the trained model; returns the entries to record.
            steps_per_epoch: batches per epoch when known (None: unknown).
            first_callbacks: application callbacks that come before the standard ones.
            callbacks: callbacks that come after them (the caller's extra ones).
            checks: functions called after `fit` and after evaluation.

        Returns:
            The ``"valid"`` entry returned by ``evaluate`` ({} on non-chief workers).
        """
        run, checks = self.run, list(checks)
        epochs = plan_epochs(run.fit_epochs(default_epochs), run.max_steps, steps_per_epoch)
        all_callbacks = [*first_callbacks,
                         *standard_callbacks(self.workdir, run.time_budget, run.max_steps),
                         *callbacks]
        model.fit(train_data, validation_data=valid_data, epochs=epochs,
                  callbacks=all_callbacks)
        train_seconds = time.monotonic() - self.started
        for check in checks:
            check()
        if not is_chief():
            return {}
        export(self.workdir.export)
        self.log(f"export: {self.workdir.export}")
        entries = dict(evaluate())
        for check in checks:
            check()
        if "valid" not in entries:
            raise KeyError("`evaluate` must return the 'valid' scores among its entries")
        write_metrics(self.workdir, {**entries, "train_seconds": round(train_seconds, 1)})
        return entries["valid"]
