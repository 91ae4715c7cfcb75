"""Tests for vision.matching.assignment and vision.matching.ops_solver: the keras.ops solver
reaches scipy's minimum cost, under XLA."""

import keras
import numpy as np
import pytest
from keras import ops

from vision.matching.assignment import _assign_numpy, assign

tf_only = pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="tf.function")


def xla_compiled(fn):
    """`fn` compiled by XLA: ``tf.function(jit_compile=True)`` or ``jax.jit``."""
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        return tf.function(fn, jit_compile=True)
    if keras.backend.backend() == "jax":
        import jax

        return jax.jit(fn)
    pytest.skip(f"no XLA compilation under the {keras.backend.backend()} backend")


def random_batch(rng, batch, num_queries, num_targets):
    """A batch of assignment problems of mixed kinds, with padded targets holding garbage.

    Image b draws its number of valid targets in [0, M] (0 and M included), scatters them over
    the M slots, and its costs from one of: normal floats, small integers (many ties), equal
    costs everywhere (every matching ties), normal floats plus 1e4 on some queries (the
    matcher's prohibitive cost).
    """
    kinds = rng.integers(0, 4, batch)
    cost = rng.normal(size=(batch, num_queries, num_targets))
    cost[kinds == 1] = rng.integers(0, 4, size=(int((kinds == 1).sum()), num_queries, num_targets))
    cost[kinds == 2] = 1.0
    prohibitive = (kinds == 3)[:, None] & (rng.random((batch, num_queries)) < 0.3)
    cost = np.where(prohibitive[:, :, None], cost + 1e4, cost)
    counts = rng.integers(0, num_targets + 1, batch)
    counts[:2] = 0, num_targets
    valid = np.zeros((batch, num_targets), bool)
    for b, n in enumerate(counts):
        valid[b, rng.permutation(num_targets)[:n]] = True
    cost = cost.astype("float32")
    cost[~np.broadcast_to(valid[:, None, :], cost.shape)] = np.nan  # padding may hold anything
    return cost, valid


def total_cost(cost, indices):
    """(B,) float64 sum of each image's matched entries of `cost`."""
    picked = np.take_along_axis(cost.astype("float64"), np.maximum(indices, 0)[:, :, None], 2)
    return np.where(indices >= 0, picked[:, :, 0], 0.0).sum(axis=1)


def check_against_scipy(indices, cost, valid, exact=False):
    """Each image's matching is a maximum matching at scipy's minimum total cost.

    Totals are summed in float64 from the entries. They must be equal for integer-valued
    costs (and everywhere with `exact`); otherwise to the float32 rounding of the solver's
    potentials.
    """
    num_queries = cost.shape[1]
    for b in range(cost.shape[0]):
        matched = indices[b][indices[b] >= 0]
        assert len(set(matched.tolist())) == matched.size, "a target is matched twice"
        assert valid[b][matched].all(), "a padded target is matched"
        assert matched.size == min(num_queries, int(valid[b].sum()))
    total = total_cost(cost, indices)
    want = total_cost(cost, _assign_numpy(cost, valid))
    finite = np.where(valid[:, None, :], cost, 0.0)
    integer = np.all(finite == np.round(finite), axis=(1, 2)) | exact
    np.testing.assert_array_equal(total[integer], want[integer])
    np.testing.assert_allclose(total[~integer], want[~integer], rtol=1e-6, atol=1e-4)


def test_ops_reaches_scipy_minimum_on_1000_problems_under_xla():
    rng = np.random.default_rng(0)
    solve = xla_compiled(lambda c, v: assign(c, v, solver="ops"))
    # 1,024 images of Q = 8 queries and M = 10 target slots: from no valid target to fewer,
    # as many and more valid targets than queries (one shape: one XLA compilation).
    batch, num_queries, num_targets = 1024, 8, 10
    cost, valid = random_batch(rng, batch, num_queries, num_targets)
    counts = valid.sum(axis=1)
    assert counts.min() == 0 and counts.max() == num_targets and (counts == num_queries).any()
    indices = ops.convert_to_numpy(solve(cost, valid))
    assert indices.shape == (batch, num_queries) and indices.dtype == np.int32
    check_against_scipy(indices, cost, valid)


@tf_only
def test_ops_float64_is_exact_on_near_ties_with_unknown_batch_and_no_xla():
    import tensorflow as tf

    solve = tf.function(
        lambda c, v: assign(c, v, solver="ops"),
        input_signature=[
            tf.TensorSpec([None, 100, 20], tf.float64), tf.TensorSpec([None, 20], tf.bool)
        ],
        jit_compile=False,
    )
    cost, valid = random_batch(np.random.default_rng(1), 32, 100, 20)
    # Multiples of 1/50 are inexact in binary: many matchings tie up to rounding.
    cost = (np.round(cost.astype("float64") * 50) / 50).astype("float32").astype("float64")
    check_against_scipy(solve(cost, valid).numpy(), cost, valid, exact=True)


def test_ops_eager_float64_and_integer_costs():
    cost, valid = random_batch(np.random.default_rng(2), 4, 6, 4)
    cost = np.nan_to_num(cost, nan=0.0).astype("float64")
    cost += np.random.default_rng(3).normal(scale=1e-9, size=cost.shape)  # below float32
    indices = ops.convert_to_numpy(assign(cost, valid, solver="ops"))
    check_against_scipy(indices, cost, valid, exact=True)
    cost = np.round(cost * 3).astype("int32")
    indices = ops.convert_to_numpy(assign(cost, valid, solver="ops"))
    check_against_scipy(indices, cost, valid)


def test_ops_static_edge_shapes():
    for shape in [(3, 4, 0), (3, 0, 4), (2, 1, 1), (2, 1, 5), (2, 5, 1)]:
        cost = np.random.default_rng(3).normal(size=shape).astype("float32")
        valid = np.ones((shape[0], shape[2]), bool)
        indices = ops.convert_to_numpy(assign(cost, valid, solver="ops"))
        assert indices.shape == shape[:2]
        if 0 in shape:
            np.testing.assert_array_equal(indices, -1)
        else:
            check_against_scipy(indices, cost, valid)


def test_ops_solves_long_augmenting_paths():
    # cost[q, t] = q * t (Q = M): every target prefers query 0 and the optimum is the
    # anti-diagonal, so most targets go in by augmenting paths that move targets placed before.
    n = 8
    cost = np.outer(np.arange(n), np.arange(n)).astype("float32")[None]
    indices = ops.convert_to_numpy(assign(cost, np.ones((1, n), bool), solver="ops"))
    np.testing.assert_array_equal(indices[0], np.arange(n)[::-1])
