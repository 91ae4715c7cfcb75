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
    x0, y0, x1, y1 = ops.unstack(_as_boxes(boxes, "boxes"), num=4, axis=-1)
    return (x1 - x0) * (y1 - y0)


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
    return _iou_and_union(*_corners(boxes1, boxes2))


def _corners(boxes1: Any, boxes2: Any) -> tuple[list, list]:
    """The coordinates ``x0, y0, x1, y1`` of ``boxes1`` as ``(..., N, 1)`` and of ``boxes2``
    as ``(..., 1, M)``: one split each, where slicing them out took a graph node (and its
    gradient's) per coordinate, a share of every traced detection loss."""
    return (ops.unstack(ops.expand_dims(boxes1, -2), num=4, axis=-1),
            ops.unstack(ops.expand_dims(boxes2, -3), num=4, axis=-1))


def _iou_and_union(corners1: list, corners2: list) -> tuple[Any, Any]:
    (ax0, ay0, ax1, ay1), (bx0, by0, bx1, by1) = corners1, corners2
    width = ops.maximum(ops.minimum(ax1, bx1) - ops.maximum(ax0, bx0), 0.0)  # (..., N, M)
    height = ops.maximum(ops.minimum(ay1, by1) - ops.maximum(ay0, by0), 0.0)
    inter = width * height
    area1 = (ax1 - ax0) * (ay1 - ay0)  # (..., N, 1)
    area2 = (bx1 - bx0) * (by1 - by0)  # (..., 1, M)
    union = area1 + area2 - inter  # (..., N, M)
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
    corners1, corners2 = _corners(boxes1, boxes2)
    iou, union = _iou_and_union(corners1, corners2)
    (ax0, ay0, ax1, ay1), (bx0, by0, bx1, by1) = corners1, corners2
    width = ops.maximum(ops.maximum(ax1, bx1) - ops.minimum(ax0, bx0), 0.0)  # (..., N, M)
    height = ops.maximum(ops.maximum(ay1, by1) - ops.minimum(ay0, by0), 0.0)
    enclosing = width * height
    return iou - _safe_divide(enclosing - union, enclosing)
