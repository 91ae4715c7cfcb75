"""Loading an exported detector: `load_detector` and `Detector`.

What `vision.export.saved_model.export_detector` writes (``DIR/export``): a SavedModel with the
signatures ``serving_default`` (`SERVING`: ``images`` uint8 ``(B, H, W, 3)``) and
``serving_bytes`` (`BYTES_SIGNATURE`: ``image_bytes`` tf.string ``(B,)``), both returning
``boxes``, ``scores`` and ``labels``, and ``classes.json`` (`CLASSES_FILE`). The names are
defined here, for the writer and the readers alike. This module needs only ``tensorflow`` and
``numpy`` (no Keras model is built).

Example:
    >>> detector = load_detector("runs/shapes/export")
    >>> detector(np.zeros([1, 480, 640, 3], np.uint8))["boxes"].shape  # (1, Q, 4)
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

import numpy as np
import tensorflow as tf

__all__ = [
    "BYTES_KEY",
    "BYTES_SIGNATURE",
    "CLASSES_FILE",
    "Detector",
    "IMAGES_KEY",
    "OUTPUT_KEYS",
    "PREPROCESSING_FILE",
    "SERVING",
    "describe_export",
    "load_detector",
    "read_classes",
]

SERVING = "serving_default"  # uint8 images in
BYTES_SIGNATURE = "serving_bytes"  # encoded images in
IMAGES_KEY = "images"  # SERVING input: uint8 (B, H, W, 3)
BYTES_KEY = "image_bytes"  # BYTES_SIGNATURE input: tf.string (B,)
OUTPUT_KEYS = ("boxes", "scores", "labels")  # (B, Q, 4) xyxy pixels, (B, Q), (B, Q) int32
CLASSES_FILE = "classes.json"
# A fixed-size detector's resize and scaling (`vision.data.augment.FixedSize` as JSON:
# height, width, rescale, mean, std); absent where the resize keeps the aspect ratio (DETR).
PREPROCESSING_FILE = "preprocessing.json"


def _read_classes(path: str) -> tuple[tuple[str, ...], list[int] | None]:
    """``(class_names, category_ids)`` of a ``classes.json``; ValueError naming it if bad."""
    try:
        with open(path, encoding="utf-8") as f:
            info = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{path}: not a valid JSON file ({error}).") from None
    names = info.get("class_names") if isinstance(info, dict) else None
    ids = info.get("category_ids") if isinstance(info, dict) else None
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise ValueError(f"{path}: 'class_names' must be a non-empty list of strings. "
                         f"Received: {names!r}")
    if ids is not None and (
        not isinstance(ids, list) or len(ids) != len(names)
        or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids)
    ):
        raise ValueError(f"{path}: 'category_ids' must be null or {len(names)} integers, one "
                         f"per class name. Received: {ids!r}")
    return tuple(names), ids


def read_classes(path: str | os.PathLike) -> tuple[tuple[str, ...], list[int] | None]:
    """``(class_names, category_ids)`` of the detector export at ``path``, read without
    loading it; ValueError naming the path when it is no detector export."""
    path = os.fspath(path)
    if not os.path.isfile(os.path.join(path, "saved_model.pb")):
        raise ValueError(f"No exported detector at {path!r} (expected DIR/export, a "
                         "SavedModel written by train_detr.py).")
    classes = os.path.join(path, CLASSES_FILE)
    if not os.path.isfile(classes):
        raise ValueError(f"{classes} is missing: the export has no class names.")
    return _read_classes(classes)


def describe_export(path: str | os.PathLike) -> dict:
    """What the server's page shows of a detector export (``class_names``), read without
    loading it (the ``detector`` entry of `tfx_transformer.applications.EXPORTS`)."""
    return {"class_names": list(read_classes(path)[0])}


def _signature(path: str, signatures, name: str):
    if name not in signatures:
        raise ValueError(f"{path} has no {name!r} signature (it has {sorted(signatures)}), so "
                         "it is no detector export")
    return signatures[name]


class Detector:
    """A loaded ``Detector`` SavedModel (see `load_detector`).

    Attributes:
        path: the export directory.
        class_names: name of each label.
        category_ids: COCO category id of each label, or None.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        self.class_names, self.category_ids = read_classes(self.path)
        self._saved_model = tf.saved_model.load(self.path)  # keeps the variables alive
        signatures = self._saved_model.signatures
        self._images = _signature(self.path, signatures, SERVING)
        self._bytes = _signature(self.path, signatures, BYTES_SIGNATURE)

    def __call__(self, images) -> dict[str, np.ndarray]:
        """Detections of ``(B, H, W, 3)`` uint8 images: boxes, scores, labels as NumPy."""
        images = tf.convert_to_tensor(images)
        if images.dtype != tf.uint8 or images.shape.rank != 4 or images.shape[-1] != 3:
            raise ValueError("`images` must be uint8 of shape (B, H, W, 3). Received: "
                             f"dtype={images.dtype.name}, shape={tuple(images.shape)}")
        return {k: v.numpy() for k, v in self._images(**{IMAGES_KEY: images}).items()}

    def detect_bytes(self, image_bytes: Sequence[bytes]) -> dict[str, np.ndarray]:
        """Detections of encoded images (any sizes); raises `tf.errors.InvalidArgumentError`
        for data that is not a decodable image."""
        data = tf.constant(list(image_bytes), tf.string, shape=[len(image_bytes)])
        return {k: v.numpy() for k, v in self._bytes(**{BYTES_KEY: data}).items()}


def load_detector(path: str | os.PathLike) -> Detector:
    """Loads ``DIR/export``; raises ValueError naming the path when it is not an export."""
    return Detector(path)
