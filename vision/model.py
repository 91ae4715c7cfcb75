"""The DETR detector: CNN backbone, Transformer encoder-decoder, object queries, set loss.

Follows facebookresearch/detr (``models/detr.py``, ``backbone.py``, ``transformer.py``):
images and their pixel validity mask go through the backbone; the mask is resized (nearest)
to the feature map and gives the 2-D sine position embedding; a 1x1 conv projects the
features to ``hidden_dim``; the encoder attends over the flattened features (position added
to queries and keys in every layer, padded keys masked); the decoder starts from zeros with
``num_queries`` learned query positions added in every layer and returns every layer's
output; shared heads give class logits (last index = no-object) and normalized cxcywh boxes.

Training uses Keras ``fit``: ``compute_loss`` is the Hungarian-matched ``SetCriterion``.
"""

from __future__ import annotations

from typing import Callable

import keras
from keras import ops

from tfx_transformer import SinePositionEmbedding2D, TransformerDecoder, TransformerEncoder
from vision.backbone import build_backbone
from vision.losses import SetCriterion
from vision.matcher import HungarianMatcher
from vision.optimizer import DetrAdamW
from vision.queries import (
    grid_reference_logits,
    near_points,
    reference_embedding,
    refine_boxes,
    reset_transformer_parameters,
    resize_mask,
    select_proposals,
    torch_linear_init,
)

QUERY_TYPES = ("learned", "reference", "encoder")

__all__ = [
    "DETR",
    "QUERY_TYPES",
    "build_criterion",
    "build_model",
    "reset_transformer_parameters",
    "resize_mask",
]

_LOSS_TERMS = ("loss_ce", "loss_bbox", "loss_giou")


