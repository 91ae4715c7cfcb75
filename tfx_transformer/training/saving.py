"""The run's state on disk: never NaN, never half-written, never more than the disk holds.

`RunGuard` ends `fit` with an error at a NaN loss, before anything of that epoch is saved.
`Backup` writes at each epoch's end, once the weights are finite (`check_finite`) and the disk
has room (`require_space`), each file whole or not at all (`workdir.write_atomically`):

1. ``DIR/checkpoints/epoch-NNN.weights.h5``: the weights alone (what averaging reads);
2. ``DIR/backup/latest.weights.h5``: weights and optimizer state (what a rerun resumes);
3. ``DIR/backup/training_metadata.json``: the epoch done and the optimizer step reached.

So the backup never records an epoch whose checkpoint is missing or cut short. Then the epoch
checkpoints that ``keep`` does not name are deleted. `check_workdir` reads all of it before a
rerun loads any data.

Failing a run on purpose (the tests' SIGKILLs and NaNs) is `tfx_transformer.training.faults`.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import keras
import numpy as np

from tfx_transformer.training.callbacks import steps_taken
from tfx_transformer.training.workdir import (
    CHECKPOINT_NAME,
    NoSpaceError,
    Workdir,
    checkpoint_files,
    read_metrics,
    read_object,
    read_state,
    remove_leftovers,
    write_atomically,
)

__all__ = ["Backup", "NonFiniteLossError", "NonFiniteWeightsError", "RunGuard", "StateSizes",
           "check_export", "check_finite", "check_training_space", "check_workdir",
           "copy_weights_only", "opens", "require_space", "save_model_file"]

_MIB = 2**20


class NonFiniteLossError(ValueError):
    """The loss became NaN or infinite; ``step`` is the optimizer step, ``epoch`` 1-based."""

    def __init__(self, message: str, step: int, epoch: int):
        super().__init__(message)
        self.step, self.epoch = step, epoch


class NonFiniteWeightsError(ValueError):
    """The model's weights hold NaN or infinite values (an update that overflowed)."""


class RunGuard(keras.callbacks.Callback):
    """Ends `fit` with an error before the epoch's checkpoint and backup are written.

    A NaN or infinite loss raises `NonFiniteLossError` at the end of its step, so the backup
    keeps the last good epoch (Keras's ``TerminateOnNaN`` only stops, and the epoch's
    checkpoint would hold NaN weights); an epoch without a batch raises `ValueError` (no data
    would loop over empty epochs for ever). Put it before `Backup`.
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
            step = steps_taken(self.model)
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


def check_finite(model: keras.Model, when: str, kept: str) -> None:
    """Raises `NonFiniteWeightsError` naming ``when`` and what is ``kept`` when a weight of
    ``model`` is NaN or infinite."""
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
    5 % and 1 MiB for the files' own overhead) for ``what`` ("the export")."""
    needed = int(needed * 1.05) + _MIB
    free = shutil.disk_usage(directory).free
    if free < needed:
        raise NoSpaceError(
            f"{directory}: {free / _MIB:.1f} MiB free on its disk, {what} needs about "
            f"{needed / _MIB:.1f} MiB: nothing of it was written and the last good state is "
            "kept; free some space (or use a --workdir on another disk) and rerun the same "
            "command")


class Backup(keras.callbacks.BackupAndRestore):
    """Keras's `BackupAndRestore` (which restores the weights, the optimizer and the epoch at
    train begin) writing each epoch's checkpoint and backup as the module docstring says.

    ``delete_checkpoint`` deletes the backup when `fit` ends (Keras's default); ``keep(epoch,
    logs)`` names the epochs whose checkpoints to keep once epoch ``epoch`` is written.
    """

    def __init__(self, workdir: Workdir, delete_checkpoint: bool = True,
                 keep: Callable[[int, dict], set] | None = None):
        super().__init__(str(workdir.backup), delete_checkpoint=delete_checkpoint,
                         double_checkpoint=False)
        self.workdir, self.keep = workdir, keep

    def on_train_begin(self, logs=None):
        try:
            super().on_train_begin(logs)
        except Exception as error:  # h5py, JSON and shape errors alike
            if not self.workdir.backup_weights.exists():
                raise
            raise ValueError(
                f"cannot resume from {self.workdir.backup_weights} ({type(error).__name__}: "
                f"{str(error)[:200]}); delete {self.backup_dir} to train again from epoch 1, "
                "or rerun with --restart") from None

    def on_train_batch_end(self, batch, logs=None):
        pass  # saves at epoch ends only

    def on_epoch_end(self, epoch, logs=None):
        model, epoch, workdir = self.model, epoch + 1, self.workdir
        step = steps_taken(model)
        check_finite(model, f"after epoch {epoch} (step {step})", self._kept(epoch))
        workdir.backup.mkdir(parents=True, exist_ok=True)
        sizes = StateSizes(model)
        require_space(workdir.backup, sizes.state + sizes.weights,
                      f"the checkpoint and backup of epoch {epoch}")
        checkpoint = workdir.checkpoints / CHECKPOINT_NAME.format(epoch=epoch)

        def write_state(tmp: str) -> None:
            model.save_weights(tmp)
            copy_weights_only(tmp, checkpoint)

        write_atomically(workdir.backup_weights, write_state)
        metadata = json.dumps({"epoch": epoch, "step": step})
        write_atomically(workdir.backup_metadata, lambda tmp: Path(tmp).write_text(metadata))
        if self.keep is not None:
            needed = self.keep(epoch, dict(logs or {}))
            for number, path in checkpoint_files(workdir.checkpoints).items():
                if number not in needed and number <= epoch:
                    path.unlink(missing_ok=True)

    def _kept(self, epoch: int) -> str:
        if epoch <= 1 or not self.workdir.backup_weights.exists():
            return "and nothing was saved before it (first epoch)"
        previous = self.workdir.checkpoints / CHECKPOINT_NAME.format(epoch=epoch - 1)
        return (f"the last good state is epoch {epoch - 1}'s: {previous} and "
                f"{self.workdir.backup_weights}")


