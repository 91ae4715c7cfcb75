"""PyTorch's default initializations, which DETR's numbers rely on.

DETR initializes its heads with PyTorch's ``nn.Linear`` / ``nn.Conv2d`` defaults and its
Transformer with ``xavier_uniform_`` on every weight matrix (``Transformer._reset_parameters``).
Keras's defaults differ (Glorot with Keras's fans, zero biases), so `vision.modeling.detr.DETR` and
its heads use these instead. ``keras.ops`` / ``keras.random`` only.
"""

from __future__ import annotations

import math

import keras

__all__ = ["reset_transformer_parameters", "torch_linear_init"]


def torch_linear_init(fan_in: int) -> dict:
    """PyTorch's default ``nn.Linear`` / ``nn.Conv2d`` initialization, as layer arguments.

    Kernel ``U(+-1/sqrt(fan_in))`` (``kaiming_uniform_`` with ``a=sqrt(5)``) and bias
    ``U(+-1/sqrt(fan_in))``.

    Args:
        fan_in: input features of the layer (``in_channels * kh * kw`` for a convolution).

    Returns:
        ``{"kernel_initializer": ..., "bias_initializer": ...}`` for a Keras ``Dense`` or
        ``Conv2D`` (new initializer objects, so that layers get different weights).
    """
    bound = 1.0 / math.sqrt(fan_in)
    return dict(
        kernel_initializer=keras.initializers.VarianceScaling(1.0 / 3.0, "fan_in", "uniform"),
        bias_initializer=keras.initializers.RandomUniform(-bound, bound),
    )


def reset_transformer_parameters(stack) -> None:
    """Re-initializes a built Transformer stack as DETR's ``Transformer._reset_parameters``.

    DETR applies ``xavier_uniform_`` to every PyTorch weight matrix of its Transformer. Keras
    computes the fans of the 3-D attention kernels ``(d, H, k)`` as if they were conv kernels,
    which makes them about 3x smaller (and the attention logits about 9x flatter) than
    DETR's. Here each kernel gets the bound of its PyTorch matrix: the packed query/key/value
    projection ``(3d, d)`` gives ``sqrt(6 / 4d)``, the output projection ``(d, d)``
    ``sqrt(6 / 2d)``, the feed-forward ``(f, d)``/``(d, f)`` ``sqrt(6 / (d + f))``. Biases keep
    PyTorch's values: zero in attention, ``U(+-1/sqrt(fan_in))`` in the feed-forward layers.

    Args:
        stack: a built `tfx_transformer.TransformerEncoder` or `TransformerDecoder` (its public
            ``layers``); the draws come from Keras's global seed generator, in layer order.
    """
    def uniform(variable, bound):
        variable.assign(keras.random.uniform(variable.shape, -bound, bound, variable.dtype))

    for layer in stack.layers:
        for name in ("self_attention", "cross_attention"):
            attention = getattr(layer, name, None)  # encoder layers have no cross-attention
            if attention is None:
                continue
            d = attention.query_dense.kernel.shape[0]
            for dense in (attention.query_dense, attention.key_dense, attention.value_dense):
                uniform(dense.kernel, math.sqrt(6.0 / (4 * d)))
            out = attention.output_dense.kernel  # (H, value_dim, d)
            uniform(out, math.sqrt(6.0 / (out.shape[0] * out.shape[1] + out.shape[2])))
        for dense in (layer.feedforward.inner, layer.feedforward.outer):
            fan_in, fan_out = dense.kernel.shape
            uniform(dense.kernel, math.sqrt(6.0 / (fan_in + fan_out)))
            uniform(dense.bias, 1.0 / math.sqrt(fan_in))
