"""The geometry of DETR's object queries and DETR's own initialization.

The validity mask of the feature map, reference points and boxes (DAB-/Conditional DETR),
two-stage proposals from the encoder's cells (Deformable / Efficient DETR), iterative box
refinement, the cross-attention window around a reference point, and the PyTorch
initializations DETR relies on. `vision.model.DETR` uses them; ``keras.ops`` only.
"""

from __future__ import annotations

import math
from typing import Any

import keras
from keras import ops

from tfx_transformer import sine_features

__all__ = [
    "cell_centres",
    "grid_reference_logits",
    "near_points",
    "reference_embedding",
    "refine_boxes",
    "reset_transformer_parameters",
    "resize_mask",
    "select_proposals",
    "torch_linear_init",
]


def grid_reference_logits(num_queries: int) -> list[list[float]]:
    """Logits (inverse sigmoid) of ``num_queries`` points ``(x, y)`` on a grid over the image.

    ``ceil(sqrt(Q))`` columns and as many rows as needed, each point at its cell's centre.
    """
    side = math.ceil(math.sqrt(num_queries))
    rows = math.ceil(num_queries / side)  # the rows actually used, so the grid spans the image
    grid = [[((i % side) + 0.5) / side, ((i // side) + 0.5) / rows] for i in range(num_queries)]
    return [[math.log(v / (1.0 - v)) for v in point] for point in grid]


def reset_transformer_parameters(stack) -> None:
    """Re-initializes a Transformer stack as DETR's ``Transformer._reset_parameters`` does.

    DETR applies ``xavier_uniform_`` to every PyTorch weight matrix of its Transformer. Keras
    computes the fans of the 3-D attention kernels ``(d, H, k)`` as if they were conv kernels,
    which makes them about 3x smaller (and the attention logits about 9x flatter) than
    DETR's. Here each kernel gets the bound of its PyTorch matrix: the packed query/key/value
    projection ``(3d, d)`` gives ``sqrt(6 / 4d)``, the output projection ``(d, d)``
    ``sqrt(6 / 2d)``, the feed-forward ``(f, d)``/``(d, f)`` ``sqrt(6 / (d + f))``. Biases keep
    PyTorch's values: zero in attention, ``U(+-1/sqrt(fan_in))`` in the feed-forward layers.
    """
    def uniform(variable, bound):
        variable.assign(keras.random.uniform(variable.shape, -bound, bound, variable.dtype))

    for layer in stack.layers:
        for name in ("self_attention", "cross_attention"):
            attention = getattr(layer, name, None)
            if attention is None:
                continue
            d = attention.query_dense.kernel.shape[0]
            for dense in (attention.query_dense, attention.key_dense, attention.value_dense):
                uniform(dense.kernel, math.sqrt(6.0 / (4 * d)))
            out = attention.output_dense.kernel
            uniform(out, math.sqrt(6.0 / (out.shape[0] * out.shape[1] + out.shape[2])))
        for dense in (layer.feedforward.inner, layer.feedforward.outer):
            fan_in, fan_out = dense.kernel.shape
            uniform(dense.kernel, math.sqrt(6.0 / (fan_in + fan_out)))
            uniform(dense.bias, 1.0 / math.sqrt(fan_in))


def torch_linear_init(fan_in: int) -> dict:
    """PyTorch's default ``nn.Linear`` / ``nn.Conv2d`` initialization, used by DETR's heads."""
    bound = 1.0 / math.sqrt(fan_in)
    return dict(
        kernel_initializer=keras.initializers.VarianceScaling(1.0 / 3.0, "fan_in", "uniform"),
        bias_initializer=keras.initializers.RandomUniform(-bound, bound),
    )


def reference_embedding(points, hidden_dim: int, mlp, dtype="float32"):
    """``(B, Q, K)`` normalized points or cxcywh boxes -> ``(B, Q, d)`` query positions.

    The sine features (``y`` before ``x``, as `SinePositionEmbedding2D`'s layout) of
    each coordinate times 2π, through a two-layer MLP.
    """
    order = [1, 0] if points.shape[-1] == 2 else [1, 0, 2, 3]
    points = ops.take(points, order, axis=-1) * (2 * math.pi)
    query_pos = ops.cast(sine_features(points, hidden_dim // 2), dtype)
    for layer in mlp:
        query_pos = layer(query_pos)
    return query_pos


def cell_centres(feature_valid):
    """``(B, h, w)`` validity -> cell centres ``cx``, ``cy`` ``(B, h, w)`` normalized by the
    valid extent, and the valid width ``(B, h, 1)`` and height ``(B, 1, w)`` in cells."""
    valid = ops.cast(feature_valid, "float32")  # (B, h, w)
    cells_h = ops.sum(valid, axis=1, keepdims=True)  # (B, 1, w)
    cells_w = ops.sum(valid, axis=2, keepdims=True)  # (B, h, 1)
    cy = (ops.cumsum(valid, axis=1) - 0.5) / (cells_h + 1e-6)
    cx = (ops.cumsum(valid, axis=2) - 0.5) / (cells_w + 1e-6)
    return cx, cy, cells_w, cells_h


def select_proposals(memory, feature_valid, class_head, box_head, num_classes: int,
                     num_queries: int):
    """Two-stage queries: every cell's proposal, then the ``Q`` best as queries.

    Returns:
        ``(proposals, target, reference)``: ``proposals`` a dict with ``pred_logits``
        ``(B, S, C + 1)`` and ``pred_boxes`` ``(B, S, 4)`` (padded cells: certain
        no-object), ``target`` ``(B, Q, d)`` the chosen cells' features, ``reference``
        ``(B, Q, 4)`` the logits of their boxes, without gradient.
    """
    batch, q = ops.shape(memory)[0], num_queries
    cx, cy, cells_w, cells_h = cell_centres(feature_valid)
    width = 2.0 / ops.maximum(cells_w, 1.0) + ops.zeros_like(cx)  # (B, h, w): 2 cells
    height = 2.0 / ops.maximum(cells_h, 1.0) + ops.zeros_like(cy)
    anchors = ops.reshape(ops.stack([cx, cy, width, height], axis=-1), (batch, -1, 4))
    anchors = ops.clip(anchors, 0.01, 0.99)
    anchors = ops.log(anchors / (1.0 - anchors))  # (B, S, 4) logits
    valid = ops.reshape(feature_valid, (batch, -1))  # (B, S)
    logits = ops.cast(class_head(memory), "float32")  # (B, S, C + 1)
    no_object = ops.one_hot(num_classes, num_classes + 1) * 2e4 - 1e4
    logits = ops.where(valid[..., None], logits, no_object)
    boxes = memory
    for layer in box_head:
        boxes = layer(boxes)
    boxes = ops.cast(boxes, "float32") + anchors  # (B, S, 4) logits
    # "valid": padded cells are never matched and take no part in the loss.
    proposals = {"pred_logits": logits, "pred_boxes": ops.sigmoid(boxes), "valid": valid}

    # Object score of each cell; Q dummy candidates (never better than a valid cell)
    # keep top_k defined when the feature map has fewer than Q cells.
    score = ops.max(ops.softmax(ops.stop_gradient(logits), axis=-1)[..., :-1], axis=-1)
    score = ops.where(valid, score, -1.0)  # (B, S)
    score = ops.pad(score, [[0, 0], [0, q]], constant_values=-2.0)  # (B, S + Q)
    memory = ops.pad(memory, [[0, 0], [0, q], [0, 0]])
    boxes = ops.pad(ops.stop_gradient(boxes), [[0, 0], [0, q], [0, 0]])  # centre cells
    _, chosen = ops.top_k(score, q)  # (B, Q)
    target = ops.take_along_axis(memory, chosen[..., None], axis=1)  # (B, Q, d)
    reference = ops.take_along_axis(boxes, chosen[..., None], axis=1)  # (B, Q, 4)
    return proposals, target, reference


def near_points(feature_valid, points, radius: float):
    """``(B, Q, S)`` bool: valid feature cells within ``radius`` of each point (per axis).

    ``points`` is ``(B, Q, 2)`` normalized ``(cx, cy)``.

    A cell's coordinate is its centre normalized by the valid extent of its image, the
    same frame as the normalized boxes.
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


def refine_boxes(decoder, box_logits, position, target, memory, memory_pos, reference,
                 return_cross_attention: bool = False, training=None):
    """The decoder stack's layers one by one, each refining the reference boxes.

    Layer ``i`` is positioned by the boxes of layer ``i - 1`` (the proposals for the first):
    its query position embedding and attention window come from them, and its box is
    predicted as an offset from them in logit space (Deformable DETR's iterative bounding-box
    refinement, with DAB-DETR's box position embedding). No gradient flows through the
    reference boxes from one layer to the next.

    Args:
        decoder: a `TransformerDecoder` with a final norm (applied to every layer's output,
            as the stack's intermediate outputs).
        box_logits: ``(B, Q, d)`` -> ``(B, Q, 4)`` float32 box logits (the box head).
        position: ``(B, Q, 4)`` boxes -> ``(query_pos (B, Q, d), memory_mask)``.
        target: ``(B, Q, d)`` the first layer's input.
        memory, memory_pos: ``(B, S, d)`` encoder output and its position embedding.
        reference: ``(B, Q, 4)`` logits of the first layer's reference boxes.

    Returns:
        ``(hs, boxes, weights)``: ``(L, B, Q, d)`` normalized layer outputs, ``(L, B, Q, 4)``
        boxes, ``(L, B, heads, Q, S)`` cross-attention or None.
    """
    x, hs, boxes, weights = target, [], [], []
    for layer in decoder.layers:
        query_pos, mask = position(ops.sigmoid(reference))
        out = layer(
            x, memory, memory_mask=mask, query_pos=query_pos, memory_pos=memory_pos,
            return_cross_attention=return_cross_attention, training=training,
        )
        x, attention = out if return_cross_attention else (out, None)
        h = decoder.norm(x)  # (B, Q, d)
        box = box_logits(h) + reference  # (B, Q, 4) logits
        hs.append(h)
        boxes.append(ops.sigmoid(box))
        weights.append(attention)
        reference = ops.stop_gradient(box)
    weights = ops.stack(weights, axis=0) if return_cross_attention else None
    return ops.stack(hs, axis=0), ops.stack(boxes, axis=0), weights
