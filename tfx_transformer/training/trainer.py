"""The skeleton both trainers follow, written once.

An application trainer (`nlp.train.train_nmt`, `vision.training.train.train_detr`) creates a
`Trainer`
first thing (strategy, precision, seed, work directory), loads its data, builds and compiles
its model in ``trainer.strategy.scope()``, then hands over to `Trainer.train`: callbacks, fit,
the chief guard, export, evaluation and ``metrics.json``. Only the parts that differ come in
as arguments: the application's own callbacks, checks, and export and evaluation functions.

The run's phase is recorded in ``DIR/run.json`` (`tfx_transformer.training.workdir.PHASES`), so a
rerun
of the same command picks up where the last one stopped: inside `fit` (from the backup of the
last epoch), before or during the export, during the evaluation; and a finished run says so
and changes nothing. A larger ``epochs`` or ``max_steps`` continues a finished run from its
last state; ``RunOptions.restart`` starts over (the earlier run's files move to
``DIR/previous-N/``; its ``export/`` stays until the new export replaces it).

Example:
    >>> trainer = Trainer(workdir, run)
    >>> with trainer.strategy.scope():
    ...     model = build_and_compile()
    >>> scores = trainer.train(model, train_ds, valid_ds, default_epochs=10,
    ...                        export=save, evaluate=score)
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import keras
import tensorflow as tf

from tfx_transformer.training.bounds import Progress, plan_epochs
from tfx_transformer.training.callbacks import inject_fault, standard_callbacks
from tfx_transformer.training.distribute import broadcast_from_chief, get_strategy, is_chief
from tfx_transformer.training.precision import fast_bfloat16, set_mixed_precision
from tfx_transformer.training.run import LONG_RUN_EPOCHS, RunOptions
from tfx_transformer.training.workdir import (
    Workdir,
    check_workdir,
    read_metrics,
    read_state,
    write_metrics,
    write_state,
)

__all__ = ["Trainer"]


class Trainer:
    """Sets a run up and, once the model is built, trains, exports, evaluates and reports.

    Creating it gets the `tf.distribute` strategy (before any other TensorFlow work, as
    ``multi_worker`` requires), sets the dtype policy and the random seed, creates the work
    directory and reads what a rerun reads (``metrics.json``, ``run.json``, the backup), so a
    broken file is an error before any data is loaded. With ``run.restart`` it then moves the
    earlier run's files (``checkpoints/``, ``backup/``, ``logs/``, ``metrics.json``,
    ``run.json`` and ``state_files``) to ``DIR/previous-N/`` and says so; nothing is deleted.
    The clock of ``train_seconds`` starts here.

    Args:
        workdir: the work directory.
        run: the run options.
        log: where progress lines go.
        state_files: the application's own files of a run in the work directory (e.g.
            ``tokenizer.model``), moved aside by a restart.

    Attributes:
        strategy: the `tf.distribute.Strategy` to build the model under.
        workdir: the `Workdir`.
        run: the `RunOptions`.
    """

    def __init__(self, workdir: str | os.PathLike, run: RunOptions,
                 log: Callable[..., None] = print, *, state_files: Iterable[str] = ()):
        if not isinstance(run, RunOptions):
            raise TypeError(f"`run` must be a RunOptions. Received: {type(run).__name__}")
        if run.strategy == "multi_worker" and run.time_budget is not None:
            # Each worker's clock would stop it (and set a time-based schedule) on its own.
            raise ValueError("`--time-budget` cannot bound a `--strategy multi_worker` run: "
                             "each worker measures its own time, so they would stop at "
                             "different steps; bound it with `--max-steps` or `--epochs`")
        self.started = time.monotonic()
        self.strategy: tf.distribute.Strategy = get_strategy(run.strategy)
        policy = set_mixed_precision(run.mixed_precision)
        keras.utils.set_random_seed(run.seed)
        self.run, self.workdir, self.log = run, Workdir(workdir), log
        if run.mixed_precision == "auto":
            log(f"mixed precision: {policy} ({fast_bfloat16() or 'no fast bfloat16 here'})")
        if run.restart:
            self._move_aside(["checkpoints", "backup", "logs", "metrics.json", "run.json",
                              *state_files])
        check_workdir(self.workdir)

    @property
    def replicas(self) -> int:
        """Replicas in sync: the global batch is the per-replica batch times this."""
        return self.strategy.num_replicas_in_sync

    def _move_aside(self, names: list[str]) -> None:
        root = self.workdir.root
        found = [name for name in names if (root / name).exists()
                 and not (name in ("checkpoints", "logs") and not any((root / name).iterdir()))]
        if not found or not is_chief():
            return
        number = 1
        while (root / f"previous-{number}").exists():
            number += 1
        target = root / f"previous-{number}"
        target.mkdir()
        for name in found:
            shutil.move(str(root / name), str(target / name))
        self.workdir = Workdir(root)  # recreates checkpoints/ and logs/
        kept = " (export/ stays until the new export replaces it)" if (
            self.workdir.export.exists()) else ""
        self.log(f"restart: moved the earlier run's {', '.join(found)} to {target}{kept}")

    def check_data(self, data: str) -> None:
        """A work directory continues one data set: another ``--data`` is an error.

        The spec is recorded (paths made absolute) when training starts; a later run of the
        same directory on other data would silently keep the earlier run's tokenizer,
        weights and export. Call it before `finished`.

        Raises:
            ValueError: the directory's run was on other data; names both and the way out.
        """
        self._data = _normalized_spec(data)
        recorded = read_state(self.workdir).get("data")
        if recorded is not None and recorded != self._data:
            raise ValueError(
                f"--data {data}: {self.workdir.root} holds a run on --data {recorded}; go on "
                "with that --data, or use --restart (or a new --workdir) to train on new data")

    @property
    def fit_seconds(self) -> float:
        """Training time the earlier processes of this run spent (0 for a new run): what a
        resumed or continued run's time budget and budget schedule count from."""
        return float(read_state(self.workdir).get("fit_seconds", 0.0))

    def total_steps(self, default_epochs: int, steps_per_epoch: int | None) -> int | None:
        """The run's step bound: ``max_steps``, or its epochs times ``steps_per_epoch``,
        whichever is smaller; None when neither is known (a run bounded by time only)."""
        bounds = []
        if self.run.max_steps is not None:
            bounds.append(self.run.max_steps)
        epochs = self.run.fit_epochs(default_epochs)
        if steps_per_epoch and epochs < LONG_RUN_EPOCHS:
            bounds.append(epochs * steps_per_epoch)
        return min(bounds) if bounds else None

    def _request(self, default_epochs: int) -> dict:
        run = self.run
        return {"epochs": run.fit_epochs(default_epochs), "max_steps": run.max_steps,
                "time_budget": run.time_budget}

    def _needs_training(self, state: dict, request: dict) -> bool:
        """False when the recorded fit already covers ``request`` (or is the same request)."""
        if state.get("phase", "training") == "training":
            return True
        epochs, steps = state.get("epochs", 0), state.get("steps", 0)
        if epochs >= request["epochs"] or (
                request["max_steps"] is not None and steps >= request["max_steps"]):
            return False
        return request != state.get("request")

    def finished(self, default_epochs: int) -> dict | None:
        """The recorded ``"valid"`` scores when this run finished and the request adds nothing.

        Says so in one line. Call it before loading data: a finished run then costs nothing.
        Returns None when there is something to do (a new run, a resumed one, a longer one).
        """
        state = self._read_state()
        if state.get("phase") != "finished" or self._needs_training(
                state, self._request(default_epochs)):
            return None
        self.log(f"{self.workdir.root}: this run finished earlier ({state.get('epochs')} epochs, "
                 f"{state.get('steps')} steps); export/, checkpoints/ and metrics.json are left "
                 "as they are. A larger --epochs or --max-steps continues it, --restart trains "
                 "it again")
        return read_metrics(self.workdir).get("valid", {})

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
        choose_weights: Callable[[], Any] | None = None,
    ) -> dict:
        """Fits ``model``; then, on the chief only, exports, evaluates, writes metrics.json.

        0. A finished run whose request adds nothing returns its recorded scores (`finished`).
        1. `fit` for ``run.fit_epochs(default_epochs)`` epochs (no more than ``max_steps``
           needs when ``steps_per_epoch`` is known) with ``first_callbacks``, the
           `standard_callbacks` (guard, resume, checkpoints, logs, time budget, step limit,
           history) and ``callbacks``, in that order. Skipped when the recorded fit already
           covers the request (a run killed during export or evaluation): the weights then
           come from the backup.
        2. ``checks`` run (each raises if the data broke a rule during `fit`).
        3. Non-chief workers stop here and return ``{}``: only the chief writes.
        4. ``choose_weights()`` (if given) sets the weights to export and evaluate from the
           epoch checkpoints (an average, the best epoch); ``export(workdir.export)`` writes
           the SavedModel (unless recorded as done).
        5. ``evaluate()`` returns the ``metrics.json`` entries of the run, ``"valid"`` (the
           scores) among them; ``checks`` run again.
        6. Those entries and ``train_seconds`` are merged into ``metrics.json``.

        ``DIR/run.json`` records each phase as it ends; the backup is kept.

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
            choose_weights: sets the model's final weights before export and evaluation
                (also when a killed run resumes there); None: the last weights.

        Returns:
            The ``"valid"`` entry returned by ``evaluate`` ({} on non-chief workers).

        Raises:
            ValueError: ``steps_per_epoch`` is 0 (no training data), or the loss became NaN
                (`tfx_transformer.training.callbacks.NonFiniteLossError`).
        """
        done = self.finished(default_epochs)
        if done is not None:
            return done
        if steps_per_epoch == 0:
            raise ValueError("no training batches: the training data is empty")
        run, checks, workdir = self.run, list(checks), self.workdir
        request, state = self._request(default_epochs), self._read_state()
        if self._needs_training(state, request):
            self._record(phase="training", request=request,
                         **({"data": self._data} if getattr(self, "_data", None) else {}))
            epochs = plan_epochs(request["epochs"], run.max_steps, steps_per_epoch)
            spent = self.fit_seconds
            progress = Progress(self.total_steps(default_epochs, steps_per_epoch),
                                run.time_budget, spent,
                                epochs=epochs if epochs < LONG_RUN_EPOCHS else None)
            all_callbacks = [*first_callbacks,
                             *standard_callbacks(workdir, run.time_budget, run.max_steps,
                                                 keep_backup=True, offset_seconds=spent,
                                                 progress=progress),
                             *callbacks]
            history = model.fit(train_data, validation_data=valid_data, epochs=epochs,
                                shuffle=False, callbacks=all_callbacks, verbose=0)
            for check in checks:
                check()
            epochs_done = max([e + 1 for e in history.epoch], default=0)
            metadata = workdir.backup / "training_metadata.json"
            if metadata.exists():  # also counts the epochs of earlier processes
                epochs_done = json.loads(metadata.read_text()).get("epoch", epochs_done)
            state = self._record(phase="trained", epochs=epochs_done,
                                steps=_iterations(model),
                                train_seconds=round(time.monotonic() - self.started, 1))
        elif is_chief():
            self._restore(model, state)
        if not is_chief():
            return {}
        if choose_weights is not None:
            choose_weights()
        if state["phase"] == "trained":
            inject_fault("export")
            export(workdir.export)
            state = self._record(phase="exported", export_steps=state["steps"])
            self.log(f"export: {workdir.export} ({state['steps']} steps)")
        inject_fault("evaluate")
        entries = dict(evaluate())
        for check in checks:
            check()
        if "valid" not in entries:
            raise KeyError("`evaluate` must return the 'valid' scores among its entries")
        write_metrics(workdir, {**entries, "train_seconds": state.get("train_seconds")})
        self._record(phase="finished")
        return entries["valid"]

    def _read_state(self) -> dict:
        """``run.json``: the chief's on every worker (broadcast by the chief under
        ``multi_worker``; the others have none), so that all of them take the same path. A
        worker that went on alone would wait for its peers in `fit` for ever."""
        if self.run.strategy != "multi_worker":
            return read_state(self.workdir)
        chief = is_chief()
        state = json.dumps(read_state(self.workdir)).encode("utf-8") if chief else None
        return json.loads(broadcast_from_chief(state, self.strategy).decode("utf-8"))

    def _record(self, **fields: Any) -> dict:
        """Merges ``fields`` into ``run.json`` (the chief's; other workers keep them in memory)."""
        if not is_chief():
            self._state = {**getattr(self, "_state", {}), **fields}
            return self._state
        return write_state(self.workdir, **fields)

    def _restore(self, model: keras.Model, state: dict) -> None:
        """The fitted weights and optimizer state of a run killed after `fit`, from the backup."""
        weights = self.workdir.backup / "latest.weights.h5"
        if not weights.exists():
            raise ValueError(f"{self.workdir.state} says training is done, but {weights} is "
                             "missing; rerun with --restart")
        if model.optimizer is not None and not model.optimizer.built:
            model.optimizer.build(model.trainable_variables)
        try:
            model.load_weights(str(weights))
        except Exception as error:  # h5py and shape errors alike
            raise ValueError(f"cannot read {weights} ({type(error).__name__}); rerun with "
                             "--restart") from None
        if _iterations(model) != state.get("steps"):
            raise ValueError(f"{weights} holds step {_iterations(model)}, but "
                             f"{self.workdir.state} records {state.get('steps')}; rerun with "
                             "--restart")
        self.log(f"resume: training finished earlier ({state.get('steps')} steps), "
                 f"{'evaluating' if state['phase'] == 'exported' else 'exporting'} now")


def _normalized_spec(spec: str) -> str:
    """``scheme:PATH[:PATH]`` with the paths that exist made absolute (the same data given
    by another relative path is the same data)."""
    scheme, *parts = str(spec).split(":")
    return ":".join([scheme, *(os.path.abspath(p) if p and os.path.exists(p) else p
                               for p in parts)])


def _iterations(model: keras.Model) -> int:
    return int(keras.ops.convert_to_numpy(model.optimizer.iterations))
