"""CNN backbones of the detector: ResNet-50/101 (DETR's, `vision.modeling.resnet`) and a small
CNN for CPU work.

Both take images normalized with the ImageNet mean and standard deviation (RGB, DETR's
convention) and return one feature map ``(B, ceil(H / stride), ceil(W / stride), C)``. Their
``trainable_variables`` are the "backbone" variables that DETR trains with a 10x smaller
learning rate.
"""

from __future__ import annotations

import keras
from keras import ops

from tfx_transformer import checks
from tfx_transformer.replicas import replica_sum
from vision.modeling.resnet import ResNetBackbone

__all__ = ["BACKBONES", "IMAGENET_MEAN", "IMAGENET_STD", "ResNetBackbone", "TinyBackbone",
           "ValidBatchNorm", "build_backbone"]

BACKBONES = ("resnet50", "resnet101", "tiny")  # the names `build_backbone` accepts
TINY_NORMS = ("batch", "layer")  # the normalizations of `TinyBackbone`

IMAGENET_MEAN = (0.485, 0.456, 0.406)  # RGB, of pixel values in [0, 1]
IMAGENET_STD = (0.229, 0.224, 0.225)


@keras.saving.register_keras_serializable(package="vision")
class TinyBackbone(keras.layers.Layer):
    """A small CNN: ``len(filters)`` blocks of 3x3 stride-2 conv, normalization, relu.

    Output stride ``2 ** len(filters)`` (16 by default). Padding never leaks: the input and
    every block's output are multiplied by the validity mask at that resolution (so
    convolutions see zeros in padded areas, exactly like the implicit zero padding at the
    border of an unpadded image), and each conv pads one pixel on every side explicitly (the
    output grid does not depend on the padded size). The normalization is a BatchNorm
    (``norm="batch"``: statistics over the valid pixels of the batch in training, PyTorch's
    momentum 0.1, the running statistics at inference) or a per-pixel LayerNorm over
    channels (``"layer"``: no batch statistics, so training and inference compute the same).

    Args:
        filters: channels of each block.
        norm: ``"batch"`` or ``"layer"``.
        **kwargs: base layer arguments.

    Call arguments:
        images: ``(B, H, W, 3)`` float.
        valid: ``(B, H, W)`` bool, ``True`` = valid pixel, or ``None`` (all valid).
        training: BatchNorm's mode.

    Returns:
        ``(B, ceil(H / s), ceil(W / s), filters[-1])`` with ``s = 2 ** len(filters)``; zero
        at padded positions.
    """

    def __init__(self, filters: tuple[int, ...] | list[int] = (32, 64, 128, 256),
                 norm: str = "batch", **kwargs):
        super().__init__(**kwargs)
        filters = checks.positive_ints("filters", tuple(filters))
        if norm not in TINY_NORMS:
            raise ValueError(f"`norm` must be one of {TINY_NORMS}. Received: norm={norm!r}")
        self.filters, self.norm = filters, norm
        self.stride = 2 ** len(filters)
        self.output_channels = filters[-1]

    def build(self, images_shape, valid_shape=None):
        self.convs, self.norms = [], []
        channels = images_shape[-1]
        for i, f in enumerate(self.filters):
            conv = keras.layers.Conv2D(
                f, 3, strides=2, padding="valid", use_bias=False, kernel_initializer="he_normal",
                dtype=self.dtype_policy, name=f"conv_{i}",
            )
            conv.build((None, None, None, channels))
            if self.norm == "batch":
                norm = ValidBatchNorm(dtype=self.dtype_policy, name=f"norm_{i}")
            else:
                norm = keras.layers.LayerNormalization(
                    epsilon=1e-5, dtype=self.dtype_policy, name=f"norm_{i}")
            norm.build((None, None, None, f))
            self.convs.append(conv)
            self.norms.append(norm)
            channels = f

    def call(self, images, valid=None, training=None):
        x = images
        if valid is not None:
            valid = ops.cast(valid, x.dtype)[..., None]  # (B, H, W, 1)
            x = x * valid
        for conv, norm in zip(self.convs, self.norms):
            x = conv(ops.pad(x, [[0, 0], [1, 1], [1, 1], [0, 0]]))  # (B, ceil(H/2), ceil(W/2), f)
            if valid is not None:
                valid = valid[:, ::2, ::2]  # the pixel at the centre of each conv window
            if self.norm == "batch":
                x = norm(x, valid, training=training)
            else:
                x = norm(x)
            x = ops.relu(x)
            if valid is not None:
                x = x * valid
        return x

    def compute_output_shape(self, images_shape, valid_shape=None):
        return _strided_shape(images_shape, self.stride, self.output_channels)

    def get_config(self):
        config = super().get_config()
        config.update(filters=list(self.filters), norm=self.norm)
        return config

    @classmethod
    def from_config(cls, config):
        # Models saved before `norm` existed have the LayerNorm backbone.
        return super().from_config({"norm": "layer", **config})


