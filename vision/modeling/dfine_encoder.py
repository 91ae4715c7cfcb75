"""D-FINE's hybrid encoder: RT-DETR's (`vision.modeling.hybrid_encoder`) with GELAN fusion.

As transformers' ``DFineHybridEncoder`` (Peterande/D-FINE ``hybrid_encoder.py``) computes it,
the input projections, AIFI and the FPN/PAN wiring are RT-DETR's; what differs is the blocks:

- the FPN's lateral 1x1 convolutions are not activated;
- each fusion block is a `RepNCSPELAN4` (YOLOv9's GELAN block with CSP-RepVGG branches)
  instead of a `CSPRepLayer`, with ``round(3 * depth_mult)`` RepVGG blocks per branch;
- the PAN downsamples by `SCDown`: a 1x1 `ConvNorm` then a depthwise 3x3 stride-2 one,
  neither activated, instead of one full 3x3 stride-2 convolution.

Names follow transformers' modules (``pan_blocks.0.csp_rep1.bottlenecks.2.conv1`` ->
``pan_blocks_0/csp_rep1/bottlenecks_2/conv1``).
"""

from __future__ import annotations

import keras
from keras import ops

from vision.modeling.hybrid_encoder import ConvNorm, CSPRepLayer, HybridEncoder

__all__ = ["DFineHybridEncoder", "RepNCSPELAN4", "SCDown"]


@keras.saving.register_keras_serializable(package="vision")
class RepNCSPELAN4(keras.layers.Layer):
    """GELAN fusion (transformers' ``DFineRepNCSPELAN4``): ``conv1`` (1x1, ``2 * channels``)
    is split in two halves ``a, b``; ``c = conv2(csp_rep1(b))``, ``e = conv3(csp_rep2(c))``
    (3x3 convolutions, ``branch`` channels); the output is ``conv4([a, b, c, e])`` (1x1).

    Args:
        channels: output channels (the input has ``2 * channels``; the halves ``channels``).
        hidden_expansion: the branches' width is ``round(hidden_expansion * channels // 2)``
            (transformers' arithmetic).
        num_blocks: RepVGG blocks in each CSP branch.
        activation: the CSP branches' activation (``activation_function``); the block's own
            four convolutions use SiLU, as transformers' do whatever the config says.
        epsilon: the BatchNorms' epsilon.
        **kwargs: base layer arguments.
    """

    def __init__(self, channels: int, hidden_expansion: float = 1.0, num_blocks: int = 3,
                 activation: str | None = "silu", epsilon: float = 1e-5, **kwargs):
        super().__init__(**kwargs)
        self.channels, self.hidden_expansion, self.num_blocks = channels, hidden_expansion, \
            num_blocks
        self.activation, self.epsilon = activation, epsilon
        self.branch = branch = round(hidden_expansion * channels // 2)
        own = dict(activation="silu", epsilon=epsilon, dtype=self.dtype_policy)
        csp = dict(hidden_expansion=1.0, num_blocks=num_blocks, activation=activation,
                   epsilon=epsilon, dtype=self.dtype_policy)
        self.conv1 = ConvNorm(2 * channels, 1, name="conv1", **own)
        self.csp_rep1 = CSPRepLayer(branch, name="csp_rep1", **csp)
        self.conv2 = ConvNorm(branch, 3, name="conv2", **own)
        self.csp_rep2 = CSPRepLayer(branch, name="csp_rep2", **csp)
        self.conv3 = ConvNorm(branch, 3, name="conv3", **own)
        self.conv4 = ConvNorm(channels, 1, name="conv4", **own)

    def build(self, input_shape):
        self.conv1.build(input_shape)
        self.csp_rep1.build((None, None, None, self.channels))
        branch = (None, None, None, self.branch)
        for layer in (self.conv2, self.csp_rep2, self.conv3):
            layer.build(branch)
        self.conv4.build((None, None, None, 2 * self.channels + 2 * self.branch))

    def call(self, x, training=None):
        x = self.conv1(x, training=training)
        first, second = x[..., :self.channels], x[..., self.channels:]
        c = self.conv2(self.csp_rep1(second, training=training), training=training)
        e = self.conv3(self.csp_rep2(c, training=training), training=training)
        return self.conv4(ops.concatenate([first, second, c, e], axis=-1), training=training)

    def compute_output_shape(self, input_shape):
        return (*input_shape[:-1], self.channels)

    def get_config(self):
        config = super().get_config()
        config.update(channels=self.channels, hidden_expansion=self.hidden_expansion,
                      num_blocks=self.num_blocks, activation=self.activation,
                      epsilon=self.epsilon)
        return config


@keras.saving.register_keras_serializable(package="vision")
class SCDown(keras.layers.Layer):
    """Spatial-channel downsampling (transformers' ``DFineSCDown``): a 1x1 `ConvNorm`, then a
    depthwise ``kernel_size`` `ConvNorm` of stride ``strides``; no activation.

    Args:
        channels: input and output channels.
        kernel_size: the depthwise convolution's kernel (3).
        strides: its stride (2).
        epsilon: the BatchNorms' epsilon.
        **kwargs: base layer arguments.
    """

    def __init__(self, channels: int, kernel_size: int = 3, strides: int = 2,
                 epsilon: float = 1e-5, **kwargs):
        super().__init__(**kwargs)
        self.channels, self.kernel_size, self.strides, self.epsilon = channels, kernel_size, \
            strides, epsilon
        self.conv1 = ConvNorm(channels, 1, epsilon=epsilon, dtype=self.dtype_policy,
                              name="conv1")
        self.conv2 = ConvNorm(channels, kernel_size, strides, epsilon=epsilon, depthwise=True,
                              dtype=self.dtype_policy, name="conv2")

    def build(self, input_shape):
        self.conv1.build(input_shape)
        self.conv2.build((None, None, None, self.channels))

    def call(self, x, training=None):
        return self.conv2(self.conv1(x, training=training), training=training)

    def compute_output_shape(self, input_shape):
        return self.conv2.compute_output_shape((*input_shape[:-1], self.channels))

    def get_config(self):
        config = super().get_config()
        config.update(channels=self.channels, kernel_size=self.kernel_size,
                      strides=self.strides, epsilon=self.epsilon)
        return config


@keras.saving.register_keras_serializable(package="vision")
class DFineHybridEncoder(HybridEncoder):
    """`HybridEncoder` with D-FINE's `RepNCSPELAN4` fusion and `SCDown` downsampling.

    Args:
        num_blocks: RepVGG blocks per CSP branch (``round(3 * depth_mult)``).
        **kwargs: `HybridEncoder`'s arguments.
    """

    def __init__(self, num_blocks: int = 3, **kwargs):
        self.num_blocks = num_blocks
        super().__init__(**kwargs)

    def _lateral(self, name: str) -> keras.layers.Layer:
        return ConvNorm(self.hidden_dim, 1, epsilon=self.epsilon, dtype=self.dtype_policy,
                        name=name)  # not activated, unlike RT-DETR's

    def _fusion_block(self, name: str) -> keras.layers.Layer:
        return RepNCSPELAN4(self.hidden_dim, hidden_expansion=self.hidden_expansion,
                            num_blocks=self.num_blocks, activation=self.activation,
                            epsilon=self.epsilon, dtype=self.dtype_policy, name=name)

    def _downsample(self, name: str) -> keras.layers.Layer:
        return SCDown(self.hidden_dim, 3, 2, epsilon=self.epsilon, dtype=self.dtype_policy,
                      name=name)

    def get_config(self):
        config = super().get_config()
        config.update(num_blocks=self.num_blocks)
        return config
