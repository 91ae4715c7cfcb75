"""Transformer encoder layer and stack."""

from __future__ import annotations

import keras

from tfx_transformer.layers.block import ResidualBlockLayer
from tfx_transformer.layers.masks import key_padding_mask
from tfx_transformer.layers.position import add_position
from tfx_transformer.layers.stack import TransformerStack

__all__ = ["TransformerEncoderLayer", "TransformerEncoder"]


@keras.saving.register_keras_serializable(package="tfx_transformer")
class TransformerEncoderLayer(ResidualBlockLayer):
    """Self-attention then feed-forward, each with a residual connection and LayerNorm.

    Queries and keys are ``x + pos``, values are ``x`` (DETR passes its 2-D embedding as
    ``pos`` in every layer; translation passes none). Arguments: see ``ResidualBlockLayer``.

    Call arguments:
        x: ``(B, S, d)``.
        padding_mask: boolean ``(B, S)``, ``True`` = valid token/pixel; padded keys are ignored.
        pos: ``(B, S, d)`` position embedding added to queries and keys, or ``None``.
        training: enables dropout.

    Returns:
        ``(B, S, d)``.
    """

    def build(self, x_shape):
        d_model = x_shape[-1]
        self.self_attention = self._attention(d_model, "self_attention")
        self.self_attention.build(x_shape, x_shape)
        self.self_attention_norm = self._norm(x_shape, "self_attention_norm")
        self.self_attention_dropout = self._dropout_layer()
        self.feedforward = self._feedforward(x_shape)
        self.feedforward_norm = self._norm(x_shape, "feedforward_norm")
        self.feedforward_dropout = self._dropout_layer()

    def call(self, x, padding_mask=None, pos=None, training=None):
        mask = key_padding_mask(padding_mask)  # (B, 1, S)

        def attend(h):
            qk = add_position(h, pos)
            out = self.self_attention(qk, h, qk, attention_mask=mask, training=training)
            return out.output, None

        x, _ = self.residual(
            x, attend, self.self_attention_norm, self.self_attention_dropout, training
        )
        x, _ = self.residual(
            x,
            lambda h: (self.feedforward(h, training=training), None),
            self.feedforward_norm,
            self.feedforward_dropout,
            training,
        )
        return x


@keras.saving.register_keras_serializable(package="tfx_transformer")
class TransformerEncoder(TransformerStack):
    """A stack of ``num_layers`` ``TransformerEncoderLayer``\\ s and an optional final LayerNorm.

    Args:
        num_layers: number of layers.
        num_heads, hidden_dim, dropout, attention_dropout, activation_dropout, activation,
            norm_first, layer_norm_epsilon, kernel_initializer, bias_initializer: passed to
            every ``TransformerEncoderLayer`` (see ``ResidualBlockLayer``).
        final_norm: apply a LayerNorm to the output; ``None`` means ``norm_first`` (pre-norm
            stacks need it, post-norm outputs are already normalised).
        **kwargs: base layer arguments.

    Attributes:
        layers: the ``TransformerEncoderLayer``\\ s, in order (after ``build``).
        norm: the final ``LayerNormalization``, or ``None``.

    Call arguments: as ``TransformerEncoderLayer``.

    Returns:
        ``(B, S, d)``.
    """

    layer_class = TransformerEncoderLayer

    def call(self, x, padding_mask=None, pos=None, training=None):
        for layer in self.layers:
            x = layer(x, padding_mask=padding_mask, pos=pos, training=training)
        return self.normalize(x)
