"""D-FINE's decoder: fine-grained distribution refinement (FDR) of the boxes' four edges.

As transformers' ``DFineDecoder`` (with the heads ``DFineForObjectDetection`` gives it;
Peterande/D-FINE's ``DFINETransformer``) computes it, for ``eval_idx`` the last layer and
``layer_scale`` 1 (every published checkpoint). From the selected cells' features ``x`` and
box logits ``z`` (reference ``r = sigmoid(z)``), each layer ``i``:

1. ``pos = clip(query_pos_head(r), -10, 10)``;
2. the decoder layer (`DFineDecoderLayer`): self-attention + residual + LayerNorm;
   deformable cross-attention without value or output projection, merged with its input by
   a gate (``LayerNorm(g1 * x + g2 * attended)``, ``g = sigmoid(Dense([x, attended]))``);
   FFN + residual + LayerNorm (the sum clipped to float16's range first);
3. layer 0 only: ``r0 = sigmoid(pre_box_head(x) + z)`` is every layer's initial box;
4. the edge distributions: ``corners_i = box_head_i(x_i + stop_gradient(x_{i-1})) +
   corners_{i-1}`` (``4 x (max_num_bins + 1)`` logits, the earlier layers' sum carrying its
   gradient); each edge's distance is ``sum softmax(corners) * W`` (`weighting_function`),
   and the box ``distance_to_box(r0, distances)``; the next layer starts from it without
   its gradient;
5. ``class_head_i(x)`` plus the location-quality estimate of the layer's distributions
   (``LQE``: an MLP of each edge's top-4 probabilities and their mean) gives its logits.

The layers reuse the shared `tfx_transformer` layers (``MultiHeadAttention``,
``MultiScaleDeformableAttention`` with ``use_projections=False``, ``FeedForward``);
`transformers_arrays` maps a checkpoint's ``model.decoder.*`` tensors onto them.
``keras.ops`` only.
"""

from __future__ import annotations

import math

import keras
import numpy as np
from keras import ops

from tfx_transformer import checks
from tfx_transformer.layers.block import ResidualBlockLayer
from tfx_transformer.layers.deformable_attention import MultiScaleDeformableAttention
from tfx_transformer.layers.masks import to_attention_mask
from tfx_transformer.layers.position import add_position
from vision.modeling.heads import MLP
from vision.modeling.rtdetr_decoder import _INVERSE_SIGMOID_EPS

__all__ = ["DFineDecoder", "DFineDecoderLayer", "distance_to_box", "weighting_function"]

_FLOAT16_MAX = 65504.0


