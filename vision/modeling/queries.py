"""Where DETR's object queries come from: one registered layer per strategy.

Every strategy has the same call contract, ``queries(memory, feature_valid) ->
QueryOutput``: the decoder's starting content, the query position embedding, the
reference points or boxes (logits) that position the queries, and extra model outputs.
Strategies with references own the MLP that embeds a point or box as a query position
(``embed``), which `vision.modeling.refinement.IterativeRefinement` uses again for later layers.

- ``"learned"``, `LearnedQueries`: DETR's learned ``query_pos``, content zeros, no reference.
- ``"reference"``, `ReferenceQueries`: a learned reference point per query on a grid
  (DAB-/Conditional DETR); position = MLP of the point's sine features; each box centre is an
  offset from the point in logit space.
- ``"encoder"``, `TwoStageQueries`: two-stage (Deformable / Efficient DETR): every encoder
  cell proposes a class and a box; the ``Q`` best cells become the queries, with the cell's
  feature as content and its box (no gradient) as reference; the proposals get their own set
  loss (``extra["enc_outputs"]``).
- ``"mixed"``, `MixedQueries`: DINO's mixed query selection: the reference boxes (and so the
  positions) of the ``Q`` best cells as ``"encoder"``, but a learned content per query
  instead of the cells' features.

Every strategy also takes ``one_to_many_queries`` (H-DETR's hybrid branch): that many more
queries in training only, selected the same way, which cannot attend to the ``Q`` one-to-one
queries nor they to them (``QueryOutput.self_attention_mask``); their predictions are
``"one_to_many"`` in the model's outputs, matched to repeated targets by the set loss
(`vision.matching.losses.SetCriterion`). At inference the strategy gives the ``Q`` queries
alone.

Adding a strategy: one layer class here with the contract below, and its name in
`QUERY_LAYERS` (which `vision.config.DetrConfig.query_type` accepts).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import keras
from keras import ops

from tfx_transformer import checks, sine_features
from vision.modeling.geometry import cell_anchors, grid_reference_logits
from vision.modeling.heads import MLP
from vision.modeling.init import torch_linear_init

__all__ = ["QUERY_LAYERS", "LearnedQueries", "MixedQueries", "QueryOutput", "QueryStrategy",
           "ReferenceQueries", "TwoStageQueries", "query_layer_class"]


class QueryOutput(NamedTuple):
    """What a query strategy gives the decoder (``B`` images, ``Q`` queries, ``d`` width).

    Attributes:
        content: ``(B, Q, d)`` the decoder's input.
        position: ``(B, Q, d)`` query position embedding added in every layer.
        reference: ``(B, Q, K)`` float32 logits of the reference points (``K = 2``, cx cy) or
            boxes (``K = 4``, cxcywh) the predicted boxes are offsets from; ``None`` without.
        extra: more entries of the model's outputs (e.g. ``"enc_outputs"``); may be empty.
        self_attention_mask: ``(B, Q, Q)`` bool, which queries each query may attend to in
            the decoder's self-attention, or ``None`` (all of them).
    """

    content: Any
    position: Any
    reference: Any | None
    extra: dict
    self_attention_mask: Any | None = None


class QueryStrategy(keras.layers.Layer):
    """Base class of the query layers: arguments, config, and the ``embed`` contract.

    Args:
        num_queries: ``Q``.
        hidden_dim: ``d``, the Transformer width.
        num_classes: object classes ``C`` (used by strategies that classify proposals).
        one_to_many_queries: training-only queries of the hybrid one-to-many branch (0:
            none); see the module docstring.
        **kwargs: base layer arguments.

    Call arguments:
        memory: ``(B, S, d)`` encoder output, ``S = h * w`` cells row-major.
        feature_valid: ``(B, h, w)`` bool, ``True`` = a cell of the image.
        training: unused by the strategies here.

    Returns:
        A `QueryOutput`.
    """

    #: Coordinates of the reference: 0 (none), 2 (points) or 4 (boxes).
    reference_size = 0

    def __init__(self, num_queries: int, hidden_dim: int, num_classes: int,
                 one_to_many_queries: int = 0, **kwargs):
        super().__init__(**kwargs)
        self.num_queries = num_queries
        self.hidden_dim = hidden_dim
        self.num_classes = num_classes
        self.one_to_many_queries = checks.non_negative_int("one_to_many_queries",
                                                           one_to_many_queries)
        # Per-query weights hold the one-to-one queries first.
        self.total_queries = num_queries + self.one_to_many_queries

    def count(self, training=None) -> int:
        """How many queries a call gives: ``Q``, plus the one-to-many ones in training."""
        return self.total_queries if training else self.num_queries

    def embed(self, reference: Any) -> Any:
        """``(B, Q, K)`` normalized points or boxes -> ``(B, Q, d)`` query positions."""
        raise ValueError(
            f"{type(self).__name__} has no reference points to embed (reference_size=0)."
        )

    def self_attention_mask(self, batch, count: int):
        """``(B, T, T)``: the one-to-one and the one-to-many queries do not see each other;
        ``None`` when there are only the one-to-one queries."""
        if count == self.num_queries:
            return None
        group = ops.arange(count) >= self.num_queries  # (T,) True = one-to-many
        same = ops.equal(group[:, None], group[None, :])  # (T, T)
        return ops.broadcast_to(same[None], (batch, count, count))

    def predictions(self, logits, boxes) -> dict:
        """The decoder's ``(L, B, T, C + 1)`` logits and ``(L, B, T, 4)`` boxes -> the
        model's ``pred_logits``, ``pred_boxes`` and ``aux_outputs`` of the one-to-one queries,
        and the one-to-many queries' as ``"one_to_many"`` (same keys) when there are any."""
        q = self.num_queries
        if logits.shape[2] == q:
            return _layer_predictions(logits, boxes)
        return {**_layer_predictions(logits[:, :, :q], boxes[:, :, :q]),
                "one_to_many": _layer_predictions(logits[:, :, q:], boxes[:, :, q:])}

    def get_config(self):
        config = super().get_config()
        config.update(num_queries=self.num_queries, hidden_dim=self.hidden_dim,
                      num_classes=self.num_classes,
                      one_to_many_queries=self.one_to_many_queries)
        return config


