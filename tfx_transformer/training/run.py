"""A run, whatever it trains: its options, the protocol of the task it trains, and what its
``run.json`` decides.

`RunOptions` holds how a run runs (strategy, bounds, seed, held-out share); the model's
hyperparameters live in the application's config (`nlp.config.NMTConfig`,
`vision.config.DetrConfig`). Both are validated once, when created.

An application subclasses `Task` and gives what it alone knows; `Trainer.fit` calls, in this
order::

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

`check_data`, `needs_training` and `read_run_state` are what ``run.json`` decides: the data a
run continues, whether it still trains, and the state every worker starts from.

Example:
    >>> RunOptions(max_steps=100, seed=1).fit_epochs(default=10)
    100000
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tfx_transformer import checks
from tfx_transformer.data_spec import normalized
from tfx_transformer.training.checkpoints import Averaging
from tfx_transformer.training.distribute import (
    MIXED_PRECISION,
    STRATEGIES,
    broadcast_from_chief,
    is_chief,
)
from tfx_transformer.training.workdir import Workdir, read_state

if TYPE_CHECKING:  # only annotations: the commands' flags (`tfx_transformer.cli`) load no Keras
    import keras

__all__ = ["LONG_RUN_EPOCHS", "RunContext", "RunOptions", "Task", "TaskData", "check_data",
           "needs_training", "read_run_state"]

LONG_RUN_EPOCHS = 100_000  # with a time budget or step limit, those decide when to stop


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """The options of one training run (the ``--strategy``, ``--epochs``, ... flags).

    Raises:
        ValueError: on creation, for any field out of range; the message names the field and
            the value received.
    """

    strategy: str = "auto"  # "auto", "mirrored" or "multi_worker" (`distribute.get_strategy`)
    mixed_precision: str = "none"  # "none", "bfloat16", "float16" or "auto" (`distribute`)
    # None: the trainer's default (the preset's), or unbounded with max_steps / time_budget.
    epochs: int | None = None
    max_steps: int | None = None  # stop after this many optimizer steps in total
    time_budget: float | None = None  # minutes of training; then export and evaluate as usual
    seed: int = 0  # weights, shuffling, augmentation, embedded data; 0 .. 2**32 - 1
    valid_fraction: float = 0.05  # held-out share of a file source (tsv:, coco:)
    eval_limit: int | None = None  # validate and evaluate on at most this many examples
    # XLA-compile the train step. Off by default: NMT's bucket shapes each compile anew, and
    # DETR's scipy matcher is a host callback.
    jit_compile: bool = False
    # Start over in a work directory that holds a run: its files move to DIR/previous-N/.
    restart: bool = False

    def __post_init__(self):
        if self.strategy not in STRATEGIES:
            raise checks.CheckError("strategy", self.strategy, f"one of {STRATEGIES}")
        if self.mixed_precision not in MIXED_PRECISION:
            raise checks.CheckError("mixed_precision", self.mixed_precision,
                                    f"one of {tuple(MIXED_PRECISION)}")
        for name in ("epochs", "max_steps", "eval_limit"):
            checks.positive_int(name, getattr(self, name), optional=True)
        checks.positive_number("time_budget", self.time_budget, optional=True)  # minutes
        checks.integer("seed", self.seed, minimum=0, maximum=2**32 - 1)  # NumPy's seeds
        checks.fraction("valid_fraction", self.valid_fraction)
        for name in ("jit_compile", "restart"):
            checks.boolean(name, getattr(self, name))

    @property
    def bounded(self) -> bool:
        """True when ``max_steps`` or ``time_budget`` decides when training stops."""
        return self.max_steps is not None or self.time_budget is not None

    def fit_epochs(self, default: int) -> int:
        """``epochs``; if None, `LONG_RUN_EPOCHS` for a bounded run, else ``default``."""
        if self.epochs is not None:
            return self.epochs
        return LONG_RUN_EPOCHS if self.bounded else default


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
    # The learning-rate schedule `build_model` compiled the model with, set there: the trainer
    # tells it where the run is (`tfx_transformer.training.callbacks.ScheduleProgress`).
    # None: a plain rate, or a schedule that needs no telling.
    schedule: Any = None

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


def check_data(state: dict, data: str, run: RunOptions, root) -> tuple[str, dict | None]:
    """A work directory continues one data set, split alike: another ``--data``,
    ``--valid-fraction`` or ``--seed`` is an error (it would silently keep the earlier run's
    tokenizer and weights, or train on its held-out examples).

    Returns:
        ``(spec, split)``: the spec as recorded (paths made absolute), and the split a new run
        must record before anything derived from the data is written (None when recorded).
    """
    spec = normalized(data)
    split = {"valid_fraction": run.valid_fraction, "seed": run.seed}
    recorded, recorded_split = state.get("data"), state.get("split", split)
    if recorded is not None and recorded != spec:
        raise ValueError(
            f"--data {data}: {root} holds a run on --data {recorded}; go on with that --data, "
            "or use --restart (or a new --workdir) to train on new data")
    for name, value in recorded_split.items():
        if split[name] != value:
            flag = "--" + name.replace("_", "-")
            raise ValueError(
                f"{flag} {split[name]}: {root} holds a run with {flag} {value} (another split "
                f"would train on its held-out examples); go on with {flag} {value}, or use "
                "--restart (or a new --workdir)")
    return spec, (split if recorded is None else None)


def needs_training(state: dict, request: dict) -> bool:
    """False when the recorded fit already covers ``request`` (or is the same request).

    A finished fit is covered when its steps reach the request's step bound: ``max_steps``,
    or ``epochs`` times the recorded epoch length, whichever is smaller. Where the step bound
    says nothing (a run bounded by its time budget), the same request is covered and any
    other is not.
    """
    if state.get("phase", "training") == "training":
        return True
    steps, per_epoch = state.get("steps", 0), state.get("steps_per_epoch")
    bounds = [request["max_steps"]] if request["max_steps"] is not None else []
    if per_epoch:
        bounds.append(request["epochs"] * per_epoch)
    elif state.get("epochs", 0) >= request["epochs"]:  # a run.json without the epoch length
        return False
    if bounds and steps >= min(bounds):
        return False
    return request != state.get("request")


def read_run_state(workdir: Workdir, run: RunOptions, strategy) -> tuple[dict, int, int]:
    """``(run.json, the epochs the backup holds, the optimizer steps it holds)``: the chief's
    on every worker (broadcast by the chief under ``multi_worker``; the others have none), so
    that all of them take the same path. A worker that went on alone would wait for its peers
    in `fit` for ever."""
    state = read_state(workdir)
    try:
        metadata = json.loads(workdir.backup_metadata.read_text())
        epoch, step = int(metadata.get("epoch", 0)), int(metadata.get("step", 0))
    except (OSError, ValueError, AttributeError):
        epoch, step = 0, 0  # none, or broken: `check_workdir` and the restore name it
    if run.strategy == "multi_worker":
        payload = json.dumps({"state": state, "epoch": epoch, "step": step}).encode("utf-8") \
            if is_chief() else None
        received = json.loads(broadcast_from_chief(payload, strategy).decode("utf-8"))
        state, epoch, step = received["state"], received["epoch"], received["step"]
    return state, epoch, step
