"""The linear sum assignment (LSAP) that DETR's matching solves, per image, exactly.

`assign(cost, valid, solver)` with one of two solvers (`SOLVERS`):

- ``"scipy"`` (default): `scipy.optimize.linear_sum_assignment` on the host. Inside a
  TensorFlow graph it runs as a host callback (`tf.numpy_function`), which XLA cannot compile:
  a train step that uses it must be compiled with ``jit_compile=False`` (set it explicitly;
  Keras's ``"auto"`` may pick XLA). Under JAX it needs concrete (non-traced) values.
- ``"ops"``: a pure ``keras.ops`` solver (`vision.matching.ops_solver`), batched over images,
  with no host callback, so it compiles with XLA and runs under JAX/TPU. It reaches the same
  minimum total cost as scipy; where several assignments tie it may pick a different one.

DETR's cost is `vision.matching.matcher.HungarianMatcher`.
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
from keras import ops

from vision.matching.ops_solver import assign_ops

__all__ = ["SOLVERS", "assign"]

SOLVERS = ("scipy", "ops")


def assign(cost: Any, valid: Any, solver: str = "scipy") -> Any:
    """Minimum-cost one-to-one assignment of queries to targets, per image.

    Every valid target gets exactly one query when an image has at most `Q` valid targets
    (the usual case). With more valid targets than queries, every query gets one target and
    the best `Q` targets are chosen (as `scipy.optimize.linear_sum_assignment` and DETR do).
    Padded targets (`valid` False) are never matched; images without targets are legal.

    Args:
        cost: Float tensor of shape `(B, Q, M)`: cost of matching query `q` to target `m`.
            Entries of padded targets are ignored (they may hold anything, even NaN).
        valid: Bool tensor of shape `(B, M)`, True for real targets, False for padding.
        solver: ``"scipy"`` (host callback; needs ``jit_compile=False``) or ``"ops"``
            (pure ``keras.ops``; XLA/JAX compatible; needs static `Q` and `M`).

    Returns:
        int32 tensor of shape `(B, Q)`: the index in `[0, M)` of the target matched to each
        query, or -1 where the query is unmatched.

    Raises:
        ValueError: For an unknown `solver`, badly shaped `cost` / `valid`, or ``"ops"`` with
            an unknown `Q` or `M`.
    """
    if solver not in SOLVERS:
        raise ValueError(f"`solver` must be one of {SOLVERS}. Received: solver={solver!r}")
    cost = ops.convert_to_tensor(cost)
    valid = ops.cast(ops.convert_to_tensor(valid), "bool")
    cost_shape, valid_shape = tuple(cost.shape), tuple(valid.shape)
    if len(cost_shape) != 3:
        raise ValueError(f"`cost` must have shape (B, Q, M). Received: shape={cost_shape}")
    expected = (cost_shape[0], cost_shape[2])
    if len(valid_shape) != 2 or any(
        a is not None and b is not None and a != b for a, b in zip(valid_shape, expected)
    ):
        raise ValueError(
            f"`valid` must have shape (B, M) = {expected} to match `cost`. "
            f"Received: shape={valid_shape}"
        )
    if solver == "scipy":
        return _assign_scipy(cost, valid)
    return assign_ops(cost, valid)


# --- "scipy" solver -------------------------------------------------------------------------


def _assign_numpy(cost: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """`assign` on NumPy arrays with `scipy.optimize.linear_sum_assignment`, image by image."""
    from scipy.optimize import linear_sum_assignment

    batch, num_queries, _ = cost.shape
    indices = np.full((batch, num_queries), -1, dtype=np.int32)
    for b in range(batch):
        targets = np.flatnonzero(valid[b])  # (n,) column index of each real target
        if targets.size == 0 or num_queries == 0:
            continue
        rows, cols = linear_sum_assignment(cost[b][:, targets].astype(np.float64))
        indices[b, rows] = targets[cols]
    return indices


def _assign_scipy(cost: Any, valid: Any) -> Any:
    if keras.backend.backend() == "tensorflow":
        indices = _tf_host_callback(cost, valid)
        if indices is not None:
            return indices
    indices = _assign_numpy(ops.convert_to_numpy(cost), ops.convert_to_numpy(valid))
    return ops.convert_to_tensor(indices, dtype="int32")


def _tf_host_callback(cost: Any, valid: Any) -> Any:
    """TensorFlow edge: inside a `tf.function` graph, runs `_assign_numpy` on the host.

    This is the only TensorFlow in `vision.matching.assignment`; it is imported lazily. Returns
    None when
    TensorFlow executes eagerly (then the caller simply runs NumPy).
    """
    import tensorflow as tf

    if tf.executing_eagerly():
        return None
    indices = tf.numpy_function(_assign_numpy, [cost, valid], tf.int32, stateful=False)
    indices.set_shape(cost.shape[:2])  # (B, Q)
    return indices
