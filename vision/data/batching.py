"""Turns detection records into padded Keras batches: augment or resize, normalize, pad, batch.

Input records: `{"image": (H, W, 3) uint8, "boxes": (N, 4) float32 absolute pixel
(x0, y0, x1, y1), "labels": (N,) int, "image_id": () int64}` (what `vision.data.sources` give).

Output elements, for Keras `fit` (B images, M = `object_limit.max_objects`, H/W = the largest
image of the batch, or `pad_to`):

    ({"images": (B, H, W, 3) float32 ImageNet-normalized,
      "mask": (B, H, W) bool, True = real pixel, False = padding},
     {"labels": (B, M) int32, 0 where not valid,
      "boxes": (B, M, 4) float32 (cx, cy, w, h) relative to the unpadded resized image,
      "valid": (B, M) bool, True for the image's real objects (first N slots)})

With `include_info=True` a third dict follows, for evaluation: `{"image_id": (B,) int64,
"orig_size": (B, 2) int32 (height, width) of the original image, "size": (B, 2) int32 (height,
width) of the resized image before padding}`. (Keras `fit` would read a third element as sample
weights: use it for evaluation loops only.)

Images with more than `M` objects cannot be trained on (DETR needs a query per object) and
are never truncated: `ObjectLimit` leaves them out of the batches, records them, and raises
`TooManyObjectsError` (a `ValueError` with the image id and the counts) from its Keras
callback at the next batch end, or from `ObjectLimit.check`.
"""

from __future__ import annotations

import functools
import threading

import keras
import tensorflow as tf

from tfx_transformer import checks
from vision.config import AUGMENTATIONS
from vision.data.augment import (
    DetrSizes,
    FixedSize,
    detr_train_transform,
    horizontal_flip,
    normalize_image,
    resize,
)

__all__ = ["AUGMENTATIONS", "ObjectLimit", "TooManyObjectsError", "make_batches"]

class TooManyObjectsError(ValueError):
    """An image has more objects than the model has queries (target slots).

    Attributes:
        image_id: the record's ``image_id``.
        num_objects: its number of objects.
        max_objects: the limit (the trainer's ``num_queries``).
        image: a description of the image (e.g. its file), or None.
    """

    def __init__(self, image_id: int, num_objects: int, max_objects: int,
                 image: str | None = None):
        self.image_id, self.num_objects, self.max_objects = image_id, num_objects, max_objects
        self.image = image
        where = f"{image} (id {image_id})" if image else f"Image id {image_id}"
        super().__init__(
            f"{where} has {num_objects} objects, more than max_objects={max_objects} (the "
            "number of queries). Raise `num_queries` or drop the image from the data."
        )

    def __reduce__(self):
        return type(self), (self.image_id, self.num_objects, self.max_objects, self.image)


class ObjectLimit:
    """The target slots per image, and the images of a pipeline found over them.

    The trainer creates one and passes it to `make_batches` (or
    `vision.data.sources.DetectionSource.batches`), which leave such images out and record
    them here; `callback` raises the first one's `TooManyObjectsError` at the next batch end
    of ``fit`` / ``evaluate``, and `check` raises it afterwards (call it after a loop).

    Args:
        max_objects: target slots per image (DETR: ``num_queries``).
    """

    def __init__(self, max_objects: int):
        self.max_objects = checks.positive_int("max_objects", max_objects)
        self._found: list[TooManyObjectsError] = []
        self._lock = threading.Lock()

    @property
    def errors(self) -> tuple[TooManyObjectsError, ...]:
        """Every image found over the limit so far, in the order seen."""
        with self._lock:
            return tuple(self._found)

    def record(self, image_id: int, num_objects: int) -> None:
        """Notes an image over the limit."""
        with self._lock:
            self._found.append(TooManyObjectsError(image_id, num_objects, self.max_objects))

    def check(self) -> None:
        """Raises the first recorded `TooManyObjectsError`, if any."""
        errors = self.errors
        if errors:
            raise errors[0]

    def keep(self, record: dict) -> tf.Tensor:
        """``tf.data`` filter predicate: False (and recorded) for an image over the limit."""
        count = tf.shape(record["labels"])[0]

        def over():
            def note(image_id, num_objects):
                self.record(int(image_id), int(num_objects))
                return False

            kept = tf.py_function(note, [record["image_id"], count], tf.bool)
            return tf.ensure_shape(kept, [])

        return tf.cond(count <= self.max_objects, lambda: tf.constant(True), over)

    def callback(self) -> keras.callbacks.Callback:
        """A Keras callback that calls `check` at every batch end and when `fit` ends."""
        return _ObjectLimitCallback(self)


