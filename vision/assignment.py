"""The linear sum assignment (LSAP) that DETR's matching solves, per image, exactly.

`assign(cost, valid, solver)` with one of two solvers (`SOLVERS`):

- ``"scipy"`` (default): `scipy.optimize.linear_sum_assignment` on the host. Inside a
  TensorFlow graph it runs as a host callback (`tf.numpy_function`), which XLA cannot compile:
  a train step that uses it must be compiled with ``jit_compile=False`` (set it explicitly;
  Keras's ``"auto"`` may pick XLA). Under JAX it needs concrete (non-traced) values.
- ``"ops"``: a pure ``keras.ops`` shortest-augmenting-path (Jonker–Volgenant style) Hungarian
  solver, batched, with no host callback, so it compiles with XLA and runs under JAX/TPU. It
  reaches the same minimum total cost as scipy; where several assignments tie it may pick a
  different one.

DETR's cost is `vision.matcher.HungarianMatcher`.
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
from keras import ops

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
            (pure ``keras.ops``; XLA/JAX compatible).

    Returns:
        int32 tensor of shape `(B, Q)`: the index in `[0, M)` of the target matched to each
        query, or -1 where the query is unmatched.

    Raises:
        ValueError: For an unknown `solver` or badly shaped `cost` / `valid`.
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
    return _assign_ops(cost, valid)


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

    This is the only TensorFlow in `vision.assignment`; it is imported lazily. Returns None when
    TensorFlow executes eagerly (then the caller simply runs NumPy).
    """
    import tensorflow as tf

    if tf.executing_eagerly():
        return None
    indices = tf.numpy_function(_assign_numpy, [cost, valid], tf.int32, stateful=False)
    indices.set_shape(cost.shape[:2])  # (B, Q)
    return indices


# --- "ops" solver ---------------------------------------------------------------------------


def _assign_ops(cost: Any, valid: Any) -> Any:
    if keras.backend.standardize_dtype(cost.dtype) != "float64":
        cost = ops.cast(cost, "float32")  # at least float32, also for float16 / int costs
    num_queries, num_targets = cost.shape[1], cost.shape[2]
    if num_queries == 0 or num_targets == 0:
        batch = ops.shape(cost)[0]
        return ops.full((batch, num_queries), -1, dtype="int32")  # all unmatched
    cost = ops.where(valid[:, None, :], cost, ops.zeros_like(cost))  # padded entries finite
    # Usual case, targets as rows: each valid target gets one query, padded rows are skipped.
    _, query_to_target = _shortest_augmenting_path(
        ops.transpose(cost, (0, 2, 1)),  # (B, M, Q)
        row_active=valid,
        col_allowed=ops.ones_like(cost[:, :, 0], dtype="bool"),
    )
    if num_queries is not None and num_targets is not None and num_targets <= num_queries:
        return query_to_target
    # Images with more valid targets than queries: queries as rows, each gets one target.
    too_many = ops.sum(ops.cast(valid, "int32"), axis=1) > ops.shape(cost)[1]  # (B,)

    def queries_as_rows():
        target_of_query, _ = _shortest_augmenting_path(
            cost, row_active=ops.ones_like(cost[:, :, 0], dtype="bool"), col_allowed=valid
        )
        return ops.where(too_many[:, None], target_of_query, query_to_target)

    return ops.cond(ops.any(too_many), queries_as_rows, lambda: query_to_target)


