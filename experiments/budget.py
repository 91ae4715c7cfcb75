"""Where a time-budgeted run's training time goes: inside the train steps, in validation, at
the epoch boundaries (each callback timed) and everywhere else.

    python experiments/budget.py detr|nmt [--minutes 8] [--mixed-precision auto] [--workdir DIR]

Runs ``train_detr`` / ``train_nmt`` in process on the embedded data with the tiny preset and
``--time-budget MINUTES``, as ``train_*.py --data embedded --preset tiny`` does, and prints one
JSON line: the steps, the seconds of `fit`, of the first step (tracing and graph optimization),
of the other steps (median step), of validation, of each callback's epoch-boundary work, and
the share of `fit` spent inside train steps; then the held-out scores of the run. Each train
step's time is from `on_train_batch_begin` to `on_train_batch_end` (the input pipeline's
`get_next` is inside the step function, so a pipeline that cannot keep up shows as step time).
Not a test: it takes the budget and more.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import statistics
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402

CallbackList = keras.callbacks.CallbackList

from tfx_transformer.training.run import RunOptions  # noqa: E402

BOUNDARIES = ("on_train_begin", "on_epoch_begin", "on_epoch_end", "on_test_begin",
              "on_test_end", "on_train_end")
_spent: dict[str, float] = collections.defaultdict(float)


def _time_each_callback(name: str) -> None:
    """Wraps ``CallbackList.name`` so that each callback's share is added to ``_spent``."""
    original = getattr(CallbackList, name)

    def timed(self, *args, **kwargs):
        callbacks = self.callbacks
        try:
            for callback in callbacks:  # Keras's own call (logs to Python), one callback each
                self.callbacks = [callback]
                start = time.perf_counter()
                original(self, *args, **kwargs)
                _spent[f"{type(callback).__name__}.{name}"] += time.perf_counter() - start
        finally:
            self.callbacks = callbacks

    setattr(CallbackList, name, timed)


class StepClock(keras.callbacks.Callback):
    """Times every train step, validation, and the epochs' start before their first step."""

    def __init__(self):
        super().__init__()
        self.steps: list[float] = []
        self.validation = self.epoch_starts = 0.0

    def on_train_begin(self, logs=None):
        self.begin = time.perf_counter()

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch_begin = time.perf_counter()

    def on_train_batch_begin(self, batch, logs=None):
        self.step_begin = time.perf_counter()
        if batch == 0:
            self.epoch_starts += self.step_begin - self.epoch_begin

    def on_train_batch_end(self, batch, logs=None):
        self.steps.append(time.perf_counter() - self.step_begin)

    def on_test_begin(self, logs=None):
        self.test_begin = time.perf_counter()

    def on_test_end(self, logs=None):
        self.validation += time.perf_counter() - self.test_begin

    def on_train_end(self, logs=None):
        self.fit = time.perf_counter() - self.begin


def application(app: str):
    """``(preset, train)`` of ``app``: "detr" (`vision`) or "nmt" (`nlp`)."""
    if app == "detr":
        from vision.config import preset
        from vision.training.train import train_detr as train
    else:
        from nlp.config import preset
        from nlp.training.train import train_nmt as train
    return preset, train


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("app", choices=("detr", "nmt"))
    parser.add_argument("--minutes", type=float, default=8.0)
    parser.add_argument("--mixed-precision", default="auto")
    parser.add_argument("--workdir", default=None, help="default: a temporary folder")
    args = parser.parse_args(argv)
    for name in BOUNDARIES:
        _time_each_callback(name)
    workdir = args.workdir or tempfile.mkdtemp(prefix="budget-")
    shutil.rmtree(workdir, ignore_errors=True)
    run = RunOptions(time_budget=args.minutes, mixed_precision=args.mixed_precision)
    clock = StepClock()
    preset, train = application(args.app)
    scores = train("embedded", workdir, preset("tiny"), run, callbacks=[clock],
                   log=lambda *line: None)
    steps = clock.steps
    inside = sum(steps[1:])
    boundaries = {k: round(v, 2) for k, v in sorted(_spent.items(), key=lambda kv: -kv[1])
                  if v >= 0.05 and not k.startswith("StepClock")}
    print(json.dumps({
        "app": args.app, "minutes": args.minutes, "mixed_precision": args.mixed_precision,
        "steps": len(steps), "fit_s": round(clock.fit, 1),
        "first_step_s": round(steps[0], 1), "other_steps_s": round(inside, 1),
        "median_step_ms": round(1000 * statistics.median(steps[1:]), 1),
        "validation_s": round(clock.validation, 1),
        "epoch_starts_s": round(clock.epoch_starts, 1),
        "callbacks_s": boundaries,
        "inside_steps_share": round((inside + steps[0]) / clock.fit, 3),
        "scores": scores,
    }))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
