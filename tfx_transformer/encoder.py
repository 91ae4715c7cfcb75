"""Transformer encoder layer and stack."""

from __future__ import annotations

import keras

from tfx_transformer.block import ResidualBlockLayer

__all__ = ["TransformerEncoderLayer", "TransformerEncoder"]


def _key_mask(padding_mask):
    """(B, S) validity -> (B, 1, S) attention mask over keys, or None."""
    return None if padding_mask is None else keras.ops.cast(padding_mask, "bool")[:, None, :]


def _add(x, pos):
    return x if pos is None else x + keras.ops.cast(pos, x.dtype)


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
        mask = _key_mask(padding_mask)

        def attend(h):
            qk = _add(h, pos)
            return self.self_attention(qk, h, qk, attention_mask=mask, training=training), None

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
class TransformerEncoder(ResidualBlockLayer):
    """A stack of ``num_layers`` ``TransformerEncoderLayer``\\ s and an optional final LayerNorm.

    Args:
        num_layers: number of layers.
        final_norm: apply a LayerNorm to the output; ``None`` means ``norm_first`` (pre-norm
            stacks need it, post-norm outputs are already normalised).
        **kwargs: the ``TransformerEncoderLayer`` arguments, and base layer arguments.

    Call arguments: as ``TransformerEncoderLayer``.

    Returns:
        ``(B, S, d)``.
    """

    def __init__(self, num_layers: int, final_norm: bool | None = None, **kwargs):
        super().__init__(**kwargs)
        if not isinstance(num_layers, int) or num_layers <= 0:
            raise ValueError(f"`num_layers` must be a positive integer. Received: {num_layers!r}")
        self.num_layers = num_layers
        self.final_norm = final_norm

    def build(self, x_shape):
        self.layers = []
        for i in range(self.num_layers):
            layer = TransformerEncoderLayer(
                **self.layer_kwargs(), dtype=self.dtype_policy, name=f"layer_{i}"
            )
            layer.build(x_shape)
            self.layers.append(layer)
        use_norm = self.norm_first if self.final_norm is None else self.final_norm
        self.norm = self._norm(x_shape, "final_norm") if use_norm else None

    def call(self, x, padding_mask=None, pos=None, training=None):
        for layer in self.layers:
            x = layer(x, padding_mask=padding_mask, pos=pos, training=training)
        return x if self.norm is None else self.norm(x)

    def get_config(self):
        config = super().get_config()
        config.update(num_layers=self.num_layers, final_norm=self.final_norm)
        return config
