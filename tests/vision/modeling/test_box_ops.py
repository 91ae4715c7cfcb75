"""Tests for vision.modeling.box_ops against hand-computed values and an independent NumPy loop."""

import keras
import numpy as np
import pytest
from keras import ops

from vision.modeling.box_ops import (
    box_area,
    box_cxcywh_to_xyxy,
    box_iou,
    box_xyxy_to_cxcywh,
    generalized_box_iou,
)


def reference_giou(a, b):
    """GIoU of two xyxy boxes with plain Python arithmetic; 0/0 taken as 0."""
    iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = iw * ih
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    iou = inter / union if union != 0 else 0.0
    cw = max(a[2], b[2]) - min(a[0], b[0])
    ch = max(a[3], b[3]) - min(a[1], b[1])
    enclosing = cw * ch
    return iou - ((enclosing - union) / enclosing if enclosing != 0 else 0.0)


def random_xyxy(rng, n):
    lo = rng.uniform(0, 0.6, size=(n, 2))
    return np.concatenate([lo, lo + rng.uniform(0, 0.4, size=(n, 2))], axis=1).astype("float32")


def test_format_conversions_by_hand():
    cxcywh = np.array([[0.5, 0.4, 0.2, 0.6], [1.0, 2.0, 0.0, 4.0]], "float32")
    xyxy = np.array([[0.4, 0.1, 0.6, 0.7], [1.0, 0.0, 1.0, 4.0]], "float32")
    np.testing.assert_allclose(ops.convert_to_numpy(box_cxcywh_to_xyxy(cxcywh)), xyxy, atol=1e-6)
    np.testing.assert_allclose(ops.convert_to_numpy(box_xyxy_to_cxcywh(xyxy)), cxcywh, atol=1e-6)
    batched = np.random.default_rng(0).uniform(size=(2, 3, 4)).astype("float32")
    round_trip = box_xyxy_to_cxcywh(box_cxcywh_to_xyxy(batched))
    np.testing.assert_allclose(ops.convert_to_numpy(round_trip), batched, atol=1e-6)


def test_box_area():
    xyxy = np.array([[0, 0, 2, 3], [1, 1, 1, 5]], "float32")
    np.testing.assert_allclose(ops.convert_to_numpy(box_area(xyxy)), [6.0, 0.0])


def test_box_iou_by_hand_returns_union():
    a = np.array([[0, 0, 2, 2]], "float32")
    b = np.array([[1, 1, 3, 3], [0, 0, 2, 2], [5, 5, 6, 6]], "float32")
    iou, union = box_iou(a, b)
    np.testing.assert_allclose(ops.convert_to_numpy(iou), [[1 / 7, 1.0, 0.0]], rtol=1e-6)
    np.testing.assert_allclose(ops.convert_to_numpy(union), [[7.0, 4.0, 5.0]], rtol=1e-6)


@pytest.mark.parametrize(
    "box1, box2, expected",
    [
        ([0, 0, 2, 2], [1, 1, 3, 3], 1 / 7 - 2 / 9),  # overlapping: inter 1, union 7, hull 9
        ([0, 0, 1, 1], [2, 0, 3, 1], -1 / 3),  # disjoint: union 2, hull 3
        ([0, 0, 4, 4], [1, 1, 2, 2], 1 / 16),  # nested: hull = outer box
        ([0, 0, 2, 2], [0, 0, 2, 2], 1.0),  # identical
        ([1, 1, 1, 1], [0, 0, 2, 2], 0.0),  # a point inside a box: union 4, hull 4
        ([1, 1, 1, 1], [1, 1, 1, 1], 0.0),  # the same point twice: 0/0 twice
        ([1, 0, 1, 2], [2, 0, 2, 2], -1.0),  # two parallel segments: union 0, hull 2
        ([1, 0, 1, 1], [1, 2, 1, 3], 0.0),  # collinear segments: hull has zero area
    ],
)
def test_generalized_box_iou_by_hand(box1, box2, expected):
    giou = ops.convert_to_numpy(
        generalized_box_iou(np.array([box1], "float32"), np.array([box2], "float32"))
    )
    assert giou.shape == (1, 1)
    assert np.isfinite(giou).all()
    np.testing.assert_allclose(giou[0, 0], expected, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(giou[0, 0], reference_giou(box1, box2), rtol=1e-6, atol=1e-7)


def test_generalized_box_iou_random_matches_reference_and_batches():
    rng = np.random.default_rng(1)
    boxes1 = random_xyxy(rng, 10).reshape(2, 5, 4)
    boxes2 = random_xyxy(rng, 6).reshape(2, 3, 4)
    boxes2[0, 0] = [0.2, 0.2, 0.2, 0.5]  # one degenerate box in the mix
    giou = ops.convert_to_numpy(generalized_box_iou(boxes1, boxes2))
    assert giou.shape == (2, 5, 3)
    expected = np.array(
        [[[reference_giou(a, b) for b in boxes2[k]] for a in boxes1[k]] for k in range(2)]
    )
    np.testing.assert_allclose(giou, expected, rtol=1e-5, atol=1e-6)
    assert (giou <= 1 + 1e-6).all() and (giou >= -1 - 1e-6).all()
    # Element-wise GIoU of pairs through the broadcast (N, 1, 4) x (N, 1, 4) form.
    pairs = ops.convert_to_numpy(generalized_box_iou(boxes1[0, :3, None], boxes2[0, :, None]))
    np.testing.assert_allclose(pairs[:, 0, 0], np.diag(expected[0, :3]), rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="uses tf.GradientTape")
def test_degenerate_boxes_have_finite_gradients():
    import tensorflow as tf

    boxes1 = tf.Variable([[1.0, 1.0, 1.0, 1.0], [1.0, 0.0, 1.0, 1.0]])
    boxes2 = tf.constant([[1.0, 1.0, 1.0, 1.0], [1.0, 2.0, 1.0, 3.0]])
    with tf.GradientTape() as tape:
        loss = ops.sum(generalized_box_iou(boxes1, boxes2)) + ops.sum(box_iou(boxes1, boxes2)[0])
    grad = tape.gradient(loss, boxes1)
    assert np.isfinite(loss.numpy()) and np.isfinite(grad.numpy()).all()


@pytest.mark.parametrize(
    "fn, args, match",
    [
        (box_cxcywh_to_xyxy, (np.zeros((2, 3)),), r"`boxes` must have shape \(\.\.\., 4\)"),
        (box_area, (np.zeros((5,)),), r"`boxes` must have shape .*Received: shape=\(5,\)"),
        (
            generalized_box_iou,
            (np.zeros((2, 3)), np.zeros((2, 4))),
            r"`boxes1` must have shape \(\.\.\., 4\)\. Received: shape=\(2, 3\)",
        ),
        (
            box_iou,
            (np.zeros((2, 4)), np.zeros((4,))),
            r"`boxes2` must have shape \(N, 4\) or \(\.\.\., N, 4\)\. Received: shape=\(4,\)",
        ),
    ],
)
def test_bad_shapes_raise(fn, args, match):
    with pytest.raises(ValueError, match=match):
        fn(*args)
