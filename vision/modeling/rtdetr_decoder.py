"""RT-DETR's decoder: deformable cross-attention and iterative box refinement.

As transformers' ``RTDetrDecoder`` (with the per-layer heads ``RTDetrForObjectDetection``
gives it; lyuwenyu/RT-DETR's ``TransformerDecoder``) computes it in eval mode. Each layer
``i``, from the reference boxes ``r`` (sigmoid of the selected cells' box logits):

1. ``pos = query_pos_head(r)`` (MLP 4 -> 2d -> d);
2. the decoder layer (post-norm): self-attention (``q = k = x + pos``, ``v = x``), deformable
   cross-attention over the multi-level memory from ``x + pos`` around the box ``r``, FFN;
3. ``class_head_i(x)`` gives the layer's class logits, ``r' = sigmoid(box_head_i(x) +
   inverse_sigmoid(r))`` its boxes; the next layer starts from ``r'`` without its gradient.
   ``inverse_sigmoid(r)`` is carried as the logits ``r`` came from, clipped where
   transformers' ``inverse_sigmoid`` clamps (the same numbers, and no round trip through a
   probability for an int8 file to round).

The layers reuse the shared `tfx_transformer` layers (``MultiHeadAttention``,
``MultiScaleDeformableAttention``, ``FeedForward`` and ``ResidualBlockLayer``'s residual +
LayerNorm wiring); `transformers_arrays` maps a checkpoint's ``model.decoder.*`` tensors onto
them. ``keras.ops`` only.
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

__all__ = ["RTDetrDecoder", "RTDetrDecoderLayer", "build_decoder", "inverse_sigmoid",
           "transformers_arrays"]


_INVERSE_SIGMOID_EPS = 1e-5


def inverse_sigmoid(x, eps: float = _INVERSE_SIGMOID_EPS):
    """``log(x / (1 - x))`` of ``x`` clipped to ``[0, 1]``, both terms floored at ``eps``
    (transformers' and RT-DETR's ``inverse_sigmoid``)."""
    x = ops.clip(x, 0.0, 1.0)
    return ops.log(ops.maximum(x, eps) / ops.maximum(1.0 - x, eps))


@keras.saving.register_keras_serializable(package="vision")
class RTDetrDecoderLayer(ResidualBlockLayer):
    """Self-attention, deformable cross-attention, FFN; each with residual + LayerNorm.

    Args:
        num_heads: heads of both attentions.
        hidden_dim: inner width of the FFN (``decoder_ffn_dim``).
        num_levels: feature levels of the memory.
        num_points: sampling points per head and level.
        dropout: dropout on each sub-layer's output (RT-DETR: 0).
        **kwargs: the other `ResidualBlockLayer` arguments (``attention_dropout``,
            ``activation_dropout``, ``activation``, ``layer_norm_epsilon``, ...).

    Call arguments:
        x: ``(B, Q, d)`` the queries.
        memory: ``(B, S, d)`` the flattened feature levels.
        reference_points: ``(B, Q, 1, 4)`` normalized cxcywh boxes (or see
            ``MultiScaleDeformableAttention``).
        spatial_shapes: keyword-only, ``[(H_l, W_l)]`` of the memory's levels.
        query_pos: ``(B, Q, d)`` added to the self-attention's queries and keys and to the
            cross-attention's queries.
        self_attention_mask: boolean ``(B, Q, Q)``, ``True`` = may attend (the denoising
            groups' mask).
        memory_mask: boolean ``(B, S)``, ``True`` = valid.
        training: enables dropout.

    Returns:
        ``(B, Q, d)``.
    """

    def __init__(self, num_heads: int, hidden_dim: int, num_levels: int = 3,
                 num_points: int = 4, dropout: float = 0.0, **kwargs):
        super().__init__(num_heads, hidden_dim, dropout=dropout, **kwargs)
        self.num_levels = checks.positive_int("num_levels", num_levels)
        self.num_points = checks.positive_int("num_points", num_points)

    def build(self, x_shape, memory_shape, reference_points_shape=None):
        self.self_attention = self._attention(x_shape[-1], "self_attention")
        self.self_attention.build(x_shape, x_shape)
        self.self_attention_norm = self._norm(x_shape, "self_attention_norm")
        self.self_attention_dropout = self._dropout_layer()
        self.cross_attention = MultiScaleDeformableAttention(
            self.num_heads, self.num_levels, self.num_points, dtype=self.dtype_policy,
            name="cross_attention")
        self.cross_attention.build(x_shape, memory_shape)
        self.cross_attention_norm = self._norm(x_shape, "cross_attention_norm")
        self.cross_attention_dropout = self._dropout_layer()
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

        def cross_attend(h):
            return self.cross_attention(add_position(h, query_pos), memory, reference_points,
                                        spatial_shapes=spatial_shapes, value_mask=memory_mask,
                                        training=training).output, None

        x, _ = self.residual(x, self_attend, self.self_attention_norm,
                             self.self_attention_dropout, training)
        x, _ = self.residual(x, cross_attend, self.cross_attention_norm,
                             self.cross_attention_dropout, training)
        x, _ = self.residual(x, lambda h: (self.feedforward(h, training=training), None),
                             self.feedforward_norm, self.feedforward_dropout, training)
        return x

    def get_config(self):
        config = super().get_config()
        config.update(num_levels=self.num_levels, num_points=self.num_points)
        return config


@keras.saving.register_keras_serializable(package="vision")
class RTDetrDecoder(keras.layers.Layer):
    """RT-DETR's decoder layers with iterative box refinement (see the module docstring).

    Initialized as transformers' ``RTDetrForObjectDetection``: class heads Glorot-uniform
    with the bias of prior probability ``1 / (num_classes + 1)``, the box heads' last layer
    zero (each layer starts from its reference box), the deformable attention as
    ``MultiScaleDeformableAttention``.

    Args:
        num_layers: decoder layers ``L``.
        num_classes: class logits per query ``C`` (sigmoid scores, no "no object").
        num_heads: attention heads.
        ffn_dim: inner width of each layer's FFN.
        num_levels: feature levels of the memory.
        num_points: sampling points per head and level.
        dropout, attention_dropout, activation_dropout: as `ResidualBlockLayer` (RT-DETR: 0).
        activation: the FFN's activation.
        layer_norm_epsilon: LayerNorm epsilon.
        **kwargs: base layer arguments.

    Call arguments:
        target: ``(B, Q, d)`` the initial queries (the selected cells' features, then the
            denoising queries, if any).
        memory: ``(B, S, d)`` the levels' maps flattened row-major, level after level.
        reference_logits: ``(B, Q, 4)`` the initial boxes, cxcywh in logit space.
        spatial_shapes: keyword-only, ``[(H_l, W_l)]`` of the levels (ints, or scalar
            tensors).
        self_attention_mask: boolean ``(B, Q, Q)``, ``True`` = may attend, or ``None``.
        memory_mask: boolean ``(B, S)``, ``True`` = valid cell, or ``None`` (RT-DETR has none).
        training: enables dropout.

    Returns:
        ``(logits, boxes)``: every layer's class logits ``(B, L, Q, C)`` (compute dtype) and
        boxes ``(B, L, Q, 4)`` (float32, normalized cxcywh), transformers'
        ``intermediate_logits`` and ``intermediate_reference_points``.
    """

    def __init__(self, num_layers: int, num_classes: int, num_heads: int = 8,
                 ffn_dim: int = 1024, num_levels: int = 3, num_points: int = 4,
                 dropout: float = 0.0, attention_dropout: float = 0.0,
                 activation_dropout: float = 0.0, activation="relu",
                 layer_norm_epsilon: float = 1e-5, **kwargs):
        super().__init__(**kwargs)
        self.num_layers = checks.positive_int("num_layers", num_layers)
        self.num_classes = checks.positive_int("num_classes", num_classes)
        self.num_heads = checks.positive_int("num_heads", num_heads)
        self.ffn_dim = checks.positive_int("ffn_dim", ffn_dim)
        self.num_levels = checks.positive_int("num_levels", num_levels)
        self.num_points = checks.positive_int("num_points", num_points)
        self.dropout = checks.fraction("dropout", dropout)
        self.attention_dropout = checks.fraction("attention_dropout", attention_dropout)
        self.activation_dropout = checks.fraction("activation_dropout", activation_dropout)
        self.activation = keras.activations.serialize(keras.activations.get(activation))
        self.layer_norm_epsilon = checks.positive_number("layer_norm_epsilon",
                                                         layer_norm_epsilon)

    def build(self, target_shape, memory_shape, reference_logits_shape=None):
        d, policy = target_shape[-1], self.dtype_policy
        self.query_pos_head = MLP(4, 2 * d, d, 2, dtype=policy, name="query_pos_head")
        self.query_pos_head.build((*target_shape[:-1], 4))
        self.layers, self.class_heads, self.box_heads = [], [], []
        prior = 1.0 / (self.num_classes + 1)
        for i in range(self.num_layers):
            layer = RTDetrDecoderLayer(
                self.num_heads, self.ffn_dim, self.num_levels, self.num_points,
                dropout=self.dropout, attention_dropout=self.attention_dropout,
                activation_dropout=self.activation_dropout, activation=self.activation,
                layer_norm_epsilon=self.layer_norm_epsilon, dtype=policy, name=f"layer_{i}")
            layer.build(target_shape, memory_shape)
            head = keras.layers.Dense(
                self.num_classes, bias_initializer=keras.initializers.Constant(
                    -math.log((1 - prior) / prior)), dtype=policy, name=f"class_head_{i}")
            head.build(target_shape)
            box = MLP(d, d, 4, 3, dtype=policy, name=f"box_head_{i}")
            box.build(target_shape)
            last = box.layers[-1]
            last.kernel.assign(ops.zeros_like(last.kernel))
            last.bias.assign(ops.zeros_like(last.bias))
            self.layers.append(layer)
            self.class_heads.append(head)
            self.box_heads.append(box)

    def call(self, target, memory, reference_logits, *, spatial_shapes,
             self_attention_mask=None, memory_mask=None, training=None):
        x = target
        # Each layer refines ``inverse_sigmoid(reference)`` (transformers); the boxes' logits
        # are carried instead, clipped where that clamps (|logit| > -log(1e-5)): the same
        # value, without rounding the box to a probability and back (which a file with int8
        # activations does at 1/255, turning a small box's logit into another).
        limit = -math.log(_INVERSE_SIGMOID_EPS)
        z = ops.clip(ops.cast(reference_logits, "float32"), -limit, limit)  # (B, Q, 4)
        reference = ops.sigmoid(z)
        logits, boxes = [], []
        for layer, class_head, box_head in zip(self.layers, self.class_heads, self.box_heads):
            x = layer(x, memory, reference[:, :, None, :], spatial_shapes=spatial_shapes,
                      query_pos=self.query_pos_head(reference),
                      self_attention_mask=self_attention_mask, memory_mask=memory_mask,
                      training=training)
            z = ops.cast(box_head(x), "float32") + z
            refined = ops.sigmoid(z)
            logits.append(class_head(x))
            boxes.append(refined)
            reference = ops.stop_gradient(refined)
            z = ops.stop_gradient(ops.clip(z, -limit, limit))
        return ops.stack(logits, axis=1), ops.stack(boxes, axis=1)  # (B, L, Q, C), (B, L, Q, 4)

    def compute_output_shape(self, target_shape, memory_shape, reference_logits_shape=None):
        b, q = target_shape[:2]
        return (b, self.num_layers, q, self.num_classes), (b, self.num_layers, q, 4)

    def compute_output_spec(self, target, memory, reference_logits, **kwargs):
        logits, boxes = self.compute_output_shape(target.shape, memory.shape)
        return (keras.KerasTensor(logits, dtype=self.compute_dtype),
                keras.KerasTensor(boxes, dtype="float32"))

    def get_config(self):
        config = super().get_config()
        config.update(
            num_layers=self.num_layers, num_classes=self.num_classes, num_heads=self.num_heads,
            ffn_dim=self.ffn_dim, num_levels=self.num_levels, num_points=self.num_points,
            dropout=self.dropout, attention_dropout=self.attention_dropout,
            activation_dropout=self.activation_dropout, activation=self.activation,
            layer_norm_epsilon=self.layer_norm_epsilon)
        return config


def build_decoder(settings: dict, num_classes: int) -> RTDetrDecoder:
    """The (unbuilt) decoder of ``settings["decoder"]`` (`RTDetrDecoder`'s arguments but
    ``num_classes``), named ``decoder``; its container builds it with
    ``decoder.build((B, Q, d), (B, S, d))``."""
    return RTDetrDecoder(num_classes=num_classes, **settings["decoder"], name="decoder")


def transformers_arrays(state: dict, settings: dict, used: set,
                        prefix: str = "decoder/") -> dict[str, np.ndarray]:
    """A transformers ``RTDetrForObjectDetection`` checkpoint's decoder -> Keras arrays.

    Reads ``model.decoder.*`` (layers, ``query_pos_head``, ``class_embed``, ``bbox_embed``)
    under either naming: transformers v5's (``self_attn.o_proj``, ``mlp.fc1``) or the
    published files' (``self_attn.out_proj``, ``fc1``); the class and box heads also as the
    top-level ``class_embed.*`` / ``bbox_embed.*`` of older files (the same tensors).

    Args:
        state: ``{name: array}`` (PyTorch layouts).
        settings: `RTDetrDecoder`'s arguments (``num_layers`` and ``num_heads`` are read).
        used: the names read are added to it.
        prefix: put before every Keras path (the decoder's path in its model).

    Returns:
        ``{Keras weight path: array}``, e.g. ``decoder/layer_0/self_attention/query/kernel``.

    Raises:
        KeyError: the name of a tensor the checkpoint lacks.
    """
    def take(*names):
        for name in names:
            if name in state:
                used.update(n for n in names if n in state)  # a tied copy is read too
                return state[name]
        raise KeyError(names[0])

    def dense(source, target, *aliases):
        return {f"{prefix}{target}/kernel": take(f"{source}.weight",
                                                 *(f"{a}.weight" for a in aliases)).T,
                f"{prefix}{target}/bias": take(f"{source}.bias", *(f"{a}.bias" for a in aliases))}

    def norm(source, target):
        return {f"{prefix}{target}/gamma": take(f"{source}.weight"),
                f"{prefix}{target}/beta": take(f"{source}.bias")}

    heads, arrays = settings["num_heads"], {}
    for j in range(2):
        arrays.update(dense(f"model.decoder.query_pos_head.layers.{j}",
                            f"query_pos_head/query_pos_head_{j}"))
    for i in range(settings["num_layers"]):
        src, dst = f"model.decoder.layers.{i}.", f"layer_{i}/"
        for theirs, ours in (("q", "query"), ("k", "key"), ("v", "value")):
            kernel = take(f"{src}self_attn.{theirs}_proj.weight").T  # (d, H * k)
            arrays[f"{prefix}{dst}self_attention/{ours}/kernel"] = kernel.reshape(
                kernel.shape[0], heads, -1)
            arrays[f"{prefix}{dst}self_attention/{ours}/bias"] = take(
                f"{src}self_attn.{theirs}_proj.bias").reshape(heads, -1)
        out = take(f"{src}self_attn.o_proj.weight", f"{src}self_attn.out_proj.weight").T
        arrays[f"{prefix}{dst}self_attention/attention_output/kernel"] = out.reshape(
            heads, -1, out.shape[-1])
        arrays[f"{prefix}{dst}self_attention/attention_output/bias"] = take(
            f"{src}self_attn.o_proj.bias", f"{src}self_attn.out_proj.bias")
        arrays.update(norm(f"{src}self_attn_layer_norm", f"{dst}self_attention_norm"))
        for name in ("sampling_offsets", "attention_weights", "value_proj", "output_proj"):
            arrays.update(dense(f"{src}encoder_attn.{name}", f"{dst}cross_attention/{name}"))
        arrays.update(norm(f"{src}encoder_attn_layer_norm", f"{dst}cross_attention_norm"))
        arrays.update(dense(f"{src}mlp.fc1", f"{dst}feedforward/inner", f"{src}fc1"))
        arrays.update(dense(f"{src}mlp.fc2", f"{dst}feedforward/outer", f"{src}fc2"))
        arrays.update(norm(f"{src}final_layer_norm", f"{dst}feedforward_norm"))
        arrays.update(dense(f"model.decoder.class_embed.{i}", f"class_head_{i}",
                            f"class_embed.{i}"))
        for j in range(3):
            arrays.update(dense(f"model.decoder.bbox_embed.{i}.layers.{j}",
                                f"box_head_{i}/box_head_{i}_{j}", f"bbox_embed.{i}.layers.{j}"))
    return arrays
