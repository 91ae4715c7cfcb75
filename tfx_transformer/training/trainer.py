"""The run, owned once for both applications: `Trainer(workdir, run).fit(task)`.

An application is a `Task`: it loads its data, builds and compiles its model, names its own
callbacks, exports and evaluates. The trainer does everything else, in one sequence: the
strategy, precision and seed (on creation); then in `Trainer.fit` the restart, the checks of
the work directory and of ``--data``, the finished-run test, the data, the model (in the
strategy's scope), the learning rate's view of the run (`ScheduleProgress`), the standard
callbacks, `fit`, the final weights, export, evaluation and ``metrics.json``.

The run's phase is recorded in ``DIR/run.json`` (`tfx_transformer.training.workdir.PHASES`), so
a rerun of the same command picks up where the last one stopped: inside `fit` (from the backup
of the last epoch), before or during the export, during the evaluation; and a finished run
says so and changes nothing. A larger ``epochs`` or ``max_steps`` continues a finished run
from its last state; ``RunOptions.restart`` starts over (the earlier run's files move to
``DIR/previous-N/``; its ``export/`` stays until the new export replaces it).

The `Task` protocol, and the `RunContext` a task gets, are in `tfx_transformer.training.run`.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable, Iterable
from typing import Any

import keras
import tensorflow as tf

from tfx_transformer.training.callbacks import (
    MaxSteps,
    Progress,
    RunClock,
    plan_epochs,
    steps_taken,
)
from tfx_transformer.training.cluster import (
    WorkerAgreement,
    chief_address,
    leave_together,
    peer_watch,
    start_peer_watch,
    watched,
)
from tfx_transformer.training.distribute import (
    fast_bfloat16,
    get_strategy,
    is_chief,
    set_mixed_precision,
    tf_config,
)
from tfx_transformer.training.faults import FaultHook
from tfx_transformer.training.fit_callbacks import standard_callbacks
from tfx_transformer.training.run import (  # RunContext, Task, TaskData: re-exported
    LONG_RUN_EPOCHS,
    RunContext,
    RunOptions,
    Task,
    TaskData,
    check_data,
    needs_training,
    read_run_state,
)
from tfx_transformer.training.saving import (
    check_export,
    check_training_space,
    check_workdir,
    save_model_file,
)
from tfx_transformer.training.workdir import (
    Workdir,
    lock_workdir,
    move_aside,
    read_metrics,
    read_state,
    write_metrics,
    write_state,
)

__all__ = ["RunContext", "Task", "TaskData", "Trainer"]


class Trainer:
    """Sets a run up, then drives a `Task` through fit, export, evaluation and metrics.json.

    Creating it gets the `tf.distribute` strategy (before any other TensorFlow work, as
    ``multi_worker`` requires), sets the dtype policy and the random seed and creates the work
    directory.

    Args:
        workdir: the work directory.
        run: the run options.
        log: where progress lines go.

    Attributes:
        strategy: the `tf.distribute.Strategy` the model is built under.
        workdir: the `Workdir`.
        run: the `RunOptions`.
    """

    def __init__(self, workdir: str | os.PathLike, run: RunOptions,
                 log: Callable[..., None] = print):
        if not isinstance(run, RunOptions):
            raise TypeError(f"`run` must be a RunOptions. Received: {type(run).__name__}")
        if run.strategy == "multi_worker" and run.time_budget is not None:
            raise ValueError("`--time-budget` cannot bound a `--strategy multi_worker` run: "
                             "each worker measures its own time, so they would stop at "
                             "different steps; bound it with `--max-steps` or `--epochs`")
        if run.strategy == "multi_worker":  # a chief gone while the strategy connects ends
            start_peer_watch(tf_config())   # this worker too (`cluster.PeerWatch`)
        self.strategy: tf.distribute.Strategy = get_strategy(run.strategy)
        policy = set_mixed_precision(run.mixed_precision)
        keras.utils.set_random_seed(run.seed)
        self.run, self.workdir, self.log = run, Workdir(workdir), log
        self.resume_epoch = self.resume_step = 0  # what the backup holds (`_read_state`)
        self._state: dict = {}  # run.json as a non-chief worker keeps it (in memory)
        if run.mixed_precision == "auto":
            log(f"mixed precision: {policy} ({fast_bfloat16() or 'no fast bfloat16 here'})")

    @property
    def replicas(self) -> int:
        """Replicas in sync: the global batch is the per-replica batch times this."""
        return self.strategy.num_replicas_in_sync

    @property
    def training_seconds(self) -> float:
        """Training time (inside `fit`) the earlier processes of this run spent (0 for a new
        run): what a resumed or continued run's time budget and schedule count from."""
        return float(read_state(self.workdir).get("training_seconds", 0.0))

    def fit(self, task: Task, callbacks: Iterable[keras.callbacks.Callback] = ()) -> dict:
        """Runs ``task``; on the chief only, exports, evaluates and writes metrics.json.

        1. ``run.restart`` moves the earlier run's files (``checkpoints/``, ``backup/``,
           ``logs/``, ``metrics.json``, ``run.json`` and ``task.state_files``) to
           ``DIR/previous-N/``; then the work directory's files are checked, and a directory
           that holds a run on another ``--data`` is refused.
        2. A finished run whose request adds nothing returns its recorded scores at once.
        3. ``task.load_data``; ``task.build_model`` in the strategy's scope.
        4. The disk is checked for room; `fit` for ``run.fit_epochs(task.default_epochs)``
           epochs (no more than ``max_steps`` needs when the epoch length is known) with
           the whole list `fit_callbacks.standard_callbacks` orders: `ScheduleProgress`,
           ``task.callbacks``, guard, resume, checkpoints kept as ``task.averaging`` needs,
           logs, time budget, step limit, history, progress line, the epoch bound,
           ``callbacks`` and, under ``multi_worker``, the workers' agreement. Skipped when the
           recorded fit already covers the request: the weights then come from the backup.
        5. Under ``multi_worker``, every worker waits here for the others
           (`cluster.leave_together`); non-chief workers stop then and return ``{}``: only
           the chief writes.
        6. ``task.final_weights`` sets the weights to export and evaluate; ``task.export``
           writes the SavedModel and the trainer ``DIR/model.keras`` (unless recorded as
           done) once the weights are found finite and the disk has room (`check_export`).
        7. ``task.evaluate`` returns the ``metrics.json`` entries, ``"valid"`` among them;
           they and ``training_seconds`` are merged into ``metrics.json``. ``DIR/run.json``
           records each phase as it ends; the backup is kept.

        Returns:
            The ``"valid"`` entry returned by ``task.evaluate`` ({} on non-chief workers).

        Raises:
            ValueError: a broken file or a run on other data in the work directory, bad data,
                no training batches, a NaN loss or NaN weights (`NonFiniteLossError`,
                `NonFiniteWeightsError`), a full disk (`workdir.NoSpaceError`).
        """
        with lock_workdir(self.workdir):
            if self.run.strategy != "multi_worker":
                return self._fit_task(task, callbacks)
            return watched(lambda: self._fit_task(task, callbacks))

    @property
    def data_seed(self) -> int:
        """The seed of the training data's shuffle and augmentation: ``run.seed`` for a run
        that starts at epoch 1, another seed for each epoch a resumed run starts at (the
        chief's), so that resumed epochs do not repeat the order of epochs 1, 2, ...; the
        split never depends on it (``run.seed``)."""
        epoch = self.resume_epoch
        return self.run.seed if not epoch else (self.run.seed * 1_000_003 + epoch) % 2**31

    def _fit_task(self, task: Task, callbacks: Iterable[keras.callbacks.Callback]) -> dict:
        faults = FaultHook.from_env()  # the testing hook; does nothing in normal use
        if self.run.restart and is_chief():
            move_aside(self.workdir, ["checkpoints", "backup", "logs", "metrics.json",
                                      "run.json", *task.state_files], self.log)
        check_workdir(self.workdir, self.log)
        new_run = not (self.workdir.root / "run.json").exists()
        spec = self._check_data(task.data)
        request, state = self._request(task.default_epochs), self._read_state()
        if self.run.strategy == "multi_worker" and is_chief() and \
                needs_training(state, request):
            watch = peer_watch()  # until the first step: a worker that fails before it
            watch.watch(set(watch.peers))  # would leave the chief waiting
        if state.get("phase") == "finished" and not needs_training(state, request):
            self.log(f"{self.workdir.root}: this run finished earlier ({state.get('epochs')} "
                     f"epochs, {state.get('steps')} steps); export/, checkpoints/ and "
                     "metrics.json are left as they are. A larger --epochs or --max-steps "
                     "continues it, --restart trains it again")
            return read_metrics(self.workdir).get("valid", {})
        files = self._state_files(task)
        # A new model trains from scratch (or from a task's initial weights); otherwise the
        # run's own state (backup, checkpoints) replaces whatever the model starts with.
        context = RunContext(self.workdir, self.replicas, self.data_seed,
                             needs_training(state, request) and not self.resume_epoch,
                             request["epochs"], self.run.max_steps)
        try:
            data = task.load_data(context)
        except BaseException:  # bad data: a new run leaves nothing, unless it wrote files
            if new_run and self._state_files(task) == files:
                (self.workdir.root / "run.json").unlink(missing_ok=True)
            raise
        if data.steps_per_epoch == 0:
            raise ValueError("no training batches: the training data is empty")
        with self.strategy.scope():
            model = task.build_model(context, data)
        if needs_training(state, request):
            state = self._fit(task, context, model, data, request, spec, callbacks)
        elif is_chief():
            self._restore(model, state)
        if self.run.strategy == "multi_worker":  # the chief may end its process after this
            leave_together(self.strategy)
        if not is_chief():
            return {}
        final = task.final_weights(context, model)
        if final is not None:
            self.log(f"final weights: {final}")
        if state["phase"] == "trained":
            check_export(model, self.workdir.root)
            faults.at("export")
            task.export(model, self.workdir.export)
            save_model_file(model, self.workdir.model)
            state = self._record(phase="exported", export_steps=state["steps"])
            self.log(f"export: {self.workdir.export} ({state['steps']} steps)")
        faults.at("evaluate")
        entries = dict(task.evaluate(model))
        if "valid" not in entries:
            raise KeyError("`Task.evaluate` must return the 'valid' scores among its entries")
        write_metrics(self.workdir, {**entries,
                                     "training_seconds": state.get("training_seconds")})
        self._record(phase="finished")
        return entries["valid"]

    def _fit(self, task: Task, context: RunContext, model: keras.Model, data: TaskData,
             request: dict, spec: str, callbacks: Iterable[keras.callbacks.Callback]) -> dict:
        run, workdir = self.run, self.workdir
        self._record(phase="training", request=request, data=spec)
        # One rule for every continuation: train to the request's step bound, counted from
        # the steps the backup holds (an epoch cut short by a bound counts as done in Keras).
        spe = data.steps_per_epoch
        total = context.total_steps(spe)
        epochs = plan_epochs(request["epochs"], total, spe, self.resume_epoch, self.resume_step)
        clock, epoch_bound = RunClock(self.training_seconds), None
        if total is not None and spe and (run.max_steps is None or total < run.max_steps) and \
                self.resume_step + (epochs - self.resume_epoch) * spe > total:
            epoch_bound = MaxSteps(total, bound=f"epochs={request['epochs']}", clock=clock)
        check_training_space(model, workdir.root)
        progress = Progress(total, run.time_budget, clock=clock,
                            epochs=epochs if epochs < LONG_RUN_EPOCHS else None)
        last = []
        if run.strategy == "multi_worker":
            watch = peer_watch()
            last = [WorkerAgreement(self.strategy, on_first_step=lambda: watch.watch(
                set() if is_chief() else {chief_address()[0]}))]
        all_callbacks = standard_callbacks(
            workdir, run.time_budget, run.max_steps, clock=clock, keep_backup=True,
            progress=progress, averaging=task.averaging, feed_schedule=True,
            schedule=task.schedule, task_callbacks=task.callbacks(context, model),
            epoch_bound=epoch_bound, extra=callbacks, last=last)
        with warnings.catch_warnings():
            # An epoch is the whole data set: Keras warns when a data set whose length it does
            # not know yet ends its first epoch ("Your input ran out of data"), as if
            # `steps_per_epoch` had asked for more.
            warnings.filterwarnings("ignore", "Your input ran out of data", UserWarning)
            # Every worker starts at the chief's epoch (`read_run_state`), the one the chief's
            # backup restores.
            history = model.fit(data.train, validation_data=data.valid, epochs=epochs,
                                initial_epoch=self.resume_epoch, shuffle=False,
                                callbacks=all_callbacks, verbose=0)
        epochs_done = max([e + 1 for e in history.epoch], default=0)
        if workdir.backup_metadata.exists():  # also counts the epochs of earlier processes
            epochs_done = json.loads(workdir.backup_metadata.read_text()).get("epoch", epochs_done)
        return self._record(phase="trained", epochs=epochs_done, steps=steps_taken(model),
                            steps_per_epoch=spe,
                            training_seconds=round(clock.training_seconds(), 3))

    def _check_data(self, data: str) -> str:
        """The data spec as recorded; a new run records it (and its split) now."""
        state = read_state(self.workdir)
        spec, split = check_data(state, data, self.run, self.workdir.root)
        if split is not None:
            self._record(phase=state.get("phase", "training"), data=spec, split=split)
        return spec

    def _state_files(self, task: Task) -> list:
        paths = [self.workdir.root / name for name in task.state_files]
        return [(p.stat().st_mtime_ns, p.stat().st_size) if p.exists() else None for p in paths]

    def _request(self, default_epochs: int) -> dict:
        return {"epochs": self.run.fit_epochs(default_epochs), "max_steps": self.run.max_steps,
                "time_budget": self.run.time_budget}

    def _read_state(self) -> dict:
        """`read_run_state`; sets ``resume_epoch`` and ``resume_step`` (0 without a backup)."""
        state, self.resume_epoch, self.resume_step = read_run_state(
            self.workdir, self.run, self.strategy)
        return state

    def _record(self, **fields: Any) -> dict:
        """Merges ``fields`` into ``run.json`` (the chief's; other workers keep them in memory)."""
        if not is_chief():
            self._state = {**self._state, **fields}
            return self._state
        return write_state(self.workdir, **fields)

    def _restore(self, model: keras.Model, state: dict) -> None:
        """The fitted weights and optimizer state of a run killed after `fit`, from the backup."""
        weights = self.workdir.backup_weights
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
        if steps_taken(model) != state.get("steps"):
            raise ValueError(f"{weights} holds step {steps_taken(model)}, but "
                             f"{self.workdir.state} records {state.get('steps')}; rerun with "
                             "--restart")
        self.log(f"resume: training finished earlier ({state.get('steps')} steps), "
                 f"{'evaluating' if state['phase'] == 'exported' else 'exporting'} now")

