"""The run's state on disk: never NaN, never half-written, no more of it than the run needs.

`Backup` writes at each epoch's end, after checking that the weights are finite
(`check_finite`) and that the disk has room for what follows (`require_space`), each file
through a temporary file and a rename (`tfx_transformer.training.h5files.write_atomically`),
in this order:

1. ``DIR/checkpoints/epoch-NNN.weights.h5``: the weights alone (what averaging reads);
2. ``DIR/backup/latest.weights.h5``: weights and optimizer state (what a resumed run reads);
3. ``DIR/backup/training_metadata.json``: the epoch done and the optimizer step reached.

So the backup never records an epoch whose checkpoint is missing or cut short. Then the epoch
checkpoints that ``keep`` does not name are deleted (`tfx_transformer.training.checkpoints.
Averaging.needed`: the last epochs that averaging and the best epoch can still use).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import keras
import numpy as np

from tfx_transformer.training.h5files import (
    CHECKPOINT_NAME,
    NoSpaceError,
    checkpoint_files,
    copy_weights_only,
    write_atomically,
)

__all__ = ["Backup", "NonFiniteWeightsError", "StateSizes", "check_export", "check_finite",
           "check_training_space", "require_space", "save_model_file"]

_MIB = 2**20


class NonFiniteWeightsError(ValueError):
    """The model's weights hold NaN or infinite values (an update that overflowed)."""


def check_finite(model: keras.Model, when: str, kept: str) -> None:
    """Raises `NonFiniteWeightsError` when a weight of ``model`` is NaN or infinite.

    Args:
        model: the model.
        when: when this is, for the message ("after epoch 3 (step 120)").
        kept: what is kept instead, for the message.
    """
    bad = [w.path for w in model.weights
           if not np.isfinite(keras.ops.convert_to_numpy(w)).all()]
    if bad:
        names = ", ".join(bad[:3]) + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
        raise NonFiniteWeightsError(
            f"the weights are NaN or infinite {when} ({names}) although the loss was finite: "
            f"an update overflowed; nothing of it was saved or exported, {kept}. Lower the "
            "learning rate or clip the gradients (--clip-norm); a rerun resumes from the last "
            "good state")


class StateSizes:
    """Bytes of what a run writes for ``model``: ``weights`` (an epoch checkpoint, about an
    export) and ``state`` (the backup: weights and optimizer state; an optimizer not built
    yet is counted as Adam's two slots per trainable variable)."""

    def __init__(self, model: keras.Model):
        def size(variables) -> int:
            return sum(int(np.prod(v.shape)) * np.dtype(keras.backend.standardize_dtype(
                v.dtype)).itemsize for v in variables)

        self.weights = size(model.weights)
        optimizer = model.optimizer
        if optimizer is not None and optimizer.built:
            slots = size(optimizer.variables)
        else:
            slots = 2 * size(model.trainable_weights) if optimizer is not None else 0
        self.state = self.weights + slots


def require_space(directory: str | os.PathLike, needed: int, what: str) -> None:
    """Raises `NoSpaceError` unless the disk of ``directory`` has ``needed`` bytes free (plus
    5 % and 1 MiB for the files' own overhead).

    Args:
        directory: an existing directory on the disk to check.
        needed: the bytes about to be written.
        what: what they are, for the message ("the export").
    """
    needed = int(needed * 1.05) + _MIB
    free = shutil.disk_usage(directory).free
    if free < needed:
        raise NoSpaceError(
            f"{directory}: {free / _MIB:.1f} MiB free on its disk, {what} needs about "
            f"{needed / _MIB:.1f} MiB: nothing of it was written and the last good state is "
            "kept; free some space (or use a --workdir on another disk) and rerun the same "
            "command")


