"""Time of the ``keras.ops`` assignment solver (XLA) against scipy (host callback), per call.

Each call solves one batch of matching problems, ``assign(cost, valid)`` with `cost` of shape
`(B, Q, M)`, inside a ``tf.function``, the way a train step calls it: scipy's
``linear_sum_assignment`` through the host callback with ``jit_compile=False``; the
``keras.ops`` solver with ``jit_compile=True``. ``--calls K`` puts K independent batches in
one function, as a DETR step matches every decoder layer (``K = 6``), and reports the time per
call. Shapes (`SHAPES`): ``Q100/M20`` and ``Q300/M50`` with every target slot valid; DETR's
default, 100 queries and targets padded to 100 slots with 1 to 30 valid; the tiny presets, 20
and 20 with 4 valid. Costs are DETR's matching cost (`HungarianMatcher.cost_matrix`) of random
predictions against random targets (``detr``) or uniform in [0, 1) (``uniform``). Runs
alternate between the two solvers over a pool of problems; the figure is the median over
repeats of ``ratio = ops / scipy`` (lower is better). Every solution is checked to reach
scipy's total cost.

    python benchmarks/matcher.py [--batch 2,4] [--calls 1,6] [--costs detr,uniform]
        [--only "Q100/M20,Q300/M50,DETR Q100/M100,tiny Q20/M20"]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from vision.matching.assignment import assign  # noqa: E402
from vision.matching.matcher import HungarianMatcher  # noqa: E402

SHAPES = {  # name: (queries Q, target slots M, fewest and most valid targets per image)
    "Q100/M20": (100, 20, 20, 20),
    "Q300/M50": (300, 50, 50, 50),
    "DETR Q100/M100": (100, 100, 1, 30),  # DETR's default: targets padded to num_queries
    "tiny Q20/M20": (20, 20, 4, 4),  # the tiny presets with 4 objects, as benchmarks/detr.py
}


def make_problems(shape: str, kind: str, batch: int, count: int, rng) -> list:
    """`count` problems `(cost (B, Q, M) float32, valid (B, M) bool)` of one shape."""
    num_queries, num_targets, low, high = SHAPES[shape]
    problems = []
    for _ in range(count):
        valid = np.zeros((batch, num_targets), bool)
        for b, n in enumerate(rng.integers(low, high + 1, batch)):
            valid[b, :n] = True
        if kind == "uniform":
            cost = rng.random((batch, num_queries, num_targets))
        else:
            logits = rng.normal(size=(batch, num_queries, 4))
            pred = np.concatenate([rng.uniform(0.2, 0.8, (batch, num_queries, 2)),
                                   rng.uniform(0.05, 0.4, (batch, num_queries, 2))], axis=-1)
            boxes = np.concatenate([rng.uniform(0.2, 0.8, (batch, num_targets, 2)),
                                    rng.uniform(0.05, 0.3, (batch, num_targets, 2))], axis=-1)
            labels = rng.integers(0, 3, (batch, num_targets))
            cost = keras.ops.convert_to_numpy(
                HungarianMatcher().cost_matrix(logits, pred, labels, boxes))
        problems.append((tf.constant(cost, tf.float32), tf.constant(valid)))
    return problems


def total_cost(cost: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """(B,) summed cost of each image's matched pairs, in float64."""
    cost = cost.astype(np.float64)
    picked = np.take_along_axis(cost, np.maximum(indices, 0)[:, :, None], axis=2)[:, :, 0]
    return np.where(indices >= 0, picked, 0.0).sum(axis=1)


def bench(shape: str, kind: str, batch: int, calls: int, args) -> tuple[float, float, float]:
    rng = np.random.default_rng(0)
    pool = [make_problems(shape, kind, batch, calls, rng) for _ in range(args.pool)]
    steps = {}
    for solver, jit in (("ops", True), ("scipy", False)):
        @tf.function(jit_compile=jit)
        def step(problems, solver=solver):
            return [assign(cost, valid, solver=solver) for cost, valid in problems]

        steps[solver] = step
    for problems in pool:  # compile, warm up, and check the costs
        results = {name: step(problems) for name, step in steps.items()}
        for (cost, _), ours, theirs in zip(problems, results["ops"], results["scipy"]):
            cost = cost.numpy()
            np.testing.assert_allclose(total_cost(cost, ours.numpy()),
                                       total_cost(cost, theirs.numpy()), rtol=0, atol=1e-4)
    times = {name: [] for name in steps}
    for _ in range(args.repeats):
        for name, step in steps.items():
            start = time.perf_counter()
            for _ in range(args.iters):
                for problems in pool:
                    out = step(problems)
            out[-1].numpy()
            times[name].append((time.perf_counter() - start) / (args.iters * args.pool * calls))
    ratios = [o / s for o, s in zip(times["ops"], times["scipy"])]
    return (statistics.median(times["ops"]), statistics.median(times["scipy"]),
            statistics.median(ratios))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", default="4", help="comma-separated images per call")
    parser.add_argument("--calls", default="1,6", help="comma-separated calls per function")
    parser.add_argument("--costs", default="detr,uniform", help="comma-separated: detr,uniform")
    parser.add_argument("--only", default=",".join(SHAPES),
                        help=f"comma-separated shapes of {list(SHAPES)}")
    parser.add_argument("--pool", type=int, default=8, help="problems cycled through")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--iters", type=int, default=5)
    args = parser.parse_args(argv)
    shapes = [s for s in args.only.split(",") if s]
    kinds = [k for k in args.costs.split(",") if k]
    calls = [int(c) for c in args.calls.split(",") if c]
    batches = [int(b) for b in args.batch.split(",") if b]
    if set(shapes) - set(SHAPES) or set(kinds) - {"detr", "uniform"} or min(calls + batches) < 1:
        parser.error(f"unknown shapes or costs in {shapes}, {kinds}, or --calls / --batch < 1")
    print(f"keras {keras.__version__}, tensorflow {tf.__version__}, "
          f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"load average {os.getloadavg()[0]:.2f}")
    print("time per call (one batch of B images); ops = keras.ops solver under XLA, "
          "scipy = host callback without XLA")
    print(f"{'shape':<16}{'cost':<9}{'B':>3}{'calls':>6}{'ops ms':>10}{'scipy ms':>10}"
          f"{'ratio':>8}")
    for shape in shapes:
        for kind in kinds:
            for batch in batches:
                for k in calls:
                    ours, theirs, ratio = bench(shape, kind, batch, k, args)
                    print(f"{shape:<16}{kind:<9}{batch:>3}{k:>6}{ours * 1e3:>10.3f}"
                          f"{theirs * 1e3:>10.3f}{ratio:>8.2f}", flush=True)
    print(f"load average at the end {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
