"""Layers against their Keras and scipy peers, in one process.

Attention rows: forward + backward time per step (``GradientTape`` over the sum of squares of
the output, gradients of every trainable weight, in a ``tf.function``) of our
``MultiHeadAttention`` against ``keras.layers.MultiHeadAttention`` with the same weights
(copied from Keras's layer), on the same inputs: ``self`` is causal self-attention over T
tokens, ``cross`` is T queries over 2T keys, each with XLA off and on. Standard: B 16, T 64,
d 256, 8 heads, no dropout, 3 warm-up steps, 7 rounds of 10 steps. TensorFlow runs as it
decides (its oneDNN kernels only on CPUs with AVX-512); ``TF_ENABLE_ONEDNN_OPTS=1`` gives the
setting of the training commands.

Matcher rows (`cases.layers_matcher`): time per call of the ``keras.ops`` assignment solver
under XLA against scipy's ``linear_sum_assignment`` through the host callback, at the shapes
``Q100/M20``, ``Q300/M50``, DETR's default (Q100, 100 padded slots, 1–30 valid) and the tiny
presets' (Q20/M20, 4 valid), DETR-like and uniform costs, B 2 and 4, 1 and 6 calls per
function; standard: a pool of 8 problems, 7 rounds of 5 passes.

Tiny: the four attention rows at B 2, T 8, d 32, 4 heads; every matcher shape and cost at B 1,
2 calls per function (each calls count is an XLA compile of its own), a pool of 1; two short
rounds. The ratio is ``ours / peer``, the median per round.
"""

from __future__ import annotations

import os
import pathlib
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import harness  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfx_transformer as tt  # noqa: E402
from cases import layers_matcher  # noqa: E402

DESCRIPTION = ("MultiHeadAttention forward+backward against keras.layers.MultiHeadAttention; "
               "the keras.ops assignment solver (XLA) against scipy's host callback")
SIZES = {
    "tiny": {
        "attention": {"batch": 2, "length": 8, "dim": 32, "heads": 4, "dropout": 0.0,
                      "warmup_steps": 1, "repeats": 2, "iters": 2},
        "matcher": {"shapes": list(layers_matcher.SHAPES), "costs": list(layers_matcher.COSTS),
                    "batches": [1], "calls": [2], "pool": 1, "repeats": 2, "iters": 1},
    },
    "standard": {
        "attention": {"batch": 16, "length": 64, "dim": 256, "heads": 8, "dropout": 0.0,
                      "warmup_steps": 3, "repeats": 7, "iters": 10},
        "matcher": {"shapes": list(layers_matcher.SHAPES), "costs": list(layers_matcher.COSTS),
                    "batches": [2, 4], "calls": [1, 6], "pool": 8, "repeats": 7, "iters": 5},
    },
}
KERAS = "keras.layers.MultiHeadAttention"


def make_step(layer, jit: bool, causal: bool):
    @tf.function(jit_compile=jit)
    def step(q, v):
        with tf.GradientTape() as tape:
            out = layer(q, v, use_causal_mask=causal, training=True)
            if isinstance(out, tt.AttentionOutput):  # ours; Keras's returns the tensor
                out = out.output
            loss = tf.reduce_sum(tf.square(out))
        grads = tape.gradient(loss, layer.trainable_variables)
        return loss, grads

    return step


def time_steps(step, q, v, iters: int) -> float:
    """Seconds per step of ``iters`` steps."""
    start = time.perf_counter()
    for _ in range(iters):
        loss, _ = step(q, v)
    loss.numpy()
    return (time.perf_counter() - start) / iters


def attention_row(case: str, jit: bool, size: dict) -> harness.Row:
    rng = np.random.default_rng(0)
    batch, length, dim = size["batch"], size["length"], size["dim"]
    q = tf.constant(rng.normal(size=(batch, length, dim)), tf.float32)
    v = q if case == "self" else tf.constant(rng.normal(size=(batch, length * 2, dim)),
                                             tf.float32)
    head = dim // size["heads"]
    theirs = keras.layers.MultiHeadAttention(size["heads"], head, dropout=size["dropout"])
    ours = tt.MultiHeadAttention(size["heads"], head, dropout=size["dropout"])
    theirs(q, v)
    ours(q, v)
    ours.set_weights(theirs.get_weights())
    causal = case == "self"
    steps = {"ours": make_step(ours, jit, causal), KERAS: make_step(theirs, jit, causal)}
    for step in steps.values():  # compile + warm up
        time_steps(step, q, v, size["warmup_steps"])
    times = harness.alternate(
        {name: (lambda step=step: time_steps(step, q, v, size["iters"]))
         for name, step in steps.items()}, size["repeats"], warmup=0)
    label = "self (causal)" if causal else "cross (T queries, 2T keys)"
    return harness.compare(
        f"attention {label}, XLA {'on' if jit else 'off'}", times, peer=KERAS,
        settings={"case": case, "xla": jit, **size})


def run(size: dict, workdir: pathlib.Path) -> list[harness.Row]:
    rows = [attention_row(case, jit, size["attention"])
            for case in ("self", "cross") for jit in (False, True)]
    return rows + layers_matcher.rows(size["matcher"])
