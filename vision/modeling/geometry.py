"""Geometry of the feature map: resized validity, cell centres, windows, anchors, grids.

Coordinates are normalized by the *valid* extent of each image (the frame of the normalized
target boxes), so a padded image and the same image alone see the same numbers. ``keras.ops``
only.
"""

from __future__ import annotations

import math
from typing import Any

from keras import ops

__all__ = ["cell_anchors", "cell_centres", "grid_reference_logits", "near_points",
           "resize_mask"]


def resize_mask(valid: Any, height: Any, width: Any) -> Any:
    """Nearest-neighbour resize of a boolean mask, as PyTorch's ``F.interpolate`` in DETR.

    Output pixel ``(i, j)`` takes input pixel ``(floor(i * H / height), floor(j * W /
    width))``.

    Args:
        valid: ``(B, H, W)`` bool.
        height, width: output size (ints or scalar tensors).

    Returns:
        ``(B, height, width)`` bool.
    """
    shape = ops.shape(valid)
    rows = ops.floor_divide(ops.arange(height, dtype="int32") * shape[1], height)  # (height,)
    cols = ops.floor_divide(ops.arange(width, dtype="int32") * shape[2], width)  # (width,)
    return ops.take(ops.take(valid, rows, axis=1), cols, axis=2)


def cell_centres(feature_valid: Any) -> tuple[Any, Any, Any, Any]:
    """Centres of the feature cells, normalized by the valid extent of each image.

    Args:
        feature_valid: ``(B, h, w)`` bool, ``True`` = a cell of the image (valid pixels are
            a top-left rectangle).

    Returns:
        ``(cx, cy, cells_w, cells_h)``: ``cx``, ``cy`` ``(B, h, w)`` float32 centres, and the
        valid width ``(B, h, 1)`` and height ``(B, 1, w)`` in cells.
    """
    valid = ops.cast(feature_valid, "float32")  # (B, h, w)
    cells_h = ops.sum(valid, axis=1, keepdims=True)  # (B, 1, w)
    cells_w = ops.sum(valid, axis=2, keepdims=True)  # (B, h, 1)
    cy = (ops.cumsum(valid, axis=1) - 0.5) / (cells_h + 1e-6)
    cx = (ops.cumsum(valid, axis=2) - 0.5) / (cells_w + 1e-6)
    return cx, cy, cells_w, cells_h


def cell_anchors(feature_valid: Any) -> Any:
    """Logits (inverse sigmoid) of an anchor box per cell: 2 x 2 cells at the cell's centre.

    Args:
        feature_valid: ``(B, h, w)`` bool.

    Returns:
        ``(B, S = h * w, 4)`` float32 logits of ``(cx, cy, w, h)``, clipped to
        ``[0.01, 0.99]`` before the logit.
    """
    batch = ops.shape(feature_valid)[0]
    cx, cy, cells_w, cells_h = cell_centres(feature_valid)
    width = 2.0 / ops.maximum(cells_w, 1.0) + ops.zeros_like(cx)  # (B, h, w): 2 cells
    height = 2.0 / ops.maximum(cells_h, 1.0) + ops.zeros_like(cy)
    anchors = ops.reshape(ops.stack([cx, cy, width, height], axis=-1), (batch, -1, 4))
    anchors = ops.clip(anchors, 0.01, 0.99)
    return ops.log(anchors / (1.0 - anchors))  # (B, S, 4)


def near_points(feature_valid: Any, points: Any, radius: float) -> Any:
    """Valid feature cells within ``radius`` of each point, per axis.

    Args:
        feature_valid: ``(B, h, w)`` bool.
        points: ``(B, Q, 2)`` normalized ``(cx, cy)`` (no gradient flows through them).
        radius: distance per axis, in normalized image coordinates.

    Returns:
        ``(B, Q, S = h * w)`` bool.
    """
    batch = ops.shape(feature_valid)[0]
    cx, cy, _, _ = cell_centres(feature_valid)
    cx = ops.reshape(cx, (batch, 1, -1))  # (B, 1, S)
    cy = ops.reshape(cy, (batch, 1, -1))
    points = ops.stop_gradient(points)[..., None]  # (B, Q, 2, 1)
    near = ops.logical_and(
        ops.abs(cx - points[:, :, 0]) <= radius,
        ops.abs(cy - points[:, :, 1]) <= radius,
    )  # (B, Q, S)
    return ops.logical_and(near, ops.reshape(feature_valid, (batch, 1, -1)))


def grid_reference_logits(num_queries: int) -> list[list[float]]:
    """Logits (inverse sigmoid) of ``num_queries`` points ``(x, y)`` on a grid over the image.

    ``ceil(sqrt(Q))`` columns and as many rows as needed, each point at its cell's centre.

    Returns:
        ``Q`` pairs ``[logit(x), logit(y)]``, row by row.
    """
    side = math.ceil(math.sqrt(num_queries))
    rows = math.ceil(num_queries / side)  # the rows actually used, so the grid spans the image
    grid = [[((i % side) + 0.5) / side, ((i // side) + 0.5) / rows] for i in range(num_queries)]
    return [[math.log(v / (1.0 - v)) for v in point] for point in grid]
