"""Tests for nlp.training.callbacks: early stopping on validation BLEU."""

import keras
import numpy as np

from nlp.training.callbacks import Patience
from tfx_transformer.training.callbacks import MetricsLogger
from tfx_transformer.training.workdir import read_metrics

X = np.linspace(0, 1, 16, dtype="float32").reshape(4, 4)
Y = X.sum(axis=1, keepdims=True)


class Scripted(keras.callbacks.Callback):
    """Logs a given val_bleu at each epoch end (as `ValidationScores` would)."""

    def __init__(self, values):
        super().__init__()
        self.values = values

    def on_epoch_end(self, epoch, logs=None):
        logs["val_bleu"] = self.values[epoch]


def _fit(tmp_path, values, patience, epochs=10):
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    stop = Patience(tmp_path, patience)
    history = model.fit(X, Y, epochs=epochs, verbose=0, callbacks=[
        Scripted(values), stop, MetricsLogger(tmp_path)])
    return len(history.epoch), stop


def test_stops_when_bleu_stops_improving(tmp_path):
    epochs, stop = _fit(tmp_path, [1.0, 4.0, 3.0, 4.0, 2.0, 9.0, 9.0, 9.0, 9.0, 9.0], 3)
    assert epochs == 5 and stop.stopped and "best at epoch 2" in stop.reason
    assert [e["val_bleu"] for e in read_metrics(tmp_path)["history"]] == [1, 4, 3, 4, 2]


def test_keeps_going_while_it_improves(tmp_path):
    epochs, stop = _fit(tmp_path, [1.0, 2.0, 2.5, 2.4, 3.0, 3.5], 2, epochs=6)
    assert epochs == 6 and not stop.stopped


def test_earlier_epochs_of_the_run_count(tmp_path):
    """A resumed run: epochs 1-3 are in metrics.json; the count goes on from them."""
    _fit(tmp_path, [5.0, 1.0, 1.0], 5, epochs=3)

    class Resumed(Scripted):
        def on_train_begin(self, logs=None):
            pass

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    stop = Patience(tmp_path, 3)
    # initial_epoch=3: epochs 4.. of the same run; best is still epoch 1 (5.0)
    history = model.fit(X, Y, epochs=10, initial_epoch=3, verbose=0, callbacks=[
        Resumed([None, None, None, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0]), stop,
        MetricsLogger(tmp_path)])
    assert history.epoch == [3] and stop.stopped  # epoch 4: 3 epochs after the best
