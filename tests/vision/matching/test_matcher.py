"""Tests for vision.matching.assignment and vision.matching.matcher: exact against brute force,
batched."""

import itertools

import keras
import numpy as np
import pytest
from keras import ops

from vision.matching.assignment import assign
from vision.matching.matcher import HungarianMatcher

SOLVERS = ["scipy", "ops"]


def brute_force_min(cost, valid):
    """Minimum total cost of a maximum one-to-one matching of one image, over all permutations.

    Args:
        cost: (Q, M) array. valid: (M,) bool.
    """
    targets = np.flatnonzero(valid)
    num_queries, n = cost.shape[0], targets.size
    if n == 0 or num_queries == 0:
        return 0.0
    if n <= num_queries:  # every target gets a distinct query
        return min(
            sum(cost[q, t] for q, t in zip(queries, targets))
            for queries in itertools.permutations(range(num_queries), n)
        )
    return min(  # every query gets a distinct target
        sum(cost[q, t] for q, t in enumerate(chosen))
        for chosen in itertools.permutations(targets, num_queries)
    )


def check_matching(indices, cost, valid):
    """Checks one image's (Q,) indices are a valid maximum matching; returns its total cost."""
    matched = indices[indices >= 0]
    assert len(set(matched.tolist())) == matched.size, "a target is matched twice"
    assert valid[matched].all(), "a padded target is matched"
    assert matched.size == min(cost.shape[0], int(valid.sum()))
    return float(sum(cost[q, t] for q, t in enumerate(indices) if t >= 0))


def random_problem(rng, batch, num_queries, num_targets, integer=False):
    cost = rng.normal(size=(batch, num_queries, num_targets))
    if integer:  # many ties
        cost = np.round(cost * 2)
    valid = rng.random((batch, num_targets)) < 0.75
    return cost.astype("float32"), valid


@pytest.mark.parametrize("solver", SOLVERS)
def test_total_cost_equals_brute_force(solver):
    rng = np.random.default_rng(0)
    for num_queries, num_targets, integer in [(5, 3, False), (4, 4, True), (3, 5, False)]:
        cost, valid = random_problem(rng, 4, num_queries, num_targets, integer)
        indices = ops.convert_to_numpy(assign(cost, valid, solver=solver))
        assert indices.shape == (4, num_queries) and indices.dtype == np.int32
        for b in range(4):
            total = check_matching(indices[b], cost[b], valid[b])
            assert total == pytest.approx(brute_force_min(cost[b], valid[b]), abs=1e-4)


@pytest.mark.parametrize("solver", SOLVERS)
def test_batched_equals_per_image(solver):
    cost, valid = random_problem(np.random.default_rng(1), 3, 6, 4)
    batched = ops.convert_to_numpy(assign(cost, valid, solver=solver))
    for b in range(3):
        single = ops.convert_to_numpy(assign(cost[b : b + 1], valid[b : b + 1], solver=solver))
        np.testing.assert_array_equal(batched[b], single[0])


@pytest.mark.parametrize("solver", SOLVERS)
def test_empty_images_and_padding_are_never_matched(solver):
    cost = np.zeros((3, 4, 3), "float32")
    valid = np.array([[False] * 3, [True, False, True], [False] * 3])
    cost[1, :, 1] = -100.0  # the padded target is by far the cheapest
    cost[2] = np.nan  # an empty image may hold anything
    indices = ops.convert_to_numpy(assign(cost, valid, solver=solver))
    np.testing.assert_array_equal(indices[0], -1)
    np.testing.assert_array_equal(indices[2], -1)
    assert sorted(indices[1][indices[1] >= 0].tolist()) == [0, 2]


def test_ops_solver_reaches_scipy_minimum():
    rng = np.random.default_rng(2)
    cost, valid = random_problem(rng, 3, 12, 8, integer=True)
    valid[0] = True
    by_scipy = ops.convert_to_numpy(assign(cost, valid, solver="scipy"))
    by_ops = ops.convert_to_numpy(assign(cost, valid, solver="ops"))
    for b in range(3):
        expected = check_matching(by_scipy[b], cost[b], valid[b])
        assert check_matching(by_ops[b], cost[b], valid[b]) == pytest.approx(expected, abs=1e-4)


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="tf.function checks")
def test_solvers_inside_tf_function():
    import tensorflow as tf

    cost, valid = random_problem(np.random.default_rng(3), 2, 5, 3)
    expected = ops.convert_to_numpy(assign(cost, valid, solver="scipy"))
    host = tf.function(lambda c, v: assign(c, v, solver="scipy"), jit_compile=False)
    np.testing.assert_array_equal(host(cost, valid).numpy(), expected)
    xla = tf.function(lambda c, v: assign(c, v, solver="ops"), jit_compile=True)
    by_ops = xla(cost, valid).numpy()
    for b in range(2):
        assert check_matching(by_ops[b], cost[b], valid[b]) == pytest.approx(
            check_matching(expected[b], cost[b], valid[b]), abs=1e-4
        )