class _ObjectLimitCallback(keras.callbacks.Callback):
    def __init__(self, limit: ObjectLimit):
        super().__init__()
        self.limit = limit

    def on_train_batch_end(self, batch, logs=None):
        self.limit.check()

    def on_train_end(self, logs=None):  # images of the last batches and of validation
        self.limit.check()

    def on_test_batch_end(self, batch, logs=None):
        self.limit.check()

    def on_predict_batch_end(self, batch, logs=None):
        self.limit.check()


def _prepare(record: dict, seed, *, training: bool, sizes: DetrSizes, max_objects: int,
             augmentation: str = "detr", fixed: FixedSize | None = None):
    image, boxes = record["image"], tf.cast(record["boxes"], tf.float32)
    labels, image_id = tf.cast(record["labels"], tf.int32), tf.cast(record["image_id"], tf.int64)
    orig_size = tf.shape(image)[:2]
    if training and augmentation == "detr":
        image, boxes, labels = detr_train_transform(image, boxes, labels, seed, sizes)
    elif training and augmentation == "flip":
        if fixed is None:  # a fixed size stretches the image as it is (below)
            image, boxes = resize(image, boxes, sizes.eval_size, sizes.max_size)
        image, boxes = tf.cond(
            tf.random.stateless_uniform([], seed) < 0.5,
            lambda: horizontal_flip(image, boxes),
            lambda: (image, boxes),
        )
    elif fixed is None:
        image, boxes = resize(image, boxes, sizes.eval_size, sizes.max_size)
    size = tf.shape(image)[:2]
    height, width = tf.cast(size[0], tf.float32), tf.cast(size[1], tf.float32)

    x0, y0, x1, y1 = tf.unstack(tf.reshape(boxes, [-1, 4]), num=4, axis=-1)
    # (N, 4) normalized (cx, cy, w, h); the same formula as `box_ops.box_xyxy_to_cxcywh`, written
    # in TensorFlow so the pipeline does not depend on the Keras backend.
    boxes = tf.stack(
        [(x0 + x1) / 2 / width, (y0 + y1) / 2 / height, (x1 - x0) / width, (y1 - y0) / height], -1
    )
    pad = max_objects - tf.shape(labels)[0]
    if fixed is None:
        inputs = {"images": normalize_image(image), "mask": tf.ones(size, tf.bool)}
    else:  # stretched to the fixed size: the normalized boxes stay as they are
        inputs = {"images": fixed(image), "mask": tf.ones([fixed.height, fixed.width], tf.bool)}
    targets = {
        "labels": tf.ensure_shape(tf.pad(labels, [[0, pad]]), [max_objects]),
        "boxes": tf.ensure_shape(tf.pad(boxes, [[0, pad], [0, 0]]), [max_objects, 4]),
        "valid": tf.range(max_objects) < tf.shape(labels)[0],
    }
    info = {"image_id": image_id, "orig_size": orig_size, "size": size}
    return inputs, targets, info


