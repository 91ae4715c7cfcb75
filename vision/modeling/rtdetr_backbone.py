"""RT-DETR's ResNet-vd backbone (``RTDetrResNetBackbone`` of transformers, ``PResNet`` of
lyuwenyu/RT-DETR), without its classifier.

What makes it "vd" (Bag of Tricks for Image Classification, He et al. 2019, ResNet-D), as
transformers' ``modeling_rt_detr_resnet.py`` computes it:

- a deep stem: three 3x3 convolutions (stride 2, 1, 1; ``embedding_size / 2``,
  ``embedding_size / 2``, ``embedding_size`` channels), each with BatchNorm and the activation,
  then a 3x3 max-pool of stride 2 (padding 1);
- a shortcut that downsamples by a 2x2 average pool (stride 2, ``ceil_mode``: a window cut by
  the border averages the pixels it holds) before its 1x1 convolution of stride 1, instead of
  a 1x1 convolution of stride 2 that drops three pixels in four;
- bottleneck blocks (R50/R101) put the stride in the 3x3 convolution (or, with
  ``downsample_in_bottleneck``, in the first 1x1); basic blocks (R18/R34) have two 3x3
  convolutions, and the first block of every stage has a shortcut convolution, even where
  the channels do not change.

Every convolution pads as PyTorch does (``kernel // 2`` on both sides), has no bias and is
followed by a BatchNorm that is frozen (``RTDetrFrozenBatchNorm2d``: the running statistics,
epsilon 1e-5): a Keras ``BatchNormalization`` that is not trainable and always runs in
inference mode. Each layer is named after its transformers module (``encoder.stages.1.
layers.0.shortcut.1.convolution`` -> ``stages_1_layers_0_shortcut_convolution``); see
`transformers_arrays`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import keras
from keras import ops

__all__ = ["RTDetrResNetBackbone", "transformers_arrays"]

_BN_WEIGHTS = {"weight": "gamma", "bias": "beta", "running_mean": "moving_mean",
               "running_var": "moving_variance"}
_LAYER_TYPES = ("basic", "bottleneck")


@keras.saving.register_keras_serializable(package="vision")
class RTDetrResNetBackbone(keras.layers.Layer):
    """ResNet-vd with a deep stem and average-pool shortcuts, returning several stages.

    Args:
        depths: blocks per stage (R50: ``(3, 4, 6, 3)``, R18: ``(2, 2, 2, 2)``).
        hidden_sizes: output channels of each stage (R50: ``(256, 512, 1024, 2048)``).
        embedding_size: channels of the stem.
        layer_type: ``"bottleneck"`` or ``"basic"``.
        activation: the activation after each convolution (``"relu"``).
        downsample_in_bottleneck: a bottleneck's stride in its first 1x1 convolution.
        downsample_in_first_stage: the first stage has stride 2 too.
        out_indices: which outputs to return: 0 is the stem's, ``i`` the stage ``i``'s
            (RT-DETR: ``(2, 3, 4)``, strides 8, 16, 32).
        **kwargs: base layer arguments.

    Call arguments:
        images: ``(B, H, W, C)`` float, normalized as the checkpoint was trained.

    Returns:
        A list with one ``(B, h_i, w_i, channels_i)`` feature map per ``out_indices``.
    """

    def __init__(self, depths: Sequence[int] = (3, 4, 6, 3),
                 hidden_sizes: Sequence[int] = (256, 512, 1024, 2048),
                 embedding_size: int = 64, layer_type: str = "bottleneck",
                 activation: str = "relu", downsample_in_bottleneck: bool = False,
                 downsample_in_first_stage: bool = False,
                 out_indices: Sequence[int] = (2, 3, 4), **kwargs):
        super().__init__(**kwargs)
        if layer_type not in _LAYER_TYPES:
            raise ValueError(f"`layer_type` must be one of {_LAYER_TYPES}. "
                             f"Received: {layer_type!r}")
        if len(depths) != len(hidden_sizes):
            raise ValueError(f"`depths` and `hidden_sizes` must have one entry per stage. "
                             f"Received: depths={list(depths)}, hidden_sizes={list(hidden_sizes)}")
        if not out_indices or any(not 0 <= i <= len(depths) for i in out_indices):
            raise ValueError(f"`out_indices` must be in [0, {len(depths)}]. "
                             f"Received: {list(out_indices)}")
        self.depths, self.hidden_sizes = tuple(depths), tuple(hidden_sizes)
        self.embedding_size, self.layer_type = embedding_size, layer_type
        self.activation = activation
        self.downsample_in_bottleneck = downsample_in_bottleneck
        self.downsample_in_first_stage = downsample_in_first_stage
        self.out_indices = tuple(out_indices)
        half = embedding_size // 2
        self.stem = [self._conv_norm(f"embedder_{i}", filters, 3, stride)
                     for i, (filters, stride) in enumerate(((half, 2), (half, 1),
                                                           (embedding_size, 1)))]
        self.stages = []  # per stage, per block: (convs, shortcut convs or None, avg-pool?)
        in_channels = embedding_size
        for s, (depth, out_channels) in enumerate(zip(depths, hidden_sizes)):
            stride = 2 if s > 0 or downsample_in_first_stage else 1
            blocks = []
            for b in range(depth):
                blocks.append(self._block(f"stages_{s}_layers_{b}", in_channels, out_channels,
                                          stride if b == 0 else 1, first=b == 0))
                in_channels = out_channels
            self.stages.append(blocks)

    # --- construction --------------------------------------------------------------------------

    def _conv_norm(self, name: str, filters: int, size: int, stride: int) -> tuple:
        conv = keras.layers.Conv2D(
            filters, size, strides=stride, padding="valid", use_bias=False,
            kernel_initializer=keras.initializers.VarianceScaling(2.0, "fan_out",
                                                                  "untruncated_normal"),
            dtype=self.dtype_policy, name=f"{name}_convolution")
        norm = keras.layers.BatchNormalization(epsilon=1e-5, dtype=self.dtype_policy,
                                               name=f"{name}_normalization")
        norm.trainable = False  # frozen: RTDetrFrozenBatchNorm2d
        return conv, norm

    def _block(self, name: str, in_channels: int, out_channels: int, stride: int,
               first: bool) -> tuple:
        """One block: its ``[(conv, norm, activation?)]``, its shortcut ``(conv, norm)`` or
        None (identity), and whether the shortcut starts with the 2x2 average pool."""
        if self.layer_type == "bottleneck":
            reduced, in_1x1 = out_channels // 4, self.downsample_in_bottleneck
            specs = [(reduced, 1, stride if in_1x1 else 1, True),
                     (reduced, 3, 1 if in_1x1 else stride, True),
                     (out_channels, 1, 1, False)]
            project = in_channels != out_channels or stride != 1
            pool = stride == 2
        else:
            specs = [(out_channels, 3, stride, True), (out_channels, 3, 1, False)]
            project = first
            pool = in_channels != out_channels and project
        convs = [(*self._conv_norm(f"{name}_layer_{j}", filters, size, s), act)
                 for j, (filters, size, s, act) in enumerate(specs)]
        shortcut_stride = 1 if pool or self.layer_type == "bottleneck" else stride
        shortcut = (self._conv_norm(f"{name}_shortcut", out_channels, 1, shortcut_stride)
                    if project else None)
        return convs, shortcut, pool

    @property
    def output_channels(self) -> tuple[int, ...]:
        """Channels of each returned feature map."""
        sizes = (self.embedding_size, *self.hidden_sizes)
        return tuple(sizes[i] for i in self.out_indices)

    @property
    def strides(self) -> tuple[int, ...]:
        """Stride of each returned feature map (the stem's is 4)."""
        first = 2 if self.downsample_in_first_stage else 1
        strides = [4] + [4 * first * 2**s for s in range(len(self.depths))]
        return tuple(strides[i] for i in self.out_indices)

    def build(self, images_shape):
        channels = images_shape[-1]
        for conv, norm in self.stem:
            conv.build((None, None, None, channels))
            norm.build((None, None, None, conv.filters))
            channels = conv.filters
        for blocks in self.stages:
            for convs, shortcut, _ in blocks:
                block_in = channels
                for conv, norm, _ in convs:
                    conv.build((None, None, None, channels))
                    norm.build((None, None, None, conv.filters))
                    channels = conv.filters
                if shortcut is not None:
                    shortcut[0].build((None, None, None, block_in))
                    shortcut[1].build((None, None, None, channels))
        self.built = True

    # --- forward ---------------------------------------------------------------------------------

    def _act(self, x):
        return keras.activations.get(self.activation)(x)

    def _apply(self, conv, norm, x):
        size = conv.kernel_size[0]
        return norm(conv(_pad(x, size // 2) if size > 1 else x), training=False)

    def call(self, images, training=None):
        del training  # frozen BatchNorm: always inference mode
        x = images
        for conv, norm in self.stem:
            x = self._act(self._apply(conv, norm, x))
        # PyTorch pads the max-pool with -inf; after a ReLU, zeros are the same.
        x = _pad(x, 1, 0.0 if self.activation == "relu" else float("-inf"))
        x = ops.max_pool(x, 3, strides=2, padding="valid")
        outputs = [x]
        for blocks in self.stages:
            for convs, shortcut, pool in blocks:
                residual = x
                for conv, norm, act in convs:
                    x = self._apply(conv, norm, x)
                    x = self._act(x) if act else x
                if pool:  # ceil_mode: TensorFlow's "same" pads after and averages real pixels
                    residual = ops.average_pool(residual, 2, strides=2, padding="same")
                if shortcut is not None:
                    residual = self._apply(*shortcut, residual)
                x = self._act(x + residual)
            outputs.append(x)
        return [outputs[i] for i in self.out_indices]

    def compute_output_shape(self, images_shape):
        def down(n, stride):
            return None if n is None else -(-n // stride)

        return [(images_shape[0], down(images_shape[1], s), down(images_shape[2], s), c)
                for s, c in zip(self.strides, self.output_channels)]

    def get_config(self):
        config = super().get_config()
        config.update(depths=list(self.depths), hidden_sizes=list(self.hidden_sizes),
                      embedding_size=self.embedding_size, layer_type=self.layer_type,
                      activation=self.activation,
                      downsample_in_bottleneck=self.downsample_in_bottleneck,
                      downsample_in_first_stage=self.downsample_in_first_stage,
                      out_indices=list(self.out_indices))
        return config


def transformers_arrays(state: Mapping, prefix: str = ""):
    """Yields ``(Keras path inside the backbone, array)`` for each weight of a transformers
    ``RTDetrResNetBackbone`` under ``prefix`` (``model.backbone.model.`` in an
    ``RTDetrForObjectDetection``): ``embedder.embedder.0.convolution.weight`` ->
    ``embedder_0_convolution/kernel`` (transposed to ``(kh, kw, in, out)``),
    ``encoder.stages.1.layers.0.shortcut.1.normalization.running_var`` ->
    ``stages_1_layers_0_shortcut_normalization/moving_variance``. ``num_batches_tracked`` is
    skipped."""
    for name, array in state.items():
        if not name.startswith(prefix) or name.endswith("num_batches_tracked"):
            continue
        layer, param = name[len(prefix):].rsplit(".", 1)
        layer = (layer.replace("embedder.embedder.", "embedder.").replace("encoder.stages.",
                                                                          "stages.")
                 .replace("shortcut.1.", "shortcut."))
        if layer.endswith("convolution"):
            yield f"{layer.replace('.', '_')}/kernel", array.transpose(2, 3, 1, 0)
        else:
            yield f"{layer.replace('.', '_')}/{_BN_WEIGHTS.get(param, param)}", array


def _pad(x, size: int, value: float = 0.0):
    """PyTorch's symmetric padding of ``size`` pixels on each side of H and W."""
    return ops.pad(x, [[0, 0], [size, size], [size, size], [0, 0]], constant_values=value)
