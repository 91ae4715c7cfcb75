"""Training plumbing shared by the translation and detection trainers.

Strategy from ``--strategy``, mixed precision, the work-directory layout, ``metrics.json``,
the standard Keras callbacks (resume, checkpoints, TensorBoard, time budget, step limit) and
the ``error: ...`` / exit code 2 wrapper for scripts. TensorFlow is allowed here, nowhere else
in ``tfx_transformer``.

Work directory ``DIR``::

    DIR/checkpoints/epoch-NNN.weights.h5   weights + optimizer state after each epoch
    DIR/export/                            SavedModel (written by the application)
    DIR/logs/                              TensorBoard
    DIR/metrics.json                       merged, written atomically
    DIR/backup/                            BackupAndRestore state (removed after a finished fit)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import keras
import numpy as np
import tensorflow as tf

__all__ = [
    "MaxSteps", "MetricsLogger", "TimeBudget", "Workdir", "add_common_arguments", "fail",
    "get_strategy", "is_chief", "plan_epochs", "read_metrics", "run_cli", "set_mixed_precision",
    "standard_callbacks", "write_metrics",
]

STRATEGIES = ("auto", "mirrored", "multi_worker")
MIXED_PRECISION = {"none": "float32", "bfloat16": "mixed_bfloat16", "float16": "mixed_float16"}


def get_strategy(name: str) -> tf.distribute.Strategy:
    """Returns the `tf.distribute` strategy for ``--strategy NAME``.

    ``auto``: `MirroredStrategy` when more than one GPU is visible, else the default strategy.
    ``mirrored``: `MirroredStrategy` over all GPUs, or over all logical CPU devices when there
    is no GPU (that is how tests run it on two logical CPUs). ``multi_worker``:
    `MultiWorkerMirroredStrategy` from ``TF_CONFIG``; create it first thing in the program.

    Raises:
        ValueError: unknown ``name``, or ``multi_worker`` without a valid ``TF_CONFIG``.
    """
    if name == "auto":
        if len(tf.config.list_physical_devices("GPU")) > 1:
            return tf.distribute.MirroredStrategy()
        return tf.distribute.get_strategy()
    if name == "mirrored":
        if tf.config.list_physical_devices("GPU"):
            return tf.distribute.MirroredStrategy()
        cpus = [device.name for device in tf.config.list_logical_devices("CPU")]
        return tf.distribute.MirroredStrategy(devices=cpus)
    if name == "multi_worker":
        config = _tf_config()
        if not config.get("cluster") or not config.get("task"):
            raise ValueError(
                "`--strategy multi_worker` needs TF_CONFIG with 'cluster' and 'task'. "
                f"Received: TF_CONFIG={os.environ.get('TF_CONFIG')!r}"
            )
        return tf.distribute.MultiWorkerMirroredStrategy()
    raise ValueError(f"`--strategy` must be one of {STRATEGIES}. Received: strategy={name!r}")


def _tf_config() -> dict:
    raw = os.environ.get("TF_CONFIG") or "{}"
    try:
        config = json.loads(raw)
    except json.JSONDecodeError as error:
        raise ValueError(f"TF_CONFIG is not valid JSON ({error}). Received: {raw!r}") from None
    return config if isinstance(config, dict) else {}


def is_chief() -> bool:
    """True unless ``TF_CONFIG`` names this process a non-chief worker (who must not write)."""
    config = _tf_config()
    task = config.get("task") or {}
    kind, index = task.get("type"), int(task.get("index", 0))
    if kind in (None, "chief"):
        return True
    return kind == "worker" and index == 0 and "chief" not in (config.get("cluster") or {})


def set_mixed_precision(name: str) -> str:
    """Sets the global Keras dtype policy for ``--mixed-precision none|bfloat16|float16``.

    Returns:
        The policy name set: ``float32``, ``mixed_bfloat16`` or ``mixed_float16``.
    """
    if name not in MIXED_PRECISION:
        raise ValueError(
            f"`--mixed-precision` must be one of {tuple(MIXED_PRECISION)}. Received: {name!r}"
        )
    keras.config.set_dtype_policy(MIXED_PRECISION[name])
    return MIXED_PRECISION[name]


class Workdir:
    """Paths of a training work directory; creating one never deletes anything in it.

    Args:
        root: the directory. Created with ``checkpoints/`` and ``logs/`` if missing; ``export/``
            and ``backup/`` are created by their writers.
    """

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        if self.root.exists() and not self.root.is_dir():
            raise ValueError(f"`workdir` must be a directory. Received: {str(root)!r} is a file")
        for path in (self.checkpoints, self.logs):
            path.mkdir(parents=True, exist_ok=True)

    checkpoints = property(lambda self: self.root / "checkpoints")
    export = property(lambda self: self.root / "export")
    logs = property(lambda self: self.root / "logs")
    backup = property(lambda self: self.root / "backup")
    metrics = property(lambda self: self.root / "metrics.json")

    def latest_checkpoint(self) -> Path | None:
        """The ``epoch-NNN.weights.h5`` file with the highest epoch, or None."""
        found = sorted(self.checkpoints.glob("epoch-*.weights.h5"))
        return found[-1] if found else None

    def __repr__(self) -> str:
        return f"Workdir({str(self.root)!r})"


def _root(workdir: Workdir | str | os.PathLike) -> Path:
    return workdir.root if isinstance(workdir, Workdir) else Path(workdir)


def _to_json(value: Any) -> Any:
    """NumPy/TensorFlow values -> plain JSON values; NaN and infinities become None."""
    if isinstance(value, Mapping):
        return {str(key): _to_json(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_to_json(item) for item in value]
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if hasattr(value, "numpy") or isinstance(value, (np.ndarray, np.generic)):
        return _to_json(np.asarray(value).tolist())
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"metrics values must be JSON-like. Received: {type(value).__name__}")


def _merge(old: dict, new: Mapping) -> dict:
    merged = dict(old)
    for key, value in new.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            value = _merge(merged[key], value)
        merged[key] = value
    return merged


def read_metrics(workdir: Workdir | str | os.PathLike) -> dict:
    """Contents of ``DIR/metrics.json`` ({} when it does not exist)."""
    path = _root(workdir) / "metrics.json"
    if not path.exists():
        return {}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not valid JSON ({error}); fix or move it") from None


def write_metrics(workdir: Workdir | str | os.PathLike, metrics: Mapping[str, Any]) -> dict:
    """Merges ``metrics`` into ``DIR/metrics.json`` atomically (temp file + ``os.replace``).

    Nested dicts merge key by key, so no existing key is lost; NumPy scalars and arrays become
    plain JSON numbers and lists; NaN/inf become null.

    Returns:
        The merged contents written.
    """
    root = _root(workdir)
    root.mkdir(parents=True, exist_ok=True)
    merged = _merge(read_metrics(root), _to_json(dict(metrics)))
    fd, tmp = tempfile.mkstemp(prefix=".metrics.", suffix=".tmp", dir=root)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(merged, f, indent=2, sort_keys=True, allow_nan=False)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, root / "metrics.json")
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return merged


class TimeBudget(keras.callbacks.Callback):
    """Stops `fit` cleanly at the first batch end after ``minutes`` of wall-clock time.

    The clock starts at ``on_train_begin``. After a stop, ``stopped`` is True and ``reason``
    says why; the caller still evaluates and exports.

    Args:
        minutes: the budget, > 0.
        clock: seconds as a float; injectable for tests. Defaults to `time.monotonic`.
    """

    def __init__(self, minutes: float, clock: Callable[[], float] = time.monotonic):
        super().__init__()
        if not minutes > 0:
            raise ValueError(f"`time_budget` must be > 0 minutes. Received: {minutes!r}")
        self.minutes, self.clock = float(minutes), clock
        self.stopped, self.reason, self.start = False, None, None

    def on_train_begin(self, logs=None):
        self.start, self.stopped, self.reason = self.clock(), False, None

    def on_train_batch_end(self, batch, logs=None):
        elapsed = self.clock() - self.start
        if elapsed >= 60.0 * self.minutes and not self.stopped:
            self.model.stop_training = self.stopped = True
            self.reason = f"time budget of {self.minutes:g} min spent ({elapsed:.1f} s)"


class MaxSteps(keras.callbacks.Callback):
    """Stops `fit` once the optimizer has taken ``max_steps`` steps in total.

    Steps count from ``model.optimizer.iterations`` at train begin, so a run resumed by
    `BackupAndRestore` (which restores the optimizer) keeps counting where it stopped.
    """

    def __init__(self, max_steps: int):
        super().__init__()
        if not (isinstance(max_steps, int) and max_steps > 0):
            raise ValueError(f"`max_steps` must be a positive int. Received: {max_steps!r}")
        self.max_steps, self.steps, self.stopped, self.reason = max_steps, 0, False, None

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
            self.reason = f"max_steps={self.max_steps} reached"


def plan_epochs(epochs: int, max_steps: int | None, steps_per_epoch: int | None) -> int:
    """Epochs to pass to `fit`: no more than ``max_steps`` needs when the epoch length is known.

    Use with `MaxSteps` (in `standard_callbacks`), which stops at the exact step.
    """
    if max_steps is None or not steps_per_epoch or steps_per_epoch < 0:
        return epochs
    return max(1, min(epochs, math.ceil(max_steps / steps_per_epoch)))


class MetricsLogger(keras.callbacks.Callback):
    """Writes each epoch's logs to ``metrics.json["history"]`` and a ``"train"`` summary.

    History entries are keyed by 1-based ``epoch``; a resumed or restarted run replaces the
    entries from its first epoch on. Only the chief writes.

    Args:
        workdir: the work directory.
        stoppers: callbacks with ``stopped``/``reason`` (`TimeBudget`, `MaxSteps`) to report.
    """

    def __init__(self, workdir: Workdir | str | os.PathLike, stoppers: Iterable = ()):
        super().__init__()
        self.root, self.stoppers, self.write = _root(workdir), list(stoppers), is_chief()

    def on_train_begin(self, logs=None):
        self._start, self.last_epoch = time.monotonic(), None

    def on_epoch_end(self, epoch, logs=None):
        self.last_epoch = epoch + 1
        if not self.write:
            return
        # Keep earlier epochs only: drops a stale entry for this epoch and anything after it.
        old = [e for e in read_metrics(self.root).get("history", []) if e["epoch"] <= epoch]
        entry = {"epoch": epoch + 1, "elapsed_s": round(time.monotonic() - self._start, 3)}
        write_metrics(self.root, {"history": old + [_to_json({**entry, **(logs or {})})]})

    def on_train_end(self, logs=None):
        reasons = [s.reason for s in self.stoppers if getattr(s, "stopped", False)]
        if self.write:
            write_metrics(self.root, {"train": {
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
) -> list[keras.callbacks.Callback]:
    """The callbacks every trainer passes to `fit`, in order.

    `BackupAndRestore(DIR/backup)` (first, so later callbacks see the restored state; the
    model must be built before `fit`), `ModelCheckpoint` of weights every epoch into
    ``DIR/checkpoints/epoch-NNN.weights.h5``, `TerminateOnNaN`, `TensorBoard(DIR/logs)`,
    `TimeBudget` and `MaxSteps` when asked, and `MetricsLogger`. Non-chief workers back up to
    ``DIR/backup-worker-N`` and write checkpoints to a temporary directory, logs not at all.

    Args:
        workdir: the work directory.
        time_budget_minutes: stop after this much wall-clock time (None: no budget).
        max_steps: stop after this many optimizer steps in total (None: no limit).
        keep_backup: keep ``DIR/backup`` after a finished `fit` (Keras deletes it by default).
        tensorboard: include the `TensorBoard` callback; None (default): when the
            ``tensorboard`` package is installed (TensorFlow 2.21 no longer depends on it).
        clock: clock for `TimeBudget`.
    """
    workdir = workdir if isinstance(workdir, Workdir) else Workdir(workdir)
    chief = is_chief()
    backup, checkpoints = workdir.backup, workdir.checkpoints
    if not chief:
        backup = workdir.root / f"backup-worker-{_tf_config()['task'].get('index', 0)}"
        checkpoints = Path(tempfile.mkdtemp(prefix="tfx-checkpoints-"))
    callbacks = [
        keras.callbacks.BackupAndRestore(str(backup), delete_checkpoint=not keep_backup),
        keras.callbacks.ModelCheckpoint(
            str(checkpoints / "epoch-{epoch:03d}.weights.h5"), save_weights_only=True
        ),
        keras.callbacks.TerminateOnNaN(),
    ]
    if tensorboard is None:
        tensorboard = importlib.util.find_spec("tensorboard") is not None
        if not tensorboard:
            logging.getLogger(__name__).warning("`tensorboard` is not installed: no DIR/logs")
    if tensorboard and chief:
        callbacks.append(keras.callbacks.TensorBoard(str(workdir.logs)))
    stoppers = []
    if time_budget_minutes is not None:
        stoppers.append(TimeBudget(time_budget_minutes, clock=clock))
    if max_steps is not None:
        stoppers.append(MaxSteps(max_steps))
    return callbacks + stoppers + [MetricsLogger(workdir, stoppers)]


def _positive(kind: type) -> Callable[[str], Any]:
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a {kind.__name__}, got {text!r}") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text!r}")
        return value

    return parse


def add_common_arguments(parser: argparse.ArgumentParser, *, default_epochs: int = 10) -> None:
    """Adds --workdir --epochs --max-steps --time-budget --strategy --mixed-precision --seed."""
    parser.add_argument("--workdir", required=True, help="work directory (created if missing)")
    parser.add_argument("--epochs", type=_positive(int), default=default_epochs)
    parser.add_argument("--max-steps", type=_positive(int), default=None,
                        help="stop after this many train steps in total")
    parser.add_argument("--time-budget", type=_positive(float), default=None, metavar="MIN",
                        help="stop cleanly after MIN minutes of training, then export")
    parser.add_argument("--strategy", choices=STRATEGIES, default="auto")
    parser.add_argument("--mixed-precision", choices=tuple(MIXED_PRECISION), default="none")
    parser.add_argument("--seed", type=int, default=0)


def fail(message: str) -> int:
    """Prints ``error: MESSAGE`` as one line on stderr and returns exit code 2."""
    print(f"error: {' '.join(str(message).split())}", file=sys.stderr)
    return 2


def run_cli(main_fn: Callable[..., int | None], *args: Any, **kwargs: Any) -> int:
    """Runs ``main_fn(*args, **kwargs)``; bad input becomes one ``error:`` line and exit code 2.

    Catches `ValueError`, `OSError` (incl. `FileNotFoundError`) and `tf.errors.NotFoundError`;
    anything else is a bug and keeps its traceback. Set ``TFX_TRANSFORMER_DEBUG=1`` to see the
    traceback of caught errors too. Use as ``sys.exit(run_cli(main))``.
    """
    try:
        return int(main_fn(*args, **kwargs) or 0)
    except (ValueError, OSError, tf.errors.NotFoundError) as error:
        if os.environ.get("TFX_TRANSFORMER_DEBUG"):
            raise
        message = getattr(error, "message", None) or str(error) or type(error).__name__
        return fail(message)
    except KeyboardInterrupt:
        fail("interrupted")
        return 130
