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

import math
from typing import Any, Callable

import keras
from keras import ops

from tfx_transformer import (
    SinePositionEmbedding2D,
    TransformerDecoder,
    TransformerEncoder,
    sine_features,
)
from vision.backbone import build_backbone
from vision.losses import SetCriterion
from vision.matcher import HungarianMatcher
from vision.optimizer import DetrAdamW

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


def _torch_linear_init(fan_in: int) -> dict:
    """PyTorch's default ``nn.Linear`` / ``nn.Conv2d`` initialization, used by DETR's heads."""
    bound = 1.0 / math.sqrt(fan_in)
    return dict(
        kernel_initializer=keras.initializers.VarianceScaling(1.0 / 3.0, "fan_in", "uniform"),
        bias_initializer=keras.initializers.RandomUniform(-bound, bound),
    )


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
            **_torch_linear_init(backbone.output_channels),
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
            num_classes + 1, dtype=self.dtype_policy, name="class_head", **_torch_linear_init(d)
        )
        self.box_head = [
            keras.layers.Dense(
                units, activation=activation, dtype=self.dtype_policy, name=f"box_head_{i}",
                **_torch_linear_init(d),
            )
            for i, (units, activation) in enumerate([(d, "relu"), (d, "relu"), (4, None)])
        ]
        if query_type != "learned":
            # The position embedding of a reference point (2 coordinates) or box (4).
            self._reference_features = d * (2 if query_type == "encoder" else 1)
            self.reference_mlp = [
                keras.layers.Dense(
                    units, activation=activation, dtype=self.dtype_policy,
                    name=f"reference_mlp_{i}", **_torch_linear_init(fan_in),
                )
                for i, (units, activation, fan_in) in enumerate(
                    [(d, "relu", self._reference_features), (d, None, d)])
            ]
        if query_type == "encoder":
            self.proposal_class_head = keras.layers.Dense(
                num_classes + 1, dtype=self.dtype_policy, name="proposal_class_head",
                **_torch_linear_init(d),
            )
            self.proposal_box_head = [
                keras.layers.Dense(
                    units, activation=activation, dtype=self.dtype_policy,
                    name=f"proposal_box_head_{i}", **_torch_linear_init(d),
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
            side = math.ceil(math.sqrt(q))
            rows = math.ceil(q / side)  # the rows actually used, so the grid spans the image
            grid = [[((i % side) + 0.5) / side, ((i // side) + 0.5) / rows] for i in range(q)]
            self.reference_logits = self.add_weight(
                shape=(q, 2), initializer=keras.initializers.Constant(
                    [[math.log(v / (1.0 - v)) for v in point] for point in grid]),
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
            query_pos = self._reference_embedding(points)
            target = ops.zeros_like(query_pos)
        else:
            proposals, target, reference = self._proposals(memory, feature_valid)
            outputs["enc_outputs"] = proposals
            points = ops.sigmoid(reference)  # (B, Q, 4)
            query_pos = self._reference_embedding(points)
        if self.box_refinement:
            hs, boxes, weights = self._refining_decoder(
                target, memory, memory_mask, pos, feature_valid, reference,
                return_cross_attention, training,
            )
        else:
            if self.attention_radius is not None:
                memory_mask = self._near_points(feature_valid, points[..., :2])  # (B, Q, S)
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

    def _refining_decoder(self, target, memory, memory_mask, pos, feature_valid, reference,
                          return_cross_attention, training):
        """The decoder stack's layers one by one, each refining the reference boxes.

        Layer ``i`` is positioned by the boxes of layer ``i - 1`` (the proposals for the
        first): its query position embedding and attention window come from them, and its
        box is predicted as an offset from them in logit space (Deformable DETR's iterative
        bounding-box refinement, with DAB-DETR's box position embedding). No gradient flows
        through the reference boxes from one layer to the next.

        Returns:
            ``(hs, boxes, weights)``: ``(L, B, Q, d)`` normalized layer outputs,
            ``(L, B, Q, 4)`` boxes, ``(L, B, heads, Q, S)`` cross-attention or None.
        """
        x, hs, boxes, weights = target, [], [], []
        for layer in self.decoder.layers:
            points = ops.sigmoid(reference)  # (B, Q, 4)
            mask = memory_mask
            if self.attention_radius is not None:
                mask = self._near_points(feature_valid, points[..., :2])  # (B, Q, S)
            out = layer(
                x, memory, memory_mask=mask, query_pos=self._reference_embedding(points),
                memory_pos=pos, return_cross_attention=return_cross_attention,
                training=training,
            )
            x, attention = out if return_cross_attention else (out, None)
            h = self.decoder.norm(x)  # (B, Q, d), as the stack's intermediate outputs
            box = self._box_logits(h) + reference  # (B, Q, 4) logits
            hs.append(h)
            boxes.append(ops.sigmoid(box))
            weights.append(attention)
            reference = ops.stop_gradient(box)
        weights = ops.stack(weights, axis=0) if return_cross_attention else None
        return ops.stack(hs, axis=0), ops.stack(boxes, axis=0), weights

    def _reference_embedding(self, points):
        """``(B, Q, K)`` normalized points or cxcywh boxes -> ``(B, Q, d)`` query positions.

        The sine features (``y`` before ``x``, as `SinePositionEmbedding2D`'s layout) of
        each coordinate times 2π, through a two-layer MLP.
        """
        order = [1, 0] if points.shape[-1] == 2 else [1, 0, 2, 3]
        points = ops.take(points, order, axis=-1) * (2 * math.pi)
        query_pos = ops.cast(sine_features(points, self.hidden_dim // 2), self.compute_dtype)
        for layer in self.reference_mlp:
            query_pos = layer(query_pos)
        return query_pos

    def _cell_centres(self, feature_valid):
        """``(B, h, w)`` validity -> cell centres ``cx``, ``cy`` ``(B, h, w)`` normalized by the
        valid extent, and the valid width ``(B, h, 1)`` and height ``(B, 1, w)`` in cells."""
        valid = ops.cast(feature_valid, "float32")  # (B, h, w)
        cells_h = ops.sum(valid, axis=1, keepdims=True)  # (B, 1, w)
        cells_w = ops.sum(valid, axis=2, keepdims=True)  # (B, h, 1)
        cy = (ops.cumsum(valid, axis=1) - 0.5) / (cells_h + 1e-6)
        cx = (ops.cumsum(valid, axis=2) - 0.5) / (cells_w + 1e-6)
        return cx, cy, cells_w, cells_h

    def _proposals(self, memory, feature_valid):
        """Two-stage queries: every cell's proposal, then the ``Q`` best as queries.

        Returns:
            ``(proposals, target, reference)``: ``proposals`` a dict with ``pred_logits``
            ``(B, S, C + 1)`` and ``pred_boxes`` ``(B, S, 4)`` (padded cells: certain
            no-object), ``target`` ``(B, Q, d)`` the chosen cells' features, ``reference``
            ``(B, Q, 4)`` the logits of their boxes, without gradient.
        """
        batch, q = ops.shape(memory)[0], self.num_queries
        cx, cy, cells_w, cells_h = self._cell_centres(feature_valid)
        width = 2.0 / ops.maximum(cells_w, 1.0) + ops.zeros_like(cx)  # (B, h, w): 2 cells
        height = 2.0 / ops.maximum(cells_h, 1.0) + ops.zeros_like(cy)
        anchors = ops.reshape(ops.stack([cx, cy, width, height], axis=-1), (batch, -1, 4))
        anchors = ops.clip(anchors, 0.01, 0.99)
        anchors = ops.log(anchors / (1.0 - anchors))  # (B, S, 4) logits
        valid = ops.reshape(feature_valid, (batch, -1))  # (B, S)
        logits = ops.cast(self.proposal_class_head(memory), "float32")  # (B, S, C + 1)
        no_object = ops.one_hot(self.num_classes, self.num_classes + 1) * 2e4 - 1e4
        logits = ops.where(valid[..., None], logits, no_object)
        boxes = memory
        for layer in self.proposal_box_head:
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

    def _near_points(self, feature_valid, points):
        """``(B, Q, S)`` bool: valid feature cells within ``attention_radius`` of each point.

        ``points`` is ``(B, Q, 2)`` normalized ``(cx, cy)``.

        A cell's coordinate is its centre normalized by the valid extent of its image, the
        same frame as the normalized boxes.
        """
        batch = ops.shape(feature_valid)[0]
        cx, cy, _, _ = self._cell_centres(feature_valid)
        cx = ops.reshape(cx, (batch, 1, -1))  # (B, 1, S)
        cy = ops.reshape(cy, (batch, 1, -1))
        points = ops.stop_gradient(points)[..., None]  # (B, Q, 2, 1)
        near = ops.logical_and(
            ops.abs(cx - points[:, :, 0]) <= self.attention_radius,
            ops.abs(cy - points[:, :, 1]) <= self.attention_radius,
        )  # (B, Q, S)
        return ops.logical_and(near, ops.reshape(feature_valid, (batch, 1, -1)))

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
