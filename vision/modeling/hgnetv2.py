"""D-FINE's HGNetV2 backbone (``HGNetV2Backbone`` of transformers, ``HGNetv2`` of
Peterande/D-FINE), without its classifier.

As transformers' ``modeling_hgnet_v2.py`` computes it:

- the stem: ``stem1`` (3x3, stride ``stem_strides[0]``, ``stem_channels[0] ->
  stem_channels[1]``); its output padded by one zero row and column after the image
  (``F.pad(x, (0, 1, 0, 1))``) feeds two branches: ``stem2a`` (2x2, to half the channels),
  padded the same way again, then ``stem2b`` (2x2, back to ``stem_channels[1]``); and a 2x2
  max-pool of stride 1 (``ceil_mode`` adds no window at stride 1: the zero padding is what the
  windows of the last row and column see). Both keep stem1's size; they are concatenated
  (pool first), then ``stem3`` (3x3, stride ``stem_strides[3]``, to ``stem_channels[1]``) and
  ``stem4`` (1x1, to ``stem_channels[2]``). The stem's convolutions use ``hidden_act``;
- per stage: a depthwise 3x3 convolution of stride ``stage_downsample_strides[i]`` (BatchNorm,
  no activation) where ``stage_downsample[i]``, then ``stage_num_blocks[i]`` blocks. A block
  runs ``stage_numb_of_layers[i]`` convolutions in a chain (``kxk`` with ``k =
  stage_kernel_size[i]``, to ``stage_mid_channels[i]``; a light block's is a 1x1 convolution
  without activation followed by a depthwise ``kxk``), concatenates its input with every
  output of the chain, and aggregates them by two 1x1 convolutions (to half of
  ``stage_out_channels[i]``, then to all of it). Every block after the first adds its input
  (the drop path before that sum is ``nn.Identity`` in transformers: its rate is never set);
- every convolution of the stages is followed by a ReLU, whatever ``hidden_act`` says, except
  the downsampling and the light blocks' 1x1 convolutions, which have none; with
  ``use_learnable_affine_block`` every convolution with an activation is followed by a
  learnable affine map ``scale * x + bias`` (one scalar each: ``lab``).

Every convolution pads as PyTorch does (``(kernel - 1) // 2`` on both sides: none for the
stem's 2x2), has no bias and is followed by a BatchNorm that is frozen (epsilon 1e-5:
``nn.BatchNorm2d``'s default, and ``DFineFrozenBatchNorm2d``'s, which D-FINE puts in its place):
a Keras ``BatchNormalization`` that is not trainable and always runs in inference mode. Each
layer is named after its transformers module (``encoder.stages.2.blocks.1.layers.0.conv2.
convolution`` -> ``stages_2_blocks_1_layers_0_conv2_convolution``); see `transformers_arrays`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import keras
from keras import ops

__all__ = ["HGNetV2Backbone", "transformers_arrays"]

_BN_WEIGHTS = {"weight": "gamma", "bias": "beta", "running_mean": "moving_mean",
               "running_var": "moving_variance"}
_STAGE_FIELDS = ("stage_in_channels", "stage_mid_channels", "stage_out_channels",
                 "stage_num_blocks", "stage_downsample", "stage_downsample_strides",
                 "stage_light_block", "stage_kernel_size", "stage_numb_of_layers")


class _Affine(keras.layers.Layer):
    """``HGNetV2LearnableAffineBlock``: ``scale * x + bias``, one scalar each."""

    def build(self, input_shape):
        self.scale = self.add_weight(shape=(1,), initializer="ones", name="scale")
        self.bias = self.add_weight(shape=(1,), initializer="zeros", name="bias")

    def call(self, x):
        return self.scale * x + self.bias


@keras.saving.register_keras_serializable(package="vision")
class HGNetV2Backbone(keras.layers.Layer):
    """HGNetV2: a stem of two branches, then stages of blocks that aggregate the outputs of a
    chain of convolutions; returns several stages.

    Args:
        stem_channels: ``(input channels, stem1's, the stem's output)`` (D-FINE L:
            ``(3, 32, 48)``).
        stem_strides: strides of stem1, stem2a, stem2b, stem3, stem4 (``(2, 1, 1, 2, 1)``;
            stem2a's and stem2b's must be 1: their branch is concatenated with stem1's size).
        stage_in_channels, stage_mid_channels, stage_out_channels: per stage, the input
            channels (the previous stage's output), the chain's and the output's.
        stage_num_blocks: blocks per stage.
        stage_downsample: whether a stage starts with the depthwise strided convolution.
        stage_downsample_strides: its stride, per stage.
        stage_light_block: whether a stage's blocks are light (1x1, then depthwise ``kxk``).
        stage_kernel_size: ``k`` of a stage's chain.
        stage_numb_of_layers: convolutions in the chain of each of a stage's blocks.
        use_learnable_affine_block: the ``scale * x + bias`` after each activation.
        hidden_act: the stem's activation (Keras name: ``"relu"``).
        out_indices: which outputs to return: 0 is the stem's, ``i`` the stage ``i``'s
            (D-FINE: ``(2, 3, 4)``, strides 8, 16, 32; the nano model ``(3, 4)``).
        **kwargs: base layer arguments.

    Call arguments:
        images: ``(B, H, W, C)`` float, normalized as the checkpoint was trained.

    Returns:
        A list with one ``(B, h_i, w_i, channels_i)`` feature map per ``out_indices``.
    """

    def __init__(self, stem_channels: Sequence[int] = (3, 32, 48),
                 stem_strides: Sequence[int] = (2, 1, 1, 2, 1),
                 stage_in_channels: Sequence[int] = (48, 128, 512, 1024),
                 stage_mid_channels: Sequence[int] = (48, 96, 192, 384),
                 stage_out_channels: Sequence[int] = (128, 512, 1024, 2048),
                 stage_num_blocks: Sequence[int] = (1, 1, 3, 1),
                 stage_downsample: Sequence[bool] = (False, True, True, True),
                 stage_downsample_strides: Sequence[int] = (2, 2, 2, 2),
                 stage_light_block: Sequence[bool] = (False, False, True, True),
                 stage_kernel_size: Sequence[int] = (3, 3, 5, 5),
                 stage_numb_of_layers: Sequence[int] = (6, 6, 6, 6),
                 use_learnable_affine_block: bool = False, hidden_act: str = "relu",
                 out_indices: Sequence[int] = (2, 3, 4), **kwargs):
        super().__init__(**kwargs)
        stages = dict(zip(_STAGE_FIELDS, (
            stage_in_channels, stage_mid_channels, stage_out_channels, stage_num_blocks,
            stage_downsample, stage_downsample_strides, stage_light_block, stage_kernel_size,
            stage_numb_of_layers)))
        lengths = {name: len(value) for name, value in stages.items()}
        if len(set(lengths.values())) != 1 or not stage_in_channels:
            raise ValueError(f"The `stage_*` arguments must have one entry per stage. "
                             f"Received lengths: {lengths}")
        if len(stem_channels) != 3 or len(stem_strides) != 5 or list(stem_strides[1:3]) != [1, 1]:
            raise ValueError(f"`stem_channels` must have 3 entries and `stem_strides` 5, the "
                             f"second and third 1. Received: stem_channels="
                             f"{list(stem_channels)}, stem_strides={list(stem_strides)}")
        expected = [stem_channels[2], *stage_out_channels[:-1]]
        if list(stage_in_channels) != expected:
            raise ValueError(f"`stage_in_channels` must be the stem's and each previous "
                             f"stage's output channels, {expected}. Received: "
                             f"{list(stage_in_channels)}")
        if any(size % 2 == 0 for size in stage_kernel_size):
            raise ValueError(f"`stage_kernel_size` must hold odd sizes. Received: "
                             f"{list(stage_kernel_size)}")
        if not out_indices or any(not 0 <= i <= len(stage_in_channels) for i in out_indices):
            raise ValueError(f"`out_indices` must be in [0, {len(stage_in_channels)}]. "
                             f"Received: {list(out_indices)}")
        self.stem_channels, self.stem_strides = tuple(stem_channels), tuple(stem_strides)
        for name, value in stages.items():
            setattr(self, name, tuple(value))
        self.use_learnable_affine_block = bool(use_learnable_affine_block)
        self.hidden_act, self.out_indices = hidden_act, tuple(out_indices)
        self._units = []  # (conv, norm, activation, affine, in, out channels), for build
        c_in, mid, c_out = stem_channels
        self.stem = {name: self._unit(f"embedder_{name}", cin, filters, size, stride,
                                      activation=hidden_act)
                     for name, cin, filters, size, stride in (
                         ("stem1", c_in, mid, 3, stem_strides[0]),
                         ("stem2a", mid, mid // 2, 2, stem_strides[1]),
                         ("stem2b", mid // 2, mid, 2, stem_strides[2]),
                         ("stem3", 2 * mid, mid, 3, stem_strides[3]),
                         ("stem4", mid, c_out, 1, stem_strides[4]))}
        self.stages = [self._stage(s) for s in range(len(stage_in_channels))]

    # --- construction --------------------------------------------------------------------------

    def _unit(self, name: str, in_channels: int, filters: int, size: int, stride: int = 1,
              depthwise: bool = False, activation: str | None = "relu") -> tuple:
        """``HGNetV2ConvLayer``: convolution, frozen BatchNorm, activation (or None) and,
        with an activation and ``use_learnable_affine_block``, the affine map."""
        init = keras.initializers.VarianceScaling(2.0, "fan_out", "untruncated_normal")
        common = dict(strides=stride, padding="valid", use_bias=False,
                      dtype=self.dtype_policy, name=f"{name}_convolution")
        conv = (keras.layers.DepthwiseConv2D(size, depthwise_initializer=init, **common)
                if depthwise else
                keras.layers.Conv2D(filters, size, kernel_initializer=init, **common))
        norm = keras.layers.BatchNormalization(epsilon=1e-5, dtype=self.dtype_policy,
                                               name=f"{name}_normalization")
        norm.trainable = False  # frozen: D-FINE's DFineFrozenBatchNorm2d
        affine = (_Affine(dtype=self.dtype_policy, name=f"{name}_lab")
                  if activation and self.use_learnable_affine_block else None)
        unit = (conv, norm, activation, affine, in_channels, filters)
        self._units.append(unit)
        return unit

    def _stage(self, s: int) -> tuple:
        """``HGNetV2Stage``: the downsampling unit or None, and per block ``(chain, where each
        link is a list of units, the two aggregation units, residual?)``."""
        in_channels, mid, out = (self.stage_in_channels[s], self.stage_mid_channels[s],
                                 self.stage_out_channels[s])
        size, light = self.stage_kernel_size[s], self.stage_light_block[s]
        downsample = (self._unit(f"stages_{s}_downsample", in_channels, in_channels, 3,
                                 self.stage_downsample_strides[s], depthwise=True,
                                 activation=None)
                      if self.stage_downsample[s] else None)
        blocks = []
        for b in range(self.stage_num_blocks[s]):
            name, block_in = f"stages_{s}_blocks_{b}", in_channels if b == 0 else out
            chain = []
            for j in range(self.stage_numb_of_layers[s]):
                link, c = f"{name}_layers_{j}", block_in if j == 0 else mid
                chain.append([self._unit(f"{link}_conv1", c, mid, 1, activation=None),
                              self._unit(f"{link}_conv2", mid, mid, size, depthwise=True)]
                             if light else [self._unit(link, c, mid, size)])
            total = block_in + self.stage_numb_of_layers[s] * mid
            aggregation = [self._unit(f"{name}_aggregation_0", total, out // 2, 1),
                           self._unit(f"{name}_aggregation_1", out // 2, out, 1)]
            blocks.append((chain, aggregation, b > 0))
        return downsample, blocks

    @property
    def output_channels(self) -> tuple[int, ...]:
        """Channels of each returned feature map."""
        sizes = (self.stem_channels[2], *self.stage_out_channels)
        return tuple(sizes[i] for i in self.out_indices)

    @property
    def strides(self) -> tuple[int, ...]:
        """Stride of each returned feature map (the stem's is 4 with the default strides)."""
        stem1, _, _, stem3, stem4 = self.stem_strides
        strides = [stem1 * stem3 * stem4]
        for down, stride in zip(self.stage_downsample, self.stage_downsample_strides):
            strides.append(strides[-1] * (stride if down else 1))
        return tuple(strides[i] for i in self.out_indices)

    def build(self, images_shape):
        if images_shape[-1] is not None and images_shape[-1] != self.stem_channels[0]:
            raise ValueError(f"The images must have stem_channels[0] = "
                             f"{self.stem_channels[0]} channels. Received: {images_shape}")
        for conv, norm, _, affine, in_channels, filters in self._units:
            conv.build((None, None, None, in_channels))
            norm.build((None, None, None, filters))
            if affine is not None:
                affine.build((None, None, None, filters))
        self.built = True

    # --- forward ---------------------------------------------------------------------------------

    @staticmethod
    def _apply(unit, x):
        conv, norm, activation, affine, _, _ = unit
        pad = (conv.kernel_size[0] - 1) // 2  # none for 1x1 and 2x2
        x = norm(conv(_pad(x, pad) if pad else x), training=False)
        if activation:
            x = keras.activations.get(activation)(x)
        return x if affine is None else affine(x)

    def call(self, images, training=None):
        del training  # frozen BatchNorm: always inference mode
        stem = self.stem
        x = _pad_after(self._apply(stem["stem1"], images))
        branch = self._apply(stem["stem2b"], _pad_after(self._apply(stem["stem2a"], x)))
        # The zeros added after the image are part of the pooled windows, as in transformers.
        pooled = ops.max_pool(x, 2, strides=1, padding="valid")
        x = ops.concatenate([pooled, branch], axis=-1)
        x = self._apply(stem["stem4"], self._apply(stem["stem3"], x))
        outputs = [x]
        for downsample, blocks in self.stages:
            if downsample is not None:
                x = self._apply(downsample, x)
            for chain, aggregation, residual in blocks:
                features, y = [x], x
                for link in chain:
                    for unit in link:
                        y = self._apply(unit, y)
                    features.append(y)
                y = ops.concatenate(features, axis=-1)
                for unit in aggregation:
                    y = self._apply(unit, y)
                x = y + x if residual else y
            outputs.append(x)
        return [outputs[i] for i in self.out_indices]

    def compute_output_shape(self, images_shape):
        def down(n, stride):
            return None if n is None else -(-n // stride)

        return [(images_shape[0], down(images_shape[1], s), down(images_shape[2], s), c)
                for s, c in zip(self.strides, self.output_channels)]

    def get_config(self):
        config = super().get_config()
        config.update({name: list(getattr(self, name)) for name in _STAGE_FIELDS})
        config.update(stem_channels=list(self.stem_channels),
                      stem_strides=list(self.stem_strides),
                      use_learnable_affine_block=self.use_learnable_affine_block,
                      hidden_act=self.hidden_act, out_indices=list(self.out_indices))
        return config


def transformers_arrays(state: Mapping, prefix: str = ""):
    """Yields ``(Keras path inside the backbone, array)`` for each weight of a transformers
    ``HGNetV2Backbone`` under ``prefix`` (``model.backbone.model.`` in a
    ``DFineForObjectDetection``): ``embedder.stem1.convolution.weight`` ->
    ``embedder_stem1_convolution/kernel`` (transposed to ``(kh, kw, in, out)``; a depthwise
    convolution's, ``downsample`` and ``conv2``, to ``(kh, kw, channels, 1)``),
    ``encoder.stages.1.blocks.0.aggregation.0.normalization.running_var`` ->
    ``stages_1_blocks_0_aggregation_0_normalization/moving_variance``,
    ``embedder.stem1.lab.scale`` -> ``embedder_stem1_lab/scale``. ``num_batches_tracked`` is
    skipped."""
    for name, array in state.items():
        if not name.startswith(prefix) or name.endswith("num_batches_tracked"):
            continue
        layer, param = name[len(prefix):].rsplit(".", 1)
        layer = layer.replace("encoder.stages.", "stages.").replace(".", "_")
        if layer.endswith("_downsample_convolution") or layer.endswith("_conv2_convolution"):
            yield f"{layer}/kernel", array.transpose(2, 3, 0, 1)
        elif layer.endswith("_convolution"):
            yield f"{layer}/kernel", array.transpose(2, 3, 1, 0)
        elif layer.endswith("_normalization"):
            yield f"{layer}/{_BN_WEIGHTS.get(param, param)}", array
        else:  # the affine map: scale, bias
            yield f"{layer}/{param}", array


def _pad(x, size: int):
    """PyTorch's symmetric zero padding of ``size`` pixels on each side of H and W."""
    return ops.pad(x, [[0, 0], [size, size], [size, size], [0, 0]])


def _pad_after(x):
    """``F.pad(x, (0, 1, 0, 1))``: one zero row below and one zero column to the right."""
    return ops.pad(x, [[0, 0], [0, 1], [0, 1], [0, 0]])
