"""How close to this machine's limit our steps run: the matmul peak measured through TensorFlow
(float32, and bfloat16 where the CPU has AMX or AVX512-BF16), and the model FLOPs utilization
(MFU = model FLOPs / step time / peak) of the NMT base train step, the DETR r50 train step and
the NMT base decoding step.

    python experiments/peak.py [--repeats 5] [--sizes 1024,2048,4096]

* Peak: ``tf.linalg.matmul`` of two N x N matrices in a ``tf.function`` (TensorFlow's default
  thread pools), ``2 N^3`` FLOPs per product; the best N's median over ``--repeats``. bfloat16
  is measured only when ``/proc/cpuinfo`` lists ``amx_bf16`` or ``avx512_bf16``.
* Steps: ``experiments/precision.py``'s cases (``nmt-base``: ``Seq2SeqTransformer`` base,
  vocabulary 8000, batch 16 x 40 source and target tokens, label-smoothed loss, Adam;
  ``detr-r50``: the r50 preset, batch 2 of 256 px, 4 objects, set loss, AdamW), float32,
  ``train_on_batch``, no XLA; and one cached beam-search decoding step of the base model
  (batch 32 x beam 4 rows, source 24 tokens, cache 48 wide; ``nlp.search.steps.cached_decoder_step``
  in a ``tf.function``).
* FLOPs: the NMT train and decoding steps counted analytically (``2 m n k`` per matrix
  product, the attention products included, a train step = 3 x the forward pass: the backward
  pass computes two products per forward one); DETR with TensorFlow's profiler
  (``tf.compat.v1.profiler``'s ``float_operation`` on the forward graph: convolutions and
  matrix products; ``Einsum``, which it does not count, adds the attention products, under 2 %
  here) times 3 (an upper bound: the frozen stem and first stage need no weight gradients).
  Counting the NMT forward pass with the profiler too gives a cross-check (printed).

Prints a table (machine named) and JSON last. Not a test: about two minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from precision import CASES, LENGTH, VOCAB  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "benchmarks"))
from harness import machine, machine_line  # noqa: E402


def cpu_flags() -> set:
    try:
        with open("/proc/cpuinfo") as f:
            return set(next(line for line in f if line.startswith("flags")).split())
    except (OSError, StopIteration):
        return set()


def timed(fn, repeats: int, iters: int = 1) -> float:
    fn()  # trace and warm up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        times.append((time.perf_counter() - start) / iters)
    return statistics.median(times)


def matmul_peaks(dtypes, sizes, repeats: int) -> dict:
    """The best size's median FLOP/s per dtype; the dtypes alternate within each repeat."""
    best = {}
    for n in sizes:
        a = tf.random.normal((n, n), dtype="float32")
        products = {}
        for dtype in dtypes:
            x, y = tf.cast(a, dtype), tf.cast(tf.transpose(a), dtype)
            products[dtype] = tf.function(
                lambda x=x, y=y: tf.reduce_sum(tf.cast(tf.linalg.matmul(x, y)[:1, :1],
                                                       "float32")))
            products[dtype]().numpy()  # trace and warm up
        iters = max(1, 2048 // n) ** 2
        times = {dtype: [] for dtype in dtypes}
        for _ in range(repeats):
            for dtype, product in products.items():
                times[dtype].append(timed(lambda p=product: p().numpy(), 1, iters))
        for dtype in dtypes:
            seconds = statistics.median(times[dtype])
            if 2.0 * n ** 3 / seconds > best.get(dtype, {}).get("flops", 0):
                best[dtype] = {"n": n, "flops": 2.0 * n ** 3 / seconds, "seconds": seconds}
    return best


def nmt_flops(batch, source, target, layers, d, ffn, vocab, train=True) -> float:
    """Forward (x3 for ``train``) FLOPs of the encoder-decoder, ``2 m n k`` per product."""
    encoder = source * layers * (8 * d * d + 4 * d * ffn + 4 * source * d)
    decoder = target * layers * (12 * d * d + 4 * d * ffn + 4 * target * d + 4 * source * d)
    cross_kv = source * layers * 4 * d * d
    logits = target * 2 * d * vocab
    return batch * (encoder + decoder + cross_kv + logits) * (3 if train else 1)


def decode_step_flops(rows, source, width, layers, d, ffn, vocab) -> float:
    """One cached step: projections, attention over the cache and the source, FFN, logits."""
    per_row = layers * (12 * d * d + 4 * d * ffn + 4 * width * d + 4 * source * d)
    return rows * (per_row + 2 * d * vocab)


def profiler_flops(fn, *specs) -> float:
    graph = tf.function(fn).get_concrete_function(*specs).graph
    options = tf.compat.v1.profiler.ProfileOptionBuilder.float_operation()
    options["output"] = "none"
    return float(tf.compat.v1.profiler.profile(graph, options=options).total_float_ops)


def steps(repeats: int) -> list:
    rows = []
    build, x, y = CASES["nmt-base"]()
    model = build()
    seconds = timed(lambda: model.train_on_batch(x, y), repeats)
    batch = x["source"].shape[0]
    kw = dict(layers=model.num_encoder_layers, d=model.d_model, ffn=model.ffn_dim, vocab=VOCAB)
    counted = nmt_flops(batch, LENGTH, LENGTH, **kw)
    specs = {k: tf.TensorSpec(v.shape, tf.int32) for k, v in x.items()}
    check = 3 * profiler_flops(lambda inputs: model(inputs), specs)
    rows.append({"step": f"NMT base train step ({batch} x {LENGTH})", "seconds": seconds,
                 "flops": counted, "counted": "analytic", "profiler_cross_check": check})

    decode = decode_step(model, repeats)
    rows.append(decode)

    build, x, y = CASES["detr-r50"]()
    detr = build()
    seconds = timed(lambda: detr.train_on_batch(x, y), repeats)
    specs = {k: tf.TensorSpec(v.shape, tf.float32 if v.dtype == np.float32 else tf.bool)
             for k, v in x.items()}
    forward = profiler_flops(lambda inputs: detr(inputs), specs)
    rows.append({"step": f"DETR r50 train step ({x['images'].shape[0]} x "
                         f"{x['images'].shape[1]} px)", "seconds": seconds,
                 "flops": 3 * forward, "counted": "TF profiler x 3"})
    return rows


def decode_step(model, repeats: int, batch=32, beam=4, source=24, width=48) -> dict:
    from nlp.search.steps import cached_decoder_step, cross_attention_caches, empty_caches

    rng = np.random.default_rng(0)
    ids = tf.constant(rng.integers(4, VOCAB, (batch * beam, source)), tf.int32)
    memory, mask = model.encode(ids)
    cross, caches = cross_attention_caches(model, memory), empty_caches(model, batch * beam, width)
    tokens = tf.constant(rng.integers(4, VOCAB, (batch * beam, 1)), tf.int32)

    @tf.function
    def step(index):
        logits, updated = cached_decoder_step(model, tokens, index, caches, cross, mask)
        return tf.reduce_sum(logits[:1, :1]) + sum(tf.reduce_sum(c[:1, :1, :1, :1]) for c in
                                                   updated)

    seconds = timed(lambda: step(tf.constant(width // 2)).numpy(), repeats, iters=10)
    flops = decode_step_flops(batch * beam, source, width, model.num_decoder_layers,
                              model.d_model, model.ffn_dim, VOCAB)
    return {"step": f"NMT base decoding step ({batch} x beam {beam} rows, cache {width})",
            "seconds": seconds, "flops": flops, "counted": "analytic"}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--sizes", default="1024,2048,4096")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    flags = cpu_flags()
    bf16 = sorted(flags & {"amx_bf16", "avx512_bf16"})
    peaks = matmul_peaks(["float32", "bfloat16"] if bf16 else ["float32"], sizes, args.repeats)
    rows = steps(args.repeats)
    print(f"\nmachine: {machine_line(machine())}; bf16 flags: {', '.join(bf16) or 'none'}; "
          f"TensorFlow {tf.__version__}, {tf.config.threading.get_intra_op_parallelism_threads()}"
          " intra-op threads (0 = all cores)")
    print("| measure | GFLOP | time | GFLOP/s | of the float32 peak |\n|---|---:|---:|---:|---:|")
    for dtype, p in peaks.items():
        print(f"| matmul peak, {dtype} ({p['n']}²) | {2 * p['n'] ** 3 / 1e9:.1f} | "
              f"{p['seconds'] * 1e3:.1f} ms | {p['flops'] / 1e9:.1f} | "
              f"{p['flops'] / peaks['float32']['flops']:.0%} |")
    for r in rows:
        r["gflops_per_s"] = r["flops"] / r["seconds"] / 1e9
        r["mfu_float32"] = r["flops"] / r["seconds"] / peaks["float32"]["flops"]
        print(f"| {r['step']} ({r['counted']}) | {r['flops'] / 1e9:.1f} | "
              f"{r['seconds'] * 1e3:.0f} ms | {r['gflops_per_s']:.1f} | "
              f"{r['mfu_float32']:.0%} |")
    check = rows[0]["profiler_cross_check"]
    print(f"NMT train FLOPs, profiler x 3 (no Einsum): {check / 1e9:.1f} G against "
          f"{rows[0]['flops'] / 1e9:.1f} G counted")
    print(json.dumps({"machine": machine(), "bf16_flags": bf16, "peaks": peaks, "steps": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
