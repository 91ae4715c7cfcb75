"""The exported detector: a SavedModel from raw images to boxes, scores and labels.

Preprocessing (resize like evaluation, ImageNet normalization, padding + validity mask), the
model and post-processing are one graph of core TensorFlow ops, so the SavedModel runs in a
process that has only ``tensorflow`` (and under ``saved_model_cli``)::

    import tensorflow as tf

    detector = tf.saved_model.load("DIR/export")
    out = detector.signatures["serving_default"](images=tf.zeros([1, 480, 640, 3], tf.uint8))
    out["boxes"], out["scores"], out["labels"]  # (1, Q, 4) xyxy pixels, (1, Q), (1, Q)

    data = tf.io.read_file("photo.jpg")
    out = detector.signatures["serving_bytes"](image_bytes=tf.stack([data]))

``DIR/export/classes.json`` holds ``{"class_names": [...], "category_ids": [...] | null}``:
label ``i`` is ``class_names[i]`` (and COCO category ``category_ids[i]`` for ``coco:`` data).

This module writes exports; `vision.export.load` reads them (`load_detector`, `Detector`) and
defines the signature and file names.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Sequence

import tensorflow as tf

from tfx_transformer.saved_model import write_saved_model
from tfx_transformer.training.workdir import write_export_dir
from vision.data.augment import FixedSize, normalize_image, resized_shape
from vision.data.decode import decode_image
from vision.export.load import (
    BYTES_KEY,
    BYTES_SIGNATURE,
    CLASSES_FILE,
    IMAGES_KEY,
    OUTPUT_KEYS,
    PREPROCESSING_FILE,
    SERVING,
)
from vision.modeling.postprocess import postprocess

__all__ = ["decode_and_preprocess", "export_detector", "make_detect_fn",
           "preprocess_images"]

IMAGES_SPEC = tf.TensorSpec([None, None, None, 3], tf.uint8, name=IMAGES_KEY)
BYTES_SPEC = tf.TensorSpec([None], tf.string, name=BYTES_KEY)


def _resize(image, image_size, max_size):
    """One image or a batch of same-size images, resized and normalized: ``(pixels,
    (height, width) after the resize)``."""
    if isinstance(image_size, FixedSize):
        return image_size(image), tf.constant([image_size.height, image_size.width])
    shape = tf.shape(image)
    height, width = resized_shape(shape[-3], shape[-2], image_size, max_size)
    resized = tf.image.resize(image, tf.stack([height, width]), antialias=True)
    return normalize_image(resized), tf.stack([height, width])


def preprocess_images(images, image_size: int | FixedSize, max_size: int | None
                      ) -> tuple[dict, tf.Tensor]:
    """Model inputs of a batch of same-size images, as the evaluation pipeline makes them.

    Args:
        images: ``(B, H, W, 3)`` uint8.
        image_size: shorter side after resizing (``DetrConfig.image_size``), or a `FixedSize`.
        max_size: cap on the longer side (``DetrConfig.max_image_size``; None with a
            `FixedSize`).

    Returns:
        ``({"images": (B, H', W', 3) float32, "mask": (B, H', W') bool}, sizes (B, 2) int32)``
        with ``sizes`` the original ``(H, W)`` of each image.
    """
    shape = tf.shape(images)
    check = tf.debugging.assert_positive(
        shape[1:3], message=f"`{IMAGES_KEY}` must be (B, H, W, 3) with H and W of at least 1 "
                            "pixel; received an image of zero height or width")
    with tf.control_dependencies([check]):  # before any op that a zero size would break
        images = tf.identity(images)
    pixels, resized = _resize(images, image_size, max_size)
    mask = tf.ones(tf.concat([shape[:1], resized], 0), tf.bool)
    sizes = tf.tile(shape[None, 1:3], [shape[0], 1])  # (B, 2)
    return {"images": pixels, "mask": mask}, sizes


def decode_and_preprocess(image_bytes, image_size: int | FixedSize, max_size: int | None):
    """Decodes encoded images (JPEG, PNG, GIF, BMP, WebP) of any sizes into one padded batch.

    Each image is decoded to RGB (grayscale and RGBA converted, first GIF frame) as displayed
    (a JPEG's EXIF orientation applied: `vision.data.decode.decode_image`), resized and
    normalized on its own, then the batch is zero-padded to the largest one, with the mask
    marking real pixels, exactly as ``vision.data.batching.make_batches`` pads.

    Args:
        image_bytes: ``(B,)`` tf.string.

    Returns:
        As `preprocess_images`.
    """
    def one(data):
        image = decode_image(data)
        pixels, resized = _resize(image, image_size, max_size)
        return tf.RaggedTensor.from_tensor(pixels, ragged_rank=1), tf.shape(image)[:2], resized

    ragged, sizes, resized_sizes = tf.map_fn(one, image_bytes, fn_output_signature=(
        tf.RaggedTensorSpec([None, None, 3], tf.float32, ragged_rank=1),
        tf.TensorSpec([2], tf.int32), tf.TensorSpec([2], tf.int32)))
    images = ragged.to_tensor()  # (B, H', W', 3): zero-padded to the largest image
    shape = tf.shape(images)
    rows = tf.range(shape[1])[None, :, None] < resized_sizes[:, None, None, 0]  # (B, H', 1)
    cols = tf.range(shape[2])[None, None, :] < resized_sizes[:, None, None, 1]  # (B, 1, W')
    return {"images": images, "mask": tf.logical_and(rows, cols)}, sizes


def _detections(model, inputs: dict, sizes) -> dict:
    # A model with its own post-processing (RT-DETR's sigmoid scores) has `postprocess`.
    post = getattr(model, "postprocess", postprocess)(model(inputs, training=False), sizes)
    return {key: post[key] for key in OUTPUT_KEYS}


def _no_detections(model) -> dict:
    """The outputs of an empty batch: ``(0, Q, 4)``, ``(0, Q)``, ``(0, Q)``."""
    queries = model.num_queries
    return {"boxes": tf.zeros([0, queries, 4], tf.float32),
            "scores": tf.zeros([0, queries], tf.float32),
            "labels": tf.zeros([0, queries], tf.int32)}


def _forward(model) -> Callable:
    """``_detections`` of ``model`` as one `tf.function`: the signatures of an export call it,
    so the model is traced once, not once per signature."""
    specs = ({"images": tf.TensorSpec([None, None, None, 3], tf.float32),
              "mask": tf.TensorSpec([None, None, None], tf.bool)},
             tf.TensorSpec([None, 2], tf.int32))
    return tf.function(lambda inputs, sizes: _detections(model, inputs, sizes),
                       input_signature=specs)


def _serving(model, image_size: int | FixedSize, max_size: int | None, from_bytes: bool,
             forward: Callable | None = None) -> Callable:
    prepare = decode_and_preprocess if from_bytes else preprocess_images
    forward = forward or (lambda inputs, sizes: _detections(model, inputs, sizes))

    def detect(images):
        return tf.cond(tf.shape(images)[0] > 0,
                       lambda: forward(*prepare(images, image_size, max_size)),
                       lambda: _no_detections(model))

    return detect


def make_detect_fn(model, image_size: int | FixedSize, max_size: int | None,
                   from_bytes: bool = False) -> Callable:
    """The exported computation, for use in process: raw images -> detections of every query.

    Args:
        model: a `vision.modeling.detr.DETR` or `vision.modeling.rtdetr.RTDetr`.
        image_size, max_size: the resize of `preprocess_images`.
        from_bytes: take ``(B,)`` encoded images instead of ``(B, H, W, 3)`` uint8.

    Returns:
        A `tf.function` returning ``{"boxes": (B, Q, 4) xyxy pixels of the input image,
        "scores": (B, Q), "labels": (B, Q) int32}``; empty outputs for an empty batch. An image
        of zero height or width fails with an `InvalidArgumentError` that says so.
    """
    return tf.function(_serving(model, image_size, max_size, from_bytes),
                       input_signature=[BYTES_SPEC if from_bytes else IMAGES_SPEC])


def export_detector(model, path: str | os.PathLike, class_names: Sequence[str],
                    image_size: int | FixedSize, max_size: int | None,
                    category_ids: Sequence[int] | None = None) -> str:
    """Writes the ``Detector`` SavedModel and ``classes.json``.

    With a `FixedSize`, ``preprocessing.json`` (`vision.export.load.PREPROCESSING_FILE`) records it.

    Signatures: ``serving_default`` (``images`` uint8 ``(B, H, W, 3)``) and ``serving_bytes``
    (``image_bytes`` tf.string ``(B,)``), both returning ``boxes`` ``(B, Q, 4)`` float32 xyxy
    pixels of each input image (as displayed: a JPEG's EXIF orientation is applied),
    ``scores`` ``(B, Q)`` float32 and ``labels`` ``(B, Q)`` int32. Every query is returned;
    apply a score threshold downstream. An empty batch returns empty outputs (``B = 0``); an
    image of zero height or width fails with an `InvalidArgumentError` that says so.

    The export is written to a temporary directory beside ``path`` and moved into place at the
    end (`tfx_transformer.training.workdir.write_export_dir`), so a failed export leaves
    the previous one as it was.

    Args:
        model: a trained `vision.modeling.detr.DETR`, or an `vision.modeling.rtdetr.RTDetr`
            (its own post-processing: the ``Q`` best (query, class) scores).
        path: output directory (replaced if it exists).
        class_names: name of each label.
        image_size, max_size: the evaluation resize (``DetrConfig.image_size``,
            ``max_image_size``), or a `FixedSize` and None.
        category_ids: COCO category id of each label, if any.

    Returns:
        ``path`` as a string.
    """
    if len(class_names) != model.num_classes:
        raise ValueError(f"`class_names` must name the model's {model.num_classes} classes. "
                         f"Received: {len(class_names)} names")

    def write(directory):
        forward = _forward(model)
        write_saved_model(directory, model, [
            (name, _serving(model, image_size, max_size, from_bytes, forward),
             [BYTES_SPEC if from_bytes else IMAGES_SPEC])
            for name, from_bytes in ((SERVING, False), (BYTES_SIGNATURE, True))])
        with open(os.path.join(directory, CLASSES_FILE), "w", encoding="utf-8") as f:
            json.dump({"class_names": list(class_names),
                       "category_ids": None if category_ids is None else list(category_ids)},
                      f, indent=2)
        if isinstance(image_size, FixedSize):  # what the LiteRT and ONNX writers resize to
            with open(os.path.join(directory, PREPROCESSING_FILE), "w", encoding="utf-8") as f:
                json.dump(dataclasses.asdict(image_size), f, indent=2)

    return write_export_dir(path, write)
