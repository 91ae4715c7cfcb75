"""Detections from DETR's outputs: the one place where predictions become boxes and scores.

``keras.ops`` only, with static shapes (no filtering that changes the number of queries), so
that it can be part of an exported graph.
"""

from __future__ import annotations

from typing import Any

from keras import ops

from vision.modeling.box_ops import box_cxcywh_to_xyxy

__all__ = ["postprocess"]


def postprocess(outputs: dict, image_sizes: Any, threshold: float | None = None) -> dict:
    """Scores, labels and pixel boxes of every query, as DETR's ``PostProcess``.

    The class probabilities are the softmax over ``C + 1`` logits; the no-object class is
    dropped, and a query's score and label are the maximum probability over the ``C`` real
    classes and its index. Boxes are converted from normalized cxcywh to xyxy pixels of the
    original image, ``(x0 * w, y0 * h, x1 * w, y1 * h)``.

    Args:
        outputs: dict with ``"pred_logits"`` ``(B, Q, C + 1)`` and ``"pred_boxes"``
            ``(B, Q, 4)`` normalized cxcywh (other keys are ignored).
        image_sizes: ``(B, 2)``: the original ``(height, width)`` of each image.
        threshold: optional score threshold; ``keep`` marks queries with
            ``score > threshold``.

    Returns:
        dict with ``"scores"`` ``(B, Q)`` float32, ``"labels"`` ``(B, Q)`` int32 in ``[0, C)``,
        ``"boxes"`` ``(B, Q, 4)`` float32 xyxy pixels, and ``"keep"`` ``(B, Q)`` bool (all
        True without a threshold).
    """
    logits = ops.cast(outputs["pred_logits"], "float32")
    boxes = ops.cast(outputs["pred_boxes"], "float32")
    if len(logits.shape) != 3 or (logits.shape[-1] is not None and logits.shape[-1] < 2):
        raise ValueError(
            "`outputs['pred_logits']` must have shape (B, Q, C + 1) with C >= 1. "
            f"Received: shape={tuple(logits.shape)}"
        )
    if len(boxes.shape) != 3 or boxes.shape[-1] != 4:
        raise ValueError(
            "`outputs['pred_boxes']` must have shape (B, Q, 4). "
            f"Received: shape={tuple(boxes.shape)}"
        )
    sizes = ops.cast(image_sizes, "float32")
    if len(sizes.shape) != 2 or sizes.shape[-1] != 2:
        raise ValueError(
            f"`image_sizes` must have shape (B, 2) of (height, width). "
            f"Received: shape={tuple(sizes.shape)}"
        )
    probs = ops.softmax(logits, axis=-1)[..., :-1]  # (B, Q, C): no-object dropped
    # The maximum and its index (the lower one on ties, as argmax) by top_k: a float argmax of
    # Keras's TensorFlow backend adds a bitwise op that LiteRT has no builtin kernel for.
    top_scores, top_labels = ops.top_k(probs, 1)  # (B, Q, 1) each
    scores = top_scores[..., 0]  # (B, Q)
    labels = ops.cast(top_labels[..., 0], "int32")  # (B, Q)
    height, width = sizes[:, 0], sizes[:, 1]  # (B,)
    scale = ops.stack([width, height, width, height], axis=-1)[:, None, :]  # (B, 1, 4)
    pixel_boxes = box_cxcywh_to_xyxy(boxes) * scale  # (B, Q, 4)
    keep = ops.ones_like(scores, dtype="bool") if threshold is None else scores > threshold
    return {"scores": scores, "labels": labels, "boxes": pixel_boxes, "keep": keep}
