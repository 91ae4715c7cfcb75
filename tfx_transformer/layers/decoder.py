"""Transformer decoder layer and stack, with KV caches for incremental decoding."""

from __future__ import annotations

import keras
from keras import ops

from tfx_transformer.layers.block import ResidualBlockLayer
from tfx_transformer.layers.masks import to_attention_mask
from tfx_transformer.layers.output import AttentionOutput, call_arguments
from tfx_transformer.layers.position import add_position
from tfx_transformer.layers.stack import TransformerStack

__all__ = ["TransformerDecoderLayer", "TransformerDecoder"]


def _output_spec(output_shape, attention_shape, cache, dtype) -> AttentionOutput:
    """``AttentionOutput`` of KerasTensors; ``None`` where ``attention_shape``/``cache`` is."""
    attention = None
    if attention_shape is not None:
        attention = keras.KerasTensor(attention_shape, dtype=dtype)
    if cache is not None:
        cache = keras.KerasTensor(cache.shape, dtype=cache.dtype)
    return AttentionOutput(keras.KerasTensor(output_shape, dtype=dtype), attention, cache)


def _spec_arguments(layer, args, kwargs):
    """``(x, cache, S or None)`` of a decoder ``call``: ``S`` when it returns cross-attention
    weights, from ``memory`` ``(B, S, d)`` or from the cache ``(..., 2, B, H, S, D)``."""
    arguments = call_arguments(layer, args, kwargs)
    memory, cross_cache = arguments["memory"], arguments["cross_attention_cache"]
    length = None
    if arguments["return_cross_attention"]:
        length = memory.shape[1] if cross_cache is None else cross_cache.shape[-2]
    return arguments["x"], arguments["cache"], length


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
        cache: self-attention cache ``(2, B, H, T_max, D)`` (keys then values, heads-major;
            see ``MultiHeadAttention``); with ``cache_index``, ``x`` holds the step(s) at
            ``cache_index``.
        cache_index: int or scalar tensor.
        cross_attention_cache: ``(2, B, H, S, D)`` from ``compute_cross_attention_cache``;
            skips re-projecting ``memory``.
        return_cross_attention: also return the cross-attention weights.
        training: enables dropout.

    Returns:
        ``AttentionOutput(output, attention, cache)``, always: ``output`` ``(B, T, d)``;
        ``attention`` the cross-attention weights ``(B, H, T, S)`` if
        ``return_cross_attention``, else ``None``; ``cache`` the updated self-attention
        cache ``(2, B, H, T_max, D)`` if ``cache`` was given, else ``None``.
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
        """Projects ``memory`` once into cross-attention keys/values ``(2, B, H, S, D)``."""
        return self.cross_attention.compute_cache(memory, key=add_position(memory, memory_pos))

    def empty_cache(self, batch_size, max_length, dtype=None):
        """Zeros of the self-attention cache shape ``(2, B, H, max_length, D)``."""
        attention = self.self_attention
        shape = (2, batch_size, attention.num_heads, max_length, attention.key_dim)
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
    ) -> AttentionOutput:
        self_mask = to_attention_mask(self_attention_mask, "self_attention_mask")  # (B, 1|T, T)
        cross_mask = to_attention_mask(memory_mask, "memory_mask")  # (B, 1|T, S)

        def self_attend(h):
            qk = add_position(h, query_pos)
            out = self.self_attention(
                qk, h, qk, attention_mask=self_mask, use_causal_mask=use_causal_mask,
                training=training, cache=cache, cache_index=cache_index,
            )
            return out.output, out.cache

        def cross_attend(h):
            q = add_position(h, query_pos)
            if cross_attention_cache is None:
                value, key = memory, add_position(memory, memory_pos)
            else:  # precomputed keys/values; `value` only passes the shapes checks
                value, key = q, None
            out = self.cross_attention(
                q, value, key, attention_mask=cross_mask,
                return_attention_scores=return_cross_attention, training=training,
                cache=cross_attention_cache,
            )
            return out.output, out.attention

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
        return AttentionOutput(output=x, attention=weights, cache=new_cache)

    def compute_output_spec(self, *args, **kwargs) -> AttentionOutput:
        x, cache, length = _spec_arguments(self, args, kwargs)
        b, t = x.shape[:2]
        attention = None if length is None else (b, self.num_heads, t, length)  # (B, H, T, S)
        return _output_spec(x.shape, attention, cache, self.compute_dtype)


