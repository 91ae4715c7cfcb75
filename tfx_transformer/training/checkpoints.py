"""The weights a run exports: its last epoch, its best epoch, or an average of epochs.

Every trainer saves the weights (without the optimizer state) of each epoch to
``DIR/checkpoints/epoch-NNN.weights.h5`` (`tfx_transformer.training.saving.Backup`) and the
epoch's logs to ``metrics.json["history"]``. `choose_weights` picks from them what is
exported: the epoch with the best value of a validation metric (early stopping's "best
checkpoint"), and the arithmetic mean of the last ``average_last`` epochs up to it (fairseq's
``average_checkpoints.py --num-epoch-checkpoints N``). A task says what it exports with an
`Averaging`, whose `Averaging.needed` tells the trainer which checkpoints to keep: the others
are deleted as the run goes.

Example:
    >>> choose_weights(model, workdir, average_last=3, monitor="val_bleu")
    'the mean of epochs 7-9 (best val_bleu 21.3 at epoch 9)'
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from tfx_transformer import checks
from tfx_transformer.training.workdir import Workdir, checkpoint_files, read_metrics

if TYPE_CHECKING:  # Keras loads with the model (the commands' flags need none of it)
    import keras

__all__ = ["AVERAGE_MAX", "AVERAGE_SHARE", "Averaging", "average_count", "average_weights",
           "best_epoch", "choose_weights", "epoch_checkpoints"]

# `average_last=None`: average the last quarter of the epochs up to the exported one, at most
# 10. On real text (experiments/nmt_real.py, 29 epochs of 50 steps) the mean of the last 5, 8
# and 12 epochs scored BLEU 21.6, 21.9 and 20.8 against 14.5 for the last epoch alone.
AVERAGE_SHARE = 0.25
AVERAGE_MAX = 10


def epoch_checkpoints(workdir: Workdir | str | os.PathLike) -> dict[int, Path]:
    """``{epoch (1-based): path}`` of the epoch checkpoints in ``DIR/checkpoints``."""
    workdir = workdir if isinstance(workdir, Workdir) else Workdir(workdir)
    return checkpoint_files(workdir.checkpoints)


def average_weights(model: keras.Model, paths: Sequence[str | os.PathLike]) -> None:
    """Sets ``model``'s weights to the arithmetic mean of the weight files ``paths``.

    Each file is loaded into ``model`` in turn (an epoch checkpoint holds no optimizer state:
    the optimizer's is left as it is); the mean is taken in float64 and cast to each
    variable's dtype.

    Raises:
        ValueError: no paths, or a file that does not fit ``model`` (named).
    """
    import keras

    if not paths:
        raise ValueError("`paths` must name at least one weights file")
    total = None
    for path in paths:
        try:
            with warnings.catch_warnings():  # Keras: "Skipping variable loading for optimizer"
                warnings.filterwarnings("ignore", message="Skipping variable loading")
                model.load_weights(str(path))
        except Exception as error:  # h5py and shape errors alike
            raise ValueError(f"cannot load {path} into the model ({type(error).__name__}: "
                             f"{str(error)[:200]})") from None
        values = [keras.ops.convert_to_numpy(w).astype(np.float64) for w in model.weights]
        total = values if total is None else [t + v for t, v in zip(total, values)]
    for weight, value in zip(model.weights, total):
        weight.assign((value / len(paths)).astype(keras.backend.standardize_dtype(weight.dtype)))


def average_count(epochs: int) -> int:
    """How many epochs ``average_last=None`` averages when the exported epoch is ``epochs``:
    `AVERAGE_SHARE` of them, rounded half up, at least 1 and at most `AVERAGE_MAX`."""
    return max(1, min(AVERAGE_MAX, int(epochs * AVERAGE_SHARE + 0.5)))


def best_epoch(history: Sequence[dict], monitor: str, mode: str = "max") -> int | None:
    """The 1-based epoch of ``history`` (``metrics.json["history"]``) with the best
    ``monitor``; the first of equals; None when no entry has it."""
    if mode not in ("max", "min"):
        raise ValueError(f"`mode` must be 'max' or 'min'. Received: {mode!r}")
    scored = [(e[monitor], e["epoch"]) for e in history
              if isinstance(e.get(monitor), (int, float)) and np.isfinite(e[monitor])]
    if not scored:
        return None
    sign = 1.0 if mode == "max" else -1.0
    best = max(sign * value for value, _ in scored)
    return min(epoch for value, epoch in scored if sign * value == best)


def choose_weights(model: keras.Model, workdir: Workdir | str | os.PathLike,
                   average_last: int | None = 1, monitor: str | None = None,
                   mode: str = "max") -> str:
    """Sets ``model``'s weights to what the run exports; returns a line saying which.

    The run's final epoch is the last one in ``metrics.json["history"]``; with ``monitor``
    (e.g. ``"val_bleu"``), the best epoch by it instead. The weights are the mean of the
    checkpoints of the ``average_last`` epochs ending there (fewer when fewer exist; None:
    `average_count` of that epoch's number). When that is just the last epoch's checkpoint,
    the model keeps its weights (they are that epoch's).

    Raises:
        ValueError: ``average_last`` < 1, or a checkpoint that does not fit ``model``.
    """
    checks.positive_int("average_last", average_last, optional=True)
    history = read_metrics(workdir).get("history", [])
    checkpoints = epoch_checkpoints(workdir)
    last = max([e["epoch"] for e in history] or list(checkpoints) or [0])
    end, why = last, ""
    if monitor is not None:
        best = best_epoch(history, monitor, mode)
        if best is not None:
            end = best
            value = next(e[monitor] for e in history if e["epoch"] == best)
            why = f" (best {monitor} {value:.4g} at epoch {best} of {last})"
    if average_last is None:
        average_last = average_count(end)
    epochs = [e for e in range(end - average_last + 1, end + 1) if e in checkpoints]
    if end == last and epochs in ([], [last]):
        return f"the weights of the last epoch ({last}){why}"
    if not epochs:
        return f"the weights of the last epoch ({last}): no checkpoint of epoch {end}{why}"
    average_weights(model, [checkpoints[e] for e in epochs])
    if len(epochs) == 1:
        return f"the weights of epoch {epochs[0]}{why}"
    return f"the mean of the weights of epochs {epochs[0]}-{epochs[-1]}{why}"


@dataclasses.dataclass(frozen=True)
class Averaging:
    """What a run exports from its epoch checkpoints (`choose_weights` with these arguments).

    Attributes:
        last: the epochs averaged (None: `average_count` of the exported epoch; 1: that epoch).
        monitor: the validation metric that picks the best epoch (None: the last epoch).
        mode: ``"max"`` or ``"min"``: which ``monitor`` value is best.
    """

    last: int | None = 1
    monitor: str | None = None
    mode: str = "max"

    def __post_init__(self):
        checks.positive_int("Averaging.last", self.last, optional=True)
        if self.mode not in ("max", "min"):
            raise ValueError(f"`Averaging.mode` must be 'max' or 'min'. Received: {self.mode!r}")

    def choose(self, model: keras.Model, workdir: Workdir | str | os.PathLike) -> str:
        """`choose_weights` of ``model`` and ``workdir``: sets the weights, says which."""
        return choose_weights(model, workdir, self.last, self.monitor, self.mode)

    def needed(self, history: Sequence[dict]) -> set[int]:
        """The epochs whose checkpoints `choose` may still read, now or at a later epoch.

        ``history`` is ``metrics.json["history"]`` up to the epoch just done. Needed: the
        ``last`` epochs ending at the latest one and, with ``monitor``, those ending at the
        best one. An epoch dropped here is never needed later: a later best epoch is a
        later epoch, and `average_count` grows by at most one epoch per epoch.
        """
        if not history:
            return set()
        ends = {max(e["epoch"] for e in history)}
        if self.monitor is not None:
            best = best_epoch(history, self.monitor, self.mode)
            ends |= {best} if best is not None else set()
        needed = set()
        for end in ends:
            count = average_count(end) if self.last is None else self.last
            needed.update(range(end - count + 1, end + 1))
        return needed
