"""Transformer decoder layer and stack, with KV caches for incremental decoding."""

from __future__ import annotations

import keras
from keras import ops

from tfx_transformer.block import ResidualBlockLayer
from tfx_transformer.encoder import _add, _key_mask

__all__ = ["TransformerDecoderLayer", "TransformerDecoder"]


def _self_mask(mask):
    """(B, T) key validity -> (B, 1, T); (B, T, T) passes through."""
    if mask is None or len(mask.shape) == 3:
        return mask
    if len(mask.shape) != 2:
        raise ValueError(
            "`self_attention_mask` must have shape (B, T) or (B, T, T). "
            f"Received: shape={tuple(mask.shape)}"
        )
    return ops.cast(mask, "bool")[:, None, :]


def _memory_mask(memory_mask):
    """(B, S) or (B, T, S) validity -> attention mask broadcastable to (B, T, S), or None."""
    if memory_mask is None or len(memory_mask.shape) == 3:
        return memory_mask
    return _key_mask(memory_mask)


@keras.saving.register_keras_serializable(package="tfx_transformer")
class TransformerDecoderLayer(ResidualBlockLayer):
    """Self-attention, cross-attention over ``memory``, then feed-forward.

    Each sub-layer has a residual connection and LayerNorm (see ``ResidualBlockLayer``).
    Self-attention: ``q = k = x + query_pos``, ``v = x``. Cross-attention: ``q = x +
    query_pos``, ``k = memory + memory_pos``, ``v = memory``.

    Call arguments:
        x: ``(B, T, d)``.
        memory: ``(B, S, d_m)``; may be ``None`` when ``cross_attention_cache`` is given.
        self_attention_mask: boolean ``(B, T)`` key validity or ``(B, T, T)``.
        memory_mask: boolean ``(B, S)``, ``True`` = valid source position, or ``(B, T, S)``
            per query position.
        query_pos: ``(B, T, d)`` or ``None``.
        memory_pos: ``(B, S, d_m)`` or ``None``.
        use_causal_mask: forbid attending to later target positions.
        cache: self-attention cache ``(B, 2, T_max, H, D)``; with ``cache_index``, ``x`` holds
            the step(s) at ``cache_index`` and the updated cache is returned.
        cache_index: int or scalar tensor.
        cross_attention_cache: ``(B, 2, S, H, D)`` from ``compute_cross_attention_cache``;
            skips re-projecting ``memory``.
        return_cross_attention: also return cross-attention weights ``(B, H, T, S)``.
        training: enables dropout.

    Returns:
        ``(B, T, d)``; then the updated ``cache`` if given; then the cross-attention weights
        if ``return_cross_attention``.
    """

    def build(self, x_shape, memory_shape=None):
        memory_shape = x_shape if memory_shape is None else memory_shape
        d_model = x_shape[-1]
        self.self_attention = self._attention(d_model, "self_attention")
        self.self_attention.build(x_shape, x_shape)
        self.self_attention_norm = self._norm(x_shape, "self_attention_norm")
        self.self_attention_dropout = self._dropout_layer()
        self.cross_attention = self._attention(d_model, "cross_attention")
        self.cross_attention.build(x_shape, memory_shape)
        self.cross_attention_norm = self._norm(x_shape, "cross_attention_norm")
        self.cross_attention_dropout = self._dropout_layer()
        self.feedforward = self._feedforward(x_shape)
        self.feedforward_norm = self._norm(x_shape, "feedforward_norm")
        self.feedforward_dropout = self._dropout_layer()

    def compute_cross_attention_cache(self, memory, memory_pos=None):
        """Projects ``memory`` once into cross-attention keys/values ``(B, 2, S, H, D)``."""
        return self.cross_attention.compute_cache(memory, key=_add(memory, memory_pos))

    def empty_cache(self, batch_size, max_length, dtype=None):
        """Zeros of the self-attention cache shape ``(B, 2, max_length, H, D)``."""
        attention = self.self_attention
        shape = (batch_size, 2, max_length, attention.num_heads, attention.key_dim)
        return ops.zeros(shape, dtype=dtype or self.compute_dtype)

    def call(
        self,
        x,
        memory,
        self_attention_mask=None,
        memory_mask=None,
        query_pos=None,
        memory_pos=None,
        use_causal_mask: bool = False,
        cache=None,
        cache_index=None,
        cross_attention_cache=None,
        return_cross_attention: bool = False,
        training=None,
    ):
        self_mask = _self_mask(self_attention_mask)

        def self_attend(h):
            qk = _add(h, query_pos)
            out = self.self_attention(
                qk, h, qk, attention_mask=self_mask, use_causal_mask=use_causal_mask,
                training=training, cache=cache, cache_index=cache_index,
            )
            return out if cache is not None else (out, None)

        def cross_attend(h):
            q = _add(h, query_pos)
            if cross_attention_cache is None:
                value, key, cross_cache = memory, _add(memory, memory_pos), None
            else:
                value, key, cross_cache = q, None, cross_attention_cache
            out = self.cross_attention(
                q, value, key, attention_mask=_memory_mask(memory_mask),
                return_attention_scores=return_cross_attention, training=training,
                cache=cross_cache,
            )
            if cross_cache is not None:
                out = out[:-1] if return_cross_attention else out[0]
            return out if return_cross_attention else (out, None)

        x, new_cache = self.residual(
            x, self_attend, self.self_attention_norm, self.self_attention_dropout, training
        )
        x, weights = self.residual(
            x, cross_attend, self.cross_attention_norm, self.cross_attention_dropout, training
        )
        x, _ = self.residual(
            x,
            lambda h: (self.feedforward(h, training=training), None),
            self.feedforward_norm,
            self.feedforward_dropout,
            training,
        )
        outputs = [x]
        if cache is not None:
            outputs.append(new_cache)
        if return_cross_attention:
            outputs.append(weights)
        return outputs[0] if len(outputs) == 1 else tuple(outputs)