@keras.saving.register_keras_serializable(package="vision")
class ValidBatchNorm(keras.layers.Layer):
    """BatchNorm over the valid pixels of the whole global batch, PyTorch's ``BatchNorm2d`` step.

    In training the per-channel mean and (biased) variance are taken over the valid pixels
    only, summed over every replica of a `tf.distribute` strategy (one statistic for the
    global batch, as a single device computes it: synchronized BatchNorm); the running
    statistics move by ``momentum`` towards the batch mean and the unbiased batch variance.
    At inference the running statistics normalize. (Keras's `BatchNormalization` takes a mask
    too, but its masked statistics stay per replica.)

    Args:
        momentum: PyTorch's: ``running = (1 - momentum) * running + momentum * batch``.
        epsilon: added to the variance.
        **kwargs: base layer arguments.

    Call arguments:
        x: ``(B, H, W, C)``.
        valid: ``(B, H, W, 1)`` of 0/1 in ``x``'s dtype, or ``None`` (all valid).
        training: batch statistics (and a running-statistics update) when true.
    """

    def __init__(self, momentum: float = 0.1, epsilon: float = 1e-5, **kwargs):
        super().__init__(**kwargs)
        self.momentum, self.epsilon = float(momentum), float(epsilon)

    def build(self, x_shape, valid_shape=None):
        shape = (x_shape[-1],)
        add = self.add_weight
        self.gamma = add(shape=shape, initializer="ones", name="gamma", autocast=False)
        self.beta = add(shape=shape, initializer="zeros", name="beta", autocast=False)
        self.moving_mean = add(shape=shape, initializer="zeros", name="moving_mean",
                               trainable=False, autocast=False, aggregation="mean")
        self.moving_variance = add(shape=shape, initializer="ones", name="moving_variance",
                                   trainable=False, autocast=False, aggregation="mean")

    def call(self, x, valid=None, training=None):
        x32 = ops.cast(x, "float32")
        if training:
            if valid is None:
                weighted, count = x32, ops.cast(ops.prod(ops.shape(x32)[:3]), "float32")
            else:
                valid = ops.cast(valid, "float32")
                weighted, count = x32 * valid, ops.sum(valid)
            count, total, squares = replica_sum(
                [count, ops.sum(weighted, axis=(0, 1, 2)),
                 ops.sum(weighted * x32, axis=(0, 1, 2))])
            count = ops.maximum(count, 1.0)
            mean = total / count
            variance = ops.maximum(squares / count - ops.square(mean), 0.0)
            unbiased = variance * count / ops.maximum(count - 1.0, 1.0)
            m = self.momentum
            self.moving_mean.assign((1 - m) * self.moving_mean + m * ops.stop_gradient(mean))
            self.moving_variance.assign(
                (1 - m) * self.moving_variance + m * ops.stop_gradient(unbiased))
        else:
            mean, variance = self.moving_mean, self.moving_variance
        scale = self.gamma * ops.rsqrt(variance + self.epsilon)
        return ops.cast(x32 * scale + (self.beta - mean * scale), x.dtype)

    def compute_output_shape(self, x_shape, valid_shape=None):
        return x_shape

    def get_config(self):
        config = super().get_config()
        config.update(momentum=self.momentum, epsilon=self.epsilon)
        return config


def _strided_shape(images_shape, stride: int, channels: int) -> tuple:
    def down(n):
        return None if n is None else -(-n // stride)

    return (images_shape[0], down(images_shape[1]), down(images_shape[2]), channels)


def build_backbone(
    name: str, weights: str | None = None, **kwargs
) -> ResNetBackbone | TinyBackbone:
    """Builds a backbone by name.

    Args:
        name: ``"resnet50"``, ``"resnet101"`` or ``"tiny"``.
        weights: for a ResNet: a local torchvision-layout state dict (ImageNet weights as
            DETR starts from them: torchvision's ``resnet50-0676ba61.pth``, or the same
            names in a ``.safetensors`` file, which needs no torch), or ``None`` for random
            weights. Must be ``None`` for ``"tiny"``.
        **kwargs: layer arguments (``filters`` for ``"tiny"``).

    Returns:
        The built backbone layer; it has ``stride`` and ``output_channels`` attributes.
    """
    if name in ("resnet50", "resnet101"):
        backbone = ResNetBackbone(int(name.removeprefix("resnet")), name="backbone", **kwargs)
        backbone.build((None, None, None, 3))
        if weights is not None:
            from vision.pretrained.detr import read_state_dict

            backbone.load_torchvision(read_state_dict(weights, "--backbone-weights"),
                                      f"--backbone-weights {weights}")
        return backbone
    if name == "tiny":
        if weights is not None:
            raise ValueError(
                f"The 'tiny' backbone has no pretrained weights. Received: weights={weights!r}"
            )
        return TinyBackbone(name="backbone", **kwargs)
    raise ValueError(f"`name` must be one of {BACKBONES}. Received: name={name!r}")
