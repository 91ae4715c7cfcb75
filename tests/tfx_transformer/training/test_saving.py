"""Tests for the run's state on disk (tfx_transformer.training.saving):
checkpoints written whole and in order, broken ones repaired, only what averaging needs kept,
a full disk and NaN weights refused with the last good state intact."""

import collections
import json
import re
import warnings

import h5py
import keras
import numpy as np
import pytest
import tensorflow as tf

from tfx_transformer.cli import run_cli
from tfx_transformer.training import run as trainer_task
from tfx_transformer.training import saving
from tfx_transformer.training.checkpoints import Averaging, choose_weights, epoch_checkpoints
from tfx_transformer.training.fit_callbacks import standard_callbacks
from tfx_transformer.training.run import RunOptions
from tfx_transformer.training.saving import check_workdir
from tfx_transformer.training.trainer import TaskData, Trainer
from tfx_transformer.training.workdir import (
    Workdir,
    read_metrics,
    read_state,
    write_state,
)

X = np.arange(48, dtype="float32").reshape(12, 4) / 48.0
Y = X.sum(axis=1, keepdims=True)


def _model(learning_rate=0.1):
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.Adam(learning_rate), loss="mse")
    return model


def _fit(workdir, epochs, model=None, **kwargs):
    model = model or _model()
    model.fit(X, Y, batch_size=4, epochs=epochs, verbose=0, shuffle=False,
              callbacks=standard_callbacks(workdir, keep_backup=True, tensorboard=False,
                                           **kwargs))
    return model


def _files(directory):
    return sorted(p.name for p in directory.iterdir())


def _loads_finite(path):
    """The weights file loads into a fresh model and holds finite weights."""
    model = _model()
    with warnings.catch_warnings():  # a checkpoint has no optimizer state to load
        warnings.filterwarnings("ignore", message="Skipping variable loading")
        model.load_weights(str(path))
    return all(np.isfinite(w).all() for w in model.get_weights())


