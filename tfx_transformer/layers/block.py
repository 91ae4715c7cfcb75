"""The residual + LayerNorm wiring shared by the encoder and decoder layers."""

from __future__ import annotations

import keras

from tfx_transformer import checks
from tfx_transformer.layers.attention import MultiHeadAttention
from tfx_transformer.layers.feedforward import FeedForward

__all__ = ["ResidualBlockLayer", "block_arguments", "layer_norm"]


def _check_arguments(num_heads, hidden_dim, dropout) -> None:
    checks.positive_int("num_heads", num_heads)
    checks.positive_int("hidden_dim", hidden_dim)
    checks.fraction("dropout", dropout)


def block_arguments(
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
) -> dict:
    """Validates the arguments of a Transformer layer and returns them serialized.

    The stacks forward this dict to each of their layers and store it in their config;
    ``ResidualBlockLayer.get_config`` holds the same keys. Arguments: see
    ``ResidualBlockLayer``.

    Returns:
        The arguments by name, JSON-serializable, with ``attention_dropout`` and
        ``activation_dropout`` resolved (``None`` means ``dropout``).

    Raises:
        ValueError: naming the argument that is out of range.
    """
    _check_arguments(num_heads, hidden_dim, dropout)
    return dict(
        num_heads=num_heads,
        hidden_dim=hidden_dim,
        dropout=dropout,
        attention_dropout=dropout if attention_dropout is None else attention_dropout,
        activation_dropout=dropout if activation_dropout is None else activation_dropout,
        activation=keras.activations.serialize(keras.activations.get(activation)),
        norm_first=norm_first,
        layer_norm_epsilon=layer_norm_epsilon,
        kernel_initializer=keras.initializers.serialize(keras.initializers.get(kernel_initializer)),
        bias_initializer=keras.initializers.serialize(keras.initializers.get(bias_initializer)),
    )


def layer_norm(input_shape, epsilon: float, dtype, name: str) -> keras.layers.LayerNormalization:
    """A built ``LayerNormalization`` over the last axis of ``input_shape``."""
    norm = keras.layers.LayerNormalization(epsilon=epsilon, dtype=dtype, name=name)
    norm.build(input_shape)
    return norm


class ResidualBlockLayer(keras.layers.Layer):
    """Base of ``TransformerEncoderLayer`` and ``TransformerDecoderLayer``.

    Holds the hyperparameters both share and one ``residual`` method for both norm
    placements, so pre-norm and post-norm are never written twice:

    * post-norm (``norm_first=False``, the paper): ``x = norm(x + dropout(f(x)))``
    * pre-norm (``norm_first=True``): ``x = x + dropout(f(norm(x)))``

    Args:
        num_heads: attention heads; ``d_model`` must be divisible by it.
        hidden_dim: inner width of the feed-forward network.
        dropout: dropout on every sub-layer output (and inside the FFN).
        attention_dropout: dropout on attention weights (defaults to ``dropout``).
        activation_dropout: dropout after the FFN activation (defaults to ``dropout``, as in
            DETR and ``torch.nn.Transformer``; fairseq's translation models use 0).
        activation: FFN activation.
        norm_first: pre-norm when True, post-norm (default) when False.
        layer_norm_epsilon: LayerNorm epsilon.
        kernel_initializer: initializer of every kernel.
        bias_initializer: initializer of every bias.
        **kwargs: base layer arguments.
    """

    def __init__(
        self,
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
        **kwargs,
    ):
        super().__init__(**kwargs)
        _check_arguments(num_heads, hidden_dim, dropout)
        self.num_heads = num_heads
        self.hidden_dim = hidden_dim
        self.dropout = dropout
        self.attention_dropout = dropout if attention_dropout is None else attention_dropout
        self.activation_dropout = dropout if activation_dropout is None else activation_dropout
        self.activation = keras.activations.get(activation)
        self.norm_first = norm_first
        self.layer_norm_epsilon = layer_norm_epsilon
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.supports_masking = True

    def _head_dim(self, d_model: int) -> int:
        if d_model % self.num_heads:
            raise ValueError(
                f"The model dimension must be divisible by `num_heads`. Received: "
                f"d_model={d_model}, num_heads={self.num_heads}"
            )
        return d_model // self.num_heads

    def _attention(self, d_model: int, name: str) -> MultiHeadAttention:
        return MultiHeadAttention(
            num_heads=self.num_heads,
            key_dim=self._head_dim(d_model),
            dropout=self.attention_dropout,
            output_dim=d_model,
            kernel_initializer=self._clone(self.kernel_initializer),
            bias_initializer=self._clone(self.bias_initializer),
            dtype=self.dtype_policy,
            name=name,
        )

    def _feedforward(self, input_shape) -> FeedForward:
        ffn = FeedForward(
            self.hidden_dim,
            dropout=self.activation_dropout,
            activation=self.activation,
            kernel_initializer=self._clone(self.kernel_initializer),
            bias_initializer=self._clone(self.bias_initializer),
            dtype=self.dtype_policy,
            name="feedforward",
        )
        ffn.build(input_shape)
        return ffn

    def _norm(self, input_shape, name: str) -> keras.layers.LayerNormalization:
        return layer_norm(input_shape, self.layer_norm_epsilon, self.dtype_policy, name)

    def _dropout_layer(self) -> keras.layers.Dropout:
        return keras.layers.Dropout(self.dropout, dtype=self.dtype_policy)

    @staticmethod
    def _clone(initializer):
        return initializer.__class__.from_config(initializer.get_config())

    def residual(self, x, fn, norm, dropout, training=None):
        """Applies ``fn`` with the residual connection and LayerNorm placement of this layer.

        ``fn`` maps the (possibly normalised) input to ``(output, extras)``; the extras (a
        cache, attention weights) are passed back unchanged.
        """
        y, extras = fn(norm(x) if self.norm_first else x)
        x = x + dropout(y, training=training)
        return (x if self.norm_first else norm(x)), extras

    def compute_output_shape(self, x_shape, *args, **kwargs):
        return x_shape

    def get_config(self):
        config = super().get_config()
        config.update(
            block_arguments(
                num_heads=self.num_heads,
                hidden_dim=self.hidden_dim,
                dropout=self.dropout,
                attention_dropout=self.attention_dropout,
                activation_dropout=self.activation_dropout,
                activation=self.activation,
                norm_first=self.norm_first,
                layer_norm_epsilon=self.layer_norm_epsilon,
                kernel_initializer=self.kernel_initializer,
                bias_initializer=self.bias_initializer,
            )
        )
        return config
