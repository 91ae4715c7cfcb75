"""Detections from the detectors' outputs: the one place where predictions become boxes and
scores (`postprocess`: DETR's softmax; `rtdetr_postprocess`: RT-DETR's sigmoid scores).

``keras.ops`` only, with static shapes (no filtering that changes the number of queries), so
that it can be part of an exported graph.
"""

from __future__ import annotations

from typing import Any

from keras import ops

from vision.modeling.box_ops import box_cxcywh_to_xyxy

__all__ = ["postprocess", "rtdetr_postprocess"]


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


def rtdetr_postprocess(outputs: dict, image_sizes: Any, threshold: float | None = None) -> dict:
    """Detections from sigmoid class scores, as transformers' RT-DETR image processors'
    ``post_process_object_detection`` (``use_focal_loss=True``): the ``Q`` best of all
    ``Q * C`` (query, class) scores, highest first, each with its query's box.

    Args:
        outputs: dict with ``"pred_logits"`` ``(B, Q, C)`` and ``"pred_boxes"`` ``(B, Q, 4)``
            normalized cxcywh.
        image_sizes: ``(B, 2)``: each image's ``(height, width)`` for the pixel boxes.
        threshold: ``keep`` marks the scores above it (all True without one).

    Returns:
        dict with ``"scores"`` ``(B, Q)``, ``"labels"`` ``(B, Q)`` int32, ``"boxes"``
        ``(B, Q, 4)`` xyxy pixels and ``"keep"`` ``(B, Q)`` bool.
    """
    logits = ops.cast(outputs["pred_logits"], "float32")
    boxes = ops.cast(outputs["pred_boxes"], "float32")
    if len(logits.shape) != 3 or len(boxes.shape) != 3 or boxes.shape[-1] != 4:
        raise ValueError("`outputs` must have 'pred_logits' (B, Q, C) and 'pred_boxes' "
                         f"(B, Q, 4). Received: shapes {tuple(logits.shape)} and "
                         f"{tuple(boxes.shape)}")
    queries, classes = logits.shape[1], logits.shape[2]
    scores, index = ops.top_k(ops.reshape(ops.sigmoid(logits), (-1, queries * classes)),
                              queries)  # (B, Q) each
    labels = ops.cast(index % classes, "int32")
    chosen = ops.take_along_axis(boxes, (index // classes)[..., None], axis=1)  # (B, Q, 4)
    sizes = ops.cast(image_sizes, "float32")
    scale = ops.stack([sizes[:, 1], sizes[:, 0], sizes[:, 1], sizes[:, 0]], axis=-1)[:, None]
    keep = ops.ones_like(scores, dtype="bool") if threshold is None else scores > threshold
    return {"scores": scores, "labels": labels, "boxes": box_cxcywh_to_xyxy(chosen) * scale,
            "keep": keep}
