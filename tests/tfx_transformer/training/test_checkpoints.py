"""Tests for tfx_transformer.training.checkpoints: the weights a run exports."""

import keras
import numpy as np
import pytest

from tfx_transformer.training.checkpoints import (
    average_count,
    average_weights,
    best_epoch,
    choose_weights,
    epoch_checkpoints,
)
from tfx_transformer.training.workdir import Workdir, write_metrics


def _model():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2),
                              keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    return model


@pytest.fixture
def run(tmp_path):
    """A work directory with 4 epoch checkpoints of known weights and a history."""
    workdir, model = Workdir(tmp_path), _model()
    saved = {}
    rng = np.random.default_rng(0)
    for epoch in range(1, 5):
        values = [rng.normal(size=w.shape).astype("float32") for w in model.get_weights()]
        model.set_weights(values)
        model.save_weights(str(workdir.checkpoints / f"epoch-{epoch:03d}.weights.h5"))
        saved[epoch] = values
    write_metrics(workdir, {"history": [{"epoch": e, "val_bleu": b}
                                        for e, b in zip(range(1, 5), [3.0, 9.0, 7.0, 8.0])]})
    return workdir, model, saved


def _mean(saved, epochs):
    return [np.mean([saved[e][i] for e in epochs], axis=0) for i in range(len(saved[1]))]


def _close(model, expected):
    for got, want in zip(model.get_weights(), expected):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_epoch_checkpoints_lists_by_epoch(run):
    workdir, _, _ = run
    (workdir.checkpoints / "notes.txt").write_text("not a checkpoint")
    assert list(epoch_checkpoints(workdir)) == [1, 2, 3, 4]


def test_average_equals_arithmetic_mean(run):
    workdir, model, saved = run
    paths = [workdir.checkpoints / f"epoch-{e:03d}.weights.h5" for e in (2, 3, 4)]
    average_weights(model, paths)
    _close(model, _mean(saved, (2, 3, 4)))
    with pytest.raises(ValueError, match="at least one"):
        average_weights(model, [])


def test_choose_last_average_and_best(run):
    workdir, model, saved = run
    model.set_weights(saved[4])
    assert "last epoch (4)" in choose_weights(model, workdir)
    _close(model, saved[4])
    assert "epochs 3-4" in choose_weights(model, workdir, average_last=2)
    _close(model, _mean(saved, (3, 4)))
    line = choose_weights(model, workdir, monitor="val_bleu")
    assert "epoch 2" in line and "best val_bleu 9" in line
    _close(model, saved[2])
    choose_weights(model, workdir, average_last=5, monitor="val_bleu")  # only epochs 1-2 exist
    _close(model, _mean(saved, (1, 2)))


def test_default_average_is_a_quarter_of_the_epochs(run):
    # A quarter of the epochs up to the exported one, rounded half up, 1 to 10.
    assert [average_count(n) for n in (1, 2, 5, 6, 10, 29, 100)] == [1, 1, 1, 2, 3, 7, 10]
    workdir, model, saved = run
    write_metrics(workdir, {"history": [{"epoch": e} for e in range(1, 7)]})
    for epoch in (5, 6):  # epochs 5 and 6 reuse the weights of 1 and 2
        model.set_weights(saved[epoch - 4])
        model.save_weights(str(workdir.checkpoints / f"epoch-{epoch:03d}.weights.h5"))
    assert "epochs 5-6" in choose_weights(model, workdir, average_last=None)
    _close(model, _mean(saved, (1, 2)))
    with pytest.raises(ValueError, match="None or a positive integer"):
        choose_weights(model, workdir, average_last=0)


def test_a_checkpoint_of_another_model_is_named(run):
    workdir, _, _ = run
    other = keras.Sequential([keras.Input((5,)), keras.layers.Dense(1)])
    with pytest.raises(ValueError, match="epoch-003"):
        choose_weights(other, workdir, average_last=2)


def test_best_epoch_first_of_equals_and_mode():
    history = [{"epoch": 1, "m": 2.0}, {"epoch": 2, "m": 5.0}, {"epoch": 3, "m": 5.0},
               {"epoch": 4}, {"epoch": 5, "m": float("nan")}]
    assert best_epoch(history, "m") == 2
    assert best_epoch(history, "m", mode="min") == 1
    assert best_epoch(history, "other") is None
