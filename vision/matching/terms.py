"""The terms of the set loss for predictions already matched to their targets
(`vision.matching.losses.SetCriterion` sums them over decoder layers).

Each takes ``(B, Q, ...)`` predictions, each prediction's ``matched_labels`` and
``target_boxes`` (its target's, any value where unmatched) and ``matched`` ``(B, Q)`` bool;
``pred_valid`` ``(B, Q)`` bool (None: all) marks the predictions that take part.
"""

from __future__ import annotations

from typing import Any

from keras import ops

from vision.modeling.box_ops import box_cxcywh_to_xyxy, box_iou, generalized_box_iou

__all__ = ["box_losses", "cross_entropy_loss", "matchability_aware_loss", "matched_targets",
           "varifocal_loss"]


def matched_targets(labels: Any, boxes: Any, indices: Any) -> tuple:
    """``(matched, matched_labels, target_boxes)`` of each prediction's target index
    ``indices`` ``(B, Q)`` (-1: none; no gradient): ``(B, Q)`` bool, ``(B, Q)`` int32 and
    ``(B, Q, 4)``, the last two any value where unmatched."""
    indices = ops.stop_gradient(ops.cast(indices, "int32"))
    safe = ops.maximum(indices, 0)
    return (indices >= 0, ops.take_along_axis(ops.cast(labels, "int32"), safe, axis=1),
            ops.take_along_axis(boxes, ops.repeat(safe[..., None], 4, axis=-1), axis=1))


def _own_iou(pred_boxes: Any, target_boxes: Any) -> Any:
    """``(B, Q)`` IoU of each predicted cxcywh box with its own target box."""
    return box_iou(box_cxcywh_to_xyxy(pred_boxes)[..., None, :],
                   box_cxcywh_to_xyxy(target_boxes)[..., None, :])[0][..., 0, 0]


def cross_entropy_loss(logits: Any, pred_boxes: Any, target_boxes: Any, matched_labels: Any,
                       matched: Any, pred_valid: Any, eos_coef: float,
                       iou_aware: bool = False) -> Any:
    """DETR's ``loss_ce`` over ``C + 1`` logits: unmatched predictions target no-object
    (the last class); the weighted mean ``Σ wᵢ ℓᵢ / Σ wᵢ`` with weight 1, ``eos_coef`` for
    no-object. ``iou_aware``: a matched prediction's target is its IoU (no gradient) on its
    class and the rest on no-object."""
    num_classes = logits.shape[-1] - 1
    target_classes = ops.where(matched, matched_labels, num_classes)  # (B, Q)
    log_probs = ops.log_softmax(logits, axis=-1)
    nll = -ops.take_along_axis(log_probs, target_classes[..., None], axis=-1)[..., 0]
    if iou_aware:  # matched: IoU on the class, 1 - IoU on no-object
        iou = ops.stop_gradient(ops.clip(_own_iou(pred_boxes, target_boxes), 0.0, 1.0))
        nll = ops.where(matched, iou * nll - (1.0 - iou) * log_probs[..., -1], nll)
    weights = ops.where(matched, 1.0, eos_coef)  # (B, Q)
    if pred_valid is not None:  # invalid predictions take no part in the loss
        weights = ops.where(pred_valid, weights, 0.0)
    total = ops.sum(weights)
    safe = ops.where(total > 0, total, 1.0)
    return ops.where(total > 0, ops.sum(weights * nll) / safe, 0.0)


def varifocal_loss(logits: Any, pred_boxes: Any, target_boxes: Any, matched_labels: Any,
                   matched: Any, pred_valid: Any, alpha: float, gamma: float) -> Any:
    """RT-DETR's varifocal loss over ``C`` sigmoid logits, summed (divide by num_boxes):
    binary cross-entropy of every (prediction, class) logit against the target score (the
    matched box's IoU, no gradient, on its class; 0 elsewhere), weighted by
    ``alpha * sigmoid(logit)^gamma`` (no gradient) where the target is 0 and by the target
    score where it is not."""
    one_hot = _class_one_hot(logits, matched_labels, matched)
    score = ops.stop_gradient(_own_iou(pred_boxes, target_boxes))[..., None] * one_hot
    prob = ops.stop_gradient(ops.sigmoid(logits))
    return _weighted_bce_sum(logits, score, alpha * prob**gamma * (1.0 - one_hot) + score,
                             pred_valid)


def matchability_aware_loss(logits: Any, pred_boxes: Any, target_boxes: Any,
                            matched_labels: Any, matched: Any, pred_valid: Any, gamma: float,
                            alpha: float | None = None) -> Any:
    """DEIM's matchability-aware loss over ``C`` sigmoid logits, summed (divide by
    num_boxes): binary cross-entropy of every (prediction, class) logit against the target
    ``IoU^gamma`` (the matched box's IoU, no gradient, on its class; 0 elsewhere), weighted
    by 1 on the matched class and by ``sigmoid(logit)^gamma`` (no gradient; times ``alpha``
    if given) elsewhere. Unlike the varifocal loss, a poorly placed match is not weighted
    down: its low target still pulls its score up from nothing."""
    one_hot = _class_one_hot(logits, matched_labels, matched)
    iou = ops.stop_gradient(ops.clip(_own_iou(pred_boxes, target_boxes), 0.0, 1.0))
    score = (iou[..., None] * one_hot) ** gamma
    prob = ops.stop_gradient(ops.sigmoid(logits))
    weight = (1.0 if alpha is None else alpha) * prob**gamma * (1.0 - one_hot) + one_hot
    return _weighted_bce_sum(logits, score, weight, pred_valid)


def _class_one_hot(logits: Any, matched_labels: Any, matched: Any) -> Any:
    """``(B, Q, C)``: 1 on each matched prediction's class, 0 elsewhere."""
    return ops.one_hot(matched_labels, logits.shape[-1]) * ops.cast(matched, "float32")[
        ..., None]


def _weighted_bce_sum(logits: Any, target: Any, weight: Any, pred_valid: Any) -> Any:
    """``Σ weight · BCE(logits, target)`` (the stable form with logits) over the valid
    predictions (``pred_valid`` None: all)."""
    loss = weight * (ops.relu(logits) - logits * target + ops.log1p(ops.exp(-ops.abs(logits))))
    if pred_valid is not None:  # invalid predictions take no part in the loss
        loss = ops.where(ops.cast(pred_valid, "bool")[..., None], loss, 0.0)
    return ops.sum(loss)


def box_losses(pred_boxes: Any, target_boxes: Any, matched: Any, num_boxes: Any) -> dict:
    """``loss_bbox`` (L1 of normalized cxcywh) and ``loss_giou`` (1 - GIoU) summed over the
    matched pairs / ``num_boxes``."""
    l1 = ops.sum(ops.abs(pred_boxes - target_boxes), axis=-1)  # (B, Q)
    giou = generalized_box_iou(
        box_cxcywh_to_xyxy(pred_boxes)[..., None, :],  # (B, Q, 1, 4)
        box_cxcywh_to_xyxy(target_boxes)[..., None, :],
    )[..., 0, 0]  # (B, Q): GIoU of each query with its own target
    zeros = ops.zeros_like(l1)
    return {"loss_bbox": ops.sum(ops.where(matched, l1, zeros)) / num_boxes,
            "loss_giou": ops.sum(ops.where(matched, 1.0 - giou, zeros)) / num_boxes}