class Task(trainer_task.Task):
    """A regression task for `Trainer`; ``exported`` counts the exports."""

    data, default_epochs, state_files = "embedded", 2, ()

    def __init__(self, learning_rate=0.1, steps=3):
        self.learning_rate, self.steps, self.exported = learning_rate, steps, 0

    def load_data(self, context):
        ds = tf.data.Dataset.from_tensor_slices((X, Y)).batch(len(X) // self.steps)
        return TaskData(ds, None, self.steps)

    def build_model(self, context, data):
        return _model(self.learning_rate)

    def callbacks(self, context, model):
        return []

    def export(self, model, path):
        self.exported += 1
        path.mkdir()
        (path / "weights.npy").write_bytes(np.concatenate(
            [w.ravel() for w in model.get_weights()]).tobytes())

    def evaluate(self, model):
        return {"valid": {"n": 1}}


# --- 3. half-written checkpoints ---

def test_the_checkpoint_is_complete_before_the_backup_records_its_epoch(tmp_path, monkeypatch):
    _fit(tmp_path, 1)
    real, seen = saving.copy_weights_only, []

    def killed_after_the_checkpoint(source, target):  # a kill between the two writes
        real(source, target)
        seen.append(json.loads((tmp_path / "backup" / "training_metadata.json").read_text()))
        raise KeyboardInterrupt

    monkeypatch.setattr(saving, "copy_weights_only", killed_after_the_checkpoint)
    with pytest.raises(KeyboardInterrupt):
        _fit(tmp_path, 2)
    assert seen == [{"epoch": 1, "step": 3}]  # the backup still says epoch 1 ...
    assert _loads_finite(tmp_path / "checkpoints" / "epoch-002.weights.h5")  # ... 2 is whole
    assert not list(tmp_path.rglob(".tmp-*"))  # the backup's temporary file went too


def test_a_write_cut_short_by_a_full_disk_keeps_the_earlier_files(tmp_path, monkeypatch):
    _fit(tmp_path, 1)
    backup = (tmp_path / "backup" / "latest.weights.h5").read_bytes()

    def full_disk(self, filepath, **kwargs):
        with open(filepath, "wb") as f:
            f.write(b"\x89HDF\r\n" + b"\0" * 100)  # a start, then no room
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(keras.Model, "save_weights", full_disk)
    with pytest.raises(saving.NoSpaceError, match="disk of .*backup is full"):
        _fit(tmp_path, 2)
    assert (tmp_path / "backup" / "latest.weights.h5").read_bytes() == backup
    assert _files(tmp_path / "checkpoints") == ["epoch-001.weights.h5"]
    assert not list(tmp_path.rglob(".tmp-*"))


def test_a_broken_checkpoint_is_rewritten_from_the_backup_or_set_aside(tmp_path):
    _fit(tmp_path, 3, averaging=Averaging(3))
    checkpoints = tmp_path / "checkpoints"
    expected = (tmp_path / "checkpoints" / "epoch-003.weights.h5").read_bytes()
    # What a kill between the backup and the checkpoint left before: epoch 3 cut short, and
    # epoch 1 broken (no backup holds it any more).
    for name in ("epoch-003.weights.h5", "epoch-001.weights.h5"):
        path = checkpoints / name
        path.write_bytes(path.read_bytes()[:200])
    (checkpoints / ".tmp-x-epoch-004.weights.h5").write_bytes(b"left by a kill")
    write_state(tmp_path, phase="training")
    lines = []
    check_workdir(Workdir(tmp_path), lines.append)
    assert lines == [
        f"warning: {checkpoints / 'epoch-001.weights.h5'} is cut short or corrupt: moved to "
        "epoch-001.weights.h5.broken; checkpoint averaging leaves epoch 1 out",
        f"warning: {checkpoints / 'epoch-003.weights.h5'} was cut short or corrupt: rewritten "
        f"from {tmp_path / 'backup' / 'latest.weights.h5'} (epoch 3)"]
    assert _files(checkpoints) == ["epoch-001.weights.h5.broken", "epoch-002.weights.h5",
                                   "epoch-003.weights.h5"]
    assert _loads_finite(checkpoints / "epoch-003.weights.h5")
    with h5py.File(checkpoints / "epoch-003.weights.h5") as new, \
            h5py.File(tmp_path / "backup" / "latest.weights.h5") as backup:
        assert "optimizer" not in new and "optimizer" in backup
        assert len(expected) == (checkpoints / "epoch-003.weights.h5").stat().st_size
    model = _model()
    assert choose_weights(model, tmp_path, average_last=3) == (
        "the mean of the weights of epochs 2-3")  # every rerun can average again


def test_the_backups_epoch_without_its_checkpoint_gets_it_back(tmp_path):
    _fit(tmp_path, 2)
    (tmp_path / "checkpoints" / "epoch-002.weights.h5").unlink()  # killed before its write
    write_state(tmp_path, phase="training")
    lines = []
    check_workdir(Workdir(tmp_path), lines.append)
    assert len(lines) == 1 and "epoch-002.weights.h5 was missing: rewritten from" in lines[0]
    assert _loads_finite(tmp_path / "checkpoints" / "epoch-002.weights.h5")


# --- 6. what a run keeps ---

class Score(keras.callbacks.Callback):
    """Logs ``val_score`` per epoch from ``values``."""

    def __init__(self, values):
        super().__init__()
        self.values = values

    def on_epoch_end(self, epoch, logs=None):
        logs["val_score"] = self.values[epoch]


@pytest.mark.parametrize("averaging, scores, kept", [
    (Averaging(), None, [6]),  # the default (DETR): the last epoch
    (Averaging(2), None, [5, 6]),  # --average-last 2
    (Averaging(None), None, [5, 6]),  # NMT's default: a quarter of 6 epochs, rounded: 2
    (Averaging(2, "val_score"), [1, 5, 2, 3, 1, 0], [1, 2, 5, 6]),  # --patience: best is 2
])
def test_only_the_checkpoints_averaging_needs_are_kept(tmp_path, averaging, scores, kept):
    model = _model()
    extra = [Score(scores)] if scores else []
    model.fit(X, Y, batch_size=4, epochs=6, verbose=0, shuffle=False, callbacks=extra + (
        standard_callbacks(tmp_path, keep_backup=True, tensorboard=False,
                           averaging=averaging)))
    assert list(epoch_checkpoints(tmp_path)) == kept
    backup = tmp_path / "backup"
    assert _files(backup) == ["latest.weights.h5", "training_metadata.json"]  # one state
    sizes = {p.stat().st_size for p in (tmp_path / "checkpoints").iterdir()}
    full = (backup / "latest.weights.h5").stat().st_size
    assert max(sizes) < 0.75 * full  # no optimizer state: Adam's slots double the weights
    assert averaging.choose(model, tmp_path).startswith("the ")  # what it needs is there


class FreeSpace:
    """A stand-in for `shutil.disk_usage`: ``free`` bytes from call ``after`` on."""

    def __init__(self, after, free=1000):
        self.calls, self.after, self.free = 0, after, free

    def __call__(self, path):
        self.calls += 1
        free = self.free if self.calls > self.after else 10**12
        return collections.namedtuple("usage", "total used free")(10**12, 0, free)


def _cli(trainer, task, capsys):
    code = run_cli(lambda: trainer.fit(task) and 0)
    return code, capsys.readouterr().err


def test_a_full_disk_at_an_epoch_end_is_one_error_line_and_keeps_epoch_1(tmp_path, monkeypatch,
                                                                        capsys):
    # Free-space checks: at the start, then at each epoch's end (2: epoch 2's).
    monkeypatch.setattr(saving.shutil, "disk_usage", FreeSpace(after=2))
    task = Task()
    code, err = _cli(Trainer(tmp_path, RunOptions(epochs=3)), task, capsys)
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"error: {tmp_path / 'backup'}: 0.0 MiB free on its disk, the "
                          "checkpoint and backup of epoch 2 needs about ")
    assert _files(tmp_path / "checkpoints") == ["epoch-001.weights.h5"]
    assert json.loads((tmp_path / "backup" / "training_metadata.json").read_text())["epoch"] == 1
    assert _loads_finite(tmp_path / "checkpoints" / "epoch-001.weights.h5")
    assert _loads_finite(tmp_path / "backup" / "latest.weights.h5")
    assert task.exported == 0 and read_state(tmp_path)["phase"] == "training"