@keras.saving.register_keras_serializable(package="tfx_transformer")
class TransformerDecoder(TransformerStack):
    """A stack of ``num_layers`` ``TransformerDecoderLayer``\\ s with a shared final LayerNorm.

    Args:
        num_layers: number of layers.
        num_heads, hidden_dim, dropout, attention_dropout, activation_dropout, activation,
            norm_first, layer_norm_epsilon, kernel_initializer, bias_initializer: passed to
            every ``TransformerDecoderLayer`` (see ``ResidualBlockLayer``).
        return_intermediate: return every layer's output, each passed through the final
            LayerNorm, stacked as ``(L, B, T, d)`` (DETR's auxiliary losses use them).
        final_norm: apply the final LayerNorm; ``None`` means ``norm_first or
            return_intermediate`` (DETR's decoder always has it).
        **kwargs: base layer arguments.

    Attributes:
        layers: the ``TransformerDecoderLayer``\\ s, in order (after ``build``). Calling them
            one by one, each output through ``normalize``, gives the stack's intermediate
            outputs (how DETR's box refinement runs the decoder layer by layer).

    Call arguments: as ``TransformerDecoderLayer``, except that ``cache`` and
        ``cross_attention_cache`` have a leading layer axis: ``(L, 2, B, H, T_max, D)`` and
        ``(L, 2, B, H, S, D)`` (``cache[i]`` is layer ``i``'s, contiguous).

    Returns:
        ``AttentionOutput(output, attention, cache)``, always: ``output`` ``(B, T, d)``, or
        ``(L, B, T, d)`` with ``return_intermediate``; ``attention`` every layer's
        cross-attention weights ``(L, B, H, T, S)`` if ``return_cross_attention``, else
        ``None``; ``cache`` the updated cache ``(L, 2, B, H, T_max, D)`` if ``cache`` was
        given, else ``None``.
    """

    layer_class = TransformerDecoderLayer

    # Written out, not inherited: ``return_intermediate`` stands before ``final_norm``.
    def __init__(self, num_layers: int, num_heads: int, hidden_dim: int, dropout: float = 0.1,
                 attention_dropout: float | None = None, activation_dropout: float | None = None,
                 activation="relu", norm_first: bool = False, layer_norm_epsilon: float = 1e-5,
                 kernel_initializer="glorot_uniform", bias_initializer="zeros",
                 return_intermediate: bool = False, final_norm: bool | None = None, **kwargs):
        super().__init__(
            num_layers, num_heads, hidden_dim, dropout, attention_dropout, activation_dropout,
            activation, norm_first, layer_norm_epsilon, kernel_initializer, bias_initializer,
            final_norm=final_norm, **kwargs,
        )
        self.return_intermediate = return_intermediate

    def _uses_final_norm(self) -> bool:
        return super()._uses_final_norm() or self.return_intermediate

    def build(self, x_shape, memory_shape=None):
        super().build(x_shape, memory_shape)

    def compute_cross_attention_cache(self, memory, memory_pos=None):
        """Cross-attention keys/values of every layer, ``(L, 2, B, H, S, D)``."""
        caches = [layer.compute_cross_attention_cache(memory, memory_pos) for layer in self.layers]
        return ops.stack(caches, axis=0)

    def empty_cache(self, batch_size, max_length, dtype=None):
        """Zeros of the self-attention cache shape ``(L, 2, B, H, max_length, D)``."""
        return ops.stack(
            [layer.empty_cache(batch_size, max_length, dtype) for layer in self.layers], axis=0
        )

    # The layer's call arguments, passed on to every layer (the caches sliced per layer).
    def call(self, x, memory, self_attention_mask=None, memory_mask=None, query_pos=None,
             memory_pos=None, use_causal_mask: bool = False, cache=None, cache_index=None,
             cross_attention_cache=None, return_cross_attention: bool = False,
             training=None) -> AttentionOutput:
        intermediate, caches, weights = [], [], []
        for i, layer in enumerate(self.layers):
            out = layer(
                x, memory, self_attention_mask=self_attention_mask, memory_mask=memory_mask,
                query_pos=query_pos, memory_pos=memory_pos, use_causal_mask=use_causal_mask,
                cache=None if cache is None else cache[i], cache_index=cache_index,
                cross_attention_cache=(
                    None if cross_attention_cache is None else cross_attention_cache[i]
                ),
                return_cross_attention=return_cross_attention, training=training,
            )
            x = out.output
            caches.append(out.cache)
            weights.append(out.attention)
            if self.return_intermediate:
                intermediate.append(self.normalize(x))
        if self.return_intermediate:
            output = ops.stack(intermediate, axis=0)  # (L, B, T, d)
        else:
            output = self.normalize(x)  # (B, T, d)
        return AttentionOutput(
            output=output,
            # (L, B, H, T, S)
            attention=ops.stack(weights, axis=0) if return_cross_attention else None,
            # (L, 2, B, H, T_max, D)
            cache=None if cache is None else ops.stack(caches, axis=0),
        )

    def compute_output_shape(self, x_shape, *args, **kwargs):
        """The shape of the ``output`` field."""
        if self.return_intermediate:
            return (self.num_layers, *x_shape)
        return x_shape

    def compute_output_spec(self, *args, **kwargs) -> AttentionOutput:
        x, cache, length = _spec_arguments(self, args, kwargs)
        b, t = x.shape[:2]
        attention = None
        if length is not None:  # (L, B, H, T, S)
            attention = (self.num_layers, b, self._layer_arguments["num_heads"], t, length)
        output = self.compute_output_shape(x.shape)
        return _output_spec(output, attention, cache, self.compute_dtype)

    def get_config(self):
        config = super().get_config()
        config.update(return_intermediate=self.return_intermediate)
        return config