@keras.saving.register_keras_serializable(package="vision")
class DETR(keras.Model):
    """DEtection TRansformer.

    Args:
        num_classes: number of object classes ``C`` (the no-object class is added).
        backbone: a backbone layer from `vision.backbone.build_backbone` (has ``stride`` and
            ``output_channels``; called as ``backbone(images, valid=...)``).
        hidden_dim: Transformer width ``d`` (a multiple of 4 and of ``num_heads``).
        num_heads: attention heads.
        num_encoder_layers, num_decoder_layers: stack depths.
        ffn_dim: feed-forward inner width.
        dropout: Transformer dropout.
        num_queries: object queries ``Q``.
        norm_first: pre-norm Transformer when True (DETR's default is post-norm).
        query_type: where the object queries come from.
            ``"learned"``: DETR's learned ``query_pos`` (one vector per query).
            ``"reference"``: a learned reference point ``(cx, cy)`` per query, initialized on
            a grid over the image; its position embedding is an MLP of the point's sine
            features (as DAB-/Conditional DETR) and the box centre is predicted as an offset
            from the point in logit space.
            ``"encoder"``: two-stage, as Deformable DETR's and Efficient DETR's: every encoder
            cell predicts a class and a box (relative to an anchor of 2x2 cells at the cell);
            those proposals get their own set loss (``outputs["enc_outputs"]``); the
            ``num_queries`` cells of highest object score become the queries, with the
            cell's feature as the decoder's starting content, the proposal box (no gradient)
            as reference box, an MLP of its sine features as position embedding, and every
            predicted box an offset from it in logit space.
        attention_radius: unless ``query_type="learned"``, limits each query's
            cross-attention to the feature cells within this distance (normalized image
            coordinates, per axis) of its reference point. ``None``: the whole image.
        box_refinement: with ``query_type="encoder"``, each decoder layer refines the boxes
            of the previous one, which position the next layer (Deformable DETR's iterative
            refinement).
        **kwargs: base model arguments.

    Call arguments:
        inputs: dict with ``"images"`` ``(B, H, W, 3)`` float32 (ImageNet mean/std normalized)
            and ``"mask"`` ``(B, H, W)`` bool, ``True`` = valid pixel (optional: all valid).
        training: enables dropout.

    Returns:
        dict with ``"pred_logits"`` ``(B, Q, C + 1)``, ``"pred_boxes"`` ``(B, Q, 4)``
        (normalized cxcywh in [0, 1], float32) and ``"aux_outputs"``: a list of
        ``num_decoder_layers - 1`` dicts with the same two keys, one per earlier decoder layer.
        With ``query_type="encoder"`` also ``"enc_outputs"``: the proposals of every feature
        cell, ``pred_logits`` ``(B, S, C + 1)``, ``pred_boxes`` ``(B, S, 4)`` and ``valid``
        ``(B, S)`` (False for padded cells). ``S`` depends on the padded image size, so
        ``model.predict`` over batches of different sizes cannot concatenate them: call the
        model per batch (as `vision.export` does) or use fixed-size batches.
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
        **kwargs,
    ):
        super().__init__(**kwargs)
        if query_type not in QUERY_TYPES:
            raise ValueError(
                f"`query_type` must be one of {QUERY_TYPES}. Received: query_type={query_type!r}"
            )
        if box_refinement and query_type != "encoder":
            raise ValueError(
                "`box_refinement` needs reference boxes: `query_type='encoder'`. Received: "
                f"query_type={query_type!r}"
            )
        if attention_radius is not None and (
            query_type == "learned" or isinstance(attention_radius, bool)
            or not isinstance(attention_radius, (int, float)) or attention_radius <= 0
        ):
            raise ValueError(
                "`attention_radius` must be None or a positive number, and needs a "
                "`query_type` with reference points ('reference' or 'encoder'). Received: "
                f"attention_radius={attention_radius!r}, query_type={query_type!r}"
            )
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
        self.box_refinement = bool(box_refinement)
        self.attention_radius = None if attention_radius is None else float(attention_radius)

        d = hidden_dim
        self.backbone = backbone
        self.position = SinePositionEmbedding2D(d // 2, dtype=self.dtype_policy, name="position")
        self.input_proj = keras.layers.Conv2D(
            d, 1, dtype=self.dtype_policy, name="input_proj",
            **torch_linear_init(backbone.output_channels),
        )
        stack = dict(
            num_heads=num_heads, hidden_dim=ffn_dim, dropout=dropout, norm_first=norm_first,
            dtype=self.dtype_policy,
        )
        self.encoder = TransformerEncoder(num_encoder_layers, name="encoder", **stack)
        self.decoder = TransformerDecoder(
            num_decoder_layers, return_intermediate=True, final_norm=True, name="decoder", **stack
        )
        self.class_head = keras.layers.Dense(
            num_classes + 1, dtype=self.dtype_policy, name="class_head", **torch_linear_init(d)
        )
        self.box_head = [
            keras.layers.Dense(
                units, activation=activation, dtype=self.dtype_policy, name=f"box_head_{i}",
                **torch_linear_init(d),
            )
            for i, (units, activation) in enumerate([(d, "relu"), (d, "relu"), (4, None)])
        ]
        if query_type != "learned":
            # The position embedding of a reference point (2 coordinates) or box (4).
            self._reference_features = d * (2 if query_type == "encoder" else 1)
            self.reference_mlp = [
                keras.layers.Dense(
                    units, activation=activation, dtype=self.dtype_policy,
                    name=f"reference_mlp_{i}", **torch_linear_init(fan_in),
                )
                for i, (units, activation, fan_in) in enumerate(
                    [(d, "relu", self._reference_features), (d, None, d)])
            ]
        if query_type == "encoder":
            self.proposal_class_head = keras.layers.Dense(
                num_classes + 1, dtype=self.dtype_policy, name="proposal_class_head",
                **torch_linear_init(d),
            )
            self.proposal_box_head = [
                keras.layers.Dense(
                    units, activation=activation, dtype=self.dtype_policy,
                    name=f"proposal_box_head_{i}", **torch_linear_init(d),
                )
                for i, (units, activation) in enumerate([(d, "relu"), (d, "relu"), (4, None)])
            ]
        self.criterion: SetCriterion | None = None
        self.loss_trackers = [keras.metrics.Mean(name=name) for name in _LOSS_TERMS]
        self._num_replicas = 1
        self._all_reduce_sum: Callable | None = None

    def build(self, inputs_shape):
        images_shape = inputs_shape["images"] if isinstance(inputs_shape, dict) else inputs_shape
        images_shape = (None, None, None, images_shape[-1])
        d, q = self.hidden_dim, self.num_queries
        if not self.backbone.built:  # a deserialized backbone comes built
            self.backbone.build(images_shape, images_shape[:3])
        self.input_proj.build((None, None, None, self.backbone.output_channels))
        self.encoder.build((None, None, d))
        self.decoder.build((None, q, d), (None, None, d))
        reset_transformer_parameters(self.encoder)
        reset_transformer_parameters(self.decoder)
        self.class_head.build((None, None, d))
        for layer in self.box_head:
            layer.build((None, None, d))
        if self.query_type != "learned":
            self.reference_mlp[0].build((None, self._reference_features))
            self.reference_mlp[1].build((None, d))
        if self.query_type == "encoder":
            self.proposal_class_head.build((None, None, d))
            for layer in self.proposal_box_head:
                layer.build((None, None, d))
        elif self.query_type == "reference":
            # Points on a regular grid over the image, stored as logits (inverse sigmoid).
            self.reference_logits = self.add_weight(
                shape=(q, 2), initializer=keras.initializers.Constant(grid_reference_logits(q)),
                name="reference_logits",
            )
        else:
            # nn.Embedding's default N(0, 1), as DETR's query_embed.
            self.query_embed = self.add_weight(
                shape=(q, d), initializer=keras.initializers.RandomNormal(stddev=1.0),
                name="query_embed",
            )
        self.built = True

    @property
    def backbone_variables(self) -> list:
        """The backbone's trainable variables (trained with the smaller learning rate)."""
        return list(self.backbone.trainable_variables)

    def call(self, inputs, training=None):
        return self.forward(inputs, training=training)[0]

    def forward(self, inputs, training=None, return_cross_attention: bool = False):
        """The forward pass of ``call``, optionally with the decoder's cross-attention.

        Returns:
            ``(outputs, weights, (h, w))``: ``outputs`` as ``call``; ``weights``
            ``(L, B, heads, Q, h * w)`` or ``None``; ``(h, w)`` the feature-map size.
        """
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
        valid = ops.cast(valid, "bool")
        features = self.backbone(images, valid=valid, training=training)  # (B, h, w, C)
        shape = ops.shape(features)
        batch, d = shape[0], self.hidden_dim
        feature_valid = resize_mask(valid, shape[1], shape[2])  # (B, h, w)
        pos = self.position(feature_valid)  # (B, h, w, d)
        x = self.input_proj(features)  # (B, h, w, d)
        x = ops.reshape(x, (batch, -1, d))  # (B, S = h * w, d)
        pos = ops.reshape(pos, (batch, -1, d))  # (B, S, d)
        memory_mask = ops.reshape(feature_valid, (batch, -1))  # (B, S)
        memory = self.encoder(x, padding_mask=memory_mask, pos=pos, training=training)

        outputs = {}
        reference = None  # logits of the reference points (Q, 2) or boxes (B, Q, 4)
        if self.query_type == "learned":
            query_pos = ops.cast(self.query_embed, self.compute_dtype)  # (Q, d)
            query_pos = ops.repeat(query_pos[None], batch, axis=0)  # (B, Q, d)
            target = ops.zeros_like(query_pos)
        elif self.query_type == "reference":
            reference = ops.cast(self.reference_logits, "float32")  # (Q, 2)
            points = ops.repeat(ops.sigmoid(reference)[None], batch, axis=0)  # (B, Q, 2)
            query_pos = reference_embedding(points, d, self.reference_mlp, self.compute_dtype)
            target = ops.zeros_like(query_pos)
        else:
            proposals, target, reference = select_proposals(
                memory, feature_valid, self.proposal_class_head, self.proposal_box_head,
                self.num_classes, self.num_queries,
            )
            outputs["enc_outputs"] = proposals
            points = ops.sigmoid(reference)  # (B, Q, 4)
            if not self.box_refinement:  # refinement embeds each layer's own boxes
                query_pos = reference_embedding(points, d, self.reference_mlp, self.compute_dtype)
        if self.box_refinement:
            def position(points):  # (B, Q, 4) boxes -> query positions, attention mask
                window = memory_mask if self.attention_radius is None else near_points(
                    feature_valid, points[..., :2], self.attention_radius)
                return reference_embedding(
                    points, d, self.reference_mlp, self.compute_dtype), window

            hs, boxes, weights = refine_boxes(
                self.decoder, self._box_logits, position, target, memory, pos, reference,
                return_cross_attention, training,
            )
        else:
            if self.attention_radius is not None:  # (B, Q, S)
                memory_mask = near_points(feature_valid, points[..., :2], self.attention_radius)
            decoded = self.decoder(
                target, memory, memory_mask=memory_mask, query_pos=query_pos,
                memory_pos=pos, return_cross_attention=return_cross_attention,
                training=training,
            )  # (L, B, Q, d) [, (L, B, heads, Q, S)]
            hs, weights = decoded if return_cross_attention else (decoded, None)
            boxes = self._box_logits(hs)  # (L, B, Q, 4)
            if reference is not None:
                if reference.shape[-1] == 2:  # points: offsets of the centres only
                    reference = ops.pad(reference, [[0, 0], [0, 2]])
                boxes = boxes + reference  # (Q, 4) or (B, Q, 4) broadcasts over (L, B, Q, 4)
            boxes = ops.sigmoid(boxes)  # (L, B, Q, 4)
        logits = ops.cast(self.class_head(hs), "float32")  # (L, B, Q, C + 1)
        outputs = {
            **outputs,
            "pred_logits": logits[-1],
            "pred_boxes": boxes[-1],
            "aux_outputs": [
                {"pred_logits": logits[i], "pred_boxes": boxes[i]}
                for i in range(self.num_decoder_layers - 1)
            ],
        }
        return outputs, weights, (shape[1], shape[2])

    def _box_logits(self, hs):
        boxes = hs
        for layer in self.box_head:
            boxes = layer(boxes)
        return ops.cast(boxes, "float32")

    # --- training ----------------------------------------------------------------------------

    def compile(self, optimizer=None, criterion: SetCriterion | None = None, jit_compile=False,
                **kwargs):
        """Configures training; ``loss`` is the set ``criterion``.

        Args:
            optimizer: defaults to ``DetrAdamW()`` (DETR's settings). A `DetrAdamW` without
                backbone variables gets this model's ``backbone_variables``.
            criterion: a `SetCriterion`; defaults to DETR's (``HungarianMatcher(1, 5, 2)``,
                ``eos_coef`` 0.1, weights 1/5/2, auxiliary losses).
            jit_compile: ``False`` by default because the matcher's default ``"scipy"`` solver
                is a host callback that XLA cannot compile; with a
                ``HungarianMatcher(solver="ops")`` criterion, ``True`` works.
            **kwargs: other ``keras.Model.compile`` arguments (not ``loss``).
        """
        if kwargs.get("loss") is not None:
            raise ValueError(
                "DETR's loss is its set `criterion`; pass `criterion=`, not `loss=`. "
                f"Received: loss={kwargs['loss']!r}"
            )
        kwargs.pop("loss", None)
        optimizer = DetrAdamW() if optimizer is None else keras.optimizers.get(optimizer)
        inner = getattr(optimizer, "inner_optimizer", optimizer)  # a LossScaleOptimizer's
        if isinstance(inner, DetrAdamW) and not inner.has_backbone_variables:
            inner.set_backbone_variables(self.backbone_variables)
        if criterion is None:
            criterion = SetCriterion(self.num_classes, HungarianMatcher())
        self.criterion = criterion
        super().compile(optimizer=optimizer, jit_compile=jit_compile, **kwargs)

    def get_compile_config(self):
        config = super().get_compile_config()
        if config and self.criterion is not None:
            config["criterion"] = keras.saving.serialize_keras_object(self.criterion)
        return config

    def compile_from_config(self, config):
        config = keras.saving.deserialize_keras_object(config)
        self.compile(**config)
        if self.built:
            self.optimizer.build(self.trainable_variables)  # so that its state can be loaded

    def configure_replicas(self, num_replicas: int, all_reduce_sum: Callable | None) -> None:
        """Sets the cross-replica reduction used by a distributed trainer.

        DETR normalizes the box losses by the number of targets averaged over replicas, and
        Keras sums the replicas' gradients, so each replica's loss is divided by
        ``num_replicas``. The trainer (the TensorFlow edge) passes
        ``strategy.num_replicas_in_sync`` and a function summing a scalar over replicas.
        """
        if not isinstance(num_replicas, int) or num_replicas < 1:
            raise ValueError(
                f"`num_replicas` must be a positive integer. Received: {num_replicas!r}"
            )
        self._num_replicas = num_replicas
        self._all_reduce_sum = all_reduce_sum

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        """The criterion's ``"loss"`` on ``y = {"labels", "boxes", "valid"}``.

        Also updates the ``loss_ce``, ``loss_bbox`` and ``loss_giou`` metrics (last layer).
        """
        del x, sample_weight, training
        if self.criterion is None:
            raise ValueError("Call `compile()` before training or evaluating the model.")
        if y is None or y_pred is None:
            return None
        num_boxes = self.criterion.count_boxes(y)
        if self._all_reduce_sum is not None:
            num_boxes = self._all_reduce_sum(num_boxes) / self._num_replicas
        losses = self.criterion(y_pred, y, num_boxes=num_boxes)
        for tracker in self.loss_trackers:
            tracker.update_state(losses[tracker.name])
        loss = losses["loss"]
        for extra in self.losses:  # regularization losses, if any
            loss = loss + ops.cast(extra, loss.dtype)
        if self._num_replicas > 1:
            loss = loss / self._num_replicas
        return loss

    # --- serialization -----------------------------------------------------------------------

    def get_config(self):
        return {
            "name": self.name,
            "trainable": self.trainable,
            "dtype": keras.saving.serialize_keras_object(self.dtype_policy),
            "num_classes": self.num_classes,
            "backbone": keras.saving.serialize_keras_object(self.backbone),
            "hidden_dim": self.hidden_dim,
            "num_heads": self.num_heads,
            "num_encoder_layers": self.num_encoder_layers,
            "num_decoder_layers": self.num_decoder_layers,
            "ffn_dim": self.ffn_dim,
            "dropout": self.dropout,
            "num_queries": self.num_queries,
            "norm_first": self.norm_first,
            "query_type": self.query_type,
            "attention_radius": self.attention_radius,
            "box_refinement": self.box_refinement,
        }

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["backbone"] = keras.saving.deserialize_keras_object(config["backbone"])
        if isinstance(config.get("dtype"), dict):
            config["dtype"] = keras.saving.deserialize_keras_object(config["dtype"])
        return cls(**config)


