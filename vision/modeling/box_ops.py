"""Bounding-box arithmetic: format conversion, area, pairwise IoU and generalized IoU.

Two box formats are used throughout `vision`:

- ``cxcywh``: ``(center_x, center_y, width, height)``, what the detector predicts;
- ``xyxy``: ``(x0, y0, x1, y1)`` with ``x0 <= x1`` and ``y0 <= y1``, what IoU is computed on.

The formulas follow facebookresearch/detr (``util/box_ops.py``) exactly, with one deliberate
difference: every division is "safe". Where a denominator is zero (a union of two zero-area
boxes, or an enclosing box of zero area) the quotient is defined as 0 instead of NaN, and the
gradient through it is finite as well. For boxes of positive area the values are unchanged.

Only ``keras.ops`` is used, so these functions run under every Keras backend and inside XLA.
"""

from __future__ import annotations

from typing import Any

import keras
from keras import ops

__all__ = [
    "box_area",
    "box_cxcywh_to_xyxy",
    "box_iou",
    "box_xyxy_to_cxcywh",
    "generalized_box_iou",
]


def _as_boxes(boxes: Any, name: str, min_rank: int = 1) -> Any:
    """Converts `boxes` to a floating tensor and checks that its last axis has size 4."""
    boxes = ops.convert_to_tensor(boxes)
    if not _is_float(boxes.dtype):
        boxes = ops.cast(boxes, keras.config.floatx())
    shape = tuple(boxes.shape)
    if len(shape) < 1 or (shape[-1] is not None and shape[-1] != 4):
        raise ValueError(f"`{name}` must have shape (..., 4). Received: shape={shape}")
    if len(shape) < min_rank:
        raise ValueError(f"`{name}` must have shape (N, 4) or (..., N, 4). Received: shape={shape}")
    return boxes


def _is_float(dtype: Any) -> bool:
    return "float" in keras.backend.standardize_dtype(dtype)


def _safe_divide(numerator: Any, denominator: Any) -> Any:
    """`numerator / denominator`, and 0 where `denominator` is 0 (finite value and gradient)."""
    nonzero = ops.not_equal(denominator, 0)
    # The inner `where` keeps the untaken branch finite, so its gradient is not NaN either.
    safe = ops.where(nonzero, denominator, ops.ones_like(denominator))
    return ops.where(nonzero, numerator / safe, ops.zeros_like(numerator))


def box_cxcywh_to_xyxy(boxes: Any) -> Any:
    """Converts boxes from ``(cx, cy, w, h)`` to ``(x0, y0, x1, y1)``.

    Args:
        boxes: Tensor of shape `(..., 4)` in cxcywh format.

    Returns:
        Tensor of shape `(..., 4)` in xyxy format.
    """
    boxes = _as_boxes(boxes, "boxes")
    cx, cy, w, h = ops.unstack(boxes, num=4, axis=-1)
    return ops.stack([cx - 0.5 * w, cy - 0.5 * h, cx + 0.5 * w, cy + 0.5 * h], axis=-1)


def box_xyxy_to_cxcywh(boxes: Any) -> Any:
    """Converts boxes from ``(x0, y0, x1, y1)`` to ``(cx, cy, w, h)``.

    Args:
        boxes: Tensor of shape `(..., 4)` in xyxy format.

    Returns:
        Tensor of shape `(..., 4)` in cxcywh format.
    """
    boxes = _as_boxes(boxes, "boxes")
    x0, y0, x1, y1 = ops.unstack(boxes, num=4, axis=-1)
    return ops.stack([(x0 + x1) / 2, (y0 + y1) / 2, x1 - x0, y1 - y0], axis=-1)


def box_area(boxes: Any) -> Any:
    """Area ``(x1 - x0) * (y1 - y0)`` of xyxy boxes (as torchvision: no clamping).

    Args:
        boxes: Tensor of shape `(..., 4)` in xyxy format.

    Returns:
        Tensor of shape `(...)`.
    """
    boxes = _as_boxes(boxes, "boxes")
    return (boxes[..., 2] - boxes[..., 0]) * (boxes[..., 3] - boxes[..., 1])


