"""The multi-layer perceptron of every DETR head (``MLP`` of facebookresearch/detr)."""

from __future__ import annotations

import keras

from tfx_transformer import checks
from tfx_transformer.layers.projection import dense_call
from vision.modeling.init import torch_linear_init

__all__ = ["MLP"]


@keras.saving.register_keras_serializable(package="vision")
class MLP(keras.layers.Layer):
    """``num_layers`` dense layers, ReLU between them, PyTorch's ``nn.Linear`` initialization.

    DETR's box head is ``MLP(d, d, 4, 3)``; the two-stage proposal box head is the same;
    the position embedding of a reference point or box is ``MLP(k * d / 2, d, d, 2)``.

    The dense layers are created in ``__init__`` (their initializers draw their seeds
    there), so that a model's initialization follows the order in which it creates its heads.

    Args:
        input_dim: input features (the first layer's PyTorch fan-in).
        hidden_dim: width of every layer but the last.
        output_dim: width of the last layer (no activation).
        num_layers: number of dense layers (>= 1).
        **kwargs: base layer arguments (``name``, ``dtype``).

    Call arguments:
        x: ``(..., input_dim)``.

    Returns:
        ``(..., output_dim)`` in the layer's compute dtype.
    """

    def __init__(self, input_dim: int, hidden_dim: int, output_dim: int, num_layers: int,
                 **kwargs):
        super().__init__(**kwargs)
        self.input_dim = input_dim = checks.positive_int("input_dim", input_dim)
        self.hidden_dim = hidden_dim = checks.positive_int("hidden_dim", hidden_dim)
        self.output_dim = output_dim = checks.positive_int("output_dim", output_dim)
        self.num_layers = num_layers = checks.positive_int("num_layers", num_layers)
        fan_ins = [input_dim] + [hidden_dim] * (num_layers - 1)
        self.layers = [
            keras.layers.Dense(
                output_dim if i == num_layers - 1 else hidden_dim,
                activation=None if i == num_layers - 1 else "relu",
                dtype=self.dtype_policy, name=f"{self.name}_{i}", **torch_linear_init(fan_in),
            )
            for i, fan_in in enumerate(fan_ins)
        ]

    def build(self, input_shape):
        shape = tuple(input_shape)
        for layer in self.layers:
            layer.build(shape)
            shape = (*shape[:-1], layer.units)

    def call(self, x):
        for layer in self.layers:
            x = dense_call(layer, x)
        return x

    def compute_output_shape(self, input_shape):
        return (*tuple(input_shape)[:-1], self.output_dim)

    def get_config(self):
        config = super().get_config()
        config.update(input_dim=self.input_dim, hidden_dim=self.hidden_dim,
                      output_dim=self.output_dim, num_layers=self.num_layers)
        return config
