"""Tests for vision.matching.losses.SetCriterion against a case worked out by hand."""

import keras
import numpy as np
import pytest
from keras import ops

from vision.matching.losses import SetCriterion
from vision.matching.matcher import HungarianMatcher

NUM_CLASSES = 2  # logits have 3 entries, index 2 = no-object
EOS = 0.1

# Two images, three queries, up to two targets; image 1 has no objects.
LOGITS = np.array(
    [
        [[2.0, 0.5, -1.0], [0.1, 0.2, 1.5], [-0.5, 1.0, 0.0]],
        [[0.3, -0.2, 0.8], [1.0, 1.0, 1.0], [0.0, -1.0, 2.0]],
    ],
    "float32",
)
PRED_BOXES = np.array(
    [
        [[0.72, 0.60, 0.40, 0.25], [0.50, 0.50, 0.90, 0.90], [0.30, 0.32, 0.20, 0.20]],
        [[0.40, 0.40, 0.10, 0.10], [0.60, 0.60, 0.30, 0.20], [0.50, 0.50, 0.50, 0.50]],
    ],
    "float32",
)
TARGETS = {
    "labels": np.array([[1, 0], [0, 0]]),
    "boxes": np.array(
        [[[0.30, 0.30, 0.20, 0.20], [0.70, 0.60, 0.40, 0.20]], [[0, 0, 0, 0], [0, 0, 0, 0]]],
        "float32",
    ),
    "valid": np.array([[True, True], [False, False]]),
}
# Query 0 sits on target 1, query 2 on target 0, query 1 is unmatched.
EXPECTED_MATCH = [[1, -1, 0], [-1, -1, -1]]


def nll(logits, cls):
    return -(logits[cls] - np.log(np.exp(logits).sum()))


def giou_cxcywh(p, t):
    px0, py0, px1, py1 = p[0] - p[2] / 2, p[1] - p[3] / 2, p[0] + p[2] / 2, p[1] + p[3] / 2
    tx0, ty0, tx1, ty1 = t[0] - t[2] / 2, t[1] - t[3] / 2, t[0] + t[2] / 2, t[1] + t[3] / 2
    inter = max(0, min(px1, tx1) - max(px0, tx0)) * max(0, min(py1, ty1) - max(py0, ty0))
    union = p[2] * p[3] + t[2] * t[3] - inter
    hull = (max(px1, tx1) - min(px0, tx0)) * (max(py1, ty1) - min(py0, ty0))
    return inter / union - (hull - union) / hull


def hand_losses(num_boxes=2.0):
    """The three losses of the case above, written out."""
    lg, pb, tb = LOGITS.astype("float64"), PRED_BOXES.astype("float64"), TARGETS["boxes"]
    # Targets per query: image 0 -> class 0 (target 1), no-object, class 1 (target 0);
    # image 1 -> no-object three times. Weights 1 for classes, EOS for no-object.
    weighted = (
        nll(lg[0, 0], 0)
        + EOS * nll(lg[0, 1], 2)
        + nll(lg[0, 2], 1)
        + EOS * (nll(lg[1, 0], 2) + nll(lg[1, 1], 2) + nll(lg[1, 2], 2))
    )
    loss_ce = weighted / (1 + EOS + 1 + 3 * EOS)
    l1 = np.abs(pb[0, 0] - tb[0, 1]).sum() + np.abs(pb[0, 2] - tb[0, 0]).sum()
    giou = (1 - giou_cxcywh(pb[0, 0], tb[0, 1])) + (1 - giou_cxcywh(pb[0, 2], tb[0, 0]))
    return {"loss_ce": loss_ce, "loss_bbox": l1 / num_boxes, "loss_giou": giou / num_boxes}


def numpy_dict(losses):
    return {k: float(ops.convert_to_numpy(v)) for k, v in losses.items()}


@pytest.mark.parametrize("solver", ["scipy", "ops"])
def test_matches_hand_computation_with_aux(solver):
    matcher = HungarianMatcher(solver=solver)
    match = matcher(LOGITS, PRED_BOXES, TARGETS["labels"], TARGETS["boxes"], TARGETS["valid"])
    np.testing.assert_array_equal(ops.convert_to_numpy(match), EXPECTED_MATCH)

    criterion = SetCriterion(NUM_CLASSES, matcher, eos_coef=EOS)
    # The aux layer lists the same predictions in reverse query order: matched on its own, its
    # losses equal the last layer's; reusing the last layer's matching would change them.
    aux0 = {"pred_logits": LOGITS[:, ::-1], "pred_boxes": PRED_BOXES[:, ::-1]}
    # Uniform logits: every query's NLL is log(3), so the weighted mean is log(3).
    aux1 = {"pred_logits": np.zeros_like(LOGITS), "pred_boxes": PRED_BOXES}
    outputs = {"pred_logits": LOGITS, "pred_boxes": PRED_BOXES, "aux_outputs": [aux0, aux1]}
    losses = numpy_dict(criterion(outputs, TARGETS))
    expected = hand_losses()
    names = ["loss_ce", "loss_bbox", "loss_giou"]
    assert set(losses) == {"loss"} | {n + s for n in names for s in ("", "_0", "_1")}
    for name, value in expected.items():
        assert losses[name] == pytest.approx(value, rel=1e-5)
        assert losses[name + "_0"] == pytest.approx(value, rel=1e-5)
    assert losses["loss_ce_1"] == pytest.approx(np.log(3.0), rel=1e-5)
    assert losses["loss_bbox_1"] == pytest.approx(expected["loss_bbox"], rel=1e-5)
    boxes_total = 5 * expected["loss_bbox"] + 2 * expected["loss_giou"]
    total = 2 * (expected["loss_ce"] + boxes_total) + np.log(3.0) + boxes_total
    assert losses["loss"] == pytest.approx(total, rel=1e-5)


