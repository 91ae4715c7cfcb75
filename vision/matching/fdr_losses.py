"""D-FINE's localization losses on the edge distributions, and its set criterion.

Each decoder layer of `vision.modeling.dfine.DFine` predicts, per query and box edge, logits
over ``max_num_bins + 1`` offsets ``W(n)`` (`vision.modeling.dfine_decoder.weighting_function`)
from the query's initial box ``ref_points``. Two terms train them (the D-FINE paper;
transformers' ``DFineLoss.loss_local``, whose arithmetic these follow):

- **FGL** (fine-grained localization, `fine_grained_localization_loss`): for a matched query,
  each edge of its target box lies between two offsets ``W(n) <= t < W(n + 1)``; the loss is
  the cross-entropy to ``n`` and to ``n + 1`` weighted by the distances' complements
  (a unimodal distribution focal loss), times the query's IoU with its target (no
  gradient), summed over matched edges / num_boxes;
- **DDF** (decoupled distillation focal, `decoupled_distillation_loss`): every earlier layer's
  distributions learn the last layer's (softened by ``T = 5``, no gradient to the teacher):
  ``T^2 KL(teacher || layer)`` per edge, weighted by the teacher's best class probability,
  or for a matched query by its IoU; the matched and the unmatched edges are averaged
  apart and mixed by ``sqrt`` of their counts per image.

`DFineCriterion` adds them to RT-DETR's criterion: every decoder layer (the last included)
gets FGL, every earlier one DDF against the last; the first layer's boxes before refinement
(``pre_outputs``) get the varifocal and box losses; the denoising queries' layers likewise,
their own last layer the teacher. Each layer's losses use its own matching and its own
logits, boxes and distributions (D-FINE's pairing: transformers 5 scores layer ``i``'s
distributions with layer ``i - 1``'s boxes, experiments/README.md).
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
from keras import ops

from vision.matching.losses import SetCriterion
from vision.matching.terms import matched_targets
from vision.modeling.box_ops import box_cxcywh_to_xyxy, box_iou
from vision.modeling.dfine_decoder import weighting_function

__all__ = ["DFineCriterion", "decoupled_distillation_loss", "edge_targets",
           "fine_grained_localization_loss"]

TEMPERATURE = 5.0  # DDF's softening (transformers' and D-FINE's ``T``)


def edge_targets(ref_points, target_boxes, project: np.ndarray, reg_scale: float):
    """Each edge's bin ``n`` and the weights of ``n`` and ``n + 1``: ``(left index, weight
    left, weight right)``, each ``(..., 4)`` (transformers' ``bbox2distance`` and
    ``translate_gt``; an edge beyond the outermost offsets goes wholly to that end's bin).

    Args:
        ref_points: ``(..., 4)`` cxcywh initial boxes.
        target_boxes: ``(..., 4)`` cxcywh targets.
        project: ``W``, ``(max_num_bins + 1,)``.
        reg_scale: `weighting_function`'s ``reg_scale``.
    """
    scale = abs(reg_scale)
    bins = len(project) - 1
    x1, y1, x2, y2 = (box_cxcywh_to_xyxy(target_boxes)[..., i] for i in range(4))
    cx, cy, w, h = (ref_points[..., i] for i in range(4))
    sx, sy = w / scale + 1e-16, h / scale + 1e-16
    edges = ops.stack([(cx - x1) / sx, (cy - y1) / sy, (x2 - cx) / sx, (y2 - cy) / sy],
                      axis=-1) - 0.5 * scale  # (..., 4)
    w_table = ops.convert_to_tensor(project)
    left = ops.sum(ops.cast(w_table <= edges[..., None], "int32"), axis=-1) - 1
    inside = (left >= 0) & (left < bins)
    safe = ops.clip(left, 0, bins - 1)
    low, high = ops.take(w_table, safe), ops.take(w_table, safe + 1)
    to_low, to_high = ops.abs(edges - low), ops.abs(high - edges)
    right_weight = ops.where(inside, to_low / (to_low + to_high), ops.where(left < 0, 0.0, 1.0))
    return safe, 1.0 - right_weight, right_weight


def fine_grained_localization_loss(corners, ref_points, pred_boxes, target_boxes, matched,
                                   num_boxes, project: np.ndarray, reg_scale: float):
    """FGL (see the module docstring), summed over matched queries' edges / ``num_boxes``.

    Args:
        corners: ``(B, Q, 4 * (bins + 1))`` a layer's edge logits.
        ref_points: ``(B, Q, 4)`` the boxes the edges are measured from (no gradient).
        pred_boxes: ``(B, Q, 4)`` the layer's boxes (their IoU weights the loss).
        target_boxes: ``(B, Q, 4)`` each query's target (any value where unmatched).
        matched: ``(B, Q)`` bool.
        num_boxes: the batch's (or replicas' mean) target count.
        project, reg_scale: the decoder's ``W`` and ``reg_scale``.
    """
    bins = len(project)
    shape = ops.shape(corners)
    logits = ops.reshape(ops.cast(corners, "float32"), (shape[0], shape[1], 4, bins))
    index, left, right = (ops.stop_gradient(x) for x in edge_targets(
        ops.stop_gradient(ops.cast(ref_points, "float32")), target_boxes, project, reg_scale))
    log_probs = ops.log_softmax(logits, axis=-1)
    at_left = ops.take_along_axis(log_probs, index[..., None], axis=-1)[..., 0]
    at_right = ops.take_along_axis(log_probs, index[..., None] + 1, axis=-1)[..., 0]
    loss = -(at_left * left + at_right * right)  # (B, Q, 4)
    iou = ops.stop_gradient(_own_iou(pred_boxes, target_boxes))[..., None]
    return ops.sum(ops.where(matched[..., None], loss * iou, 0.0)) / num_boxes


def decoupled_distillation_loss(corners, teacher_corners, teacher_logits, pred_boxes,
                                target_boxes, matched, pred_valid=None, bins: int = 33):
    """DDF (see the module docstring) of one layer against its teacher.

    Args:
        corners: ``(B, Q, 4 * bins)`` the layer's edge logits.
        teacher_corners, teacher_logits: the last layer's edge and class logits (no
            gradient flows to them).
        pred_boxes, target_boxes, matched: as `fine_grained_localization_loss`'s.
        pred_valid: ``(B, Q)`` bool, the queries that take part (None: all).
        bins: ``max_num_bins + 1``.
    """
    shape = ops.shape(corners)
    size = (shape[0], shape[1], 4, bins)
    student = ops.log_softmax(ops.reshape(ops.cast(corners, "float32"), size) / TEMPERATURE,
                              axis=-1)
    teacher = ops.stop_gradient(ops.reshape(ops.cast(teacher_corners, "float32"), size))
    target_log = ops.log_softmax(teacher / TEMPERATURE, axis=-1)
    kl = ops.sum(ops.exp(target_log) * (target_log - student), axis=-1)  # (B, Q, 4)
    confidence = ops.max(ops.sigmoid(ops.cast(teacher_logits, "float32")), axis=-1)
    iou = _own_iou(pred_boxes, target_boxes)
    weight = ops.stop_gradient(ops.where(matched, iou, confidence))[..., None]
    loss = weight * TEMPERATURE**2 * kl
    taking = 1.0 if pred_valid is None else ops.cast(pred_valid, "float32")
    positive = ops.cast(matched, "float32") * taking  # (B, Q)
    negative = (1.0 - ops.cast(matched, "float32")) * taking
    n_pos, n_neg = 4.0 * ops.sum(positive), 4.0 * ops.sum(negative)  # edges
    mean_pos = ops.sum(loss * positive[..., None]) / ops.maximum(n_pos, 1.0)
    mean_neg = ops.sum(loss * negative[..., None]) / ops.maximum(n_neg, 1.0)
    batch = ops.cast(shape[0], "float32")
    root_pos, root_neg = ops.sqrt(n_pos / batch), ops.sqrt(n_neg / batch)
    return (mean_pos * root_pos + mean_neg * root_neg) / ops.maximum(root_pos + root_neg,
                                                                      1e-12)


def _own_iou(pred_boxes, target_boxes):
    return box_iou(box_cxcywh_to_xyxy(ops.cast(pred_boxes, "float32"))[..., None, :],
                   box_cxcywh_to_xyxy(ops.cast(target_boxes, "float32"))[..., None, :])[0][
        ..., 0, 0]


@keras.saving.register_keras_serializable(package="vision")
class DFineCriterion(SetCriterion):
    """RT-DETR's criterion with D-FINE's ``loss_fgl`` and ``loss_ddf`` (see the module
    docstring).

    Args:
        num_classes, matcher: as `SetCriterion`'s (varifocal classification).
        max_num_bins, reg_scale, up: the decoder's (its ``W``).
        **kwargs: `SetCriterion`'s other arguments; ``weight_dict`` defaults to D-FINE's
            (VFL 1, L1 5, GIoU 2, FGL 0.15, DDF 1.5).
    """

    def __init__(self, num_classes: int, matcher, max_num_bins: int = 32,
                 reg_scale: float = 4.0, up: float = 0.5, **kwargs):
        kwargs.setdefault("classification", "varifocal")
        kwargs.setdefault("weight_dict", {
            "loss_mal" if kwargs["classification"] == "matchability" else "loss_vfl": 1.0,
            "loss_bbox": 5.0, "loss_giou": 2.0, "loss_fgl": 0.15, "loss_ddf": 1.5})
        super().__init__(num_classes, matcher, **kwargs)
        self.max_num_bins, self.reg_scale, self.up = int(max_num_bins), float(reg_scale), \
            float(up)
        self.project = weighting_function(self.max_num_bins, self.up, self.reg_scale)

    def __call__(self, outputs: dict, targets: dict, num_boxes: Any = None) -> dict:
        outputs = _with_teacher(outputs)
        if "denoising" in outputs:
            outputs = {**outputs, "denoising": _with_teacher(outputs["denoising"])}
        return super().__call__(outputs, targets, num_boxes)

    def _losses_of_match(self, layer: dict, labels: Any, boxes: Any, indices: Any,
                         pred_valid: Any, num_boxes: Any, union: tuple | None = None) -> dict:
        losses = super()._losses_of_match(layer, labels, boxes, indices, pred_valid, num_boxes,
                                          union)
        if "pred_corners" not in layer:
            return losses
        indices, num_boxes = union or (indices, num_boxes)  # FGL and DDF: the box terms'
        matched, _, target_boxes = matched_targets(labels, boxes, indices)
        pred_boxes = ops.cast(layer["pred_boxes"], "float32")
        losses["loss_fgl"] = fine_grained_localization_loss(
            layer["pred_corners"], layer["ref_points"], pred_boxes, target_boxes, matched,
            num_boxes, self.project, self.reg_scale)
        if "teacher_corners" in layer:
            losses["loss_ddf"] = decoupled_distillation_loss(
                layer["pred_corners"], layer["teacher_corners"], layer["teacher_logits"],
                pred_boxes, target_boxes, matched, pred_valid, self.max_num_bins + 1)
        return losses

    def get_config(self) -> dict:
        return {**super().get_config(), "max_num_bins": self.max_num_bins,
                "reg_scale": self.reg_scale, "up": self.up}


def _with_teacher(outputs: dict) -> dict:
    """The outputs with ``ref_points`` in every layer's dict and, in each earlier layer's, the
    last layer's edge and class logits as ``teacher_corners`` / ``teacher_logits``."""
    if "pred_corners" not in outputs:
        return outputs
    ref = outputs["ref_points"]
    teacher = {"teacher_corners": ops.stop_gradient(outputs["pred_corners"]),
               "teacher_logits": ops.stop_gradient(outputs["pred_logits"])}
    aux = [{**layer, "ref_points": ref, **teacher} for layer in outputs.get("aux_outputs", [])]
    return {**outputs, "aux_outputs": aux}
