"""The ``"ops"`` solver of `vision.matching.assignment.assign`: exact LSAP in ``keras.ops``.

Batched over images, with no host callback, so it compiles with XLA and runs under JAX/TPU: a
vectorized row reduction (Jonker–Volgenant's augmenting row reduction, all rows at once)
places most targets, then shortest augmenting paths (the method of scipy's solver) place the
rest, with dual potentials that certify the minimum. It reaches the same minimum total cost as
scipy; where several assignments tie it may pick a different one. It computes in float32
(float64 when `cost` is float64): with float32, assignments whose totals differ by less than
float32 rounding of the potentials count as ties (integer-valued costs stay exact); float64
costs decide as finely as scipy, which solves in float64. Under XLA on a CPU it is faster
than the host callback at DETR's shapes (`benchmarks/cases/layers.py`).
"""

from __future__ import annotations

from typing import Any

import keras
from keras import ops

__all__ = ["assign_ops"]


def assign_ops(cost: Any, valid: Any) -> Any:
    """`vision.matching.assignment.assign` with ``solver="ops"``, on checked tensors.

    Args:
        cost: float ``(B, Q, M)``, ``Q`` and ``M`` static.
        valid: bool ``(B, M)``.

    Returns:
        int32 ``(B, Q)``: the target of each query, -1 where unmatched.
    """
    if keras.backend.standardize_dtype(cost.dtype) != "float64":
        cost = ops.cast(cost, "float32")  # at least float32, also for float16 / int costs
    num_queries, num_targets = cost.shape[1], cost.shape[2]
    if num_queries is None or num_targets is None:
        raise ValueError(
            "The 'ops' solver needs a static number of queries and targets. "
            f"Received: cost of shape {tuple(cost.shape)}"
        )
    if num_queries == 0 or num_targets == 0:
        batch = ops.shape(cost)[0]
        return ops.full((batch, num_queries), -1, dtype="int32")  # all unmatched
    # Targets as rows, queries as columns: each valid target gets one query.
    col_allowed = None
    extra = num_targets - num_queries
    if extra > 0:
        # An image may have up to `extra` more valid targets than queries. Zero-cost dummy
        # columns, as many as it has surplus targets, take the targets left unmatched, so the
        # queries match the best Q targets (what scipy's rectangular solver does).
        surplus = ops.sum(ops.cast(valid, "int32"), axis=1) - num_queries  # (B,)
        dummies = ops.arange(extra, dtype="int32")[None, :] < surplus[:, None]  # (B, extra)
        col_allowed = ops.concatenate([ops.ones_like(cost[:, :, 0], dtype="bool"), dummies], 1)
        zeros = ops.tile(ops.zeros_like(cost[:, :1, :]), (1, extra, 1))  # (B, extra, M)
        cost = ops.concatenate([cost, zeros], axis=1)  # (B, M, M)
    _, query_to_target = _solve(cost, row_active=valid, col_allowed=col_allowed)
    return query_to_target[:, :num_queries]