def test_num_boxes_override_weights_and_no_aux():
    criterion = SetCriterion(
        NUM_CLASSES,
        HungarianMatcher(),
        eos_coef=EOS,
        weight_dict={"loss_ce": 2.0, "loss_giou": 1.0},
        aux_loss=False,
    )
    outputs = {"pred_logits": LOGITS, "pred_boxes": PRED_BOXES, "aux_outputs": [{}]}
    losses = numpy_dict(criterion(outputs, TARGETS, num_boxes=4.0))
    expected = hand_losses(num_boxes=4.0)
    assert set(losses) == {"loss", "loss_ce", "loss_bbox", "loss_giou"}
    assert losses["loss_bbox"] == pytest.approx(expected["loss_bbox"], rel=1e-5)
    assert losses["loss"] == pytest.approx(
        2 * expected["loss_ce"] + expected["loss_giou"], rel=1e-5
    )
    clamped = numpy_dict(criterion(outputs, TARGETS, num_boxes=0.25))  # clamped to 1
    assert clamped["loss_bbox"] == pytest.approx(hand_losses(num_boxes=1.0)["loss_bbox"], rel=1e-5)


def test_batch_without_objects():
    targets = {
        "labels": np.zeros((2, 2), "int32"),
        "boxes": np.zeros((2, 2, 4), "float32"),
        "valid": np.zeros((2, 2), bool),
    }
    criterion = SetCriterion(NUM_CLASSES, HungarianMatcher(), eos_coef=EOS)
    losses = numpy_dict(criterion({"pred_logits": LOGITS, "pred_boxes": PRED_BOXES}, targets))
    # All weights equal EOS, so the weighted mean is the plain mean of no-object NLLs.
    mean_nll = np.mean([nll(q.astype("float64"), 2) for q in LOGITS.reshape(-1, 3)])
    assert losses["loss_ce"] == pytest.approx(mean_nll, rel=1e-5)
    assert losses["loss_bbox"] == 0.0 and losses["loss_giou"] == 0.0
    assert losses["loss"] == pytest.approx(mean_nll, rel=1e-5)


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="uses tf.GradientTape")
@pytest.mark.parametrize("solver, jit_compile", [("scipy", False), ("ops", True)])
def test_gradients_in_compiled_step(solver, jit_compile):
    import tensorflow as tf

    criterion = SetCriterion(NUM_CLASSES, HungarianMatcher(solver=solver), eos_coef=EOS)
    logits, boxes = tf.Variable(LOGITS), tf.Variable(PRED_BOXES)

    @tf.function(jit_compile=jit_compile)
    def step():
        with tf.GradientTape() as tape:
            loss = criterion({"pred_logits": logits, "pred_boxes": boxes}, TARGETS)["loss"]
        return loss, tape.gradient(loss, [logits, boxes])

    loss, (grad_logits, grad_boxes) = step()
    expected = hand_losses()
    assert float(loss) == pytest.approx(
        expected["loss_ce"] + 5 * expected["loss_bbox"] + 2 * expected["loss_giou"], rel=1e-5
    )
    assert np.isfinite(grad_logits.numpy()).all() and np.isfinite(grad_boxes.numpy()).all()
    np.testing.assert_array_equal(grad_boxes.numpy()[1], 0.0)  # image without objects
    np.testing.assert_array_equal(grad_boxes.numpy()[0, 1], 0.0)  # unmatched query


def test_config_round_trip():
    criterion = SetCriterion(3, HungarianMatcher(cost_bbox=4.0, solver="ops"), eos_coef=0.2)
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(criterion))
    assert isinstance(restored, SetCriterion)
    assert restored.get_config() == criterion.get_config()
    assert restored.matcher.get_config()["cost_bbox"] == 4.0


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"outputs": {"pred_logits": LOGITS}}, r"`outputs` must have keys 'pred_logits'"),
        (
            {"outputs": {"pred_logits": LOGITS[..., :2], "pred_boxes": PRED_BOXES}},
            r"num_classes \+ 1\) = \(B, Q, 3\)\. Received: shape=\(2, 3, 2\)",
        ),
        ({"targets": {"labels": TARGETS["labels"]}}, r"`targets` must have keys"),
        (
            {"outputs": {"pred_logits": LOGITS, "pred_boxes": PRED_BOXES, "aux_outputs": [{}]}},
            r"`outputs\['aux_outputs'\]\[0\]` must have keys",
        ),
    ],
)
def test_bad_input_raises(kwargs, match):
    criterion = SetCriterion(NUM_CLASSES, HungarianMatcher())
    call = {"outputs": {"pred_logits": LOGITS, "pred_boxes": PRED_BOXES}, "targets": TARGETS}
    call.update(kwargs)
    with pytest.raises(ValueError, match=match):
        criterion(call["outputs"], call["targets"])


def test_bad_constructor_arguments_raise():
    with pytest.raises(ValueError, match=r"`num_classes` must be a positive integer.*0"):
        SetCriterion(0, HungarianMatcher())
    with pytest.raises(ValueError,
                       match=r"`eos_coef` must be a non-negative number\. Received: eos_coef=-1"):
        SetCriterion(2, HungarianMatcher(), eos_coef=-1)