def build_criterion(config, num_classes: int) -> SetCriterion:
    """The `SetCriterion` of a `vision.config.DetrConfig` for ``num_classes`` classes."""
    matcher = HungarianMatcher(
        cost_class=config.cost_class, cost_bbox=config.cost_bbox, cost_giou=config.cost_giou,
        solver=config.matcher_solver,
    )
    weights = {"loss_ce": config.loss_ce, "loss_bbox": config.loss_bbox,
               "loss_giou": config.loss_giou}
    return SetCriterion(num_classes, matcher, config.eos_coef, weights, config.aux_loss,
                        config.proposal_matches)


def build_model(config, num_classes: int) -> DETR:
    """Builds (uncompiled, with weights) the `DETR` of a `vision.config.DetrConfig`.

    Args:
        config: the model fields of the config are used.
        num_classes: number of object classes, from the data.

    Returns:
        A built `DETR`.
    """
    kwargs = {"filters": config.tiny_filters} if config.backbone == "tiny" else {}
    backbone = build_backbone(config.backbone, weights=config.backbone_weights, **kwargs)
    model = DETR(
        num_classes, backbone, hidden_dim=config.hidden_dim, num_heads=config.num_heads,
        num_encoder_layers=config.num_encoder_layers,
        num_decoder_layers=config.num_decoder_layers, ffn_dim=config.ffn_dim,
        dropout=config.dropout, num_queries=config.num_queries, norm_first=config.norm_first,
        query_type=config.query_type, attention_radius=config.attention_radius,
        box_refinement=config.box_refinement,
        name="detr",
    )
    model.build({"images": (None, None, None, 3), "mask": (None, None, None)})
    return model
