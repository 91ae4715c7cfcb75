"""The toy task the trainer's tests run (`Trainer(workdir, run).fit(task)`): a regression of
12 rows in 3 steps an epoch, with every hook of a `Task`; ``events`` records what the trainer
calls."""

import keras
import numpy as np
import tensorflow as tf

from tfx_transformer.training.trainer import Task, TaskData

X = np.arange(48, dtype="float32").reshape(12, 4) / 48.0
Y = X.sum(axis=1, keepdims=True)


def toy_data():
    return tf.data.Dataset.from_tensor_slices((X, Y)).batch(4)  # 3 steps per epoch


def toy_model():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    return model


class Events(keras.callbacks.Callback):
    def __init__(self, log, name):
        super().__init__()
        self.log, self.name = log, name

    def on_train_begin(self, logs=None):
        self.log.append(f"{self.name}: begin")

    def on_train_end(self, logs=None):
        self.log.append(f"{self.name}: end")


class ToyTask(Task):
    """A regression task with every hook; ``events`` records what the trainer calls."""

    state_files = ("tokenizer.model",)

    def __init__(self, events, data="embedded", default_epochs=2, crash_in=None,
                 steps_per_epoch=3, extra=(), final=False):
        self.events, self.data, self.default_epochs = events, data, default_epochs
        self.crash_in, self.steps, self.extra = crash_in, steps_per_epoch, list(extra)
        if final:
            self.final_weights = self._final_weights

    def load_data(self, context):
        self.events.append("load_data")
        return TaskData(toy_data(), toy_data(), self.steps)

    def build_model(self, context, data):
        self.events.append(f"build_model in {type(tf.distribute.get_strategy()).__name__}")
        self.events.append(("fresh", context.fresh))
        return toy_model()

    def callbacks(self, context, model):
        task = self

        class Steps(keras.callbacks.Callback):
            def on_train_batch_end(self, batch, logs=None):
                task.events.append("step")
                if task.crash_in == "training" and int(self.model.optimizer.iterations) == 4:
                    raise Crash

        return [Steps(), *self.extra]

    def _final_weights(self, context, model):
        self.events.append("final_weights")
        return "the last epoch"

    def export(self, model, path):
        self.events.append("export")
        if self.crash_in == "export":
            raise Crash
        path.mkdir(exist_ok=True)
        (path / "steps").write_text(str(int(model.optimizer.iterations)))

    def evaluate(self, model):
        self.events.append("evaluate")
        if self.crash_in == "evaluate":
            raise Crash
        if self.crash_in == "check":
            raise ValueError("image 7 has too many objects")
        return {"valid": {"steps": int(model.optimizer.iterations),
                          "loss": float(model.evaluate(X, Y, verbose=0))}, "data": {"n": 12}}


class Crash(Exception):
    """Stands for a kill: nothing of the trainer runs after it."""
