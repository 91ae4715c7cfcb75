"""Forward+backward time of our MultiHeadAttention against keras.layers.MultiHeadAttention.

Same shapes, same weights, same process; runs alternate between the two and the figure is
the median over repeats of ``ratio = ours / keras`` (lower is better).

    python benchmarks/attention.py [--batch 16] [--length 64] [--dim 256] [--heads 8]

TensorFlow runs as it decides (its oneDNN kernels only on CPUs with AVX-512), as in a user's
own program; ``TF_ENABLE_ONEDNN_OPTS=1`` gives the setting of the training commands.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfx_transformer as tt  # noqa: E402


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


def time_once(step, q, v, iters: int) -> float:
    start = time.perf_counter()
    for _ in range(iters):
        loss, _ = step(q, v)
    loss.numpy()
    return (time.perf_counter() - start) / iters


def bench(case: str, jit: bool, args) -> tuple[float, float, float]:
    rng = np.random.default_rng(0)
    q = tf.constant(rng.normal(size=(args.batch, args.length, args.dim)), tf.float32)
    v = q if case == "self" else tf.constant(
        rng.normal(size=(args.batch, args.length * 2, args.dim)), tf.float32
    )
    head = args.dim // args.heads
    theirs = keras.layers.MultiHeadAttention(args.heads, head, dropout=args.dropout)
    ours = tt.MultiHeadAttention(args.heads, head, dropout=args.dropout)
    theirs(q, v)
    ours(q, v)
    ours.set_weights(theirs.get_weights())
    causal = case == "self"
    steps = {"ours": make_step(ours, jit, causal), "keras": make_step(theirs, jit, causal)}
    for step in steps.values():  # compile + warm up
        time_once(step, q, v, 3)
    times = {"ours": [], "keras": []}
    for _ in range(args.repeats):
        for name, step in steps.items():
            times[name].append(time_once(step, q, v, args.iters))
    ratios = [o / k for o, k in zip(times["ours"], times["keras"])]
    return statistics.median(times["ours"]), statistics.median(times["keras"]), statistics.median(
        ratios
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--dropout", type=float, default=0.0)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--iters", type=int, default=10)
    args = parser.parse_args(argv)
    print(f"keras {keras.__version__}, tensorflow {tf.__version__}, "
          f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"TF_ENABLE_ONEDNN_OPTS={os.environ.get('TF_ENABLE_ONEDNN_OPTS')}")
    print(f"B {args.batch}, T {args.length}, d {args.dim}, {args.heads} heads, forward+backward; "
          "self = causal self-attention, cross = T queries over 2T keys")
    print(f"{'case':<8}{'xla':<6}{'ours ms':>10}{'keras ms':>10}{'ratio':>8}")
    for case in ("self", "cross"):
        for jit in (False, True):
            ours, theirs, ratio = bench(case, jit, args)
            print(f"{case:<8}{str(jit):<6}{ours * 1e3:>10.2f}{theirs * 1e3:>10.2f}{ratio:>8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