class Backup(keras.callbacks.BackupAndRestore):
    """`BackupAndRestore` that writes the epoch's checkpoint and backup safely (module
    docstring), prunes the checkpoints, and names a broken backup.

    A backup that cannot be read is a `ValueError` naming the file and what to do.

    Args:
        backup_dir: the backup directory (``DIR/backup``).
        delete_checkpoint: delete it when `fit` ends (Keras's default).
        checkpoints: where the epoch checkpoints go (None: none are written).
        keep: ``keep(epoch, logs)`` -> the epochs (1-based) whose checkpoints to keep after
            epoch ``epoch`` is written (None: all).
    """

    def __init__(self, backup_dir: str | os.PathLike, delete_checkpoint: bool = True,
                 checkpoints: str | os.PathLike | None = None,
                 keep: Callable[[int, dict], set] | None = None):
        super().__init__(str(backup_dir), delete_checkpoint=delete_checkpoint,
                         double_checkpoint=False)
        self.checkpoints = None if checkpoints is None else Path(checkpoints)
        self.keep, self._logs = keep, {}

    def on_train_begin(self, logs=None):
        try:
            super().on_train_begin(logs)
        except Exception as error:  # h5py, JSON and shape errors alike
            if not os.path.exists(self._weights_path):
                raise
            raise ValueError(
                f"cannot resume from {self._weights_path} ({type(error).__name__}: "
                f"{str(error)[:200]}); delete {self.backup_dir} to train again from epoch 1, "
                "or rerun with --restart") from None

    def on_epoch_end(self, epoch, logs=None):
        self._logs = dict(logs or {})
        super().on_epoch_end(epoch, logs)  # calls `_save_model`

    def _save_model(self):
        model, epoch = self.model, self._current_epoch
        step = int(keras.ops.convert_to_numpy(model.optimizer.iterations))
        kept = self._kept(epoch)
        check_finite(model, f"after epoch {epoch} (step {step})", kept)
        os.makedirs(self.backup_dir, exist_ok=True)
        sizes = StateSizes(model)
        require_space(self.backup_dir, sizes.state + sizes.weights * bool(self.checkpoints),
                      f"the checkpoint and backup of epoch {epoch}")
        checkpoint = None if self.checkpoints is None else (
            self.checkpoints / CHECKPOINT_NAME.format(epoch=epoch))

        def write_state(tmp: str) -> None:
            model.save_weights(tmp)
            if checkpoint is not None:
                copy_weights_only(tmp, checkpoint)

        write_atomically(self._weights_path, write_state)
        metadata = json.dumps({"epoch": epoch, "batch": self._last_batch_seen, "step": step})
        write_atomically(self._training_metadata_path, lambda tmp: Path(tmp).write_text(metadata))
        for stale in (self._prev_weights_path, self._prev_training_metadata_path):
            Path(stale).unlink(missing_ok=True)  # an earlier version's second backup
        if checkpoint is not None and self.keep is not None:
            needed = self.keep(epoch, self._logs)
            for number, path in checkpoint_files(self.checkpoints).items():
                if number not in needed and number <= epoch:
                    path.unlink(missing_ok=True)

    def _kept(self, epoch: int) -> str:
        if epoch <= 1 or not os.path.exists(self._weights_path):
            return "and nothing was saved before it (first epoch)"
        where = f"{self._weights_path}"
        if self.checkpoints is not None:
            where = f"{self.checkpoints / CHECKPOINT_NAME.format(epoch=epoch - 1)} and {where}"
        return f"the last good state is epoch {epoch - 1}'s: {where}"


def check_training_space(model: keras.Model, directory: str | os.PathLike) -> None:
    """Before `fit`: room on the disk of ``directory`` for an epoch's checkpoint and backup."""
    sizes = StateSizes(model)
    require_space(directory, sizes.state + sizes.weights, "an epoch's checkpoint and backup")


def check_export(model: keras.Model, directory: str | os.PathLike) -> None:
    """Before an export: finite weights, and room on the disk of ``directory`` for an export
    of about the size of the weights (the export's variables)."""
    check_finite(model, "before the export", "the backup and checkpoints are kept")
    sizes = StateSizes(model)
    require_space(directory, 2 * sizes.weights + sizes.state, "the export with model.keras")


def save_model_file(model: keras.Model, path: str | os.PathLike) -> Path:
    """``model.save(path)`` through a temporary file and a rename: the exported weights in
    Keras's own format (with the optimizer's state), for ``keras.saving.load_model``."""
    return write_atomically(path, model.save)