def box_iou(boxes1: Any, boxes2: Any) -> tuple[Any, Any]:
    """Pairwise intersection over union of two sets of xyxy boxes.

    Leading batch axes are allowed and broadcast: `(..., N, 4)` and `(..., M, 4)` give
    `(..., N, M)`.

    Args:
        boxes1: Tensor of shape `(N, 4)` or `(..., N, 4)`, xyxy.
        boxes2: Tensor of shape `(M, 4)` or `(..., M, 4)`, xyxy.

    Returns:
        A tuple `(iou, union)`, both of shape `(..., N, M)`. `iou` is 0 where `union` is 0.

    Raises:
        ValueError: If an argument's last axis is not 4 or its rank is below 2.
    """
    boxes1 = _as_boxes(boxes1, "boxes1", min_rank=2)
    boxes2 = _as_boxes(boxes2, "boxes2", min_rank=2)
    return _iou_and_union(boxes1, boxes2)


def _iou_and_union(boxes1: Any, boxes2: Any) -> tuple[Any, Any]:
    b1 = ops.expand_dims(boxes1, -2)  # (..., N, 1, 4)
    b2 = ops.expand_dims(boxes2, -3)  # (..., 1, M, 4)
    top_left = ops.maximum(b1[..., :2], b2[..., :2])  # (..., N, M, 2)
    bottom_right = ops.minimum(b1[..., 2:], b2[..., 2:])  # (..., N, M, 2)
    wh = ops.maximum(bottom_right - top_left, 0.0)
    inter = wh[..., 0] * wh[..., 1]  # (..., N, M)
    area1 = (boxes1[..., 2] - boxes1[..., 0]) * (boxes1[..., 3] - boxes1[..., 1])  # (..., N)
    area2 = (boxes2[..., 2] - boxes2[..., 0]) * (boxes2[..., 3] - boxes2[..., 1])  # (..., M)
    union = ops.expand_dims(area1, -1) + ops.expand_dims(area2, -2) - inter  # (..., N, M)
    return _safe_divide(inter, union), union


def generalized_box_iou(boxes1: Any, boxes2: Any) -> Any:
    """Pairwise generalized IoU (Rezatofighi et al., 2019) of two sets of xyxy boxes.

    ``giou = iou - (enclosing_area - union) / enclosing_area``, in ``[-1, 1]``. Leading batch
    axes are allowed and broadcast: `(..., N, 4)` and `(..., M, 4)` give `(..., N, M)`; with
    `(..., N, 1, 4)` and `(..., N, 1, 4)` it gives the element-wise GIoU of matched pairs as
    `(..., N, 1, 1)`.

    Degenerate boxes (zero width or height) are legal: each 0/0 term is taken as 0, so the
    result is always finite. Boxes with ``x1 < x0`` or ``y1 < y0`` are not checked (they cannot
    be checked inside a compiled graph) and give meaningless but finite values.

    Args:
        boxes1: Tensor of shape `(N, 4)` or `(..., N, 4)`, xyxy.
        boxes2: Tensor of shape `(M, 4)` or `(..., M, 4)`, xyxy.

    Returns:
        Tensor of shape `(..., N, M)`.

    Raises:
        ValueError: If an argument's last axis is not 4 or its rank is below 2.
    """
    boxes1 = _as_boxes(boxes1, "boxes1", min_rank=2)
    boxes2 = _as_boxes(boxes2, "boxes2", min_rank=2)
    iou, union = _iou_and_union(boxes1, boxes2)
    b1 = ops.expand_dims(boxes1, -2)  # (..., N, 1, 4)
    b2 = ops.expand_dims(boxes2, -3)  # (..., 1, M, 4)
    top_left = ops.minimum(b1[..., :2], b2[..., :2])  # (..., N, M, 2)
    bottom_right = ops.maximum(b1[..., 2:], b2[..., 2:])  # (..., N, M, 2)
    wh = ops.maximum(bottom_right - top_left, 0.0)
    enclosing = wh[..., 0] * wh[..., 1]  # (..., N, M)
    return iou - _safe_divide(enclosing - union, enclosing)
