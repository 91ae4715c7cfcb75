"""RT-DETR's hybrid encoder: AIFI on the coarsest level, then CCFM's FPN and PAN.

As transformers' ``RTDetrHybridEncoder`` (lyuwenyu/RT-DETR ``hybrid_encoder.py``) computes it:

1. input projections: a 1x1 convolution and BatchNorm (epsilon 1e-5) per backbone level, to
   ``hidden_dim`` channels (transformers' ``encoder_input_proj``, which it keeps outside its
   encoder);
2. AIFI (attention-based intra-scale feature interaction): the levels in
   ``encode_proj_layers`` (the coarsest, stride 32) go through post-norm Transformer encoder
   layers (the shared `tfx_transformer.TransformerEncoder`: positions added to queries and
   keys, GELU feed-forward) with fixed 2-D sine-cosine positions (`sincos_positions_2d`);
3. CCFM (CNN-based cross-scale feature fusion): top-down, each coarser map goes through a 1x1
   "lateral" convolution, is upsampled 2x (nearest) and fused with the next finer level by a
   `CSPRepLayer`; bottom-up, each finer result is downsampled by a 3x3 stride-2 convolution and
   fused with the next coarser one by another `CSPRepLayer`.

Every convolution is `ConvNorm`: PyTorch's symmetric padding, no bias, BatchNorm, an optional
activation (``silu`` in RT-DETR). Layer names follow transformers' modules
(``fpn_blocks.0.bottlenecks.2.conv1`` -> ``fpn_blocks_0/bottlenecks_2/conv1``).
"""

from __future__ import annotations

from collections.abc import Sequence

import keras
from keras import ops

from tfx_transformer import TransformerEncoder

__all__ = ["CSPRepLayer", "ConvNorm", "HybridEncoder", "RepVggBlock", "sincos_positions_2d"]


