"""The base of the encoder and decoder stacks: ``num_layers`` layers and a final LayerNorm."""

from __future__ import annotations

import keras

from tfx_transformer import checks
from tfx_transformer.layers.block import ResidualBlockLayer, block_arguments, layer_norm

__all__ = ["TransformerStack"]


class TransformerStack(keras.layers.Layer):
    """Base of ``TransformerEncoder`` and ``TransformerDecoder``.

    Builds ``num_layers`` instances of ``layer_class`` named ``layer_0``, ``layer_1``, … with
    the same arguments, and the final LayerNorm when ``_uses_final_norm`` says so; the config
    holds ``num_layers``, ``final_norm`` and the layers' arguments.

    Args:
        num_layers: number of layers.
        num_heads, hidden_dim, dropout, attention_dropout, activation_dropout, activation,
            norm_first, layer_norm_epsilon, kernel_initializer, bias_initializer: passed to
            every layer (see ``ResidualBlockLayer``).
        final_norm: apply a LayerNorm to the output; ``None`` leaves it to
            ``_uses_final_norm``.
        **kwargs: base layer arguments.

    Attributes:
        layers: the ``layer_class`` instances, in order (after ``build``).
        norm: the final ``LayerNormalization``, or ``None``.
    """

    layer_class: type[ResidualBlockLayer]

    def __init__(
        self,
        num_layers: int,
        num_heads: int,
        hidden_dim: int,
        dropout: float = 0.1,
        attention_dropout: float | None = None,
        activation_dropout: float | None = None,
        activation="relu",
        norm_first: bool = False,
        layer_norm_epsilon: float = 1e-5,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        final_norm: bool | None = None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.num_layers = checks.positive_int("num_layers", num_layers)
        self.final_norm = final_norm
        # Forwarded to every layer as they are, and saved in the config.
        self._layer_arguments = block_arguments(
            num_heads=num_heads,
            hidden_dim=hidden_dim,
            dropout=dropout,
            attention_dropout=attention_dropout,
            activation_dropout=activation_dropout,
            activation=activation,
            norm_first=norm_first,
            layer_norm_epsilon=layer_norm_epsilon,
            kernel_initializer=kernel_initializer,
            bias_initializer=bias_initializer,
        )
        self.supports_masking = True

    def _uses_final_norm(self) -> bool:
        """Whether to build the final LayerNorm when ``final_norm`` is ``None``: pre-norm
        stacks need it, post-norm outputs are already normalised."""
        return self._layer_arguments["norm_first"]

    def build(self, x_shape, *layer_shapes):
        """Builds the layers with ``layer.build(x_shape, *layer_shapes)``, then the norm."""
        self.layers = []
        for i in range(self.num_layers):
            layer = self.layer_class(
                **self._layer_arguments, dtype=self.dtype_policy, name=f"layer_{i}"
            )
            layer.build(x_shape, *layer_shapes)
            self.layers.append(layer)
        use_norm = self._uses_final_norm() if self.final_norm is None else self.final_norm
        self.norm = None
        if use_norm:
            epsilon = self._layer_arguments["layer_norm_epsilon"]
            self.norm = layer_norm(x_shape, epsilon, self.dtype_policy, "final_norm")

    def normalize(self, x):
        """The final LayerNorm of ``x`` ``(..., d)``; ``x`` itself when there is none."""
        return x if self.norm is None else self.norm(x)

    def compute_output_shape(self, x_shape, *args, **kwargs):
        return x_shape

    def get_config(self):
        config = super().get_config()
        config.update(
            num_layers=self.num_layers, final_norm=self.final_norm, **self._layer_arguments
        )
        return config
