"""DETR's matching cost and the matcher that solves it (``models/matcher.py`` of DETR).

`HungarianMatcher` builds the cost of matching each prediction to each ground-truth object and
solves the assignment exactly with `vision.matching.assignment.assign`: DETR's softmax class
cost, or RT-DETR's focal one for sigmoid class scores (``classification="focal"``).
"""

from __future__ import annotations

from typing import Any

import keras
from keras import ops

from vision.matching.assignment import SOLVERS, assign
from vision.modeling.box_ops import box_cxcywh_to_xyxy, generalized_box_iou

__all__ = ["CLASSIFICATIONS", "HungarianMatcher"]

CLASSIFICATIONS = ("softmax", "focal")


# Cost of a prediction that must not be matched: far above any real cost (with DETR's
# weights at most 5 * 4 + 1 + 2 * 2), small enough to keep float32 precision in the solvers.
_INVALID_COST = 1e4


@keras.saving.register_keras_serializable(package="vision")
class HungarianMatcher:
    """Optimal one-to-one matching of DETR predictions to ground-truth objects.

    The cost of matching query `q` to target `m` is, exactly as in DETR,
    ``cost_bbox * L1(box_q, box_m) - cost_class * softmax(logits_q)[label_m]
    - cost_giou * GIoU(xyxy(box_q), xyxy(box_m))``, with L1 on normalized cxcywh boxes.
    With ``classification="focal"`` (RT-DETR, D-FINE: one sigmoid per class, no no-object
    logit) the class term is the focal cost of ``p = sigmoid(logits_q)[label_m]``:
    ``cost_class * (alpha (1 - p)^gamma (-log(p + 1e-8)) - (1 - alpha) p^gamma
    (-log(1 - p + 1e-8)))``. No gradient flows through the matching.

    Args:
        cost_class: Weight of the classification term.
        cost_bbox: Weight of the L1 box term.
        cost_giou: Weight of the GIoU term.
        solver: ``"scipy"`` or ``"ops"``; see `vision.matching.assignment.assign`. ``"scipy"``
            needs a train step compiled with ``jit_compile=False``.
        classification: ``"softmax"`` (DETR) or ``"focal"`` (sigmoid scores).
        alpha, gamma: of the focal cost (RT-DETR's ``matcher_alpha``, ``matcher_gamma``).

    Call arguments:
        pred_logits: `(B, Q, C + 1)` class logits, last index = no-object (``"focal"``:
            `(B, Q, C)`).
        pred_boxes: `(B, Q, 4)` predicted boxes, normalized cxcywh.
        labels: `(B, M)` int target classes in `[0, C)` (any value where padded).
        boxes: `(B, M, 4)` target boxes, normalized cxcywh.
        valid: `(B, M)` bool, True for real targets.
        pred_valid: optional `(B, Q)` bool, False for predictions that must stay unmatched
            (e.g. two-stage proposals of padded feature cells); their cost is made
            prohibitive, and any match they still get (more targets than valid predictions)
            is dropped.

    Returns:
        `(B, Q)` int32: matched target index per query, -1 where unmatched.
    """

    def __init__(
        self,
        cost_class: float = 1.0,
        cost_bbox: float = 5.0,
        cost_giou: float = 2.0,
        solver: str = "scipy",
        classification: str = "softmax",
        alpha: float = 0.25,
        gamma: float = 2.0,
    ) -> None:
        if cost_class == 0 and cost_bbox == 0 and cost_giou == 0:
            raise ValueError(
                "At least one of `cost_class`, `cost_bbox`, `cost_giou` must be non-zero. "
                "Received: all three are 0"
            )
        if solver not in SOLVERS:
            raise ValueError(f"`solver` must be one of {SOLVERS}. Received: solver={solver!r}")
        self.cost_class = float(cost_class)
        self.cost_bbox = float(cost_bbox)
        self.cost_giou = float(cost_giou)
        self.solver = solver
        if classification not in CLASSIFICATIONS:
            raise ValueError(f"`classification` must be one of {CLASSIFICATIONS}. "
                             f"Received: classification={classification!r}")
        self.classification = classification
        self.alpha = float(alpha)
        self.gamma = float(gamma)

    def cost_matrix(self, pred_logits: Any, pred_boxes: Any, labels: Any, boxes: Any) -> Any:
        """DETR's matching cost; same arguments as `__call__` (without `valid`).

        Returns:
            float32 tensor of shape `(B, Q, M)`.
        """
        logits = ops.stop_gradient(ops.cast(pred_logits, "float32"))
        pred = ops.stop_gradient(ops.cast(pred_boxes, "float32"))
        target = ops.cast(boxes, "float32")
        labels = ops.convert_to_tensor(labels)
        _check_rank(logits, "pred_logits", 3, "(B, Q, C)" if self.classification == "focal"
                    else "(B, Q, C + 1)")
        _check_shape(pred, "pred_boxes", "(B, Q, 4)")
        _check_rank(labels, "labels", 2, "(B, M)")
        _check_shape(target, "boxes", "(B, M, 4)")
        focal = self.classification == "focal"
        prob = ops.sigmoid(logits) if focal else ops.softmax(logits, axis=-1)  # (B, Q, C[+1])
        label_one_hot = ops.one_hot(ops.cast(labels, "int32"), logits.shape[-1])  # (B, M, C[+1])
        prob_of_label = ops.einsum("bqc,bmc->bqm", prob, label_one_hot)  # (B, Q, M)
        if focal:
            p, a, g = prob_of_label, self.alpha, self.gamma
            class_cost = (a * (1 - p) ** g * -ops.log(p + 1e-8)
                          - (1 - a) * p ** g * -ops.log(1 - p + 1e-8))
        else:
            class_cost = -prob_of_label
        l1 = ops.sum(ops.abs(pred[:, :, None, :] - target[:, None, :, :]), axis=-1)  # (B, Q, M)
        giou = generalized_box_iou(box_cxcywh_to_xyxy(pred), box_cxcywh_to_xyxy(target))
        return self.cost_bbox * l1 + self.cost_class * class_cost - self.cost_giou * giou

    def __call__(
        self, pred_logits: Any, pred_boxes: Any, labels: Any, boxes: Any, valid: Any,
        pred_valid: Any = None,
    ) -> Any:
        cost = self.cost_matrix(pred_logits, pred_boxes, labels, boxes)
        if pred_valid is None:
            return ops.stop_gradient(assign(cost, valid, solver=self.solver))
        pred_valid = ops.cast(pred_valid, "bool")
        cost = ops.where(pred_valid[..., None], cost, _INVALID_COST)  # (B, Q, M)
        indices = assign(cost, valid, solver=self.solver)
        return ops.stop_gradient(ops.where(pred_valid, indices, -1))

    def get_config(self) -> dict:
        return {
            "cost_class": self.cost_class,
            "cost_bbox": self.cost_bbox,
            "cost_giou": self.cost_giou,
            "solver": self.solver,
            "classification": self.classification,
            "alpha": self.alpha,
            "gamma": self.gamma,
        }

    @classmethod
    def from_config(cls, config: dict) -> HungarianMatcher:
        return cls(**config)


def _check_rank(x: Any, name: str, rank: int, expected: str) -> None:
    if len(x.shape) != rank:
        raise ValueError(f"`{name}` must have shape {expected}. Received: shape={tuple(x.shape)}")


def _check_shape(x: Any, name: str, expected: str) -> None:
    _check_rank(x, name, 3, expected)
    if x.shape[-1] is not None and x.shape[-1] != 4:
        raise ValueError(f"`{name}` must have shape {expected}. Received: shape={tuple(x.shape)}")
