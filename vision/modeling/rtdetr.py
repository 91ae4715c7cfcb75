"""RT-DETR: ResNet-vd backbone -> hybrid encoder -> query selection -> deformable decoder.

As transformers' ``RTDetrForObjectDetection`` computes it in eval mode (lyuwenyu/RT-DETR):

1. the backbone (`vision.modeling.rtdetr_backbone`) gives three maps (strides 8, 16, 32);
2. the hybrid encoder (`vision.modeling.hybrid_encoder`) projects them to ``hidden_dim``,
   runs AIFI on the coarsest and fuses them (FPN + PAN);
3. decoder input projections: a 1x1 convolution + BatchNorm per level to ``d_model``, and for
   each level beyond the encoder's a 3x3 stride-2 convolution + BatchNorm of the encoder's
   last map (transformers applies every extra one to that map);
4. query selection ("encoder output head"): the maps are flattened (level after level,
   row-major) into the memory; every cell has an anchor box (its centre, side ``0.05 *
   2^level``) in logit space, ``float32`` max where it is not inside ``(0.01, 0.99)`` (and
   that cell's memory is zeroed); ``enc_output`` (Dense + LayerNorm) then the class head and
   the box head (an MLP whose output is added to the anchor) score every cell; the
   ``num_queries`` cells of highest class logit (max over classes) give the decoder's queries
   (their ``enc_output`` features) and reference boxes (their box logits);
5. the decoder (`vision.modeling.rtdetr_decoder`) refines the boxes layer by layer; its last
   layer's class logits and boxes are the model's outputs.

The classes are scored with sigmoids (focal loss): ``num_classes`` logits, no "no object"
column. Padding masks are not used (transformers' RT-DETR has none in inference either).

In training, with the targets among the inputs (``{"images", "targets"}``) and
``num_denoising`` > 0, RT-DETR's denoising queries (`vision.modeling.denoising.RTDetrDenoising`)
follow the selected ones into the decoder; the outputs then hold theirs as ``"denoising"``
(every layer's predictions and the targets they reconstruct), which the set criterion scores
without matching.

Training (``compile`` + ``fit``, `vision.modeling.set_loss.SetLossModel`) uses RT-DETR's
criterion by default (`rtdetr_criterion`): the focal matching cost (class 2, L1 5, GIoU 2),
the varifocal classification loss and L1 / GIoU box losses (weights 1, 5, 2) on the last
decoder layer, on every earlier one and on the selected cells' boxes (``enc_outputs``), each
matched on its own, as transformers' ``RTDetrLoss`` computes them.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import keras
from keras import ops

from vision.matching.losses import SetCriterion
from vision.matching.matcher import HungarianMatcher
from vision.modeling.denoising import RTDetrDenoising
from vision.modeling.heads import MLP
from vision.modeling.hybrid_encoder import ConvNorm
from vision.modeling.postprocess import rtdetr_postprocess
from vision.modeling.set_loss import SetLossModel

__all__ = ["QuerySelection", "RTDetr", "anchors", "criterion_terms", "rtdetr_criterion"]

_LOSS_TERMS = ("loss_vfl", "loss_bbox", "loss_giou")

_FLOAT32_MAX = 3.4028234663852886e38


class QuerySelection(NamedTuple):
    """What `RTDetr.select_queries` gives the decoder (``S`` cells over all levels).

    Attributes:
        memory: ``(B, S, d)`` the flattened decoder input maps.
        spatial_shapes: ``[(h, w)]`` per level.
        enc_logits: ``(B, S, C)`` every cell's class logits.
        enc_box_logits: ``(B, S, 4)`` every cell's box, cxcywh in logit space (anchor added).
        target: ``(B, Q, d)`` the selected cells' ``enc_output`` features (the queries).
        reference_logits: ``(B, Q, 4)`` their boxes in logit space (``init_reference_points``;
            no gradient flows back through it).
        topk_logits: ``(B, Q, C)`` their class logits.
        topk_box_logits: ``(B, Q, 4)`` their boxes in logit space, with gradient (the
            ``enc_outputs`` loss trains the box head through it).
    """

    memory: Any
    spatial_shapes: list
    enc_logits: Any
    enc_box_logits: Any
    target: Any
    reference_logits: Any
    topk_logits: Any
    topk_box_logits: Any


def anchors(spatial_shapes, grid_size: float = 0.05, eps: float = 1e-2):
    """RT-DETR's anchor of every cell, in logit space: ``(1, S, 4)`` cxcywh, and ``(1, S, 1)``
    whether it lies inside ``(eps, 1 - eps)``; outside anchors hold ``float32`` max (as
    transformers' ``generate_anchors``)."""
    boxes = []
    for level, (height, width) in enumerate(spatial_shapes):
        y = (ops.arange(height, dtype="float32") + 0.5) / ops.cast(height, "float32")
        x = (ops.arange(width, dtype="float32") + 0.5) / ops.cast(width, "float32")
        cx = ops.tile(x, [height])  # (h * w,), row-major
        cy = ops.repeat(y, width)
        side = ops.full_like(cx, grid_size * 2.0**level)
        boxes.append(ops.stack([cx, cy, side, side], axis=-1))  # (h * w, 4)
    boxes = ops.concatenate(boxes, axis=0)[None]  # (1, S, 4)
    valid = ops.all((boxes > eps) & (boxes < 1 - eps), axis=-1, keepdims=True)
    logits = ops.log(boxes / (1 - boxes))
    return ops.where(valid, logits, _FLOAT32_MAX), valid


@keras.saving.register_keras_serializable(package="vision")
class RTDetr(SetLossModel):
    """The RT-DETR detector (see the module docstring).

    Args:
        num_classes: object classes ``C`` (sigmoid scores, no "no object" class).
        backbone: a `vision.modeling.rtdetr_backbone.RTDetrResNetBackbone`.
        encoder: a `vision.modeling.hybrid_encoder.HybridEncoder` over the backbone's maps.
        decoder: a `vision.modeling.rtdetr_decoder.RTDetrDecoder` of ``d_model`` width.
        d_model: the decoder's width.
        num_queries: queries ``Q`` selected from the encoder's cells.
        num_feature_levels: levels the decoder attends to (the encoder's, plus extra
            stride-2 levels).
        layer_norm_epsilon, batch_norm_epsilon: of ``enc_output``'s LayerNorm and of the
            decoder input projections' BatchNorms.
        num_denoising, label_noise_ratio, box_noise_scale: the denoising queries in training
            (transformers' fields; `RTDetrDenoising`).
        **kwargs: base model arguments.

    Call arguments:
        inputs: ``(B, H, W, 3)`` images, or a dict with ``"images"`` and, for the denoising
            queries in training, ``"targets"`` (``labels``, ``boxes``, ``valid``; a
            ``"mask"`` is ignored: RT-DETR has no padding mask).
        training: BatchNorm statistics and dropout.

    Returns:
        dict with ``"pred_logits"`` ``(B, Q, C)``, ``"pred_boxes"`` ``(B, Q, 4)`` (normalized
        cxcywh), ``"aux_outputs"`` (the earlier decoder layers' two, a list) and
        ``"enc_outputs"`` (the selected cells' ``pred_logits`` and ``pred_boxes``), and in
        training with targets ``"denoising"`` (see the module docstring).
    """

    def __init__(self, num_classes: int, backbone: keras.layers.Layer,
                 encoder: keras.layers.Layer, decoder: keras.layers.Layer,
                 d_model: int = 256, num_queries: int = 300, num_feature_levels: int = 3,
                 layer_norm_epsilon: float = 1e-5, batch_norm_epsilon: float = 1e-5,
                 num_denoising: int = 0, label_noise_ratio: float = 0.5,
                 box_noise_scale: float = 1.0, **kwargs):
        super().__init__(**kwargs)
        if num_feature_levels < encoder.num_levels:
            raise ValueError(f"`num_feature_levels` must be at least the encoder's "
                             f"{encoder.num_levels} levels. Received: {num_feature_levels}")
        self.num_classes, self.d_model, self.num_queries = num_classes, d_model, num_queries
        self.num_feature_levels = num_feature_levels
        self.layer_norm_epsilon, self.batch_norm_epsilon = layer_norm_epsilon, \
            batch_norm_epsilon
        self.backbone, self.encoder, self.decoder = backbone, encoder, decoder
        policy, d = self.dtype_policy, d_model
        self.decoder_input_proj = [self._input_projection(i) for i in range(num_feature_levels)]
        self.enc_output = keras.layers.Dense(d, dtype=policy, name="enc_output")
        self.enc_output_norm = keras.layers.LayerNormalization(
            epsilon=layer_norm_epsilon, dtype=policy, name="enc_output_norm")
        prior = 1.0 / (num_classes + 1)  # transformers' initialization, as the decoder's heads
        self.enc_score_head = keras.layers.Dense(
            num_classes, bias_initializer=keras.initializers.Constant(
                -math.log((1 - prior) / prior)), dtype=policy, name="enc_score_head")
        self.enc_bbox_head = MLP(d, d, 4, 3, dtype=policy, name="enc_bbox_head")
        self.denoising = RTDetrDenoising(num_denoising, num_classes, d, label_noise_ratio,
                                         box_noise_scale, dtype=policy, name="denoising")
        self.criterion: SetCriterion | None = None
        self.loss_trackers = [keras.metrics.Mean(name=name) for name in _LOSS_TERMS]

    def _input_projection(self, level: int) -> keras.layers.Layer:
        """Level ``level``'s decoder input projection: a 1x1 `ConvNorm` of an encoder level,
        a 3x3 stride-2 one beyond them."""
        own = level < self.encoder.num_levels
        return ConvNorm(self.d_model, 1 if own else 3, 1 if own else 2,
                        epsilon=self.batch_norm_epsilon, dtype=self.dtype_policy,
                        name=f"decoder_input_proj_{level}")

    @property
    def backbone_variables(self) -> list:
        """The backbone's trainable variables (trained with the smaller learning rate)."""
        return list(self.backbone.trainable_variables)

    def default_criterion(self) -> SetCriterion:
        """`rtdetr_criterion` for this model's classes."""
        return rtdetr_criterion(self.num_classes)

    def build(self, images_shape):
        if isinstance(images_shape, dict):
            images_shape = images_shape["images"]
        images_shape = (None, None, None, images_shape[-1])
        if not self.backbone.built:
            self.backbone.build(images_shape)
        levels = self.backbone.compute_output_shape(images_shape)
        if not self.encoder.built:
            self.encoder.build(levels)
        h = (None, None, None, self.encoder.hidden_dim)
        for proj in self.decoder_input_proj:
            proj.build(h)
        for layer in (self.enc_output, self.enc_output_norm, self.enc_score_head,
                      self.enc_bbox_head):
            layer.build((None, None, self.d_model))
        last = self.enc_bbox_head.layers[-1]  # boxes start at their anchors
        last.kernel.assign(ops.zeros_like(last.kernel))
        last.bias.assign(ops.zeros_like(last.bias))
        if not self.decoder.built:
            self.decoder.build((None, self.num_queries, self.d_model), (None, None, self.d_model))
        self.denoising.build()
        self.built = True

    def select_queries(self, images, training=None) -> QuerySelection:
        """Backbone, encoder, decoder input projections and the query selection."""
        features = self.backbone(images, training=training)
        encoded = self.encoder(features, training=training)
        sources = [proj(x, training=training)
                   for proj, x in zip(self.decoder_input_proj, encoded)]
        for proj in self.decoder_input_proj[len(encoded):]:  # transformers: all of the last
            sources.append(proj(encoded[-1], training=training))
        shapes, flat = [], []
        for source in sources:
            shape = ops.shape(source)
            shapes.append((shape[1], shape[2]))
            flat.append(ops.reshape(source, (shape[0], -1, self.d_model)))  # (B, h * w, d)
        memory = ops.concatenate(flat, axis=1)  # (B, S, d)
        anchor_logits, valid = anchors(shapes)
        output = self.enc_output_norm(self.enc_output(memory * ops.cast(valid, memory.dtype)))
        enc_logits = self.enc_score_head(output)  # (B, S, C)
        enc_boxes = self.enc_bbox_head(output) + ops.cast(anchor_logits, output.dtype)
        _, index = ops.top_k(ops.max(enc_logits, axis=-1), self.num_queries)  # (B, Q)

        def take(x):  # (B, S, k) -> (B, Q, k)
            return ops.take_along_axis(x, index[..., None], axis=1)

        topk_boxes = take(enc_boxes)
        return QuerySelection(memory, shapes, enc_logits, enc_boxes,
                              ops.stop_gradient(take(output)),
                              ops.stop_gradient(topk_boxes), take(enc_logits), topk_boxes)

    def call(self, inputs, training=None):
        images, targets = (inputs["images"], inputs.get("targets")) if isinstance(
            inputs, dict) else (inputs, None)
        selection = self.select_queries(images, training=training)
        target, reference, mask, meta = self.decoder_queries(selection, targets, training)
        logits, boxes = self.decoder(
            target, selection.memory, reference, spatial_shapes=selection.spatial_shapes,
            self_attention_mask=mask, training=training)  # (B, L, Q [+ N], C|4)
        return self.layer_outputs(selection, meta, {"pred_logits": logits, "pred_boxes": boxes})

    def decoder_queries(self, selection: QuerySelection, targets, training):
        """``(queries, reference logits, self-attention mask, denoising meta)``: the selected
        cells', followed in training by the denoising queries (mask and meta None without)."""
        target, reference = selection.target, selection.reference_logits
        if not self.denoising.active(targets, training):
            return target, reference, None, None
        content, noised, meta = self.denoising.noised(targets)
        mask = self.denoising.attention_mask(None, ops.shape(target)[0], self.num_queries, meta)
        target = ops.concatenate([target, ops.cast(content, target.dtype)], axis=1)
        # float32 (the decoder's dtype for boxes): the noised boxes are not rounded.
        reference = ops.concatenate([ops.cast(reference, "float32"), noised], axis=1)
        return target, reference, mask, meta

    def matching_part(self, x, meta):
        """``(the matching queries' part, the denoising queries' part | None)`` of a
        ``(B, L, Q [+ N], k)`` decoder output; the first keeps the static count ``Q`` (the
        "ops" solver's)."""
        if meta is None:
            return x, None
        q = self.num_queries
        shape = (-1 if x.shape[0] is None else x.shape[0], x.shape[1], q, x.shape[3])
        return ops.reshape(x[:, :, :q], shape), x[:, :, q:]

    def layer_outputs(self, selection: QuerySelection, meta, per_layer: dict) -> dict:
        """The model's outputs (see the class docstring) of the decoder's ``{key: (B, L,
        Q [+ N], k)}`` (``pred_logits``, ``pred_boxes``, ...)."""
        matching, noised = {}, {}
        for key, x in per_layer.items():
            matching[key], noised[key] = self.matching_part(ops.cast(x, "float32"), meta)
        count = matching["pred_logits"].shape[1]
        layers = [{key: x[:, i] for key, x in matching.items()} for i in range(count)]
        enc_boxes = ops.sigmoid(ops.cast(selection.topk_box_logits, "float32"))
        outputs = {**layers[-1], "aux_outputs": layers[:-1],
                   "enc_outputs": {"pred_logits": ops.cast(selection.topk_logits, "float32"),
                                   "pred_boxes": enc_boxes}}
        if meta is not None:
            layers = [{key: x[:, i] for key, x in noised.items()} for i in range(count)]
            outputs["denoising"] = {**layers[-1], "aux_outputs": layers[:-1], **{
                key: meta[key] for key in ("labels", "boxes", "positive", "valid", "groups")}}
        return outputs

    def postprocess(self, outputs: dict, image_sizes: Any) -> dict:
        """`rtdetr_postprocess` of this model's ``outputs`` (the exported detector's)."""
        return rtdetr_postprocess(outputs, image_sizes)

    def get_config(self):
        return {
            "name": self.name, "trainable": self.trainable,
            "dtype": keras.saving.serialize_keras_object(self.dtype_policy),
            "backbone": keras.saving.serialize_keras_object(self.backbone),
            "encoder": keras.saving.serialize_keras_object(self.encoder),
            "decoder": keras.saving.serialize_keras_object(self.decoder),
            "num_classes": self.num_classes, "d_model": self.d_model,
            "num_queries": self.num_queries, "num_feature_levels": self.num_feature_levels,
            "layer_norm_epsilon": self.layer_norm_epsilon,
            "batch_norm_epsilon": self.batch_norm_epsilon,
            "num_denoising": self.denoising.num_denoising,
            "label_noise_ratio": self.denoising.label_noise,
            "box_noise_scale": self.denoising.box_noise,
        }

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        for key in ("backbone", "encoder", "decoder", "dtype"):
            if isinstance(config.get(key), dict):
                config[key] = keras.saving.deserialize_keras_object(config[key])
        return cls(**config)


def rtdetr_criterion(num_classes: int, solver: str = "scipy", aux_loss: bool = True,
                     weights: dict | None = None,
                     costs: tuple[float, float, float] = (2.0, 5.0, 2.0),
                     **deim) -> SetCriterion:
    """RT-DETR's set criterion (transformers' ``RTDetrConfig`` defaults): focal matching cost
    (class, L1, GIoU `costs` 2, 5, 2; alpha 0.25, gamma 2), varifocal loss (alpha 0.75,
    gamma 2) and box losses, weighted 1 / 5 / 2 (`weights` replaces them), on every decoder
    layer with `aux_loss` and on the selected cells. `deim`: `criterion_terms`'s switches
    of DEIM's losses."""
    matcher = HungarianMatcher(*costs, solver=solver, classification="focal", alpha=0.25,
                               gamma=2.0)
    return SetCriterion(num_classes, matcher, weight_dict=weights, aux_loss=aux_loss,
                        **criterion_terms(**deim))


def criterion_terms(matchability_aware_loss: bool = False,
                    dense_one_to_one: bool = False) -> dict:
    """The `SetCriterion` settings of the real-time detectors' classification and matching:
    RT-DETR's and D-FINE's varifocal loss (alpha 0.75, gamma 2), or DEIM's
    matchability-aware loss (gamma 1.5, as DEIM's published configs); one-to-one box losses,
    or DEIM's dense one-to-one ones (`vision.matching.dense`)."""
    terms = {"classification": "matchability", "focal_alpha": 0.75, "focal_gamma": 1.5} if \
        matchability_aware_loss else {"classification": "varifocal", "focal_alpha": 0.75,
                                      "focal_gamma": 2.0}
    return {**terms, "dense_one_to_one": bool(dense_one_to_one)}
