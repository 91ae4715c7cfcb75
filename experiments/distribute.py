"""The cost of `tf.distribute.MirroredStrategy`: a train step on 2 logical CPU devices against
the same global batch on one device.

    python experiments/distribute.py [--cases nmt-tiny,detr-tiny] [--repeats 5] [--steps 4]

The machine's CPU is split into two logical devices (both share its cores, so the replicas
compute no faster than one device: the ratio shows what mirroring adds — the split of each
batch, the all-reduce of the gradients and of the loss normalizers, the per-replica ops). A
ratio near 1 means the strategy is cheap; on several GPUs or hosts the same code then scales
with the devices. Each case builds the model under each strategy from the same seed and times
``fit`` over ``--steps`` + 1 steps of one fixed batch (traced, no XLA), alternating the two
strategies; a step's time is the time between two batch ends (so not the start of ``fit``,
which builds the distributed iterator), and the figure is the median over ``--repeats``
fits after a warm-up fit of each fit's median step.

NMT: the ``tiny`` preset, vocabulary 8000, global batch 64 pairs of 40 tokens. DETR: the
``tiny`` preset, global batch 16 of 128 px images with 4 objects each.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import tensorflow as tf  # noqa: E402

_CPU = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(_CPU, [tf.config.LogicalDeviceConfiguration()] * 2)

import keras  # noqa: E402
import numpy as np  # noqa: E402

VOCAB, LENGTH = 8000, 40


def _nmt():
    from nlp.config import preset
    from nlp.modeling.model import build_model
    from nlp.training.train import compile_model

    config = preset("tiny", vocab_size=VOCAB)
    rng = np.random.default_rng(0)
    x = {"source": rng.integers(4, VOCAB, (64, LENGTH)).astype("int32"),
         "target_in": rng.integers(4, VOCAB, (64, LENGTH)).astype("int32")}
    y = rng.integers(4, VOCAB, (64, LENGTH)).astype("int32")

    def build():
        model = build_model(config)
        compile_model(model, config, jit_compile=False, total_steps=100_000)
        return model

    return build, (x, y)


def _detr():
    from vision.config import preset
    from vision.modeling.detr import build_criterion, build_model
    from vision.modeling.optimizer import build_optimizer

    batch, side, objects = 16, 128, 4
    config = preset("tiny", batch_size=batch, image_size=side, max_image_size=side)
    rng = np.random.default_rng(0)
    q = config.num_queries
    boxes = np.zeros((batch, q, 4), "float32")
    boxes[:, :objects, :2] = rng.uniform(0.2, 0.8, (batch, objects, 2))
    boxes[:, :objects, 2:] = rng.uniform(0.05, 0.3, (batch, objects, 2))
    valid = np.zeros((batch, q), "float32")
    valid[:, :objects] = 1.0
    x = {"images": rng.normal(size=(batch, side, side, 3)).astype("float32"),
         "mask": np.ones((batch, side, side), "float32")}
    y = {"labels": rng.integers(0, 3, (batch, q)).astype("int32"), "boxes": boxes,
         "valid": valid}

    def build():
        model = build_model(config, 3)
        model.compile(optimizer=build_optimizer(config, model),
                      criterion=build_criterion(config, 3), jit_compile=False)
        return model

    return build, (x, y)


CASES = {"nmt-tiny": _nmt, "detr-tiny": _detr}


class _StepTimes(keras.callbacks.Callback):
    """The time between consecutive batch ends: steps only, not the start of `fit` (which
    builds the distributed iterator)."""

    def __init__(self):
        super().__init__()
        self.times, self._last = [], None

    def on_train_begin(self, logs=None):
        self._last = None

    def on_train_batch_end(self, batch, logs=None):
        now = time.perf_counter()
        if self._last is not None:
            self.times.append(now - self._last)
        self._last = now


def measure(case: str, strategies: dict, repeats: int, steps: int) -> dict:
    build, batch = CASES[case]()
    data = tf.data.Dataset.from_tensors(batch).repeat()
    models = {}
    for name, strategy in strategies.items():
        with strategy.scope():
            keras.utils.set_random_seed(0)
            models[name] = build()
    per_round = {name: [] for name in models}
    for round_ in range(repeats + 1):  # round 0 traces and warms up
        for name, model in models.items():
            timer = _StepTimes()
            model.fit(data, steps_per_epoch=steps + 1, epochs=1, verbose=0, shuffle=False,
                      callbacks=[timer])
            if round_:
                per_round[name].append(statistics.median(timer.times))
    return {name: statistics.median(t) for name, t in per_round.items()} | {
        "ratio": statistics.median(m / s for m, s in
                                   zip(per_round["mirrored"], per_round["single"]))}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args(argv)
    cases = [c for c in args.cases.split(",") if c]
    unknown = sorted(set(cases) - set(CASES))
    if unknown or args.repeats < 1 or args.steps < 1:
        parser.error(f"unknown cases {unknown} (choose from {sorted(CASES)}), or --repeats / "
                     "--steps < 1")
    devices = [d.name for d in tf.config.list_logical_devices("CPU")]
    strategies = {"single": tf.distribute.get_strategy(),
                  "mirrored": tf.distribute.MirroredStrategy(devices)}
    print(f"TensorFlow {tf.__version__}, Keras {keras.__version__}, {os.cpu_count()} cores, "
          f"mirrored over {devices}")
    print(f"{'case':<12}{'1 device ms':>13}{'2 replicas ms':>15}{'ratio':>8}")
    for case in cases:
        r = measure(case, strategies, args.repeats, args.steps)
        print(f"{case:<12}{r['single'] * 1e3:>13.1f}{r['mirrored'] * 1e3:>15.1f}"
              f"{r['ratio']:>8.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