def weighting_function(max_num_bins: int, up: float = 0.5, reg_scale: float = 4.0
                       ) -> np.ndarray:
    """D-FINE's edge offsets ``W(n)``, ``(max_num_bins + 1,)`` float32: ``0`` in the middle,
    ``+-(step^k - 1)`` for ``k < max_num_bins / 2`` with ``step = (up * reg_scale + 1) ^ (2 /
    (max_num_bins - 2))``, and ``+-2 * up * reg_scale`` at both ends."""
    bound = abs(up) * abs(reg_scale)
    step = (bound + 1) ** (2 / (max_num_bins - 2))
    left = [-(step ** i) + 1 for i in range(max_num_bins // 2 - 1, 0, -1)]
    right = [step ** i - 1 for i in range(1, max_num_bins // 2)]
    return np.array([-2 * bound, *left, 0.0, *right, 2 * bound], dtype="float32")


def distance_to_box(reference, distances, reg_scale: float = 4.0):
    """Boxes (cxcywh) of the four edge distances ``(left, top, right, bottom)`` from the
    reference boxes ``(cx, cy, w, h)``: an edge lies ``(reg_scale / 2 + distance) * side /
    reg_scale`` from the centre (transformers' ``distance2bbox``)."""
    scale = abs(reg_scale)
    cx, cy, w, h = (reference[..., i] for i in range(4))
    x1 = cx - (0.5 * scale + distances[..., 0]) * (w / scale)
    y1 = cy - (0.5 * scale + distances[..., 1]) * (h / scale)
    x2 = cx + (0.5 * scale + distances[..., 2]) * (w / scale)
    y2 = cy + (0.5 * scale + distances[..., 3]) * (h / scale)
    return ops.stack([(x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1], axis=-1)


@keras.saving.register_keras_serializable(package="vision")
class DFineDecoderLayer(ResidualBlockLayer):
    """Self-attention, gated deformable cross-attention and FFN (see the module docstring).

    Args:
        num_heads: heads of both attentions.
        hidden_dim: inner width of the FFN (``decoder_ffn_dim``).
        num_levels: feature levels of the memory.
        num_points: sampling points per head, one count per level (``decoder_n_points``).
        offset_scale: ``decoder_offset_scale``.
        method: ``decoder_method`` (``"default"``: bilinear; ``"discrete"``).
        dropout: dropout on each sub-layer's output (D-FINE: 0).
        **kwargs: the other `ResidualBlockLayer` arguments.

    Call arguments: as `vision.modeling.rtdetr_decoder.RTDetrDecoderLayer`'s.
    """

    def __init__(self, num_heads: int, hidden_dim: int, num_levels: int = 3,
                 num_points=(3, 6, 3), offset_scale: float = 0.5, method: str = "default",
                 dropout: float = 0.0, **kwargs):
        super().__init__(num_heads, hidden_dim, dropout=dropout, **kwargs)
        self.num_levels = checks.positive_int("num_levels", num_levels)
        self.num_points = list(checks.positive_ints("num_points", num_points,
                                                    length=num_levels))
        self.offset_scale, self.method = float(offset_scale), method

    def build(self, x_shape, memory_shape, reference_points_shape=None):
        d = x_shape[-1]
        self.self_attention = self._attention(d, "self_attention")
        self.self_attention.build(x_shape, x_shape)
        self.self_attention_norm = self._norm(x_shape, "self_attention_norm")
        self.self_attention_dropout = self._dropout_layer()
        self.cross_attention = MultiScaleDeformableAttention(
            self.num_heads, self.num_levels, self.num_points, offset_scale=self.offset_scale,
            method=self.method, use_projections=False, dtype=self.dtype_policy,
            name="cross_attention")
        self.cross_attention.build(x_shape, memory_shape)
        self.cross_attention_dropout = self._dropout_layer()
        # transformers' DFineGate: weight 0 and bias 0 (each gate starts at 1/2).
        self.gate = keras.layers.Dense(2 * d, kernel_initializer="zeros",
                                       dtype=self.dtype_policy, name="gate")
        self.gate.build((*x_shape[:-1], 2 * d))
        self.gate_norm = self._norm(x_shape, "gate_norm")
        self.feedforward = self._feedforward(x_shape)
        self.feedforward_norm = self._norm(x_shape, "feedforward_norm")
        self.feedforward_dropout = self._dropout_layer()

    def call(self, x, memory, reference_points, *, spatial_shapes, query_pos=None,
             self_attention_mask=None, memory_mask=None, training=None):
        mask = to_attention_mask(self_attention_mask, "self_attention_mask")

        def self_attend(h):
            qk = add_position(h, query_pos)
            return self.self_attention(qk, h, qk, attention_mask=mask,
                                       training=training).output, None

        x, _ = self.residual(x, self_attend, self.self_attention_norm,
                             self.self_attention_dropout, training)
        attended = self.cross_attention(add_position(x, query_pos), memory, reference_points,
                                        spatial_shapes=spatial_shapes, value_mask=memory_mask,
                                        training=training).output
        attended = self.cross_attention_dropout(attended, training=training)
        gates = ops.sigmoid(self.gate(ops.concatenate([x, attended], axis=-1)))
        d = ops.shape(x)[-1]
        x = self.gate_norm(gates[..., :d] * x + gates[..., d:] * attended)
        y = x + self.feedforward_dropout(self.feedforward(x, training=training),
                                         training=training)
        return self.feedforward_norm(ops.clip(y, -_FLOAT16_MAX, _FLOAT16_MAX))

    def get_config(self):
        config = super().get_config()
        config.update(num_levels=self.num_levels, num_points=self.num_points,
                      offset_scale=self.offset_scale, method=self.method)
        return config


@keras.saving.register_keras_serializable(package="vision")
class DFineDecoder(keras.layers.Layer):
    """D-FINE's decoder layers with FDR and LQE (see the module docstring).

    Initialized as transformers' ``DFineForObjectDetection``: class heads Glorot-uniform
    with the bias of prior probability ``1 / (num_classes + 1)``, the box heads' and the
    LQEs' last layers zero, the gates at 1/2.

    Args:
        num_layers: decoder layers ``L``.
        num_classes: class logits per query ``C``.
        num_heads: attention heads.
        ffn_dim: inner width of each layer's FFN.
        num_levels: feature levels of the memory.
        num_points: sampling points per head, per level.
        offset_scale, method: the deformable attention's (``decoder_offset_scale``,
            ``decoder_method``).
        max_num_bins: bins of each edge's distribution (its logits are ``max_num_bins + 1``).
        reg_scale, up: `weighting_function`'s curvature and bound.
        top_prob_values: probabilities per edge the LQE reads.
        lqe_hidden_dim, lqe_layers: the LQE's MLP.
        dropout, attention_dropout, activation_dropout, activation, layer_norm_epsilon: the
            layers' (`ResidualBlockLayer`).
        **kwargs: base layer arguments.

    Call arguments: as `vision.modeling.rtdetr_decoder.RTDetrDecoder`'s.

    Returns:
        dict: ``logits`` ``(B, L, Q, C)`` (compute dtype; LQE included), ``boxes``
        ``(B, L, Q, 4)``, ``corners`` ``(B, L, Q, 4 * (max_num_bins + 1))`` (float32, every
        layer's edge logits), ``initial`` ``(B, Q, 4)`` (the boxes ``r0`` the distances are
        measured from), ``pre_logits`` ``(B, Q, C)`` and ``pre_boxes`` ``(B, Q, 4)`` (layer
        0's class head without LQE and ``r0`` with its gradient: D-FINE's ``pre_outputs``).
    """

    def __init__(self, num_layers: int, num_classes: int, num_heads: int = 8,
                 ffn_dim: int = 1024, num_levels: int = 3, num_points=(3, 6, 3),
                 offset_scale: float = 0.5, method: str = "default", max_num_bins: int = 32,
                 reg_scale: float = 4.0, up: float = 0.5, top_prob_values: int = 4,
                 lqe_hidden_dim: int = 64, lqe_layers: int = 2, dropout: float = 0.0,
                 attention_dropout: float = 0.0, activation_dropout: float = 0.0,
                 activation="relu", layer_norm_epsilon: float = 1e-5, **kwargs):
        super().__init__(**kwargs)
        self.num_layers = checks.positive_int("num_layers", num_layers)
        self.num_classes = checks.positive_int("num_classes", num_classes)
        self.num_heads = checks.positive_int("num_heads", num_heads)
        self.ffn_dim = checks.positive_int("ffn_dim", ffn_dim)
        self.num_levels = checks.positive_int("num_levels", num_levels)
        points = [num_points] * num_levels if isinstance(num_points, int) else num_points
        self.num_points = list(checks.positive_ints("num_points", points, length=num_levels))
        self.offset_scale, self.method = float(offset_scale), method
        self.max_num_bins = checks.positive_int("max_num_bins", max_num_bins)
        self.reg_scale, self.up = float(reg_scale), float(up)
        self.top_prob_values = checks.positive_int("top_prob_values", top_prob_values)
        self.lqe_hidden_dim = checks.positive_int("lqe_hidden_dim", lqe_hidden_dim)
        self.lqe_layers = checks.positive_int("lqe_layers", lqe_layers)
        self.dropout = checks.fraction("dropout", dropout)
        self.attention_dropout = checks.fraction("attention_dropout", attention_dropout)
        self.activation_dropout = checks.fraction("activation_dropout", activation_dropout)
        self.activation = keras.activations.serialize(keras.activations.get(activation))
        self.layer_norm_epsilon = checks.positive_number("layer_norm_epsilon",
                                                         layer_norm_epsilon)
        self.project = weighting_function(max_num_bins, up, reg_scale)

    def build(self, target_shape, memory_shape, reference_logits_shape=None):
        d, policy, bins = target_shape[-1], self.dtype_policy, self.max_num_bins + 1
        self.query_pos_head = MLP(4, 2 * d, d, 2, dtype=policy, name="query_pos_head")
        self.query_pos_head.build((*target_shape[:-1], 4))
        self.pre_box_head = MLP(d, d, 4, 3, dtype=policy, name="pre_box_head")
        self.pre_box_head.build(target_shape)
        self.layers, self.class_heads, self.box_heads, self.lqe = [], [], [], []
        prior = 1.0 / (self.num_classes + 1)
        for i in range(self.num_layers):
            layer = DFineDecoderLayer(
                self.num_heads, self.ffn_dim, self.num_levels, self.num_points,
                self.offset_scale, self.method, dropout=self.dropout,
                attention_dropout=self.attention_dropout,
                activation_dropout=self.activation_dropout, activation=self.activation,
                layer_norm_epsilon=self.layer_norm_epsilon, dtype=policy, name=f"layer_{i}")
            layer.build(target_shape, memory_shape)
            head = keras.layers.Dense(
                self.num_classes, kernel_initializer="glorot_uniform",
                bias_initializer=keras.initializers.Constant(-math.log((1 - prior) / prior)),
                dtype=policy, name=f"class_head_{i}")
            head.build(target_shape)
            box = MLP(d, d, 4 * bins, 3, dtype=policy, name=f"box_head_{i}")
            box.build(target_shape)
            lqe = MLP(4 * (self.top_prob_values + 1), self.lqe_hidden_dim, 1, self.lqe_layers,
                      dtype=policy, name=f"lqe_{i}")
            lqe.build((*target_shape[:-1], 4 * (self.top_prob_values + 1)))
            for last in (box.layers[-1], lqe.layers[-1]):
                last.kernel.assign(ops.zeros_like(last.kernel))
                last.bias.assign(ops.zeros_like(last.bias))
            self.layers.append(layer)
            self.class_heads.append(head)
            self.box_heads.append(box)
            self.lqe.append(lqe)

    def _quality(self, lqe, corners):
        """The LQE's score of each query's four edge distributions ``(B, Q, 1)``."""
        shape = ops.shape(corners)
        probs = ops.softmax(ops.reshape(corners, (shape[0], shape[1], 4,
                                                  self.max_num_bins + 1)), axis=-1)
        top, _ = ops.top_k(probs, self.top_prob_values)  # (B, Q, 4, k)
        stat = ops.concatenate([top, ops.mean(top, axis=-1, keepdims=True)], axis=-1)
        stat = ops.reshape(stat, (shape[0], shape[1], 4 * (self.top_prob_values + 1)))
        return lqe(ops.cast(stat, self.compute_dtype))

    def _distances(self, corners):
        """Each edge's expected offset ``sum softmax(logits) * W``: ``(B, Q, 4)``."""
        shape = ops.shape(corners)
        probs = ops.softmax(ops.reshape(corners, (shape[0], shape[1], 4,
                                                  self.max_num_bins + 1)), axis=-1)
        return ops.sum(probs * ops.convert_to_tensor(self.project), axis=-1)

    def call(self, target, memory, reference_logits, *, spatial_shapes,
             self_attention_mask=None, memory_mask=None, training=None):
        x = target
        limit = -math.log(_INVERSE_SIGMOID_EPS)  # where inverse_sigmoid clamps
        z = ops.clip(ops.cast(reference_logits, "float32"), -limit, limit)
        reference = ops.sigmoid(z)
        previous, corners = None, None
        logits, boxes, all_corners = [], [], []
        for i, layer in enumerate(self.layers):
            pos = ops.clip(self.query_pos_head(reference), -10.0, 10.0)
            x = layer(x, memory, reference[:, :, None, :], spatial_shapes=spatial_shapes,
                      query_pos=pos, self_attention_mask=self_attention_mask,
                      memory_mask=memory_mask, training=training)
            if i == 0:
                pre_boxes = ops.sigmoid(ops.cast(self.pre_box_head(x), "float32") + z)
                initial = ops.stop_gradient(pre_boxes)
                pre_logits = self.class_heads[0](x)
            step = self.box_heads[i](x if previous is None else x + previous)
            corners = ops.cast(step, "float32") + (0.0 if corners is None else corners)
            refined = distance_to_box(initial, self._distances(corners), self.reg_scale)
            reference = ops.stop_gradient(refined)
            previous = ops.stop_gradient(x)
            logits.append(self.class_heads[i](x) + self._quality(self.lqe[i], corners))
            boxes.append(refined)
            all_corners.append(corners)
        return {"logits": ops.stack(logits, axis=1), "boxes": ops.stack(boxes, axis=1),
                "corners": ops.stack(all_corners, axis=1), "initial": initial,
                "pre_logits": pre_logits, "pre_boxes": pre_boxes}

    def compute_output_spec(self, target, memory, reference_logits, **kwargs):
        b, q = target.shape[:2]
        n, f32 = self.num_layers, "float32"
        return {"logits": keras.KerasTensor((b, n, q, self.num_classes),
                                            dtype=self.compute_dtype),
                "boxes": keras.KerasTensor((b, n, q, 4), dtype=f32),
                "corners": keras.KerasTensor((b, n, q, 4 * (self.max_num_bins + 1)), dtype=f32),
                "initial": keras.KerasTensor((b, q, 4), dtype=f32),
                "pre_logits": keras.KerasTensor((b, q, self.num_classes),
                                                dtype=self.compute_dtype),
                "pre_boxes": keras.KerasTensor((b, q, 4), dtype=f32)}

    def get_config(self):
        config = super().get_config()
        config.update(
            num_layers=self.num_layers, num_classes=self.num_classes, num_heads=self.num_heads,
            ffn_dim=self.ffn_dim, num_levels=self.num_levels, num_points=self.num_points,
            offset_scale=self.offset_scale, method=self.method,
            max_num_bins=self.max_num_bins, reg_scale=self.reg_scale, up=self.up,
            top_prob_values=self.top_prob_values, lqe_hidden_dim=self.lqe_hidden_dim,
            lqe_layers=self.lqe_layers, dropout=self.dropout,
            attention_dropout=self.attention_dropout,
            activation_dropout=self.activation_dropout, activation=self.activation,
            layer_norm_epsilon=self.layer_norm_epsilon)
        return config
