"""Tests of the two-stage proposals' set loss: their own matching and loss terms."""

import keras
import numpy as np
import pytest

from vision.matching.losses import SetCriterion
from vision.matching.matcher import HungarianMatcher

NUM_CLASSES = 3


def test_criterion_adds_the_proposal_losses():
    rng = np.random.default_rng(5)
    criterion = SetCriterion(NUM_CLASSES, HungarianMatcher())
    layer = lambda q: {  # noqa: E731
        "pred_logits": rng.normal(size=(2, q, NUM_CLASSES + 1)).astype("float32"),
        "pred_boxes": rng.uniform(0.2, 0.8, size=(2, q, 4)).astype("float32"),
    }
    outputs = {**layer(5), "aux_outputs": [layer(5)]}
    enc = layer(12)
    targets = {
        "labels": np.array([[0, 2], [1, 0]]),
        "boxes": rng.uniform(0.2, 0.6, size=(2, 2, 4)).astype("float32"),
        "valid": np.array([[True, True], [True, False]]),
    }
    without = {k: float(v) for k, v in criterion(outputs, targets).items()}
    with_enc = {k: float(v) for k, v in criterion({**outputs, "enc_outputs": enc},
                                                   targets).items()}
    alone = {k: float(v) for k, v in criterion(enc, targets).items()}
    for name in ("loss_ce", "loss_bbox", "loss_giou"):
        assert with_enc[f"{name}_enc"] == pytest.approx(alone[name], rel=1e-6)
        assert with_enc[name] == pytest.approx(without[name], rel=1e-6)
    extra = alone["loss_ce"] + 5 * alone["loss_bbox"] + 2 * alone["loss_giou"]
    assert with_enc["loss"] == pytest.approx(without["loss"] + extra, rel=1e-5)


def test_each_object_is_matched_to_several_proposals():
    # One image, one object of class 1; the two proposals nearest to it are also the most
    # confident, so they take the object when it is repeated twice.
    target = np.array([0.5, 0.5, 0.2, 0.2], "float32")
    shifts = np.array([0.01, 0.2, 0.03, 0.1], "float32")
    proposal_boxes = np.stack([target + [d, 0, 0, 0] for d in shifts])[None]  # (1, 4, 4)
    logits = np.zeros((1, 4, NUM_CLASSES + 1), "float32")
    logits[0, :, 1] = [2.0, 0.0, 1.0, 0.0]
    decoder = {"pred_logits": logits[:, :2], "pred_boxes": proposal_boxes[:, :2]}
    outputs = {**decoder, "enc_outputs": {"pred_logits": logits, "pred_boxes": proposal_boxes}}
    targets = {"labels": np.array([[1]]), "boxes": target[None, None],
               "valid": np.array([[True]])}
    criterion = SetCriterion(NUM_CLASSES, HungarianMatcher(), proposal_matches=2)
    losses = {k: float(v) for k, v in criterion(outputs, targets).items()}
    # Matched: proposals 0 and 2 (L1 0.01 and 0.03), divided by 2 x 1 object.
    assert losses["loss_bbox_enc"] == pytest.approx((0.01 + 0.03) / 2, rel=1e-4)
    log_p = logits[0] - np.log(np.exp(logits[0]).sum(-1, keepdims=True))  # (4, C + 1)
    nll = -log_p[[0, 1, 2, 3], [1, NUM_CLASSES, 1, NUM_CLASSES]]  # class 1 or no-object
    weights = np.array([1.0, 0.1, 1.0, 0.1])  # eos_coef for no-object
    assert losses["loss_ce_enc"] == pytest.approx((weights * nll).sum() / weights.sum(), rel=1e-5)
    # The decoder's own matching stays one-to-one: query 0 (L1 0.01) only.
    assert losses["loss_bbox"] == pytest.approx(0.01, rel=1e-4)
    with pytest.raises(ValueError, match="proposal_matches"):
        SetCriterion(NUM_CLASSES, HungarianMatcher(), proposal_matches=0)


def test_padded_cells_are_never_matched_to_objects():
    # Three proposals; the best box for the object sits on a padded cell.
    target = np.array([0.5, 0.5, 0.9, 0.9], "float32")
    proposal_boxes = np.array([[target, [0.3, 0.3, 0.2, 0.2], [0.7, 0.7, 0.3, 0.3]]], "float32")
    logits = np.zeros((1, 3, NUM_CLASSES + 1), "float32")
    logits[0, 0, 0] = 5.0  # the padded cell: its no-object loss would be large
    enc = {"pred_logits": logits, "pred_boxes": proposal_boxes,
           "valid": np.array([[False, True, True]])}
    decoder = {"pred_logits": logits[:, 1:], "pred_boxes": proposal_boxes[:, 1:]}
    targets = {"labels": np.array([[0, 2]]), "boxes": np.stack([target, target])[None],
               "valid": np.array([[True, False]])}
    matcher = HungarianMatcher()
    indices = keras.ops.convert_to_numpy(
        matcher(logits, proposal_boxes, targets["labels"], targets["boxes"], targets["valid"],
                pred_valid=enc["valid"]))
    np.testing.assert_array_equal(indices, [[-1, -1, 0]])  # cell 2 is nearer than cell 1
    losses = SetCriterion(NUM_CLASSES, matcher)({**decoder, "enc_outputs": enc}, targets)
    l1 = np.abs(proposal_boxes[0, 2] - target).sum()
    assert float(losses["loss_bbox_enc"]) == pytest.approx(l1, rel=1e-5)
    # Valid cells have uniform logits: -log(1/4) each; the padded cell has weight 0.
    assert float(losses["loss_ce_enc"]) == pytest.approx(np.log(4), rel=1e-5)
    # More objects than valid proposals: the padded one still stays unmatched.
    crowded = {**targets, "valid": np.array([[True, True]])}
    indices = keras.ops.convert_to_numpy(
        matcher(logits, proposal_boxes, crowded["labels"], crowded["boxes"], crowded["valid"],
                pred_valid=np.array([[False, False, True]])))
    assert indices[0, 0] == -1 and indices[0, 1] == -1 and indices[0, 2] in (0, 1)
