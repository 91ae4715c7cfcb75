"""The decoder side of DETR: how the decoder layers are positioned and boxes predicted.

Two strategies with one contract, ``decoding(decoder, box_head, queries, start, memory,
memory_pos, feature_valid) -> DecodedQueries``:

- `StaticReferences`: every layer is positioned by the query strategy's output (one call of
  the decoder stack); each layer's box is an offset from the reference, if there is one.
- `IterativeRefinement`: the layers one by one; layer ``i`` is positioned by the boxes of
  layer ``i - 1`` (Deformable DETR's iterative box refinement with DAB-DETR's box position
  embedding), using only the decoder's public ``layers`` and ``normalize``; with
  ``look_forward_twice`` (DINO) each layer's box is an offset from the previous layer's
  box with its gradient, so a layer's loss also trains the layer before it.

Both own the cross-attention window (``attention_radius``): each query attends only to the
feature cells within that distance of its reference point. ``keras.ops`` only.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from keras import ops

from tfx_transformer import checks
from vision.modeling.geometry import near_points

__all__ = ["BoxDecoding", "DecodedQueries", "IterativeRefinement", "StaticReferences",
           "make_box_decoding"]


class DecodedQueries(NamedTuple):
    """The decoder's result for ``L`` layers, ``B`` images, ``Q`` queries.

    Attributes:
        hidden: ``(L, B, Q, d)`` every layer's output after the decoder's final norm.
        boxes: ``(L, B, Q, 4)`` float32 normalized cxcywh boxes of every layer.
        attention: ``(L, B, heads, Q, S)`` cross-attention weights, or ``None`` unless asked.
    """

    hidden: Any
    boxes: Any
    attention: Any | None


def _offsets(reference):
    """``(B, Q, 2)`` point or ``(B, Q, 4)`` box logits -> ``(B, Q, 4)`` box offsets."""
    if reference.shape[-1] == 2:  # points shift the centres only
        return ops.pad(reference, [[0, 0], [0, 0], [0, 2]])
    return reference


class BoxDecoding:
    """How the decoder turns the queries into boxes; owns the cross-attention window.

    Args:
        attention_radius: limit each query's cross-attention to the cells within this
            distance (normalized, per axis) of its reference point; ``None``: the whole image.

    Call arguments:
        decoder: a `tfx_transformer.TransformerDecoder` with a final norm and
            ``return_intermediate=True``.
        box_head: ``(..., d)`` -> ``(..., 4)`` box logits (`vision.modeling.heads.MLP`).
        queries: the query strategy layer (its ``embed`` positions refined boxes).
        start: its `vision.modeling.queries.QueryOutput`.
        memory: ``(B, S, d)`` encoder output; memory_pos: ``(B, S, d)`` its positions.
        feature_valid: ``(B, h, w)`` bool validity of the feature cells (``S = h * w``).
        return_cross_attention: also return the cross-attention weights.
        training: enables dropout.

    Returns:
        `DecodedQueries`.
    """

    def __init__(self, attention_radius: float | None = None):
        self.attention_radius = attention_radius

    def memory_mask(self, feature_valid, reference):
        """``(B, S)`` cell validity, or ``(B, Q, S)`` the valid cells near each reference."""
        if self.attention_radius is None:
            return ops.reshape(feature_valid, (ops.shape(feature_valid)[0], -1))
        points = ops.sigmoid(reference[..., :2])  # (B, Q, 2) cx, cy
        return near_points(feature_valid, points, self.attention_radius)

    def __call__(self, decoder, box_head, queries, start, memory, memory_pos, feature_valid,
                 return_cross_attention: bool = False, training=None) -> DecodedQueries:
        raise NotImplementedError


class StaticReferences(BoxDecoding):
    """All decoder layers positioned by the query strategy's output, in one stack call.

    Each layer's box is an offset (logit space) from the strategy's reference, if it has
    one. Arguments and results as `BoxDecoding`.
    """

    def __call__(self, decoder, box_head, queries, start, memory, memory_pos, feature_valid,
                 return_cross_attention: bool = False, training=None) -> DecodedQueries:
        decoded = decoder(
            start.content, memory, memory_mask=self.memory_mask(feature_valid, start.reference),
            query_pos=start.position, memory_pos=memory_pos,
            self_attention_mask=start.self_attention_mask,
            return_cross_attention=return_cross_attention, training=training,
        )  # output (L, B, Q, d), attention (L, B, heads, Q, S) or None
        boxes = ops.cast(box_head(decoded.output), "float32")  # (L, B, Q, 4) logits
        if start.reference is not None:
            boxes = boxes + _offsets(start.reference)  # broadcasts over L
        return DecodedQueries(decoded.output, ops.sigmoid(boxes), decoded.attention)


class IterativeRefinement(BoxDecoding):
    """The decoder layers one by one, each refining the boxes of the previous one.

    Layer ``i`` is positioned by the boxes of layer ``i - 1`` (the query strategy's
    reference boxes and position for the first): its query position is
    ``queries.embed(boxes)`` and its attention window is centred on them, and its box is
    predicted as an offset from them in logit space. No gradient flows through the boxes that
    position a layer. Without ``look_forward_twice`` (Deformable DETR) the offset is from
    those boxes, so no gradient flows from one layer's box to the next either; with it
    (DINO's look forward twice) the offset is from the previous layer's predicted box with
    its gradient. Needs a query strategy with reference boxes (``reference_size`` 4).
    Arguments and results as `BoxDecoding`.

    Args:
        attention_radius: as `BoxDecoding`.
        look_forward_twice: offsets from the previous layer's box with its gradient.
    """

    def __init__(self, attention_radius: float | None = None, look_forward_twice: bool = False):
        super().__init__(attention_radius)
        self.look_forward_twice = look_forward_twice

    def __call__(self, decoder, box_head, queries, start, memory, memory_pos, feature_valid,
                 return_cross_attention: bool = False, training=None) -> DecodedQueries:
        x, position, reference = start.content, start.position, start.reference
        previous = reference  # the box the next offset is from (logits)
        hidden, boxes, attention = [], [], []
        for i, layer in enumerate(decoder.layers):
            if i:
                position = queries.embed(ops.sigmoid(reference))  # (B, Q, d)
            out = layer(
                x, memory, memory_mask=self.memory_mask(feature_valid, reference),
                query_pos=position, memory_pos=memory_pos,
                self_attention_mask=start.self_attention_mask,
                return_cross_attention=return_cross_attention, training=training,
            )
            x = out.output  # (B, Q, d)
            h = decoder.normalize(x)  # as the stack's intermediate outputs
            box = ops.cast(box_head(h), "float32") + previous  # (B, Q, 4) logits
            hidden.append(h)
            boxes.append(ops.sigmoid(box))
            attention.append(out.attention)
            reference = ops.stop_gradient(box)
            previous = box if self.look_forward_twice else reference
        attention = ops.stack(attention, axis=0) if return_cross_attention else None
        return DecodedQueries(ops.stack(hidden, axis=0), ops.stack(boxes, axis=0), attention)


def make_box_decoding(box_refinement: bool, attention_radius: float | None,
                      reference_size: int, query_type: str = "",
                      look_forward_twice: bool = False) -> BoxDecoding:
    """The decoding strategy, after checking it fits the query strategy.

    Args:
        box_refinement: `IterativeRefinement` if True, else `StaticReferences`.
        attention_radius: None or a positive number.
        reference_size: the query strategy's ``reference_size`` (0, 2 or 4).
        query_type: its name, for the error messages.
        look_forward_twice: DINO's look forward twice; needs ``box_refinement``.

    Raises:
        ValueError: refinement without reference boxes, a radius without reference points,
            or a bad value (the message names the argument and the value).
    """
    checks.boolean("box_refinement", box_refinement)
    checks.boolean("look_forward_twice", look_forward_twice)
    if look_forward_twice and not box_refinement:
        raise ValueError(
            "`look_forward_twice` refines each layer's box from the previous layer's: it "
            "needs `box_refinement=True`. Received: box_refinement=False"
        )
    if box_refinement and reference_size != 4:
        raise ValueError(
            "`box_refinement` needs a `query_type` with reference boxes (e.g. 'encoder'). "
            f"Received: box_refinement=True, query_type={query_type!r}"
        )
    radius = checks.positive_number("attention_radius", attention_radius, optional=True)
    if radius is not None and reference_size == 0:
        raise ValueError(
            "`attention_radius` needs a `query_type` with reference points ('reference' or "
            f"'encoder'). Received: attention_radius={attention_radius!r}, "
            f"query_type={query_type!r}"
        )
    if box_refinement:
        return IterativeRefinement(radius, look_forward_twice)
    return StaticReferences(radius)
