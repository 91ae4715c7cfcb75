"""Multi-head attention with an optional KV cache."""

from __future__ import annotations

import numbers

import keras
from keras import ops

from tfx_transformer import checks
from tfx_transformer.layers.dot_product import multi_head_attention, scaled_dot_product_attention
from tfx_transformer.layers.masks import causal_mask, check_mask_rank, merge_masks
from tfx_transformer.layers.output import AttentionOutput, call_arguments
from tfx_transformer.layers.projection import matmul_last_axis

__all__ = ["MultiHeadAttention"]


def _check_cache_index(cache, cache_index, key):
    """A Python int ``cache_index`` must leave room in ``cache`` for the new steps of ``key``."""
    if cache is None or cache_index is None or not isinstance(cache_index, numbers.Integral):
        return
    length, steps = cache.shape[3], key.shape[1]
    if cache_index < 0 or (
        length is not None and steps is not None and cache_index + steps > length
    ):
        raise ValueError(
            "`cache_index` must leave room in `cache` for the new steps: 0 <= cache_index and "
            f"cache_index + steps <= cache length. Received: cache_index={cache_index}, "
            f"steps={steps}, cache.shape={tuple(cache.shape)} (length {length})"
        )


def _heads(x):
    """``(B, T, H, D)`` <-> ``(B, H, T, D)``; a reshape, which moves no data, when the axis
    that moves is 1 long (a decoding step)."""
    if x.shape[1] == 1 or x.shape[2] == 1:
        shape = ops.shape(x)
        return ops.reshape(x, (shape[0], shape[2], shape[1], shape[3]))
    return ops.transpose(x, (0, 2, 1, 3))


def _project(dense: keras.layers.EinsumDense, x, split: tuple | None = None):
    """``dense(x)`` for a projection into heads (``split = (H, D)``) or out of them (``None``).

    Computed as one 2-D matrix product of ``x`` flattened to ``(N, d_in)`` with the kernel
    flattened to ``(d_in, d_out)``. ``EinsumDense`` runs ``btd,dhk->bthk`` on TensorFlow as a
    batch matmul that broadcasts the kernel over the batch, whose kernel gradient is then
    ``B`` separate products summed, and a product of the 3-D ``x`` with a matrix would be
    TensorFlow's tensordot (`tfx_transformer.layers.projection.matmul_last_axis`); the flat
    product is one node. Same weights, same result; a quantized or LoRA projection keeps the
    layer's own ``call``.
    """
    if dense.lora_enabled or dense.quantization_mode is not None:
        return dense(x)
    if split is None:  # (B, T, H, D) -> (B, T, H·D)
        x = ops.reshape(x, (*ops.shape(x)[:-2], x.shape[-2] * x.shape[-1]))
    shape = dense.kernel.shape  # (d, H, D) into heads, (H, D, d_out) out of them
    kernel = ops.reshape(dense.kernel, (shape[0], -1) if split else (-1, shape[-1]))
    bias = None if dense.bias is None else ops.reshape(dense.bias, (-1,))
    return matmul_last_axis(x, kernel, bias, split)


