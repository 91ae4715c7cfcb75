"""Position encodings: 1-D sinusoidal, learned absolute, and DETR's 2-D sine embedding."""

from __future__ import annotations

import math
from typing import Any

import keras
from keras import ops

from tfx_transformer import checks

__all__ = [
    "SinusoidalPositionEncoding", "LearnedPositionEmbedding", "SinePositionEmbedding2D",
    "sine_features", "add_position",
]

_LAYOUTS = ("interleaved", "concat", "tensor2tensor")


def add_position(x: Any, pos: Any | None) -> Any:
    """``x + pos`` in the dtype of ``x``; ``x`` itself when ``pos`` is ``None``.

    The attention layers add positions to queries and keys this way (DETR's ``with_pos_embed``).

    Args:
        x: ``(B, T, d)`` features.
        pos: position embedding broadcastable to ``x`` (e.g. ``(B, T, d)`` or ``(T, d)``), or
            ``None``.

    Returns:
        A tensor of the shape and dtype of ``x``.
    """
    return x if pos is None else x + ops.cast(pos, x.dtype)


@keras.saving.register_keras_serializable(package="tfx_transformer")
class SinusoidalPositionEncoding(keras.layers.Layer):
    """Sine/cosine position encoding of "Attention Is All You Need".

    ``PE[p, 2i] = sin(p / 10000^(2i/d))`` and ``PE[p, 2i+1] = cos(p / 10000^(2i/d))``
    (``layout="interleaved"``, the paper). ``layout="concat"`` puts the ``d/2`` sines first
    and the ``d/2`` cosines after (the TensorFlow tutorial's variant).
    ``layout="tensor2tensor"`` is concat with the frequencies spread as tensor2tensor's
    timing signal spreads them, ``exp(-i · ln(10000) / (d/2 - 1))`` for ``i < d/2`` (the
    slowest is exactly ``1/10000``): fairseq's and transformers' M2M100 / NLLB positions.
    ``offset`` shifts every position: the first step is position ``offset`` (M2M100 starts
    at its ``padding_idx + 1 = 2``). Values are computed on the fly, so nothing is stored.

    Args:
        max_length: longest sequence accepted.
        layout: ``"interleaved"``, ``"concat"`` or ``"tensor2tensor"``.
        offset: the position of the first step (a non-negative integer).
        **kwargs: base layer arguments.

    Call arguments:
        inputs: ``(B, T, d)``; only its shape is used (``d`` must be even).
        start_index: position of the first step (int or scalar tensor), for cached decoding.

    Returns:
        The encoding broadcast to the shape of ``inputs``, in the layer's compute dtype.
    """

    def __init__(self, max_length: int = 2048, layout: str = "interleaved", offset: int = 0,
                 **kwargs):
        super().__init__(**kwargs)
        max_length = checks.positive_int("max_length", max_length)
        if layout not in _LAYOUTS:
            raise ValueError(f"`layout` must be one of {_LAYOUTS}. Received: layout={layout!r}")
        self.max_length = max_length
        self.layout = layout
        self.offset = checks.non_negative_int("offset", offset)

    def call(self, inputs, start_index=0):
        shape = ops.shape(inputs)
        length, dim = inputs.shape[-2], inputs.shape[-1]
        if dim is None or dim % 2:
            raise ValueError(f"The last dimension of `inputs` must be even. Received: {dim}")
        if length is not None and length > self.max_length:
            raise ValueError(
                f"Sequence length {length} exceeds `max_length`={self.max_length}."
            )
        positions = ops.cast(ops.arange(shape[-2]) + start_index + self.offset,
                             "float32")  # (T,)
        i = ops.arange(dim // 2, dtype="float32")  # (d/2,)
        if self.layout == "tensor2tensor":
            if dim < 4:
                raise ValueError(f"layout='tensor2tensor' needs a last dimension >= 4. "
                                 f"Received: {dim}")
            inv_freq = ops.exp(i * (-math.log(10000.0) / (dim // 2 - 1)))
        else:
            inv_freq = ops.exp(-math.log(10000.0) * 2.0 * i / dim)  # 1 / 10000^(2i/d)
        angles = positions[:, None] * inv_freq[None, :]  # (T, d/2)
        if self.layout == "interleaved":
            pe = ops.stack([ops.sin(angles), ops.cos(angles)], axis=-1)  # (T, d/2, 2)
            pe = ops.reshape(pe, (-1, dim))  # (T, d): sin, cos, sin, cos...
        else:
            pe = ops.concatenate([ops.sin(angles), ops.cos(angles)], axis=-1)  # (T, d)
        return ops.broadcast_to(ops.cast(pe, self.compute_dtype), shape)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(max_length=self.max_length, layout=self.layout, offset=self.offset)
        return config


@keras.saving.register_keras_serializable(package="tfx_transformer")
class LearnedPositionEmbedding(keras.layers.Layer):
    """Learned absolute position embedding (one trainable vector per position).

    Args:
        max_length: number of positions.
        initializer: initializer of the ``(max_length, d)`` table.
        **kwargs: base layer arguments.

    Call arguments:
        inputs: ``(B, T, d)``; only its shape is used.
        start_index: position of the first step (int or scalar tensor).

    Returns:
        The embeddings of positions ``start_index .. start_index+T-1`` broadcast to ``inputs``.
    """

    def __init__(self, max_length: int, initializer="glorot_uniform", **kwargs):
        super().__init__(**kwargs)
        self.max_length = checks.positive_int("max_length", max_length)
        self.initializer = keras.initializers.get(initializer)

    def build(self, input_shape):
        self.embeddings = self.add_weight(
            name="embeddings",
            shape=(self.max_length, input_shape[-1]),
            initializer=self.initializer,
        )

    def call(self, inputs, start_index=0):
        shape = ops.shape(inputs)
        length = inputs.shape[-2]
        if length is not None and length > self.max_length:
            raise ValueError(
                f"Sequence length {length} exceeds `max_length`={self.max_length}."
            )
        table = ops.convert_to_tensor(self.embeddings)
        pe = ops.slice(table, [ops.cast(start_index, "int32"), 0], [shape[-2], shape[-1]])
        return ops.broadcast_to(ops.cast(pe, self.compute_dtype), shape)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(
            max_length=self.max_length,
            initializer=keras.initializers.serialize(self.initializer),
        )
        return config


def sine_features(values: Any, num_feats: int, temperature: float = 10000.0) -> Any:
    """DETR's sine features of each coordinate, concatenated.

    Each coordinate ``v`` gives ``num_feats`` channels ``sin/cos(v / temperature^(2⌊j/2⌋ /
    num_feats))`` (sine on even ``j``, cosine on odd ``j``), as in `SinePositionEmbedding2D`.
    Used for the embedding of feature-map positions and of points such as DETR anchors (scale
    the points by ``2π`` to match a normalized `SinePositionEmbedding2D`).

    Args:
        values: ``(..., K)`` float coordinates.
        num_feats: channels per coordinate.
        temperature: the base of the frequencies.

    Returns:
        ``(..., K * num_feats)`` float32: the features of coordinate 0, then 1, ...
    """
    values = ops.cast(values, "float32")
    j = ops.arange(num_feats, dtype="float32")
    dim_t = ops.power(temperature, 2.0 * ops.floor(j / 2.0) / num_feats)  # (F,)
    is_even = ops.equal(ops.mod(ops.arange(num_feats), 2), 0)  # (F,)
    angles = values[..., None] / dim_t  # (..., K, F)
    features = ops.where(is_even, ops.sin(angles), ops.cos(angles))
    return ops.reshape(features, (*ops.shape(values)[:-1], -1))  # (..., K * F)


@keras.saving.register_keras_serializable(package="tfx_transformer")
class SinePositionEmbedding2D(keras.layers.Layer):
    """DETR's 2-D sine position embedding computed from a pixel validity mask.

    ``y = cumsum(mask, H)`` and ``x = cumsum(mask, W)``, optionally normalised by the valid
    extent (``y / (y[last row] + 1e-6) · scale``); each of ``y``, ``x`` then gives
    ``num_pos_feats`` channels ``sin/cos(v / temperature^(2⌊j/2⌋/num_pos_feats))`` (sine on even
    ``j``, cosine on odd ``j``). Output channels are the ``y`` features then the ``x``
    features, as in facebookresearch/detr (channels-last here).

    Args:
        num_pos_feats: channels per axis; the output has ``2 · num_pos_feats``.
        temperature: the base of the frequencies.
        normalize: divide by the valid extent and multiply by ``scale``.
        scale: used only when ``normalize``.
        **kwargs: base layer arguments.

    Call arguments:
        valid: boolean validity mask ``(B, H, W)``, ``True`` = valid pixel/feature (named
            ``valid``, not ``mask``, because Keras reserves ``mask`` for its implicit masks).

    Returns:
        ``(B, H, W, 2 · num_pos_feats)`` in the layer's compute dtype.
    """

    def __init__(
        self,
        num_pos_feats: int = 128,
        temperature: float = 10000.0,
        normalize: bool = True,
        scale: float = 2 * math.pi,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if not isinstance(num_pos_feats, int) or num_pos_feats <= 0 or num_pos_feats % 2:
            raise ValueError(
                f"`num_pos_feats` must be a positive even integer. Received: {num_pos_feats!r}"
            )
        self.num_pos_feats = num_pos_feats
        self.temperature = float(temperature)
        self.normalize = normalize
        self.scale = float(scale)

    def call(self, valid):
        if len(valid.shape) != 3:
            raise ValueError(
                f"`valid` must have shape (B, H, W). Received: shape={tuple(valid.shape)}"
            )
        valid = ops.cast(valid, "float32")
        y = ops.cumsum(valid, axis=1)  # (B, H, W)
        x = ops.cumsum(valid, axis=2)  # (B, H, W)
        if self.normalize:
            eps = 1e-6
            y = y / (y[:, -1:, :] + eps) * self.scale
            x = x / (x[:, :, -1:] + eps) * self.scale
        embed = sine_features(ops.stack([y, x], axis=-1), self.num_pos_feats, self.temperature)
        return ops.cast(embed, self.compute_dtype)  # (B, H, W, 2F): y features, then x

    def compute_output_shape(self, valid_shape):
        return (*valid_shape, 2 * self.num_pos_feats)

    def get_config(self):
        config = super().get_config()
        config.update(
            num_pos_feats=self.num_pos_feats,
            temperature=self.temperature,
            normalize=self.normalize,
            scale=self.scale,
        )
        return config
