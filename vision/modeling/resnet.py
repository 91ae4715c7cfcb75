"""ResNet-50 and -101 in torchvision's layout (v1.5), the backbone of every DETR checkpoint.

torchvision's ResNet (``torchvision.models.resnet``) puts a bottleneck's stride in its 3x3
convolution (v1.5; Keras's ``keras.applications.ResNet50`` is v1, the stride in the first 1x1),
pads every convolution and the max-pool symmetrically (PyTorch's ``padding=k // 2``), and DETR
replaces each BatchNorm with a frozen one (``FrozenBatchNorm2d``, eps 1e-5). Here each layer is
named after its torchvision parameter (``layer2.0.conv2.weight`` -> ``layer2_0_conv2/kernel``),
so that `ResNetBackbone.load_torchvision` takes a torchvision-layout state dict as it is.
"""

from __future__ import annotations

from collections.abc import Mapping

import keras
import numpy as np
from keras import ops

__all__ = ["DEPTHS", "ResNetBackbone"]

#: Bottleneck blocks of each stage, by depth.
DEPTHS = {50: (3, 4, 6, 3), 101: (3, 4, 23, 3)}

_BN_WEIGHTS = {"weight": "gamma", "bias": "beta", "running_mean": "moving_mean",
               "running_var": "moving_variance"}