@keras.saving.register_keras_serializable(package="vision")
class ConvNorm(keras.layers.Layer):
    """Convolution (no bias, PyTorch's ``(k - 1) // 2`` padding on each side), BatchNorm and an
    optional activation: transformers' ``RTDetrConvNormLayer`` (and ``DFineConvNormLayer``,
    whose ``groups`` is 1 or, depthwise, the channels).

    Args:
        filters: output channels.
        kernel_size: square kernel size.
        strides: stride.
        activation: activation name, or None.
        epsilon: the BatchNorm's epsilon.
        depthwise: one filter per input channel (``groups`` = channels = ``filters``; a
            ``DepthwiseConv2D``, kernel ``(k, k, filters, 1)``).
        **kwargs: base layer arguments.
    """

    def __init__(self, filters: int, kernel_size: int = 1, strides: int = 1,
                 activation: str | None = None, epsilon: float = 1e-5, depthwise: bool = False,
                 **kwargs):
        super().__init__(**kwargs)
        self.filters, self.kernel_size, self.strides = filters, kernel_size, strides
        self.activation, self.epsilon, self.depthwise = activation, epsilon, depthwise
        if depthwise:
            self.conv = keras.layers.DepthwiseConv2D(kernel_size, strides=strides,
                                                     use_bias=False, dtype=self.dtype_policy,
                                                     name="conv")
        else:
            self.conv = keras.layers.Conv2D(filters, kernel_size, strides=strides,
                                            use_bias=False, dtype=self.dtype_policy,
                                            name="conv")
        self.norm = keras.layers.BatchNormalization(epsilon=epsilon, dtype=self.dtype_policy,
                                                    name="norm")

    def build(self, input_shape):
        if self.depthwise and input_shape[-1] != self.filters:
            raise ValueError(f"A depthwise ConvNorm keeps its {self.filters} channels. "
                             f"Received input channels: {input_shape[-1]}")
        self.conv.build((None, None, None, input_shape[-1]))
        self.norm.build((None, None, None, self.filters))

    def call(self, x, training=None):
        pad = (self.kernel_size - 1) // 2
        if pad:
            x = ops.pad(x, [[0, 0], [pad, pad], [pad, pad], [0, 0]])
        x = self.norm(self.conv(x), training=training)
        return x if self.activation is None else keras.activations.get(self.activation)(x)

    def compute_output_shape(self, input_shape):
        def down(n):
            return None if n is None else (n + 2 * ((self.kernel_size - 1) // 2)
                                           - self.kernel_size) // self.strides + 1

        return (input_shape[0], down(input_shape[1]), down(input_shape[2]), self.filters)

    def get_config(self):
        config = super().get_config()
        config.update(filters=self.filters, kernel_size=self.kernel_size, strides=self.strides,
                      activation=self.activation, epsilon=self.epsilon,
                      depthwise=self.depthwise)
        return config


@keras.saving.register_keras_serializable(package="vision")
class RepVggBlock(keras.layers.Layer):
    """``activation(conv3x3(x) + conv1x1(x))``, each a `ConvNorm` without activation (RepVGG's
    training-time form; the two branches are not fused).

    Args:
        channels: input and output channels.
        activation: activation name, or None.
        epsilon: the BatchNorms' epsilon.
        **kwargs: base layer arguments.
    """

    def __init__(self, channels: int, activation: str | None = "silu", epsilon: float = 1e-5,
                 **kwargs):
        super().__init__(**kwargs)
        self.channels, self.activation, self.epsilon = channels, activation, epsilon
        self.conv1 = ConvNorm(channels, 3, epsilon=epsilon, dtype=self.dtype_policy,
                              name="conv1")
        self.conv2 = ConvNorm(channels, 1, epsilon=epsilon, dtype=self.dtype_policy,
                              name="conv2")

    def build(self, input_shape):
        self.conv1.build(input_shape)
        self.conv2.build(input_shape)

    def call(self, x, training=None):
        y = self.conv1(x, training=training) + self.conv2(x, training=training)
        return y if self.activation is None else keras.activations.get(self.activation)(y)

    def compute_output_shape(self, input_shape):
        return (*input_shape[:-1], self.channels)

    def get_config(self):
        config = super().get_config()
        config.update(channels=self.channels, activation=self.activation, epsilon=self.epsilon)
        return config


@keras.saving.register_keras_serializable(package="vision")
class CSPRepLayer(keras.layers.Layer):
    """Cross-stage-partial fusion: ``conv3(blocks(conv1(x)) + conv2(x))`` with 1x1
    `ConvNorm`\\ s (activated) and ``num_blocks`` `RepVggBlock`\\ s; ``conv3`` is the identity
    when ``hidden_expansion`` is 1 (transformers' ``RTDetrCSPRepLayer``).

    Args:
        channels: output channels (the input has any number, ``2 * channels`` in RT-DETR).
        hidden_expansion: the branches' width is ``int(channels * hidden_expansion)``.
        num_blocks: RepVGG blocks (3 in RT-DETR).
        activation: activation name.
        epsilon: the BatchNorms' epsilon.
        **kwargs: base layer arguments.
    """

    def __init__(self, channels: int, hidden_expansion: float = 1.0, num_blocks: int = 3,
                 activation: str | None = "silu", epsilon: float = 1e-5, **kwargs):
        super().__init__(**kwargs)
        self.channels, self.hidden_expansion, self.num_blocks = channels, hidden_expansion, \
            num_blocks
        self.activation, self.epsilon = activation, epsilon
        hidden = int(channels * hidden_expansion)
        conv = dict(activation=activation, epsilon=epsilon, dtype=self.dtype_policy)
        self.conv1 = ConvNorm(hidden, 1, name="conv1", **conv)
        self.conv2 = ConvNorm(hidden, 1, name="conv2", **conv)
        self.bottlenecks = [RepVggBlock(hidden, name=f"bottlenecks_{i}", **conv)
                            for i in range(num_blocks)]
        self.conv3 = ConvNorm(channels, 1, name="conv3", **conv) if hidden != channels else None

    def build(self, input_shape):
        self.conv1.build(input_shape)
        self.conv2.build(input_shape)
        hidden_shape = (None, None, None, self.conv1.filters)
        for block in self.bottlenecks:
            block.build(hidden_shape)
        if self.conv3 is not None:
            self.conv3.build(hidden_shape)

    def call(self, x, training=None):
        y = self.conv1(x, training=training)
        for block in self.bottlenecks:
            y = block(y, training=training)
        y = y + self.conv2(x, training=training)
        return y if self.conv3 is None else self.conv3(y, training=training)

    def compute_output_shape(self, input_shape):
        return (*input_shape[:-1], self.channels)

    def get_config(self):
        config = super().get_config()
        config.update(channels=self.channels, hidden_expansion=self.hidden_expansion,
                      num_blocks=self.num_blocks, activation=self.activation,
                      epsilon=self.epsilon)
        return config


def sincos_positions_2d(height, width, dim: int, temperature: float = 10000.0):
    """RT-DETR's fixed 2-D positions of an ``height x width`` grid, row-major: ``(h * w, dim)``
    laid out ``[sin(y w_k) | cos(y w_k) | sin(x w_k) | cos(x w_k)]`` with ``w_k =
    temperature^(-k / (dim / 4))``, ``y`` the row and ``x`` the column
    (transformers' ``build_2d_sinusoidal_position_embedding``)."""
    if dim % 4:
        raise ValueError(f"`dim` must be divisible by 4. Received: dim={dim}")
    quarter = dim // 4
    omega = 1.0 / ops.power(float(temperature),
                            ops.arange(quarter, dtype="float32") / quarter)  # (D/4,)
    rows = ops.repeat(ops.arange(height, dtype="float32"), width)  # (h * w,): y
    cols = ops.tile(ops.arange(width, dtype="float32"), [height])  # (h * w,): x
    y, x = rows[:, None] * omega, cols[:, None] * omega  # (h * w, D/4) each
    return ops.concatenate([ops.sin(y), ops.cos(y), ops.sin(x), ops.cos(x)], axis=-1)


@keras.saving.register_keras_serializable(package="vision")
class HybridEncoder(keras.layers.Layer):
    """Input projections, AIFI and CCFM (see the module docstring).

    Args:
        hidden_dim: channels of every output level (``encoder_hidden_dim``).
        num_levels: backbone levels taken (finest first).
        encode_proj_layers: the levels AIFI attends within (RT-DETR: the last).
        num_layers: AIFI's Transformer layers per level (0: no AIFI).
        num_heads, ffn_dim, dropout, activation_dropout, encoder_activation,
            layer_norm_epsilon: AIFI's layers.
        temperature: AIFI's position temperature.
        activation: CCFM's activation (``silu``).
        hidden_expansion: the CSP blocks' width factor.
        epsilon: CCFM's BatchNorm epsilon (``batch_norm_eps``; the input projections keep
            1e-5, as transformers' do).
        **kwargs: base layer arguments.

    Call arguments:
        features: a list of ``num_levels`` ``(B, h_i, w_i, C_i)`` maps, finest first (each
            level half the size of the one before; sizes that are not multiples of the
            coarsest stride work: an upsampled map is cropped to the finer one).
        training: BatchNorm statistics and dropout.

    Returns:
        A list of ``num_levels`` ``(B, h_i, w_i, hidden_dim)`` maps, finest first.
    """

    def __init__(self, hidden_dim: int = 256, num_levels: int = 3,
                 encode_proj_layers: Sequence[int] = (2,), num_layers: int = 1,
                 num_heads: int = 8, ffn_dim: int = 1024, dropout: float = 0.0,
                 activation_dropout: float = 0.0, encoder_activation: str = "gelu",
                 layer_norm_epsilon: float = 1e-5,
                 temperature: float = 10000.0, activation: str = "silu",
                 hidden_expansion: float = 1.0, epsilon: float = 1e-5, **kwargs):
        super().__init__(**kwargs)
        if any(not 0 <= i < num_levels for i in encode_proj_layers):
            raise ValueError(f"`encode_proj_layers` must be levels in [0, {num_levels}). "
                             f"Received: {list(encode_proj_layers)}")
        self.hidden_dim, self.num_levels = hidden_dim, num_levels
        self.encode_proj_layers, self.num_layers = tuple(encode_proj_layers), num_layers
        self.num_heads, self.ffn_dim, self.dropout = num_heads, ffn_dim, dropout
        self.activation_dropout = activation_dropout
        self.encoder_activation, self.layer_norm_epsilon = encoder_activation, layer_norm_epsilon
        self.temperature, self.activation = temperature, activation
        self.hidden_expansion, self.epsilon = hidden_expansion, epsilon
        d, policy = hidden_dim, self.dtype_policy
        self.input_proj = [ConvNorm(d, 1, dtype=policy, name=f"input_proj_{i}")
                           for i in range(num_levels)]
        self.aifi = [TransformerEncoder(num_layers, num_heads, ffn_dim, dropout=dropout,
                                        activation_dropout=activation_dropout,
                                        activation=encoder_activation,
                                        layer_norm_epsilon=layer_norm_epsilon, final_norm=False,
                                        dtype=policy, name=f"aifi_{i}")
                     for i in range(len(self.encode_proj_layers))] if num_layers else []
        self.lateral_convs = [self._lateral(f"lateral_convs_{i}") for i in range(num_levels - 1)]
        self.fpn_blocks = [self._fusion_block(f"fpn_blocks_{i}") for i in range(num_levels - 1)]
        self.downsample_convs = [self._downsample(f"downsample_convs_{i}")
                                 for i in range(num_levels - 1)]
        self.pan_blocks = [self._fusion_block(f"pan_blocks_{i}") for i in range(num_levels - 1)]

    def _lateral(self, name: str) -> keras.layers.Layer:
        """The FPN's 1x1 convolution of a coarser level before it is upsampled."""
        return ConvNorm(self.hidden_dim, 1, activation=self.activation, epsilon=self.epsilon,
                        dtype=self.dtype_policy, name=name)

    def _fusion_block(self, name: str) -> keras.layers.Layer:
        """The block fusing two concatenated levels (``2 * hidden_dim`` -> ``hidden_dim``)."""
        return CSPRepLayer(self.hidden_dim, hidden_expansion=self.hidden_expansion,
                           activation=self.activation, epsilon=self.epsilon,
                           dtype=self.dtype_policy, name=name)

    def _downsample(self, name: str) -> keras.layers.Layer:
        """The PAN's stride-2 downsampling of a level."""
        return ConvNorm(self.hidden_dim, 3, 2, activation=self.activation, epsilon=self.epsilon,
                        dtype=self.dtype_policy, name=name)

    def build(self, features_shape):
        d = self.hidden_dim
        for proj, shape in zip(self.input_proj, features_shape):
            proj.build(shape)
        for aifi in self.aifi:
            aifi.build((None, None, d))
        level, fused = (None, None, None, d), (None, None, None, 2 * d)
        for layer in (*self.lateral_convs, *self.downsample_convs):
            layer.build(level)
        for block in (*self.fpn_blocks, *self.pan_blocks):
            block.build(fused)

    def call(self, features, training=None):
        maps = [proj(x, training=training) for proj, x in zip(self.input_proj, features)]
        for aifi, level in zip(self.aifi, self.encode_proj_layers):
            maps[level] = self._attend(aifi, maps[level], training)
        # Top-down FPN: coarsest first; each lateral output replaces the map it came from.
        fpn = [maps[-1]]
        for i, (lateral, block) in enumerate(zip(self.lateral_convs, self.fpn_blocks)):
            finer = maps[self.num_levels - 2 - i]
            fpn[-1] = lateral(fpn[-1], training=training)
            up = ops.repeat(ops.repeat(fpn[-1], 2, axis=1), 2, axis=2)  # nearest, 2x
            size = ops.shape(finer)
            up = up[:, :size[1], :size[2]]  # the finer map's size (the same at multiples of 32)
            fpn.append(block(ops.concatenate([up, finer], axis=-1), training=training))
        fpn.reverse()  # finest first
        # Bottom-up PAN.
        pan = [fpn[0]]
        for i, (down, block) in enumerate(zip(self.downsample_convs, self.pan_blocks)):
            lowered = down(pan[-1], training=training)
            pan.append(block(ops.concatenate([lowered, fpn[i + 1]], axis=-1),
                             training=training))
        return pan

    def _attend(self, aifi, x, training):
        shape = ops.shape(x)
        tokens = ops.reshape(x, (shape[0], -1, self.hidden_dim))  # (B, h * w, d), row-major
        pos = sincos_positions_2d(shape[1], shape[2], self.hidden_dim, self.temperature)
        tokens = aifi(tokens, pos=ops.cast(pos[None], tokens.dtype), training=training)
        return ops.reshape(tokens, shape)

    def compute_output_shape(self, features_shape):
        return [(*shape[:-1], self.hidden_dim) for shape in features_shape]

    def get_config(self):
        config = super().get_config()
        config.update(hidden_dim=self.hidden_dim, num_levels=self.num_levels,
                      encode_proj_layers=list(self.encode_proj_layers),
                      num_layers=self.num_layers, num_heads=self.num_heads,
                      ffn_dim=self.ffn_dim, dropout=self.dropout,
                      activation_dropout=self.activation_dropout,
                      encoder_activation=self.encoder_activation,
                      layer_norm_epsilon=self.layer_norm_epsilon, temperature=self.temperature,
                      activation=self.activation, hidden_expansion=self.hidden_expansion,
                      epsilon=self.epsilon)
        return config