def _shortest_augmenting_path(cost: Any, row_active: Any, col_allowed: Any) -> tuple[Any, Any]:
    """Batched exact LSAP by successive shortest augmenting paths with dual potentials.

    Active rows are inserted one at a time; for each, a Dijkstra search over reduced costs
    ``cost[i, j] - u[i] - v[j]`` finds the cheapest augmenting path to a free allowed column,
    the potentials are updated and the path is flipped (Crouse, 2016, Algorithm 1 — the method
    behind scipy's solver). The assignment of the rows inserted so far stays optimal. A row
    that finds no free allowed column stays unassigned.

    Args:
        cost: Finite float tensor of shape `(B, R, C)`.
        row_active: Bool tensor of shape `(B, R)`; inactive rows are left unassigned.
        col_allowed: Bool tensor of shape `(B, C)`; other columns are never assigned.

    Returns:
        Tuple `(col4row (B, R), row4col (B, C))` of int32 indices, -1 where unassigned.
    """
    num_rows, num_cols = ops.shape(cost)[1], ops.shape(cost)[2]
    row_ids = ops.arange(num_rows, dtype="int32")[None, :]  # (1, R)
    col_ids = ops.arange(num_cols, dtype="int32")[None, :]  # (1, C)
    u = ops.zeros_like(cost[:, :, 0])  # (B, R) row potentials
    v = ops.zeros_like(cost[:, 0, :])  # (B, C) column potentials
    col4row = ops.cast(ops.zeros_like(u), "int32") - 1
    row4col = ops.cast(ops.zeros_like(v), "int32") - 1

    def pick(values: Any, one_hot: Any) -> Any:
        """`values[b, k_b]` for the single True entry of `one_hot[b]`: (B, K) -> (B,)."""
        return ops.sum(ops.where(one_hot, values, ops.zeros_like(values)), axis=1)

    def insert_row(cur: Any, state: tuple) -> tuple:
        u, v, col4row, row4col = state
        active = ops.take(row_active, cur, axis=1)  # (B,)

        def search_cond(i, min_val, sink, done, spc, path, seen_rows, seen_cols):
            return ops.logical_not(ops.all(done))

        def search_body(i, min_val, sink, done, spc, path, seen_rows, seen_cols):
            go = ops.logical_not(done)  # (B,)
            row_is_i = ops.equal(row_ids, i[:, None])  # (B, R)
            seen_rows = seen_rows | (go[:, None] & row_is_i)
            cost_i = ops.sum(ops.where(row_is_i[:, :, None], cost, ops.zeros_like(cost)), axis=1)
            reduced = min_val[:, None] + cost_i - pick(u, row_is_i)[:, None] - v  # (B, C)
            avail = col_allowed & ops.logical_not(seen_cols)  # (B, C)
            better = go[:, None] & avail & (reduced < spc)
            path = ops.where(better, i[:, None], path)
            spc = ops.where(better, reduced, spc)
            candidates = ops.where(avail, spc, float("inf"))
            best = ops.min(candidates, axis=1)  # (B,)
            ties = avail & ops.equal(candidates, best[:, None])
            free_ties = ties & (row4col < 0)  # prefer a free column: ends the search sooner
            chosen = ops.where(ops.any(free_ties, axis=1)[:, None], free_ties, ties)
            j = ops.cast(ops.argmax(ops.cast(chosen, "int32"), axis=1), "int32")  # (B,)
            col_is_j = ops.equal(col_ids, j[:, None])  # (B, C)
            step = go & ops.any(avail, axis=1)
            seen_cols = seen_cols | (step[:, None] & col_is_j)
            min_val = ops.where(step, best, min_val)
            owner = pick(row4col, col_is_j)  # (B,) row holding column j, or -1
            reached_free = step & (owner < 0)
            sink = ops.where(reached_free, j, sink)
            i = ops.where(step & (owner >= 0), owner, i)
            done = done | ops.logical_not(step) | reached_free
            return i, min_val, sink, done, spc, path, seen_rows, seen_cols

        minus_one_b = ops.cast(ops.zeros_like(cost[:, 0, 0]), "int32") - 1  # (B,)
        (_, min_val, sink, _, spc, path, seen_rows, seen_cols) = ops.while_loop(
            search_cond,
            search_body,
            (
                minus_one_b + 1 + cur,  # i: start the search at the new row
                ops.zeros_like(cost[:, 0, 0]),  # min_val
                minus_one_b,  # sink
                ops.logical_not(active),  # done
                ops.full_like(v, float("inf")),  # spc: shortest path cost to each column
                ops.cast(ops.zeros_like(v), "int32") - 1,  # path: predecessor row of column
                ops.zeros_like(u, dtype="bool"),  # seen_rows
                ops.zeros_like(v, dtype="bool"),  # seen_cols
            ),
        )
        success = active & (sink >= 0)  # (B,)

        # Dual update, then flip the augmenting path from the sink back to the new row.
        spc_of_row = ops.take_along_axis(spc, ops.maximum(col4row, 0), axis=1)  # (B, R)
        delta_u = ops.where(seen_rows, min_val[:, None] - spc_of_row, ops.zeros_like(u))
        delta_u = ops.where(ops.equal(row_ids, cur), min_val[:, None], delta_u)
        u = u + ops.where(success[:, None], delta_u, ops.zeros_like(u))
        delta_v = ops.where(seen_cols & success[:, None], min_val[:, None] - spc, ops.zeros_like(v))
        v = v - delta_v

        def flip_cond(j, going, col4row, row4col):
            return ops.any(going)

        def flip_body(j, going, col4row, row4col):
            col_is_j = ops.equal(col_ids, j[:, None])
            i = pick(path, col_is_j)  # (B,) predecessor row of column j
            row4col = ops.where(going[:, None] & col_is_j, i[:, None], row4col)
            row_is_i = ops.equal(row_ids, i[:, None])
            previous = pick(col4row, row_is_i)  # column row i held before
            col4row = ops.where(going[:, None] & row_is_i, j[:, None], col4row)
            j = ops.where(going, previous, j)
            return j, going & ops.not_equal(i, cur), col4row, row4col

        _, _, col4row, row4col = ops.while_loop(
            flip_cond, flip_body, (ops.maximum(sink, 0), success, col4row, row4col)
        )
        return u, v, col4row, row4col

    _, _, col4row, row4col = ops.fori_loop(0, num_rows, insert_row, (u, v, col4row, row4col))
    return col4row, row4col