def test_free_space_is_checked_at_start_and_before_the_export(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(saving.shutil, "disk_usage", FreeSpace(after=0))
    code, err = _cli(Trainer(tmp_path, RunOptions(epochs=1)), Task(), capsys)
    assert code == 2 and "an epoch's checkpoint and backup needs about" in err
    assert not (tmp_path / "backup").exists()

    # Start and one epoch end pass; the export's check does not.
    monkeypatch.setattr(saving.shutil, "disk_usage", FreeSpace(after=2))
    task = Task()
    code, err = _cli(Trainer(tmp_path, RunOptions(epochs=1)), task, capsys)
    assert code == 2 and "free on its disk, the export with model.keras needs about" in err
    assert task.exported == 0 and read_state(tmp_path)["phase"] == "trained"
    monkeypatch.setattr(saving.shutil, "disk_usage", FreeSpace(after=10**9))
    code, _ = _cli(Trainer(tmp_path, RunOptions(epochs=1)), task, capsys)  # space again
    assert code == 0 and task.exported == 1 and read_state(tmp_path)["phase"] == "finished"


# --- 7. NaN weights after a finite loss ---

@pytest.mark.parametrize("options", [dict(epochs=2), dict(max_steps=5)])
def test_an_update_that_makes_the_weights_nan_saves_and_exports_nothing(tmp_path, monkeypatch,
                                                                        capsys, options):
    # The last step of the run (6: end of epoch 2; or 5, max_steps): its loss is finite.
    last = options.get("max_steps", 6)
    monkeypatch.setenv("TFX_TRANSFORMER_FAULT", f"update:{last}")
    task = Task()
    code, err = _cli(Trainer(tmp_path, RunOptions(**options)), task, capsys)
    assert code == 2 and err.count("\n") == 1
    assert re.match(rf"error: the weights are NaN or infinite after epoch 2 \(step {last}\) "
                    r"\(sequential\w*/dense\w*/kernel, ", err)
    assert "the last good state is epoch 1's: " in err and "--clip-norm" in err
    assert task.exported == 0 and not (tmp_path / "export").exists()
    assert _files(tmp_path / "checkpoints") == ["epoch-001.weights.h5"]
    assert _loads_finite(tmp_path / "checkpoints" / "epoch-001.weights.h5")
    assert _loads_finite(tmp_path / "backup" / "latest.weights.h5")
    assert [e["epoch"] for e in read_metrics(tmp_path)["history"]] == [1]


def test_a_real_overflow_in_the_first_epoch_saves_nothing(tmp_path):
    # One step an epoch at a huge learning rate: the update overflows, its loss was finite.
    with pytest.raises(saving.NonFiniteWeightsError, match="after epoch 1 .*nothing was saved"):
        Trainer(tmp_path, RunOptions(epochs=2)).fit(Task(learning_rate=1e39, steps=1))
    assert not any((tmp_path / "checkpoints").iterdir()) and not (tmp_path / "backup").exists()


def test_nan_weights_from_a_backup_are_not_exported(tmp_path):
    model = _model()
    model.layers[0].kernel.assign(np.full((4, 3), np.nan, "float32"))
    with pytest.raises(saving.NonFiniteWeightsError, match="before the export"):
        saving.check_export(model, tmp_path)
