"""Image + box transforms of the detection pipeline, as in facebookresearch/detr `datasets/`.

All functions are TensorFlow ops usable inside `tf.data` (no Keras backend involved, so the
pipeline works whatever `KERAS_BACKEND` is). Boxes are absolute pixel `(x0, y0, x1, y1)` float32
(N, 4) with labels (N,); images are (H, W, 3), float32 after any resize.

DETR's training recipe (`make_coco_transforms`) is: random horizontal flip, then with
probability 1/2 either a resize of the shorter side to a random scale (longer side capped), or a
resize to a random "crop scale", a random size crop, and the random-scale resize. Evaluation
resizes the shorter side to a fixed size. `DetrSizes.scaled(image_size)` scales DETR's numbers
(800 px, scales 480..800, cap 1333, crop scales 400/500/600, crop 384..600) to any image size.
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf

from tfx_transformer import checks

__all__ = [
    "FixedSize",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "DetrSizes",
    "crop",
    "detr_train_transform",
    "horizontal_flip",
    "normalize_image",
    "random_size_crop",
    "resize",
    "resized_shape",
]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclasses.dataclass(frozen=True)
class DetrSizes:
    """The image sizes of DETR's augmentation, in pixels.

    Attributes:
        eval_size: Shorter side at evaluation.
        scales: Shorter sides to pick from in training.
        max_size: Cap on the longer side after each scale resize.
        crop_scales: Shorter sides to pick from before the random crop.
        crop_min_size: Smallest crop height/width.
        crop_max_size: Largest crop height/width.
    """

    eval_size: int = 800
    scales: tuple[int, ...] = tuple(range(480, 801, 32))
    max_size: int = 1333
    crop_scales: tuple[int, ...] = (400, 500, 600)
    crop_min_size: int = 384
    crop_max_size: int = 600

    @classmethod
    def scaled(cls, image_size: int = 800, max_size: int | None = None) -> DetrSizes:
        """DETR's sizes multiplied by `image_size / 800` (rounded); `image_size=800` is DETR.

        Args:
            image_size: Evaluation shorter side; training scales go from 0.6 to 1.0 of it.
            max_size: Longer-side cap; default `1333 / 800 * image_size`.
        """
        checks.integer("image_size", image_size, minimum=8)
        checks.integer("max_size", max_size, minimum=image_size, optional=True)
        factor = image_size / 800

        def scale(values):
            return tuple(sorted({max(1, round(v * factor)) for v in values}))

        default = cls()
        return cls(
            eval_size=image_size,
            scales=scale(default.scales),
            max_size=max_size if max_size is not None else round(default.max_size * factor),
            crop_scales=scale(default.crop_scales),
            crop_min_size=max(1, round(default.crop_min_size * factor)),
            crop_max_size=max(1, round(default.crop_max_size * factor)),
        )


def resized_shape(height, width, size, max_size=None) -> tuple[tf.Tensor, tf.Tensor]:
    """DETR's `get_size_with_aspect_ratio`: shorter side `size`, longer side at most `max_size`.

    Args:
        height: Image height (scalar).
        width: Image width (scalar).
        size: Target shorter side (scalar).
        max_size: Optional cap on the longer side; `size` shrinks to respect it.

    Returns:
        `(new_height, new_width)` int32 scalars (the longer side is truncated, as in DETR).
        Each side is at least 1 pixel. Where DETR's capped shorter side rounds to 0 (an
        extreme aspect ratio such as 5000 x 10 with `max_size`; DETR then fails) it is 1
        pixel and the longer side keeps the aspect ratio up to `max_size`, so every readable
        image can be resized. Elsewhere the result is exactly DETR's.
    """
    h, w = tf.cast(height, tf.float64), tf.cast(width, tf.float64)
    size = tf.cast(size, tf.float64)
    if max_size is not None:
        short, long = tf.minimum(h, w), tf.maximum(h, w)
        size = tf.where(long / short * size > max_size, tf.round(max_size * short / long), size)
    clamped = size < 1
    size = tf.maximum(size, 1.0)
    new_h = tf.where(w < h, tf.floor(size * h / w), size)
    new_w = tf.where(w < h, size, tf.floor(size * w / h))
    if max_size is not None:
        cap = tf.maximum(tf.cast(max_size, tf.float64), 1.0)
        new_h = tf.where(clamped, tf.minimum(new_h, cap), new_h)
        new_w = tf.where(clamped, tf.minimum(new_w, cap), new_w)
    return tf.cast(tf.maximum(new_h, 1.0), tf.int32), tf.cast(tf.maximum(new_w, 1.0), tf.int32)


def resize(image, boxes, size, max_size=None) -> tuple[tf.Tensor, tf.Tensor]:
    """Resizes (bilinear, antialiased) to shorter side `size` and scales the boxes with it.

    Returns:
        `(image (H', W', 3) float32, boxes (N, 4) float32)`.
    """
    shape = tf.shape(image)
    new_h, new_w = resized_shape(shape[0], shape[1], size, max_size)
    resized = tf.image.resize(image, tf.stack([new_h, new_w]), antialias=True)
    ratio_h = tf.cast(new_h, tf.float32) / tf.cast(shape[0], tf.float32)
    ratio_w = tf.cast(new_w, tf.float32) / tf.cast(shape[1], tf.float32)
    boxes = tf.convert_to_tensor(boxes, tf.float32) * tf.stack([ratio_w, ratio_h, ratio_w, ratio_h])
    return resized, boxes


def horizontal_flip(image, boxes) -> tuple[tf.Tensor, tf.Tensor]:
    """Mirrors the image left-right: a box `(x0, y0, x1, y1)` becomes `(W - x1, y0, W - x0, y1)`."""
    width = tf.cast(tf.shape(image)[1], tf.float32)
    x0, y0, x1, y1 = tf.unstack(tf.convert_to_tensor(boxes, tf.float32), num=4, axis=-1)
    return image[:, ::-1, :], tf.stack([width - x1, y0, width - x0, y1], axis=-1)


def crop(image, boxes, labels, top, left, height, width):
    """Crops the window `[top, top + height) x [left, left + width)`.

    Boxes are shifted into the window and clipped to it; boxes left empty (zero width or height)
    are dropped with their labels.

    Returns:
        `(image (height, width, 3), boxes (N', 4), labels (N',))`.
    """
    image = image[top : top + height, left : left + width, :]
    offset = tf.cast(tf.stack([left, top, left, top]), tf.float32)
    limit = tf.cast(tf.stack([width, height, width, height]), tf.float32)
    boxes = tf.clip_by_value(tf.convert_to_tensor(boxes, tf.float32) - offset, 0.0, limit)
    keep = tf.logical_and(boxes[:, 2] > boxes[:, 0], boxes[:, 3] > boxes[:, 1])
    return image, tf.boolean_mask(boxes, keep), tf.boolean_mask(labels, keep)


def _randint(seed, low, high) -> tf.Tensor:
    """Uniform int32 in `[low, high]` (inclusive, like Python's `random.randint`)."""
    return tf.random.stateless_uniform(
        [], seed, minval=tf.cast(low, tf.int32), maxval=tf.cast(high, tf.int32) + 1, dtype=tf.int32
    )


def random_size_crop(image, boxes, labels, min_size: int, max_size: int, seed):
    """DETR's `RandomSizeCrop`: a crop of random height/width in `[min_size, max_size]`.

    The sizes are also capped by the image (and `min_size` lowered for images smaller than it);
    the window position is uniform.

    Args:
        image: (H, W, 3).
        boxes: (N, 4) absolute xyxy.
        labels: (N,).
        min_size: Smallest crop side.
        max_size: Largest crop side.
        seed: (2,) integer seed of the stateless random ops.

    Returns:
        `(image, boxes, labels)` as `crop` returns them.
    """
    shape = tf.shape(image)
    seeds = tf.random.experimental.stateless_split(seed, num=4)
    width = _randint(seeds[0], tf.minimum(min_size, shape[1]), tf.minimum(shape[1], max_size))
    height = _randint(seeds[1], tf.minimum(min_size, shape[0]), tf.minimum(shape[0], max_size))
    top = _randint(seeds[2], 0, shape[0] - height)
    left = _randint(seeds[3], 0, shape[1] - width)
    return crop(image, boxes, labels, top, left, height, width)


def _choice(values: tuple[int, ...], seed) -> tf.Tensor:
    return tf.gather(tf.constant(values, tf.int32), _randint(seed, 0, len(values) - 1))


def detr_train_transform(image, boxes, labels, seed, sizes: DetrSizes):
    """DETR's training augmentation: flip, then scale resize or resize + crop + scale resize.

    Args:
        image: (H, W, 3) image, any numeric dtype.
        boxes: (N, 4) absolute xyxy float32.
        labels: (N,).
        seed: (2,) integer seed; the same seed gives the same transform.
        sizes: The `DetrSizes`.

    Returns:
        `(image (H', W', 3) float32, boxes (N', 4), labels (N',))`.
    """
    seeds = tf.random.experimental.stateless_split(seed, num=6)
    image = tf.cast(image, tf.float32)
    boxes = tf.convert_to_tensor(boxes, tf.float32)
    image, boxes = tf.cond(
        tf.random.stateless_uniform([], seeds[0]) < 0.5,
        lambda: horizontal_flip(image, boxes),
        lambda: (image, boxes),
    )

    def plain():
        return (*resize(image, boxes, _choice(sizes.scales, seeds[1]), sizes.max_size), labels)

    def cropped():
        small_image, small_boxes = resize(image, boxes, _choice(sizes.crop_scales, seeds[2]))
        small_image, small_boxes, kept = random_size_crop(
            small_image, small_boxes, labels, sizes.crop_min_size, sizes.crop_max_size, seeds[3]
        )
        size = _choice(sizes.scales, seeds[4])
        return (*resize(small_image, small_boxes, size, sizes.max_size), kept)

    return tf.cond(tf.random.stateless_uniform([], seeds[5]) < 0.5, plain, cropped)


def normalize_image(image) -> tf.Tensor:
    """Scales 0..255 pixels to [0, 1], then subtracts the ImageNet mean and divides by its std."""
    image = tf.cast(image, tf.float32) / 255.0
    return (image - tf.constant(IMAGENET_MEAN)) / tf.constant(IMAGENET_STD)


@dataclasses.dataclass(frozen=True)
class FixedSize:
    """The real-time detectors' preprocessing (RT-DETR; transformers' ``RTDetrImageProcessor``):
    every image resized to ``height`` x ``width`` whatever its aspect ratio (bilinear,
    antialiased where it shrinks, as PIL's), its pixels multiplied by ``rescale``, then
    normalized by ``mean`` and ``std`` where they are given (RT-DETR's are not). The batch
    needs no padding: its mask is all True.

    transformers resizes with PIL, in fixed point, rounding the resized pixels to integers; here
    they stay floating point (at most one grey level apart; none where no resize happens).
    """

    height: int = 640
    width: int = 640
    rescale: float = 1 / 255
    mean: tuple[float, float, float] | None = None
    std: tuple[float, float, float] | None = None

    def __call__(self, image):
        """``(..., H, W, 3)`` -> ``(..., height, width, 3)`` float32 model input."""
        resized = tf.image.resize(image, [self.height, self.width], antialias=True)
        pixels = resized * self.rescale
        if self.mean is not None:
            pixels = (pixels - tf.constant(self.mean, tf.float32)) / tf.constant(self.std,
                                                                                 tf.float32)
        return pixels