@keras.saving.register_keras_serializable(package="tfx_transformer")
class TransformerDecoder(ResidualBlockLayer):
    """A stack of ``num_layers`` ``TransformerDecoderLayer``\\ s with a shared final LayerNorm.

    Args:
        num_layers: number of layers.
        return_intermediate: return every layer's output, each passed through the final
            LayerNorm, stacked as ``(L, B, T, d)`` (DETR's auxiliary losses use them).
        final_norm: apply the final LayerNorm; ``None`` means ``norm_first or
            return_intermediate`` (DETR's decoder always has it).
        **kwargs: the ``TransformerDecoderLayer`` arguments, and base layer arguments.

    Call arguments: as ``TransformerDecoderLayer``, except that ``cache`` and
        ``cross_attention_cache`` have a layer axis: ``(B, L, 2, T_max, H, D)`` and
        ``(B, L, 2, S, H, D)``.

    Returns:
        ``(B, T, d)`` or ``(L, B, T, d)``; then the updated cache if given; then the
        cross-attention weights ``(L, B, H, T, S)`` if ``return_cross_attention``.
    """

    def __init__(
        self,
        num_layers: int,
        return_intermediate: bool = False,
        final_norm: bool | None = None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if not isinstance(num_layers, int) or num_layers <= 0:
            raise ValueError(f"`num_layers` must be a positive integer. Received: {num_layers!r}")
        self.num_layers = num_layers
        self.return_intermediate = return_intermediate
        self.final_norm = final_norm

    def build(self, x_shape, memory_shape=None):
        self.layers = []
        for i in range(self.num_layers):
            layer = TransformerDecoderLayer(
                **self.layer_kwargs(), dtype=self.dtype_policy, name=f"layer_{i}"
            )
            layer.build(x_shape, memory_shape)
            self.layers.append(layer)
        use_norm = self.final_norm
        if use_norm is None:
            use_norm = self.norm_first or self.return_intermediate
        self.norm = self._norm(x_shape, "final_norm") if use_norm else None

    def compute_cross_attention_cache(self, memory, memory_pos=None):
        """Cross-attention keys/values of every layer, ``(B, L, 2, S, H, D)``."""
        caches = [layer.compute_cross_attention_cache(memory, memory_pos) for layer in self.layers]
        return ops.stack(caches, axis=1)

    def empty_cache(self, batch_size, max_length, dtype=None):
        """Zeros of the self-attention cache shape ``(B, L, 2, max_length, H, D)``."""
        return ops.stack(
            [layer.empty_cache(batch_size, max_length, dtype) for layer in self.layers], axis=1
        )

    def call(
        self,
        x,
        memory,
        self_attention_mask=None,
        memory_mask=None,
        query_pos=None,
        memory_pos=None,
        use_causal_mask: bool = False,
        cache=None,
        cache_index=None,
        cross_attention_cache=None,
        return_cross_attention: bool = False,
        training=None,
    ):
        intermediate, caches, weights = [], [], []
        for i, layer in enumerate(self.layers):
            out = layer(
                x, memory, self_attention_mask=self_attention_mask, memory_mask=memory_mask,
                query_pos=query_pos, memory_pos=memory_pos, use_causal_mask=use_causal_mask,
                cache=None if cache is None else cache[:, i], cache_index=cache_index,
                cross_attention_cache=(
                    None if cross_attention_cache is None else cross_attention_cache[:, i]
                ),
                return_cross_attention=return_cross_attention, training=training,
            )
            out = list(out) if isinstance(out, tuple) else [out]
            x = out.pop(0)
            if cache is not None:
                caches.append(out.pop(0))
            if return_cross_attention:
                weights.append(out.pop(0))
            if self.return_intermediate:
                intermediate.append(x if self.norm is None else self.norm(x))
        if self.return_intermediate:
            result = ops.stack(intermediate, axis=0)  # (L, B, T, d)
        else:
            result = x if self.norm is None else self.norm(x)
        outputs = [result]
        if cache is not None:
            outputs.append(ops.stack(caches, axis=1))  # (B, L, 2, T_max, H, D)
        if return_cross_attention:
            outputs.append(ops.stack(weights, axis=0))  # (L, B, H, T, S)
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def compute_output_shape(self, x_shape, *args, **kwargs):
        if self.return_intermediate:
            return (self.num_layers, *x_shape)
        return x_shape

    def get_config(self):
        config = super().get_config()
        config.update(
            num_layers=self.num_layers,
            return_intermediate=self.return_intermediate,
            final_norm=self.final_norm,
        )
        return config
