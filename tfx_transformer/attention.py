"""Scaled dot-product attention and multi-head attention with an optional KV cache."""

from __future__ import annotations

import math

import keras
from keras import ops

from tfx_transformer.masks import causal_mask, merge_masks

__all__ = ["scaled_dot_product_attention", "MultiHeadAttention"]

# Filled into masked logits. The logits are float32 whatever the compute dtype, so this is
# safe under float16/bfloat16 policies; it only has to dominate any real score.
_MASKED_LOGIT = -1e9


def _masked_softmax(scores, mask):
    """Softmax over the last axis in float32; rows with every key masked give zeros.

    Args:
        scores: logits ``(..., T, S)`` of any float dtype.
        mask: boolean, broadcastable to ``scores``, ``True`` = attend; or ``None``.

    Returns:
        float32 weights with the shape of ``scores`` broadcast with ``mask``.
    """
    scores = ops.cast(scores, "float32")
    if scores.shape[-1] == 1:  # a single key: weight 1 where it may be attended
        ones = ops.ones_like(scores)
        return ones if mask is None else ops.where(ops.cast(mask, "bool"), ones, 0.0)
    if mask is None:
        return ops.softmax(scores, axis=-1)
    mask = ops.cast(mask, "bool")
    scores = ops.where(mask, scores, _MASKED_LOGIT)
    weights = ops.softmax(scores, axis=-1)
    # A fully masked row would otherwise be uniform over the masked keys.
    any_valid = ops.any(mask, axis=-1, keepdims=True)
    return ops.where(any_valid, weights, 0.0)


def _check_mask_rank(mask, max_rank: int, name: str):
    if mask is not None and (len(mask.shape) < 2 or len(mask.shape) > max_rank):
        raise ValueError(
            f"`{name}` must have rank 2 to {max_rank} (shape (T, S), (B, T, S) or "
            f"(B, H, T, S)). Received: {name}.shape={tuple(mask.shape)}"
        )


def scaled_dot_product_attention(
    q,
    k,
    v,
    mask=None,
    dropout_rate: float = 0.0,
    training=None,
    return_weights: bool = False,
    seed=None,
):
    """``softmax(q·kᵀ/√d_k, masked) · v``.

    Args:
        q: queries ``(B, H, T, D)``.
        k: keys ``(B, H, S, D)``.
        v: values ``(B, H, S, Dv)``.
        mask: boolean, broadcastable to ``(B, H, T, S)``, ``True`` = may attend. A query row
            whose keys are all masked returns zeros.
        dropout_rate: dropout on the attention weights, applied only when ``training``.
        training: Python bool or ``None`` (no dropout).
        return_weights: also return the attention weights ``(B, H, T, S)``.
        seed: optional ``keras.random.SeedGenerator`` (or int) for the dropout.

    Returns:
        ``(B, H, T, Dv)``, and the weights if ``return_weights``.
    """
    if len(q.shape) != 4 or len(k.shape) != 4 or len(v.shape) != 4:
        raise ValueError(
            "`q`, `k` and `v` must have rank 4 (B, H, T, D). Received: "
            f"q.shape={tuple(q.shape)}, k.shape={tuple(k.shape)}, v.shape={tuple(v.shape)}"
        )
    if k.shape[2] is not None and v.shape[2] is not None and k.shape[2] != v.shape[2]:
        raise ValueError(
            "`k` and `v` must have the same length. Received: "
            f"k.shape={tuple(k.shape)} and v.shape={tuple(v.shape)}"
        )
    _check_mask_rank(mask, 4, "mask")
    scale = 1.0 / math.sqrt(q.shape[-1])
    scores = ops.einsum("bhtd,bhsd->bhts", q, k) * ops.cast(scale, q.dtype)  # (B, H, T, S)
    weights = _masked_softmax(scores, mask)
    dropped = weights
    if training and dropout_rate > 0.0:
        dropped = keras.random.dropout(weights, dropout_rate, seed=seed)
    out = ops.einsum("bhts,bhsd->bhtd", ops.cast(dropped, v.dtype), v)  # (B, H, T, Dv)
    if return_weights:
        return out, ops.cast(weights, q.dtype)
    return out


