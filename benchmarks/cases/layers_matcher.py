"""The matcher rows of the ``layers`` case: the ``keras.ops`` assignment solver (XLA) against
scipy's ``linear_sum_assignment`` through the host callback, time per call.

Each call solves one batch of matching problems, ``assign(cost, valid)`` with ``cost`` of shape
``(B, Q, M)``, inside a ``tf.function``, the way a train step calls it: scipy through the host
callback with ``jit_compile=False``; the ``keras.ops`` solver with ``jit_compile=True``.
``calls`` K puts K independent batches in one function, as a DETR step matches every decoder
layer (K = 6), and the time is per call. Shapes (`SHAPES`): ``Q100/M20`` and ``Q300/M50`` with
every target slot valid; DETR's default, 100 queries and targets padded to 100 slots with 1 to
30 valid; the tiny presets, 20 and 20 with 4 valid. Costs are DETR's matching cost
(`HungarianMatcher.cost_matrix`) of random predictions against random targets (``detr``) or
uniform in [0, 1) (``uniform``). The two solvers alternate over a pool of problems; every
solution is checked to reach scipy's total cost first.
"""

from __future__ import annotations

import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import harness  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from vision.matching.assignment import assign  # noqa: E402
from vision.matching.matcher import HungarianMatcher  # noqa: E402

SHAPES = {  # name: (queries Q, target slots M, fewest and most valid targets per image)
    "Q100/M20": (100, 20, 20, 20),
    "Q300/M50": (300, 50, 50, 50),
    "DETR Q100/M100": (100, 100, 1, 30),  # DETR's default: targets padded to num_queries
    "tiny Q20/M20": (20, 20, 4, 4),  # the tiny presets with 4 objects, as the detr case
}
COSTS = ("detr", "uniform")
OPS, SCIPY = "keras.ops solver (XLA)", "scipy (host callback)"


def make_problems(shape: str, kind: str, batch: int, count: int, rng) -> list:
    """``count`` problems ``(cost (B, Q, M) float32, valid (B, M) bool)`` of one shape."""
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


def make_steps() -> dict:
    """The two solvers, each in its own ``tf.function`` (one per shape, batch and calls: a
    function traces once per input structure, so the cost kinds share it)."""
    steps = {}
    for name, solver, jit in ((OPS, "ops", True), (SCIPY, "scipy", False)):
        @tf.function(jit_compile=jit)
        def step(problems, solver=solver):
            return [assign(cost, valid, solver=solver) for cost, valid in problems]

        steps[name] = step
    return steps


def per_call(step, pool: list, iters: int, calls: int) -> float:
    """Seconds per call of ``iters`` passes over the pool."""
    start = time.perf_counter()
    for _ in range(iters):
        for problems in pool:
            out = step(problems)
    out[-1].numpy()
    return (time.perf_counter() - start) / (iters * len(pool) * calls)


def bench(steps: dict, shape: str, kind: str, batch: int, calls: int, pool_size: int,
          repeats: int, iters: int) -> dict[str, list[float]]:
    """Per-call seconds of both solvers (`harness.alternate`'s times) on one setting, after a
    pass over the pool that compiles both and checks the ops solver's costs against scipy's."""
    rng = np.random.default_rng(0)
    pool = [make_problems(shape, kind, batch, calls, rng) for _ in range(pool_size)]
    for problems in pool:
        ours, theirs = steps[OPS](problems), steps[SCIPY](problems)
        for (cost, _), o, t in zip(problems, ours, theirs):
            cost = cost.numpy()
            np.testing.assert_allclose(total_cost(cost, o.numpy()), total_cost(cost, t.numpy()),
                                       rtol=0, atol=1e-4)
    return harness.alternate({name: (lambda step=step: per_call(step, pool, iters, calls))
                              for name, step in steps.items()}, repeats, warmup=0)


def rows(size: dict) -> list[harness.Row]:
    """One row per shape, cost kind, batch and calls, in that order (``size``: the
    ``matcher`` settings)."""
    found = {}
    for shape in size["shapes"]:
        for batch in size["batches"]:
            for calls in size["calls"]:
                steps = make_steps()
                for kind in size["costs"]:
                    times = bench(steps, shape, kind, batch, calls, size["pool"],
                                  size["repeats"], size["iters"])
                    found[shape, kind, batch, calls] = harness.compare(
                        f"matcher {shape}, {kind} costs, B {batch}, {calls} "
                        f"call{'s' if calls > 1 else ''}", times, ours=OPS, peer=SCIPY,
                        settings={"shape": shape, "cost": kind, "batch": batch, "calls": calls,
                                  "pool": size["pool"], "iters": size["iters"]})
    return [found[shape, kind, batch, calls] for shape in size["shapes"]
            for kind in size["costs"] for batch in size["batches"] for calls in size["calls"]]