def make_batches(
    records: tf.data.Dataset,
    *,
    batch_size: int,
    object_limit: ObjectLimit,
    training: bool = False,
    seed: int = 0,
    image_size: int | FixedSize = 800,
    max_size: int | None = None,
    pad_to: tuple[int, int] | None = None,
    drop_remainder: bool = False,
    include_info: bool = False,
    augmentation: str = "detr",
) -> tf.data.Dataset:
    """Batches detection records into `(inputs, targets)` elements for Keras.

    Training applies DETR's augmentation (`vision.data.augment.detr_train_transform`: flip,
    multi-scale resize, random crop) with sizes `DetrSizes.scaled(image_size, max_size)`;
    evaluation resizes the shorter side to `image_size` (longer side at most `max_size`).
    Records are not shuffled here: shuffle the (cheap, undecoded) source instead, as
    `DetectionSource.batches` does.

    Args:
        records: Dataset of records (module docstring).
        batch_size: Images per batch.
        object_limit: `ObjectLimit` with the target slots per image. An image with more
            objects is left out and recorded there (its callback raises
            `TooManyObjectsError`); `DetectionSource.check_max_objects` checks sources with
            known counts up front.
        training: Augment (randomly, reproducibly from `seed`, differently each epoch).
        seed: Augmentation seed.
        image_size: Evaluation shorter side; training scales are 0.6..1.0 of it (DETR: 800).
            A `FixedSize` (RT-DETR): every image is stretched to that size and scaled as it
            says, as the export does; with ``"detr"`` augmentation after its multi-scale
            resize and crop (sizes of the fixed size's longer side).
        max_size: Longer-side cap; default `image_size * 1333 / 800`.
        pad_to: Pad every batch to this fixed `(height, width)` instead of its largest image
            (static shapes for XLA / TPU); it must hold every resized image.
        drop_remainder: Drop a last, smaller batch (static batch size).
        include_info: Add the info dict (module docstring) as a third element.
        augmentation: With `training`: `"detr"` (DETR's flip, multi-scale resize and random
            crop), `"flip"` (the evaluation resize and a random horizontal flip) or `"none"`
            (the evaluation resize only).

    Returns:
        The batched, prefetched `tf.data.Dataset`.
    """
    batch_size = checks.positive_int("batch_size", batch_size)
    if not isinstance(object_limit, ObjectLimit):
        raise ValueError(
            f"`object_limit` must be an ObjectLimit. Received: object_limit={object_limit!r}"
        )
    max_objects = object_limit.max_objects
    fixed = image_size if isinstance(image_size, FixedSize) else None
    if fixed is not None:
        image_size, max_size = max(fixed.height, fixed.width), None
    sizes = DetrSizes.scaled(image_size, max_size)
    if augmentation not in AUGMENTATIONS:
        raise ValueError(
            f"`augmentation` must be one of {AUGMENTATIONS}. Received: {augmentation!r}"
        )
    pad_to = checks.positive_ints("pad_to", pad_to, length=2, optional=True)  # (height, width)
    prepare = functools.partial(
        _prepare, training=training, sizes=sizes, max_objects=max_objects,
        augmentation=augmentation, fixed=fixed,
    )
    records = records.filter(object_limit.keep)
    if training:
        seeds = tf.data.Dataset.random(seed=seed, rerandomize_each_iteration=True).batch(2)
        ds = tf.data.Dataset.zip((records, seeds))
        ds = ds.map(prepare, num_parallel_calls=tf.data.AUTOTUNE)
    else:
        ds = records.map(lambda r: prepare(r, None), num_parallel_calls=tf.data.AUTOTUNE)
    if not include_info:
        ds = ds.map(lambda inputs, targets, info: (inputs, targets))
    height, width = (None, None) if pad_to is None else (int(pad_to[0]), int(pad_to[1]))
    shapes = (
        {"images": [height, width, 3], "mask": [height, width]},
        {"labels": [max_objects], "boxes": [max_objects, 4], "valid": [max_objects]},
        {"image_id": [], "orig_size": [2], "size": [2]},
    )
    ds = ds.padded_batch(
        batch_size, padded_shapes=shapes[:3 if include_info else 2], drop_remainder=drop_remainder
    )
    return ds.prefetch(tf.data.AUTOTUNE)
