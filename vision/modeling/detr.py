"""The DETR detector: backbone -> encoder -> object queries -> decoder -> heads.

Follows facebookresearch/detr (``models/detr.py``, ``backbone.py``, ``transformer.py``):
images and their pixel validity mask go through the backbone; the mask is resized (nearest)
to the feature map and gives the 2-D sine position embedding; a 1x1 conv projects the
features to ``hidden_dim``; the encoder attends over the flattened features (position added
to queries and keys in every layer, padded keys masked); a query strategy
(`vision.modeling.queries`) gives the decoder's starting content, query positions and reference
points; the decoding strategy (`vision.modeling.refinement`) runs the decoder and predicts every
layer's boxes; the shared class head gives the logits (last index = no-object).

Training uses Keras ``fit``: ``compute_loss`` is the Hungarian-matched ``SetCriterion``
(`vision.modeling.set_loss.SetLossModel`, the base class).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import keras
from keras import ops

from tfx_transformer import SinePositionEmbedding2D, TransformerDecoder, TransformerEncoder
from vision.matching.losses import SetCriterion
from vision.matching.matcher import HungarianMatcher
from vision.modeling.backbone import build_backbone
from vision.modeling.denoising import ContrastiveDenoising
from vision.modeling.geometry import resize_mask
from vision.modeling.heads import MLP
from vision.modeling.init import reset_transformer_parameters, torch_linear_init
from vision.modeling.queries import query_layer_class
from vision.modeling.refinement import make_box_decoding
from vision.modeling.set_loss import SetLossModel

__all__ = ["DETR", "DetrOutput", "build_criterion", "build_model"]

_LOSS_TERMS = ("loss_ce", "loss_bbox", "loss_giou")


class DetrOutput(NamedTuple):
    """The result of `DETR.forward`.

    Attributes:
        predictions: what ``DETR.call`` returns (see `DETR`).
        cross_attention: ``(L, B, heads, Q, h * w)`` the decoder's cross-attention weights
            (row-major over the feature map), or ``None`` unless asked for.
        feature_size: ``(h, w)`` the feature map's size (ints or scalar tensors).
    """

    predictions: dict
    cross_attention: Any | None
    feature_size: tuple


@keras.saving.register_keras_serializable(package="vision")
class DETR(SetLossModel):
    """DEtection TRansformer.

    Args:
        num_classes: number of object classes ``C`` (the no-object class is added).
        backbone: a backbone layer from `vision.modeling.backbone.build_backbone` (has ``stride``
        and
            ``output_channels``; called as ``backbone(images, valid=...)``).
        hidden_dim: Transformer width ``d`` (a multiple of 4 and of ``num_heads``).
        num_heads: attention heads.
        num_encoder_layers, num_decoder_layers: stack depths.
        ffn_dim: feed-forward inner width.
        dropout: Transformer dropout.
        num_queries: object queries ``Q``.
        norm_first: pre-norm Transformer when True (DETR's default is post-norm).
        query_type: where the object queries come from, a key of
            `vision.modeling.queries.QUERY_LAYERS`: ``"learned"`` (DETR), ``"reference"`` (learned
            reference points) or ``"encoder"`` (two-stage proposals); see `vision.modeling.queries`.
        attention_radius: with a ``query_type`` that has reference points, limits each
            query's cross-attention to the feature cells within this distance (normalized
            image coordinates, per axis) of its reference point. ``None``: the whole image.
        box_refinement: each decoder layer refines the boxes of the previous one, which
            position the next layer (Deformable DETR's iterative refinement); needs
            reference boxes (``query_type="encoder"``). See `vision.modeling.refinement`.
        look_forward_twice: with ``box_refinement``, each layer's box is an offset from the
            previous layer's with its gradient (DINO).
        one_to_many_queries: training-only queries of H-DETR's hybrid one-to-many branch
            (``"one_to_many"`` in the training outputs); see `vision.modeling.queries`.
        denoising_groups, denoising_label_noise, denoising_box_noise: contrastive denoising
            queries made from the targets in training (``"denoising"`` in the training
            outputs); see `vision.modeling.denoising`. Needs reference boxes.
        **kwargs: base model arguments.

    Call arguments:
        inputs: dict with ``"images"`` ``(B, H, W, 3)`` float32 (ImageNet mean/std normalized)
            and ``"mask"`` ``(B, H, W)`` bool, ``True`` = valid pixel (optional: all valid);
            in training with denoising groups, also ``"targets"`` (the loss's targets).
        training: enables dropout.

    Returns:
        dict with ``"pred_logits"`` ``(B, Q, C + 1)``, ``"pred_boxes"`` ``(B, Q, 4)``
        (normalized cxcywh in [0, 1], float32) and ``"aux_outputs"``: a list of
        ``num_decoder_layers - 1`` dicts with the same two keys, one per earlier decoder layer;
        plus the query strategy's extra outputs: in training with ``one_to_many_queries``,
        ``"one_to_many"``, a dict with the same three keys for those queries; with
        ``query_type="encoder"`` or ``"mixed"``,
        ``"enc_outputs"``: the proposals of every feature cell, ``pred_logits``
        ``(B, S, C + 1)``, ``pred_boxes`` ``(B, S, 4)`` and ``valid`` ``(B, S)`` (False for
        padded cells). ``S`` depends on the padded image size, so ``model.predict`` over
        batches of different sizes cannot concatenate them: call the model per batch (as
        `vision.export.saved_model` does) or use fixed-size batches.
    """

    def __init__(
        self,
        num_classes: int,
        backbone: keras.layers.Layer,
        hidden_dim: int = 256,
        num_heads: int = 8,
        num_encoder_layers: int = 6,
        num_decoder_layers: int = 6,
        ffn_dim: int = 2048,
        dropout: float = 0.1,
        num_queries: int = 100,
        norm_first: bool = False,
        query_type: str = "learned",
        attention_radius: float | None = None,
        box_refinement: bool = False,
        look_forward_twice: bool = False,
        one_to_many_queries: int = 0,
        denoising_groups: int = 0,
        denoising_label_noise: float = 0.5,
        denoising_box_noise: float = 1.0,
        **kwargs,
    ):
        super().__init__(**kwargs)
        query_layer = query_layer_class(query_type)
        box_decoding = make_box_decoding(box_refinement, attention_radius,
                                         query_layer.reference_size, query_type,
                                         look_forward_twice)
        for arg, value in (("num_classes", num_classes), ("num_queries", num_queries)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"`{arg}` must be a positive integer. Received: {value!r}")
        if not isinstance(hidden_dim, int) or hidden_dim <= 0 or hidden_dim % 4:
            raise ValueError(
                f"`hidden_dim` must be a positive multiple of 4. Received: {hidden_dim!r}"
            )
        self.num_classes = num_classes
        self.hidden_dim = hidden_dim
        self.num_heads = num_heads
        self.num_encoder_layers = num_encoder_layers
        self.num_decoder_layers = num_decoder_layers
        self.ffn_dim = ffn_dim
        self.dropout = dropout
        self.num_queries = num_queries
        self.norm_first = norm_first
        self.query_type = query_type
        self.attention_radius = box_decoding.attention_radius
        self.box_refinement = box_refinement
        self.look_forward_twice = look_forward_twice
        self.one_to_many_queries = one_to_many_queries
        if denoising_groups and query_layer.reference_size != 4:
            raise ValueError(
                "`denoising_groups` needs a `query_type` with reference boxes ('encoder' or "
                f"'mixed'). Received: query_type={query_type!r}"
            )

        # Created in the order of the model before the strategies became layers, so that
        # the same seed gives the same initial weights.
        d, policy = hidden_dim, self.dtype_policy
        self.backbone = backbone
        self.position = SinePositionEmbedding2D(d // 2, dtype=policy, name="position")
        self.input_proj = keras.layers.Conv2D(
            d, 1, dtype=policy, name="input_proj", **torch_linear_init(backbone.output_channels)
        )
        stack = dict(num_heads=num_heads, hidden_dim=ffn_dim, dropout=dropout,
                     norm_first=norm_first, dtype=policy)
        self.encoder = TransformerEncoder(num_encoder_layers, name="encoder", **stack)
        self.decoder = TransformerDecoder(
            num_decoder_layers, return_intermediate=True, final_norm=True, name="decoder", **stack
        )
        self.class_head = keras.layers.Dense(
            num_classes + 1, dtype=policy, name="class_head", **torch_linear_init(d)
        )
        self.box_head = MLP(d, d, 4, 3, dtype=policy, name="box_head")
        self.queries = query_layer(num_queries, d, num_classes,
                                   one_to_many_queries=one_to_many_queries,
                                   dtype=policy, name="queries")
        self.denoising = ContrastiveDenoising(
            denoising_groups, num_classes, d, denoising_label_noise, denoising_box_noise,
            dtype=policy, name="denoising")
        self.box_decoding = box_decoding
        self.criterion: SetCriterion | None = None
        self.loss_trackers = [keras.metrics.Mean(name=name) for name in _LOSS_TERMS]

    def build(self, inputs_shape):
        images_shape = inputs_shape["images"] if isinstance(inputs_shape, dict) else inputs_shape
        images_shape = (None, None, None, images_shape[-1])
        d = self.hidden_dim
        if not self.backbone.built:  # a deserialized backbone comes built
            self.backbone.build(images_shape, images_shape[:3])
        self.input_proj.build((None, None, None, self.backbone.output_channels))
        self.encoder.build((None, None, d))
        self.decoder.build((None, self.num_queries, d), (None, None, d))
        reset_transformer_parameters(self.encoder)
        reset_transformer_parameters(self.decoder)
        self.class_head.build((None, None, d))
        self.box_head.build((None, None, d))
        self.queries.build((None, None, d), (None, None, None))
        self.denoising.build()
        self.built = True

    @property
    def backbone_variables(self) -> list:
        """The backbone's trainable variables (trained with the smaller learning rate)."""
        return list(self.backbone.trainable_variables)

    def call(self, inputs, training=None):
        return self.forward(inputs, training=training).predictions

    def forward(self, inputs, training=None, return_cross_attention: bool = False) -> DetrOutput:
        """The forward pass of ``call``, optionally with the decoder's cross-attention.

        Returns:
            A `DetrOutput`: ``predictions`` (as ``call``), ``cross_attention``
            ``(L, B, heads, Q, h * w)`` or ``None``, ``feature_size`` ``(h, w)``.
        """
        images, valid = _images_and_mask(inputs)
        features = self.backbone(images, valid=valid, training=training)  # (B, h, w, C)
        memory, memory_pos, feature_valid = self._encode(features, valid, training)
        start = self.queries(memory, feature_valid, training=training)
        start, denoised = self.denoising.extend(start, inputs.get("targets"), self.queries,
                                                training)
        decoded = self.box_decoding(
            self.decoder, self.box_head, self.queries, start, memory, memory_pos,
            feature_valid, return_cross_attention=return_cross_attention, training=training,
        )  # hidden (L, B, Q, d), boxes (L, B, Q, 4)
        logits = ops.cast(self.class_head(decoded.hidden), "float32")  # (L, B, Q, C + 1)
        predictions = {**start.extra, **self.denoising.predictions(
            self.queries, logits, decoded.boxes, denoised)}
        size = ops.shape(features)[1:3]
        return DetrOutput(predictions, decoded.attention, (size[0], size[1]))

    def _encode(self, features, valid, training):
        """``(B, h, w, C)`` features -> memory ``(B, S, d)``, its positions ``(B, S, d)`` and
        the feature cells' validity ``(B, h, w)``."""
        shape = ops.shape(features)
        batch, d = shape[0], self.hidden_dim
        feature_valid = resize_mask(valid, shape[1], shape[2])  # (B, h, w)
        pos = ops.reshape(self.position(feature_valid), (batch, -1, d))  # (B, S = h * w, d)
        x = ops.reshape(self.input_proj(features), (batch, -1, d))  # (B, S, d)
        memory_mask = ops.reshape(feature_valid, (batch, -1))  # (B, S)
        memory = self.encoder(x, padding_mask=memory_mask, pos=pos, training=training)
        return memory, pos, feature_valid

    # --- serialization -----------------------------------------------------------------------

    def get_config(self):
        fields = ("num_classes", "hidden_dim", "num_heads", "num_encoder_layers",
                  "num_decoder_layers", "ffn_dim", "dropout", "num_queries", "norm_first",
                  "query_type", "attention_radius", "box_refinement", "look_forward_twice",
                  "one_to_many_queries")
        return {
            "name": self.name,
            "trainable": self.trainable,
            "dtype": keras.saving.serialize_keras_object(self.dtype_policy),
            "backbone": keras.saving.serialize_keras_object(self.backbone),
            **{field: getattr(self, field) for field in fields},
            "denoising_groups": self.denoising.groups,
            "denoising_label_noise": self.denoising.label_noise,
            "denoising_box_noise": self.denoising.box_noise,
        }

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["backbone"] = keras.saving.deserialize_keras_object(config["backbone"])
        if isinstance(config.get("dtype"), dict):
            config["dtype"] = keras.saving.deserialize_keras_object(config["dtype"])
        return cls(**config)


def _images_and_mask(inputs):
    """``{"images": (B, H, W, 3), "mask": (B, H, W) | absent}`` -> images, bool mask."""
    if not isinstance(inputs, dict) or "images" not in inputs:
        raise ValueError(
            "`inputs` must be a dict with 'images' (B, H, W, 3) and optionally 'mask' "
            f"(B, H, W). Received: {type(inputs).__name__}"
            + (f" with keys {sorted(inputs)}" if isinstance(inputs, dict) else "")
        )
    images = inputs["images"]
    valid = inputs.get("mask")
    if valid is None:
        valid = ops.ones(ops.shape(images)[:3], dtype="bool")
    return images, ops.cast(valid, "bool")


def build_criterion(config, num_classes: int) -> SetCriterion:
    """The `SetCriterion` of a `vision.config.DetrConfig` for ``num_classes`` classes."""
    matcher = HungarianMatcher(
        cost_class=config.cost_class, cost_bbox=config.cost_bbox, cost_giou=config.cost_giou,
        solver=config.matcher_solver,
    )
    weights = {"loss_ce": config.loss_ce, "loss_bbox": config.loss_bbox,
               "loss_giou": config.loss_giou}
    return SetCriterion(num_classes, matcher, config.eos_coef, weights, config.aux_loss,
                        config.proposal_matches, config.one_to_many_copies,
                        config.iou_aware_classification)


def build_model(config, num_classes: int) -> DETR:
    """Builds (uncompiled, with weights) the `DETR` of a `vision.config.DetrConfig`.

    Args:
        config: its ``backbone_kwargs()`` and ``model_kwargs()`` are used.
        num_classes: number of object classes, from the data.

    Returns:
        A built `DETR` named ``"detr"``.
    """
    backbone = build_backbone(**config.backbone_kwargs())
    model = DETR(num_classes, backbone, **config.model_kwargs(), name="detr")
    model.build({"images": (None, None, None, 3), "mask": (None, None, None)})
    return model