@keras.saving.register_keras_serializable(package="tfx_transformer")
class MultiHeadAttention(keras.layers.Layer):
    """Multi-head attention, weight-compatible with ``keras.layers.MultiHeadAttention``.

    ``get_weights()`` has the same order and shapes as Keras's layer (query, key, value
    kernels ``(d, H, key_dim)`` and biases ``(H, key_dim)``, then the output kernel
    ``(H, value_dim, d_out)`` and bias ``(d_out,)``), so weights move between the two.

    Attention is computed by ``multi_head_attention`` on the projected ``(B, T, H, D)`` heads
    (``keras.ops.dot_product_attention`` when neither the weights nor dropout are needed).

    Incremental decoding: pass ``cache`` ``(2, B, H, S_max, D)``: keys then values, each
    heads-major as the attention product reads them, so a step neither slices the cache
    apart nor transposes it (``cache[0]``, ``cache[1]`` are contiguous). With a
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
        cache: ``(2, B, H, S_max, D)`` or ``None``.
        cache_index: int or scalar tensor: where the new keys/values go in ``cache``. A
            Python int must leave room for the new steps: ``cache_index + T <= S_max``.
        query_mask, value_mask, key_mask: ``(B, T)``/``(B, S)`` validity masks, filled in
            automatically from Keras masks (e.g. ``Embedding(mask_zero=True)``).

    Returns:
        ``AttentionOutput(output, attention, cache)``, always: ``output`` ``(B, T, d_out)``;
        ``attention`` the weights ``(B, H, T, S)`` (``S = S_max`` with a cache) if
        ``return_attention_scores``, else ``None``; ``cache`` the cache ``(2, B, H, S_max,
        D)`` if one was given (updated at ``cache_index``, or the precomputed one unchanged),
        else ``None``.
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
        self.num_heads = checks.positive_int("num_heads", num_heads)
        self.key_dim = checks.positive_int("key_dim", key_dim)
        value_dim = checks.positive_int("value_dim", value_dim, optional=True)
        dropout = checks.fraction("dropout", dropout)
        self.value_dim = value_dim or key_dim
        self.dropout = dropout
        self.use_bias = use_bias
        self.output_dim = output_dim
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.seed = seed
        self.supports_masking = True
        # Dropout on the attention weights, inside `scaled_dot_product_attention`.
        self.seed_generator = keras.random.SeedGenerator(seed) if dropout > 0 else None

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
            ``(2, B, H, S, D)`` to pass as ``cache`` (without ``cache_index``).
        """
        key = value if key is None else key
        heads = self.num_heads
        k = _project(self.key_dense, key, (heads, self.key_dim))
        v = _project(self.value_dense, value, (heads, self.value_dim))
        return ops.stack([_heads(k), _heads(v)], axis=0)  # (2, B, H, S, D)

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
        check_mask_rank(attention_mask, "attention_mask")
        if (
            key.shape[1] is not None
            and value.shape[1] is not None
            and key.shape[1] != value.shape[1]
        ):
            raise ValueError(
                "`key` and `value` must have the same length. Received: "
                f"key.shape={tuple(key.shape)} and value.shape={tuple(value.shape)}"
            )

        _check_cache_index(cache, cache_index, key)

        heads_k, heads_v = (self.num_heads, self.key_dim), (self.num_heads, self.value_dim)
        q = _project(self.query_dense, query, heads_k)  # (B, T, H, Dk)
        if cache is not None and cache_index is None:
            k, v = cache[0], cache[1]  # precomputed (B, H, S, D)
        else:
            k = _project(self.key_dense, key, heads_k)  # (B, S, H, Dk)
            v = _project(self.value_dense, value, heads_v)  # (B, S, H, Dv)
            if cache is not None:
                # Only the new steps are transposed; the cache is written, never reshaped.
                new = ops.cast(ops.stack([_heads(k), _heads(v)]), cache.dtype)  # (2, B, H, T, D)
                start = [0, 0, 0, ops.cast(cache_index, "int32"), 0]
                cache = ops.slice_update(cache, start, new)  # (2, B, H, S_max, D)
                k, v = cache[0], cache[1]  # (B, H, S_max, D)

        t = ops.shape(q)[1]
        s = ops.shape(k)[1] if cache is None else ops.shape(k)[2]
        mask = self._mask(
            attention_mask, query_mask, value_mask, key_mask if key_given else None,
            use_causal_mask, t, s, cache_index,
        )
        arguments = dict(mask=mask, dropout_rate=self.dropout, training=training,
                         return_weights=return_attention_scores, seed=self.seed_generator)
        k, v = ops.cast(k, q.dtype), ops.cast(v, q.dtype)
        if cache is None:
            out = multi_head_attention(q, k, v, **arguments)  # (B, T, H, Dv)
        else:  # heads-major keys/values: the product on (B, H, T, D) heads
            out = scaled_dot_product_attention(_heads(q), k, v, **arguments)  # (B, H, T, Dv)
            out = (_heads(out[0]), out[1]) if return_attention_scores else _heads(out)
        out, weights = out if return_attention_scores else (out, None)
        out = _project(self.output_dense, out)  # (B, T, d_out)
        return AttentionOutput(
            output=out,
            attention=weights,
            cache=cache,
        )

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
        """The shape of the ``output`` field, ``(B, T, d_out)``."""
        return (*query_shape[:-1], self.output_dim or query_shape[-1])

    def compute_output_spec(self, *args, **kwargs) -> AttentionOutput:
        """The ``AttentionOutput`` of KerasTensors that ``call`` returns for its arguments."""
        arguments = call_arguments(self, args, kwargs)
        query, value, cache = arguments["query"], arguments["value"], arguments["cache"]
        return_attention_scores = arguments["return_attention_scores"]
        output = keras.KerasTensor(
            self.compute_output_shape(query.shape, value.shape), dtype=self.compute_dtype
        )
        attention = None
        if return_attention_scores:
            length = value.shape[1] if cache is None else cache.shape[3]
            attention = keras.KerasTensor(
                (query.shape[0], self.num_heads, query.shape[1], length), dtype=self.compute_dtype
            )
        if cache is not None:
            cache = keras.KerasTensor(cache.shape, dtype=cache.dtype)
        return AttentionOutput(output, attention, cache)

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