@keras.saving.register_keras_serializable(package="vision")
class ResNetBackbone(keras.layers.Layer):
    """torchvision's ResNet-50/101 (v1.5) without its head, as DETR uses it.

    Every BatchNorm is frozen (not trainable, always in inference mode, epsilon 1e-5 as DETR's
    ``FrozenBatchNorm2d``) and the stem and ``layer1`` are not trained, as in DETR
    (``train_backbone``: only ``layer2``-``layer4`` get gradients). Output stride 32, 2048
    channels: ``ceil(H / 32)`` rows, as PyTorch's padded convolutions give. The padding mask
    is not used: as in DETR, padded pixels (zeros after normalization) reach the features at
    the border of each image.

    Args:
        depth: 50 or 101.
        **kwargs: base layer arguments.

    Call arguments:
        images: ``(B, H, W, 3)`` float, ImageNet mean/std normalized RGB.
        valid: ignored; accepted so that every backbone has the same call signature.

    Returns:
        ``(B, ceil(H / 32), ceil(W / 32), 2048)``.
    """

    stride = 32
    output_channels = 2048

    def __init__(self, depth: int = 50, **kwargs):
        super().__init__(**kwargs)
        if depth not in DEPTHS:
            raise ValueError(f"`depth` must be one of {tuple(DEPTHS)}. Received: {depth!r}")
        self.depth = depth
        self.conv1, self.bn1 = self._conv("conv1", 64, 7, 2), self._norm("bn1")
        self.blocks = []  # per block: (convs, norms, downsample conv | None, its norm | None)
        for stage, count in enumerate(DEPTHS[depth]):
            width = 64 * 2**stage
            for i in range(count):
                prefix = f"layer{stage + 1}_{i}"
                stride = 2 if i == 0 and stage > 0 else 1
                convs = [self._conv(f"{prefix}_conv1", width, 1, 1),
                         self._conv(f"{prefix}_conv2", width, 3, stride),
                         self._conv(f"{prefix}_conv3", 4 * width, 1, 1)]
                norms = [self._norm(f"{prefix}_bn{j}") for j in (1, 2, 3)]
                down = (self._conv(f"{prefix}_downsample_0", 4 * width, 1, stride),
                        self._norm(f"{prefix}_downsample_1")) if i == 0 else (None, None)
                self.blocks.append((convs, norms, *down))
        for layer in self._layers_in_order():
            if layer.name.startswith(("conv1", "bn1", "layer1_")) or "bn" in layer.name \
                    or "downsample_1" in layer.name:
                layer.trainable = False

    def _conv(self, name: str, filters: int, size: int, stride: int) -> keras.layers.Conv2D:
        return keras.layers.Conv2D(filters, size, strides=stride, padding="valid",
                                   use_bias=False, dtype=self.dtype_policy, name=name)

    def _norm(self, name: str) -> keras.layers.BatchNormalization:
        return keras.layers.BatchNormalization(epsilon=1e-5, dtype=self.dtype_policy, name=name)

    def _layers_in_order(self) -> list:
        layers = [self.conv1, self.bn1]
        for convs, norms, down, down_norm in self.blocks:
            for conv, norm in zip(convs, norms):
                layers += [conv, norm]
            if down is not None:
                layers += [down, down_norm]
        return layers

    def build(self, images_shape, valid_shape=None):
        channels = images_shape[-1]
        self.conv1.build((None, None, None, channels))
        self.bn1.build((None, None, None, 64))
        channels = 64
        for convs, norms, down, down_norm in self.blocks:
            block_in = channels
            for conv, norm in zip(convs, norms):
                conv.build((None, None, None, channels))
                norm.build((None, None, None, conv.filters))
                channels = conv.filters
            if down is not None:
                down.build((None, None, None, block_in))
                down_norm.build((None, None, None, down.filters))
        self.built = True

    def call(self, images, valid=None, training=None):
        del valid, training  # frozen BatchNorm: always inference mode
        x = ops.relu(self.bn1(self.conv1(_pad(images, 3)), training=False))
        x = ops.max_pool(_pad(x, 1), 3, strides=2, padding="valid")  # x >= 0: zero pad = -inf
        for convs, norms, down, down_norm in self.blocks:
            shortcut = x
            for j, (conv, norm) in enumerate(zip(convs, norms)):
                x = norm(conv(_pad(x, 1) if j == 1 else x), training=False)
                if j < 2:
                    x = ops.relu(x)
            if down is not None:
                shortcut = down_norm(down(shortcut), training=False)
            x = ops.relu(x + shortcut)
        return x

    def compute_output_shape(self, images_shape, valid_shape=None):
        def down(n):
            return None if n is None else -(-n // self.stride)

        return (images_shape[0], down(images_shape[1]), down(images_shape[2]),
                self.output_channels)

    def get_config(self):
        config = super().get_config()
        config.update(depth=self.depth)
        return config

    # --- torchvision weights -----------------------------------------------------------------

    def load_torchvision(self, state: Mapping[str, np.ndarray], where: str = "weights") -> None:
        """Sets every weight from a torchvision-layout state dict (``conv1.weight``,
        ``layer1.0.bn1.running_mean``, ...; ``fc.*`` and ``num_batches_tracked`` are ignored).

        Raises:
            ValueError: a weight is missing or has another shape; the message names it and
                ``where``.
        """
        arrays = dict(torchvision_arrays(state))
        for variable in self.weights:
            path = variable.path.split(f"{self.name}/", 1)[-1]
            if path not in arrays:
                raise ValueError(f"{where}: it has no weight for {path!r}; a torchvision "
                                 f"ResNet-{self.depth} state dict has one")
            if arrays[path].shape != tuple(variable.shape):
                raise ValueError(f"{where}: {path!r} is {arrays[path].shape} there, "
                                 f"{tuple(variable.shape)} here")
            variable.assign(arrays[path])


def torchvision_arrays(state: Mapping[str, np.ndarray]):
    """Yields ``(Keras path inside the backbone, array)`` for every weight of a torchvision
    ResNet state dict (``layer2.0.conv2.weight`` -> ``layer2_0_conv2/kernel``, transposed to
    ``(kh, kw, in, out)``; BatchNorm ``weight``/``bias``/``running_mean``/``running_var`` ->
    ``gamma``/``beta``/``moving_mean``/``moving_variance``); ``fc.*`` and
    ``num_batches_tracked`` are skipped."""
    for name, array in state.items():
        if name.startswith("fc.") or name.endswith("num_batches_tracked"):
            continue
        layer, param = name.rsplit(".", 1)
        array = np.asarray(array, dtype="float32")
        if "conv" in layer or layer.endswith("downsample.0"):
            yield f"{layer.replace('.', '_')}/kernel", array.transpose(2, 3, 1, 0)
        else:
            yield f"{layer.replace('.', '_')}/{_BN_WEIGHTS.get(param, param)}", array


def _pad(x, size: int):
    return ops.pad(x, [[0, 0], [size, size], [size, size], [0, 0]])
