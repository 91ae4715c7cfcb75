"""Position-wise feed-forward network."""

from __future__ import annotations

import keras

from tfx_transformer import checks
from tfx_transformer.layers.projection import dense_call

__all__ = ["FeedForward"]


@keras.saving.register_keras_serializable(package="tfx_transformer")
class FeedForward(keras.layers.Layer):
    """``Dense(hidden_dim, activation) -> Dropout -> Dense(d)``, applied at every position.

    Args:
        hidden_dim: width of the inner layer.
        dropout: dropout rate after the activation.
        activation: activation of the inner layer.
        kernel_initializer: initializer of both kernels (cloned per layer).
        bias_initializer: initializer of both biases.
        **kwargs: base layer arguments.

    Call arguments:
        x: ``(B, T, d)``.
        training: enables dropout.

    Returns:
        ``(B, T, d)``.
    """

    def __init__(
        self,
        hidden_dim: int,
        dropout: float = 0.1,
        activation="relu",
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.hidden_dim = checks.positive_int("hidden_dim", hidden_dim)
        self.dropout = checks.fraction("dropout", dropout)
        self.activation = keras.activations.get(activation)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.supports_masking = True

    def _dense(self, units, activation, name):
        clone = lambda init: init.__class__.from_config(init.get_config())  # noqa: E731
        return keras.layers.Dense(
            units,
            activation=activation,
            kernel_initializer=clone(self.kernel_initializer),
            bias_initializer=clone(self.bias_initializer),
            dtype=self.dtype_policy,
            name=name,
        )

    def build(self, input_shape):
        self.inner = self._dense(self.hidden_dim, self.activation, "inner")
        self.inner.build(input_shape)
        self.inner_dropout = keras.layers.Dropout(self.dropout, dtype=self.dtype_policy)
        self.outer = self._dense(input_shape[-1], None, "outer")
        self.outer.build((*input_shape[:-1], self.hidden_dim))

    def call(self, x, training=None):
        hidden = self.inner_dropout(dense_call(self.inner, x), training=training)
        return dense_call(self.outer, hidden)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(
            hidden_dim=self.hidden_dim,
            dropout=self.dropout,
            activation=keras.activations.serialize(self.activation),
            kernel_initializer=keras.initializers.serialize(self.kernel_initializer),
            bias_initializer=keras.initializers.serialize(self.bias_initializer),
        )
        return config