@keras.saving.register_keras_serializable(package="tfx_transformer")
class MultiHeadAttention(keras.layers.Layer):
    """Multi-head attention, weight-compatible with ``keras.layers.MultiHeadAttention``.

    ``get_weights()`` has the same order and shapes as Keras's layer (query, key, value
    kernels ``(d, H, key_dim)`` and biases ``(H, key_dim)``, then the output kernel
    ``(H, value_dim, d_out)`` and bias ``(d_out,)``), so weights move between the two.

    Incremental decoding: pass ``cache`` ``(B, 2, S_max, H, D)`` (keys then values). With a
    ``cache_index`` the layer projects the new step(s), writes them into the cache at
    ``cache_index`` and attends over the whole cache (the causal mask hides the unfilled
    tail). Without ``cache_index`` the cache is used as precomputed keys/values, which is how
    cross-attention reuses one projection of the source for every step (see
    ``compute_cache``).

    Args:
        num_heads: number of heads ``H``.
        key_dim: size of each query/key head.
        value_dim: size of each value head (defaults to ``key_dim``).
        dropout: dropout rate on the attention weights.
        use_bias: whether the projections have biases.
        output_dim: last dimension of the output (defaults to the query's).
        kernel_initializer: initializer of the projection kernels (cloned per projection).
        bias_initializer: initializer of the biases.
        seed: seed of the attention dropout.
        **kwargs: base layer arguments (``name``, ``dtype``...).

    Call arguments:
        query: ``(B, T, d_q)``.
        value: ``(B, S, d_v)``.
        key: ``(B, S, d_k)``, defaults to ``value``.
        attention_mask: boolean, ``(T, S)``, ``(B, T, S)`` or ``(B, H, T, S)``; True = attend.
        use_causal_mask: also forbid attending to later positions.
        return_attention_scores: also return the weights ``(B, H, T, S)``.
        training: enables dropout.
        cache: ``(B, 2, S_max, H, D)`` or ``None``.
        cache_index: int or scalar tensor: where the new keys/values go in ``cache``.
        query_mask, value_mask, key_mask: ``(B, T)``/``(B, S)`` validity masks, filled in
            automatically from Keras masks (e.g. ``Embedding(mask_zero=True)``).

    Returns:
        ``(B, T, d_out)``; then the weights if ``return_attention_scores``; then the updated
        cache if ``cache`` was given.
    """

    def __init__(
        self,
        num_heads: int,
        key_dim: int,
        value_dim: int | None = None,
        dropout: float = 0.0,
        use_bias: bool = True,
        output_dim: int | None = None,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        seed: int | None = None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if not isinstance(num_heads, int) or num_heads <= 0:
            raise ValueError(f"`num_heads` must be a positive integer. Received: {num_heads!r}")
        if not isinstance(key_dim, int) or key_dim <= 0:
            raise ValueError(f"`key_dim` must be a positive integer. Received: {key_dim!r}")
        if value_dim is not None and (not isinstance(value_dim, int) or value_dim <= 0):
            raise ValueError(f"`value_dim` must be a positive integer. Received: {value_dim!r}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"`dropout` must be in [0, 1). Received: {dropout!r}")
        self.num_heads = num_heads
        self.key_dim = key_dim
        self.value_dim = value_dim or key_dim
        self.dropout = dropout
        self.use_bias = use_bias
        self.output_dim = output_dim
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.seed = seed
        self.supports_masking = True
        self._dropout_layer = keras.layers.Dropout(dropout, seed=seed, dtype=self.dtype_policy)

    def _dense(self, equation, output_shape, bias_axes, name):
        clone = lambda init: init.__class__.from_config(init.get_config())  # noqa: E731
        dense = keras.layers.EinsumDense(
            equation,
            output_shape=output_shape,
            bias_axes=bias_axes if self.use_bias else None,
            kernel_initializer=clone(self.kernel_initializer),
            bias_initializer=clone(self.bias_initializer),
            dtype=self.dtype_policy,
            name=name,
        )
        # Implicit Keras masks are consumed by this layer (query_mask/value_mask/key_mask);
        # the projections just pass them along instead of warning that they drop them.
        dense.supports_masking = True
        return dense

    def build(self, query_shape, value_shape, key_shape=None):
        key_shape = value_shape if key_shape is None else key_shape
        if tuple(value_shape[1:-1]) != tuple(key_shape[1:-1]):
            raise ValueError(
                "All dimensions of `value` and `key`, except the last one, must be equal. "
                f"Received: value_shape={tuple(value_shape)} and key_shape={tuple(key_shape)}"
            )
        h = self.num_heads
        self.query_dense = self._dense("btd,dhk->bthk", (None, h, self.key_dim), "hk", "query")
        self.query_dense.build(query_shape)
        self.key_dense = self._dense("bsd,dhk->bshk", (None, h, self.key_dim), "hk", "key")
        self.key_dense.build(key_shape)
        self.value_dense = self._dense("bsd,dhk->bshk", (None, h, self.value_dim), "hk", "value")
        self.value_dense.build(value_shape)
        out_dim = self.output_dim or query_shape[-1]
        self.output_dense = self._dense("bthk,hkd->btd", (None, out_dim), "d", "attention_output")
        self.output_dense.build((query_shape[0], query_shape[1], h, self.value_dim))

    def compute_cache(self, value, key=None):
        """Projects keys/values once, e.g. the encoder output for cross-attention.

        Args:
            value: ``(B, S, d_v)``.
            key: ``(B, S, d_k)``, defaults to ``value``.

        Returns:
            ``(B, 2, S, H, D)`` to pass as ``cache`` (without ``cache_index``).
        """
        key = value if key is None else key
        return ops.stack([self.key_dense(key), self.value_dense(value)], axis=1)

    def call(
        self,
        query,
        value,
        key=None,
        attention_mask=None,
        use_causal_mask: bool = False,
        return_attention_scores: bool = False,
        training=None,
        cache=None,
        cache_index=None,
        query_mask=None,
        value_mask=None,
        key_mask=None,
    ):
        if len(query.shape) != 3:
            raise ValueError(
                f"`query` must have rank 3 (B, T, d). Received: query.shape={tuple(query.shape)}"
            )
        key_given = key is not None
        key = value if key is None else key
        _check_mask_rank(attention_mask, 4, "attention_mask")
        if (
            key.shape[1] is not None
            and value.shape[1] is not None
            and key.shape[1] != value.shape[1]
        ):
            raise ValueError(
                "`key` and `value` must have the same length. Received: "
                f"key.shape={tuple(key.shape)} and value.shape={tuple(value.shape)}"
            )

        q = self.query_dense(query)  # (B, T, H, Dk)
        if cache is not None and cache_index is None:
            k = ops.cast(cache[:, 0], q.dtype)  # precomputed (B, S, H, Dk)
            v = ops.cast(cache[:, 1], q.dtype)  # precomputed (B, S, H, Dv)
        else:
            k = self.key_dense(key)  # (B, S, H, Dk)
            v = self.value_dense(value)  # (B, S, H, Dv)
            if cache is not None:
                start = [0, ops.cast(cache_index, "int32"), 0, 0]
                k = ops.slice_update(cache[:, 0], start, ops.cast(k, cache.dtype))
                v = ops.slice_update(cache[:, 1], start, ops.cast(v, cache.dtype))
                cache = ops.stack([k, v], axis=1)  # (B, 2, S_max, H, D)
            k, v = ops.cast(k, q.dtype), ops.cast(v, q.dtype)

        t, s = ops.shape(q)[1], ops.shape(k)[1]
        mask = self._mask(
            attention_mask, query_mask, value_mask, key_mask if key_given else None,
            use_causal_mask, t, s, cache_index,
        )
        scale = ops.cast(1.0 / math.sqrt(self.key_dim), q.dtype)
        scores = ops.einsum("bthd,bshd->bhts", q * scale, k)  # (B, H, T, S)
        weights = _masked_softmax(scores, mask)
        weights = ops.cast(weights, self.compute_dtype)
        dropped = self._dropout_layer(weights, training=training)
        out = ops.einsum("bhts,bshd->bthd", dropped, v)  # (B, T, H, Dv)
        out = self.output_dense(out)  # (B, T, d_out)

        result = [out]
        if return_attention_scores:
            result.append(weights)
        if cache is not None:
            result.append(cache)
        return result[0] if len(result) == 1 else tuple(result)

    def _mask(self, attention_mask, query_mask, value_mask, key_mask, causal, t, s, offset):
        """Combines every mask source into one boolean mask broadcastable to (B, H, T, S)."""
        parts = []
        if query_mask is not None:
            parts.append(ops.cast(query_mask, "bool")[:, None, :, None])  # (B, 1, T, 1)
        if value_mask is not None:
            parts.append(ops.cast(value_mask, "bool")[:, None, None, :])  # (B, 1, 1, S)
        if key_mask is not None:
            parts.append(ops.cast(key_mask, "bool")[:, None, None, :])  # (B, 1, 1, S)
        if causal:
            parts.append(causal_mask(t, s, 0 if offset is None else offset))  # (T, S)
        if attention_mask is not None:
            m = ops.cast(attention_mask, "bool")
            if len(m.shape) == 3:
                m = m[:, None]  # (B, 1, T, S)
            parts.append(m)
        return merge_masks(*parts)

    def compute_output_shape(self, query_shape, value_shape, key_shape=None):
        return (*query_shape[:-1], self.output_dim or query_shape[-1])

    def get_config(self):
        config = super().get_config()
        config.update(
            num_heads=self.num_heads,
            key_dim=self.key_dim,
            value_dim=self.value_dim,
            dropout=self.dropout,
            use_bias=self.use_bias,
            output_dim=self.output_dim,
            kernel_initializer=keras.initializers.serialize(self.kernel_initializer),
            bias_initializer=keras.initializers.serialize(self.bias_initializer),
            seed=self.seed,
        )
        return config