def _solve(cost: Any, row_active: Any, col_allowed: Any) -> tuple[Any, Any]:
    """Batched exact LSAP: each active row gets a distinct allowed column, at minimum total cost.

    Keeps dual potentials ``u`` (rows) and ``v`` (columns; never positive, zero on every free
    column) with every reduced cost (the cost of row `i` in column `j`, less ``u[i] + v[j]``)
    non-negative and zero on every assigned pair. An assignment of all active rows that
    satisfies these conditions has minimum total cost (complementary slackness of the
    rectangular problem's LP).

    1. Reduction, vectorized over all rows: each row bids for its cheapest column; a column
       goes to its bidder with the largest gap between its cheapest and second-cheapest cost,
       and the column's ``v`` drops by that gap, so the winner sits at its second-cheapest cost
       and every loser's first column costs it at least its own second-cheapest. A loser then
       takes its second-cheapest column if no winner holds it (the first such loser, if
       several). With fewer rows than columns this places nearly every row.
    2. The rows left free are inserted one at a time by shortest augmenting paths: a Dijkstra
       search over reduced costs finds the cheapest path to a free allowed column, the
       potentials are updated and the path is flipped (Crouse, 2016, Algorithm 1 — the method
       behind scipy's solver). Each insertion keeps the conditions above.

    Images run in lockstep; each step is vectorized over the batch and the columns.

    Args:
        cost: Float tensor of shape `(B, C, R)` (columns first, the layout XLA reduces fastest
            over C): ``cost[b, j, i]`` is the cost of row `i` in column `j`. Finite on active
            rows and allowed columns; other entries are ignored and may hold anything.
        row_active: Bool tensor of shape `(B, R)`; inactive rows are left unassigned.
        col_allowed: Bool tensor of shape `(B, C)`, or None for all columns; other columns are
            never assigned. No image may have more active rows than allowed columns.

    Returns:
        Tuple `(col4row (B, R), row4col (B, C))` of int32 indices, -1 where unassigned.
    """
    num_cols, num_rows = cost.shape[1], cost.shape[2]
    batch = ops.shape(cost)[0]
    inf = float("inf")
    row_ids = ops.arange(num_rows, dtype="int32")[None, :]  # (1, R)
    col_ids = ops.arange(num_cols, dtype="int32")[None, :]  # (1, C)
    row_iota = ops.arange(num_rows, dtype="float32")[None, :]  # (1, R)
    col_iota = ops.arange(num_cols, dtype="float32")[None, :]  # (1, C)
    batch_ids = ops.arange(batch, dtype="int32")  # (B,)
    if col_allowed is None:
        col_allowed = ops.ones_like(cost[:, :, 0], dtype="bool")
        masked = cost
    else:
        masked = ops.where(col_allowed[:, :, None], cost, inf)
    flat_cost = ops.reshape(cost, (-1,))
    col_base = (batch_ids[:, None] * num_cols + col_ids) * num_rows  # (B, C)

    def row_costs(i: Any) -> Any:
        """(B, C): `cost[b, :, i[b]]`, row `i[b]` of each image."""
        return ops.take(flat_cost, col_base + i[:, None], axis=0)

    def at(values: Any, index: Any) -> Any:
        """`values[b, index[b]]` for values `(B, K, ...)` and index `(B,)` or `(B, N)` in range.

        A gather from the flattened batch, which XLA runs much faster than a batched gather.
        """
        size = values.shape[1]
        offset = batch_ids * size if len(index.shape) == 1 else batch_ids[:, None] * size
        flat = ops.reshape(values, (-1,) + tuple(values.shape[2:]))
        return ops.take(flat, index + offset, axis=0)

    def per_column(segment_op: Any, values: Any, cols: Any, mask: Any) -> Any:
        """(B, C): `segment_op` of `values` (B, R) over the rows in `mask`, by column `cols`."""
        num_segments = batch * num_cols  # one per column of each image, then a discard one
        segments = ops.where(mask, cols + batch_ids[:, None] * num_cols, num_segments)
        out = segment_op(
            ops.reshape(values, (-1,)), ops.reshape(segments, (-1,)), num_segments=num_segments + 1
        )
        return ops.reshape(out[:-1], (-1, num_cols))

    def pending_rows(col4row: Any, stuck: Any) -> Any:
        """(B, R): active rows still to place, in images where no search has failed."""
        return row_active & (col4row < 0) & ops.logical_not(stuck)[:, None]

    # --- 1. Reduction --------------------------------------------------------------------
    best = ops.min(masked, axis=1)  # (B, R) cheapest cost of each row
    first = _first(masked == best[:, None, :], col_iota[:, :, None], axis=1)  # (B, R) its column
    first = ops.minimum(first, num_cols - 1)
    rest = ops.where(ops.equal(col_ids[:, :, None], first[:, None, :]), inf, masked)
    second = ops.min(rest, axis=1)  # (B, R) second-cheapest, inf with one allowed column
    second_col = _first(rest == second[:, None, :], col_iota[:, :, None], axis=1)
    second_col = ops.minimum(second_col, num_cols - 1)
    has_second = second < inf
    gap = ops.where(has_second, second - best, ops.zeros_like(best))  # (B, R), >= 0
    row_index = row_ids + ops.zeros_like(first)  # (B, R)
    # Each column bid for goes to the bidder with the largest gap, the first of them on a tie.
    top_gap = per_column(ops.segment_max, gap, first, row_active)  # (B, C), < 0 where no bid
    tops = row_active & (gap == at(top_gap, first))
    winner = per_column(ops.segment_min, row_index, first, tops)  # (B, C), > R where no bid
    won = row_active & ops.equal(at(winner, first), row_ids)  # (B, R)
    # A loser bids for its second column if no winner holds it; the first such bidder takes it.
    bid = row_active & ops.logical_not(won) & has_second & (at(winner, second_col) >= num_rows)
    bidder = per_column(ops.segment_min, row_index, second_col, bid)  # (B, C)
    won_second = bid & ops.equal(at(bidder, second_col), row_ids)  # (B, R)
    col4row = ops.where(won, first, ops.where(won_second, second_col, -1))  # (B, R)
    won_col, bid_col = winner < num_rows, bidder < num_rows  # (B, C)
    row4col = ops.where(won_col, winner, ops.where(bid_col, bidder, -1))  # (B, C)
    # An assigned row's u is its `cost - v` there: its second-cheapest cost (or the cheapest,
    # with a single allowed column).
    u = ops.where(won, best + gap, ops.where(won_second, second, ops.zeros_like(best)))
    v = -ops.where(won_col, at(gap, ops.where(won_col, winner, 0)), 0.0)  # (B, C)

    # --- 2. Shortest augmenting paths ----------------------------------------------------
    def insert_cond(u, v, col4row, row4col, stuck):
        return ops.any(pending_rows(col4row, stuck))

    def insert_body(u, v, col4row, row4col, stuck):
        pending = pending_rows(col4row, stuck)  # (B, R)
        active = _any(pending, axis=1)  # (B,)
        cur = ops.minimum(_first(pending, row_iota, axis=1), num_rows - 1)  # (B,) row to place
        owned = ops.where(row4col >= 0, float(num_cols), 0.0)  # (B, C): free columns rank first

        def search_cond(i, min_val, sink, done, spc, path, avail):
            return ops.logical_not(ops.all(done))

        def search_body(i, min_val, sink, done, spc, path, avail):
            go = ops.logical_not(done)  # (B,)
            reduced = (min_val - at(u, i))[:, None] + row_costs(i) - v  # (B, C)
            better = go[:, None] & avail & (reduced < spc)
            path = ops.where(better, i[:, None], path)
            spc = ops.where(better, reduced, spc)
            candidates = ops.where(avail, spc, inf)
            nearest = ops.min(candidates, axis=1)  # (B,)
            # The first column at the least distance, a free one if there is one (ends sooner).
            key = ops.where(candidates == nearest[:, None], col_iota + owned, 2.0 * num_cols)
            j = ops.mod(ops.cast(ops.min(key, axis=1), "int32"), num_cols)  # (B,)
            step = go & (nearest < inf)
            avail = avail & ops.logical_not(step[:, None] & ops.equal(col_ids, j[:, None]))
            min_val = ops.where(step, nearest, min_val)
            owner = at(row4col, j)  # (B,) row holding column j, or -1
            reached_free = step & (owner < 0)
            sink = ops.where(reached_free, j, sink)
            i = ops.where(step & (owner >= 0), owner, i)
            done = done | ops.logical_not(step) | reached_free
            return i, min_val, sink, done, spc, path, avail

        (_, min_val, sink, _, spc, path, avail) = ops.while_loop(
            search_cond,
            search_body,
            (
                cur,  # i: the search starts at the new row
                ops.zeros_like(v[:, 0]),  # min_val: distance of the last column reached
                ops.zeros_like(cur) - 1,  # sink: the free column reached
                ops.logical_not(active),  # done
                ops.full_like(v, inf),  # spc: shortest path cost to each column
                ops.zeros_like(row4col) - 1,  # path: predecessor row of each column
                col_allowed,  # avail: allowed columns not reached yet
            ),
        )
        success = active & (sink >= 0)  # (B,)
        # Only non-finite costs can leave a search without a free column: stop that image.
        stuck = stuck | (active & ops.logical_not(success))

        # Dual update, then flip the augmenting path from the sink back to the new row.
        seen_cols = col_allowed & ops.logical_not(avail) & success[:, None]  # (B, C)
        held = ops.maximum(col4row, 0)
        seen_rows = (col4row >= 0) & at(seen_cols, held)  # (B, R)
        delta_u = ops.where(seen_rows, min_val[:, None] - at(spc, held), ops.zeros_like(u))
        is_cur = ops.equal(row_ids, cur[:, None]) & success[:, None]
        u = u + ops.where(is_cur, min_val[:, None], delta_u)
        v = v - ops.where(seen_cols, min_val[:, None] - spc, ops.zeros_like(v))

        def flip_cond(j, going, col4row, row4col):
            return ops.any(going)

        def flip_body(j, going, col4row, row4col):
            i = at(path, j)  # (B,) predecessor row of column j
            previous = at(col4row, ops.maximum(i, 0))  # column row i held before
            row4col = ops.where(
                going[:, None] & ops.equal(col_ids, j[:, None]), i[:, None], row4col
            )
            col4row = ops.where(
                going[:, None] & ops.equal(row_ids, i[:, None]), j[:, None], col4row
            )
            j = ops.where(going, previous, j)
            return j, going & ops.not_equal(i, cur), col4row, row4col

        _, _, col4row, row4col = ops.while_loop(
            flip_cond, flip_body, (ops.maximum(sink, 0), success, col4row, row4col)
        )
        return u, v, col4row, row4col, stuck

    _, _, col4row, row4col, _ = ops.while_loop(
        insert_cond,
        insert_body,
        (u, v, col4row, row4col, ops.zeros_like(row_active[:, 0])),
    )
    return col4row, row4col


# XLA on CPU reduces float32 much faster than bool or int32, so masks are reduced as floats.


def _any(mask: Any, axis: int) -> Any:
    """`ops.any(mask, axis)`."""
    return ops.max(ops.where(mask, 1.0, 0.0), axis=axis) > 0.0


def _first(mask: Any, iota: Any, axis: int) -> Any:
    """int32 index of the first True entry of `mask` along `axis`; its size where none.

    `iota` holds the float32 indices `0, 1, ...` along `axis`, broadcastable to `mask`.
    """
    size = float(iota.shape[axis])
    return ops.cast(ops.min(ops.where(mask, iota, size), axis=axis), "int32")