def _layer_predictions(logits, boxes) -> dict:
    """Every decoder layer's outputs -> the last layer's and ``aux_outputs`` (earlier ones)."""
    return {
        "pred_logits": logits[-1],
        "pred_boxes": boxes[-1],
        "aux_outputs": [{"pred_logits": logits[i], "pred_boxes": boxes[i]}
                        for i in range(logits.shape[0] - 1)],
    }


def _sine_embedding(points: Any, hidden_dim: int, mlp: MLP, dtype: Any) -> Any:
    """``(B, Q, K)`` normalized coordinates -> ``(B, Q, d)``: sine features through ``mlp``.

    ``d / 2`` sine features per coordinate times 2π (``y`` before ``x``, the layout of
    `tfx_transformer.SinePositionEmbedding2D`).
    """
    order = [1, 0] if points.shape[-1] == 2 else [1, 0, 2, 3]
    points = ops.take(points, order, axis=-1) * (2 * math.pi)
    return mlp(ops.cast(sine_features(points, hidden_dim // 2), dtype))  # (B, Q, K*d/2) -> d


@keras.saving.register_keras_serializable(package="vision")
class LearnedQueries(QueryStrategy):
    """DETR's queries: zeros as content, a learned position per query (``query_embed``)."""

    def build(self, memory_shape=None, feature_valid_shape=None):
        # nn.Embedding's default N(0, 1), as DETR's query_embed.
        self.query_embed = self.add_weight(
            shape=(self.total_queries, self.hidden_dim),
            initializer=keras.initializers.RandomNormal(stddev=1.0), name="query_embed",
        )

    def call(self, memory, feature_valid, training=None):
        batch, count = ops.shape(memory)[0], self.count(training)
        position = ops.cast(self.query_embed[:count], self.compute_dtype)  # (Q, d)
        position = ops.repeat(position[None], batch, axis=0)  # (B, Q, d)
        return QueryOutput(ops.zeros_like(position), position, None, {},
                           self.self_attention_mask(batch, count))


@keras.saving.register_keras_serializable(package="vision")
class ReferenceQueries(QueryStrategy):
    """A learned reference point per query, initialized on a grid over the image.

    Content zeros; position = ``reference_mlp`` of the point's sine features.
    """

    reference_size = 2

    def __init__(self, num_queries: int, hidden_dim: int, num_classes: int, **kwargs):
        super().__init__(num_queries, hidden_dim, num_classes, **kwargs)
        self.reference_mlp = MLP(hidden_dim, hidden_dim, hidden_dim, 2,
                                 dtype=self.dtype_policy, name="reference_mlp")

    def build(self, memory_shape=None, feature_valid_shape=None):
        self.reference_mlp.build((None, self.hidden_dim))
        # Points on a regular grid over the image, stored as logits (inverse sigmoid).
        self.reference_logits = self.add_weight(
            shape=(self.total_queries, 2), name="reference_logits",
            initializer=keras.initializers.Constant(
                grid_reference_logits(self.num_queries)
                + (grid_reference_logits(self.one_to_many_queries)
                   if self.one_to_many_queries else [])),
        )

    def embed(self, reference):
        return _sine_embedding(reference, self.hidden_dim, self.reference_mlp, self.compute_dtype)

    def call(self, memory, feature_valid, training=None):
        batch, count = ops.shape(memory)[0], self.count(training)
        reference = ops.cast(self.reference_logits[:count], "float32")  # (Q, 2)
        reference = ops.repeat(reference[None], batch, axis=0)  # (B, Q, 2)
        position = self.embed(ops.sigmoid(reference))  # (B, Q, d)
        return QueryOutput(ops.zeros_like(position), position, reference, {},
                           self.self_attention_mask(batch, count))


@keras.saving.register_keras_serializable(package="vision")
class TwoStageQueries(QueryStrategy):
    """Two-stage queries: every cell's proposal, then the ``Q`` most confident cells.

    Each encoder cell predicts a class (``proposal_class_head``) and a box
    (``proposal_box_head``, an offset from an anchor of 2 x 2 cells at the cell, in logit
    space). Padded cells are certain no-object and chosen only when an image has fewer than
    ``Q`` valid cells; when the feature map has fewer than ``Q`` cells at all, the remaining
    queries start from zeros at the centre box.

    ``extra["enc_outputs"]``: ``pred_logits`` ``(B, S, C + 1)``, ``pred_boxes`` ``(B, S, 4)``
    and ``valid`` ``(B, S)`` (False for padded cells, which the loss ignores).
    """

    reference_size = 4

    def __init__(self, num_queries: int, hidden_dim: int, num_classes: int, **kwargs):
        super().__init__(num_queries, hidden_dim, num_classes, **kwargs)
        d = hidden_dim
        # The creation order is the order in which the initializers draw their seeds: a
        # seeded model's initial weights depend on it.
        self.reference_mlp = MLP(2 * d, d, d, 2, dtype=self.dtype_policy, name="reference_mlp")
        self.proposal_class_head = keras.layers.Dense(
            num_classes + 1, dtype=self.dtype_policy, name="proposal_class_head",
            **torch_linear_init(d),
        )
        self.proposal_box_head = MLP(d, d, 4, 3, dtype=self.dtype_policy,
                                     name="proposal_box_head")

    def build(self, memory_shape=None, feature_valid_shape=None):
        d = self.hidden_dim
        self.reference_mlp.build((None, 2 * d))
        self.proposal_class_head.build((None, None, d))
        self.proposal_box_head.build((None, None, d))

    def embed(self, reference):
        return _sine_embedding(reference, self.hidden_dim, self.reference_mlp, self.compute_dtype)

    def call(self, memory, feature_valid, training=None):
        batch, q = ops.shape(memory)[0], self.count(training)
        valid = ops.reshape(feature_valid, (batch, -1))  # (B, S)
        logits = ops.cast(self.proposal_class_head(memory), "float32")  # (B, S, C + 1)
        no_object = ops.one_hot(self.num_classes, self.num_classes + 1) * 2e4 - 1e4
        logits = ops.where(valid[..., None], logits, no_object)
        boxes = ops.cast(self.proposal_box_head(memory), "float32")
        boxes = boxes + cell_anchors(feature_valid)  # (B, S, 4) logits
        proposals = {"pred_logits": logits, "pred_boxes": ops.sigmoid(boxes), "valid": valid}

        # Object score of each cell; Q dummy candidates (never better than a valid cell)
        # keep top_k defined when the feature map has fewer than Q cells.
        score = ops.max(ops.softmax(ops.stop_gradient(logits), axis=-1)[..., :-1], axis=-1)
        score = ops.where(valid, score, -1.0)  # (B, S)
        score = ops.pad(score, [[0, 0], [0, q]], constant_values=-2.0)  # (B, S + Q)
        memory = ops.pad(memory, [[0, 0], [0, q], [0, 0]])
        boxes = ops.pad(ops.stop_gradient(boxes), [[0, 0], [0, q], [0, 0]])  # centre boxes
        _, chosen = ops.top_k(score, q)  # (B, Q)
        content = ops.take_along_axis(memory, chosen[..., None], axis=1)  # (B, Q, d)
        reference = ops.take_along_axis(boxes, chosen[..., None], axis=1)  # (B, Q, 4)
        position = self.embed(ops.sigmoid(reference))  # (B, Q, d)
        content = self.select_content(content, q)
        return QueryOutput(content, position, reference, {"enc_outputs": proposals},
                           self.self_attention_mask(batch, q))

    def select_content(self, content, count: int):
        """The decoder's ``(B, Q, d)`` input from the chosen cells' features."""
        return content


@keras.saving.register_keras_serializable(package="vision")
class MixedQueries(TwoStageQueries):
    """DINO's mixed query selection: two-stage reference boxes, learned content.

    The ``Q`` best cells position the queries and give their reference boxes, as
    `TwoStageQueries`; the decoder's input is a learned vector per query (``query_content``,
    N(0, 1) as DINO's embedding) instead of the cells' encoder features, which DINO finds
    ambiguous as content (a cell may hold part of an object or several).
    """

    def build(self, memory_shape=None, feature_valid_shape=None):
        super().build(memory_shape, feature_valid_shape)
        self.query_content = self.add_weight(
            shape=(self.total_queries, self.hidden_dim),
            initializer=keras.initializers.RandomNormal(stddev=1.0), name="query_content",
        )

    def select_content(self, content, count: int):
        learned = ops.cast(self.query_content[:count], self.compute_dtype)  # (Q, d)
        return ops.broadcast_to(learned[None], ops.shape(content))


#: ``DetrConfig.query_type`` -> its layer class.
QUERY_LAYERS: dict[str, type[QueryStrategy]] = {
    "learned": LearnedQueries,
    "reference": ReferenceQueries,
    "encoder": TwoStageQueries,
    "mixed": MixedQueries,
}


def query_layer_class(query_type: str) -> type[QueryStrategy]:
    """The layer class of ``query_type``; ValueError naming the accepted ones otherwise."""
    if not isinstance(query_type, str) or query_type not in QUERY_LAYERS:
        raise ValueError(
            f"`query_type` must be one of {tuple(QUERY_LAYERS)}. "
            f"Received: query_type={query_type!r}"
        )
    return QUERY_LAYERS[query_type]