def check_training_space(model: keras.Model, directory: str | os.PathLike) -> None:
    """Before `fit`: room on the disk of ``directory`` for an epoch's checkpoint and backup."""
    sizes = StateSizes(model)
    require_space(directory, sizes.state + sizes.weights, "an epoch's checkpoint and backup")


def check_export(model: keras.Model, directory: str | os.PathLike) -> None:
    """Before an export: finite weights, and room on the disk of ``directory`` for an export
    of about the size of the weights and ``model.keras``."""
    check_finite(model, "before the export", "the backup and checkpoints are kept")
    sizes = StateSizes(model)
    require_space(directory, 2 * sizes.weights + sizes.state, "the export with model.keras")


def save_model_file(model: keras.Model, path: str | os.PathLike) -> Path:
    """``model.save(path)`` whole or not at all: the exported weights in Keras's own format
    (with the optimizer's state), for ``keras.saving.load_model``."""
    return write_atomically(path, model.save)


def opens(path: str | os.PathLike) -> bool:
    """Whether ``path`` is an HDF5 file that opens and whose objects are all listed."""
    import h5py  # Keras's own dependency

    if not os.path.exists(path):
        return False
    try:
        with h5py.File(path, "r") as f:
            f.visit(lambda name: None)  # a truncated file fails on open (HDF5 checks its end)
        return True
    except Exception:  # any failure to read it means "broken"
        return False


def copy_weights_only(source: str | os.PathLike, target: str | os.PathLike) -> Path:
    """Writes ``target``: the Keras weights file ``source`` without its ``optimizer/`` group,
    so ``model.load_weights(target)`` leaves the model's optimizer as it is."""
    import h5py

    def write(tmp: str) -> None:
        with h5py.File(source, "r") as src, h5py.File(tmp, "w") as dst:
            for key, value in src.attrs.items():
                dst.attrs[key] = value
            for name in src:
                if name != "optimizer":
                    src.copy(src[name], dst, name=name)

    return write_atomically(target, write)


def check_workdir(workdir: Workdir, log: Callable[..., None] = print) -> None:
    """Reads what a rerun reads, before any data is loaded, and clears what a kill left.

    A broken epoch checkpoint (or the backup's epoch without one) is rewritten from the backup
    when it is the backup's epoch, else renamed ``epoch-NNN.weights.h5.broken`` (averaging then
    leaves it out); both say so on ``log``. Raises `ValueError` naming any other broken file.
    """
    read_metrics(workdir)
    read_state(workdir)
    for directory in (workdir.root, workdir.checkpoints, workdir.backup):
        remove_leftovers(directory)
    weights = workdir.backup_weights
    if weights.exists() and not opens(weights):
        raise ValueError(
            f"{weights} is truncated or corrupt, so the run cannot resume from it; delete "
            f"{workdir.backup} to train again from epoch 1, or rerun with --restart")
    metadata = workdir.backup_metadata
    epoch = None
    if metadata.exists():
        epoch = read_object(metadata).get("epoch")
        if not (isinstance(epoch, int) and epoch >= 0):
            raise ValueError(f"{metadata}: 'epoch' must be an integer >= 0, not {epoch!r}; "
                             f"delete {workdir.backup} to train again from epoch 1, or rerun "
                             "with --restart")
    checkpoints = checkpoint_files(workdir.checkpoints)
    if epoch and opens(weights) and epoch not in checkpoints:
        checkpoints[epoch] = workdir.checkpoints / CHECKPOINT_NAME.format(epoch=epoch)
    for number, path in checkpoints.items():
        if opens(path):
            continue
        state = "cut short or corrupt" if path.exists() else "missing"
        if number == epoch and opens(weights):
            copy_weights_only(weights, path)
            log(f"warning: {path} was {state}: rewritten from {weights} (epoch {epoch})")
        else:
            path.replace(f"{path}.broken")
            log(f"warning: {path} is {state}: moved to {path.name}.broken; checkpoint "
                f"averaging leaves epoch {number} out")