def detr_cost_numpy(logits, pred, labels, target, weights=(1.0, 5.0, 2.0)):
    """DETR's matching cost for one image written out with NumPy loops."""
    w_class, w_bbox, w_giou = weights
    prob = np.exp(logits - logits.max(-1, keepdims=True))
    prob /= prob.sum(-1, keepdims=True)

    def xyxy(b):
        return [b[0] - b[2] / 2, b[1] - b[3] / 2, b[0] + b[2] / 2, b[1] + b[3] / 2]

    cost = np.zeros((len(pred), len(target)))
    for q, p in enumerate(pred):
        for m, t in enumerate(target):
            a, c = xyxy(p), xyxy(t)
            inter = max(0, min(a[2], c[2]) - max(a[0], c[0])) * max(
                0, min(a[3], c[3]) - max(a[1], c[1])
            )
            union = p[2] * p[3] + t[2] * t[3] - inter
            hull = (max(a[2], c[2]) - min(a[0], c[0])) * (max(a[3], c[3]) - min(a[1], c[1]))
            giou = inter / union - (hull - union) / hull
            l1 = np.abs(p - t).sum()
            cost[q, m] = w_bbox * l1 - w_class * prob[q, labels[m]] - w_giou * giou
    return cost


@pytest.mark.parametrize("solver", SOLVERS)
def test_hungarian_matcher_cost_and_assignment(solver):
    rng = np.random.default_rng(4)
    batch, num_queries, num_targets, num_classes = 2, 5, 3, 4
    logits = rng.normal(size=(batch, num_queries, num_classes + 1)).astype("float32")
    pred = rng.uniform(0.2, 0.6, size=(batch, num_queries, 4)).astype("float32")
    labels = rng.integers(0, num_classes, size=(batch, num_targets))
    target = rng.uniform(0.2, 0.6, size=(batch, num_targets, 4)).astype("float32")
    valid = np.array([[True, True, True], [True, False, True]])
    labels[1, 1] = -1  # padding may hold an out-of-range label

    matcher = HungarianMatcher(solver=solver)
    cost = ops.convert_to_numpy(matcher.cost_matrix(logits, pred, labels, target))
    indices = ops.convert_to_numpy(matcher(logits, pred, labels, target, valid))
    for b in range(batch):
        expected = detr_cost_numpy(logits[b], pred[b], labels[b], target[b])
        keep = valid[b]
        np.testing.assert_allclose(cost[b][:, keep], expected[:, keep], rtol=1e-5, atol=1e-5)
        total = check_matching(indices[b], expected, valid[b])
        assert total == pytest.approx(brute_force_min(expected, valid[b]), abs=1e-4)


def test_matcher_config_round_trip():
    matcher = HungarianMatcher(cost_class=2.0, cost_bbox=1.0, cost_giou=0.0, solver="ops",
                               classification="focal", alpha=0.3, gamma=1.5)
    config = matcher.get_config()
    assert config == {"cost_class": 2.0, "cost_bbox": 1.0, "cost_giou": 0.0, "solver": "ops",
                      "classification": "focal", "alpha": 0.3, "gamma": 1.5}
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(matcher))
    assert isinstance(restored, HungarianMatcher) and restored.get_config() == config


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: assign(np.zeros((2, 3, 2)), np.ones((2, 2)), solver="lap"), r"`solver`.*'lap'"),
        (lambda: assign(np.zeros((3, 2)), np.ones((3, 2))), r"`cost` must have shape.*\(3, 2\)"),
        (
            lambda: assign(np.zeros((2, 3, 2)), np.ones((2, 5))),
            r"`valid` must have shape \(B, M\) = \(2, 2\).*Received: shape=\(2, 5\)",
        ),
        (lambda: HungarianMatcher(0, 0, 0), r"must be non-zero"),
        (lambda: HungarianMatcher(solver="auction"), r"`solver`.*'auction'"),
        (
            lambda: HungarianMatcher()(
                np.zeros((1, 2, 3)),
                np.zeros((1, 2, 3)),
                np.zeros((1, 1)),
                np.zeros((1, 1, 4)),
                np.ones((1, 1), bool),
            ),
            r"`pred_boxes` must have shape \(B, Q, 4\)\. Received: shape=\(1, 2, 3\)",
        ),
    ],
)
def test_bad_input_raises(call, match):
    with pytest.raises(ValueError, match=match):
        call()
