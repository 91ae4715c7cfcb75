"""Reader of COCO-format detection files: an images folder and one annotations JSON.

What is kept, following the usual DETR / detectron2 loaders:

- every image listed in `images`, including images without annotations;
- boxes `[x, y, w, h]` converted to absolute pixel `(x0, y0, x1, y1)`, clipped to the image;
  crowd annotations (`iscrowd = 1`) and boxes empty after clipping (w or h <= 0) are dropped;
- category ids mapped to contiguous labels `0..C-1` in increasing id order, names kept.

Each image file is checked up front (exists, is an image TensorFlow can decode, and has the
size the JSON records), so a bad file is reported by name before any training starts.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import json
import math
import os

import numpy as np

__all__ = ["CocoData", "CocoImage", "read_coco", "split_images"]

# Formats `tf.io.decode_image` reads, as PIL names them.
_DECODABLE = ("JPEG", "PNG", "GIF", "BMP", "WEBP")


@dataclasses.dataclass(frozen=True)
class CocoImage:
    """One image and its kept boxes.

    Attributes:
        image_id: The COCO image id.
        file_name: The file name the JSON records (relative to the images folder).
        path: Path of the image file.
        height: Image height in pixels.
        width: Image width in pixels.
        boxes: (N, 4) float32 absolute pixel `(x0, y0, x1, y1)`.
        labels: (N,) int32 contiguous labels.
    """

    image_id: int
    file_name: str
    path: str
    height: int
    width: int
    boxes: np.ndarray
    labels: np.ndarray


@dataclasses.dataclass(frozen=True)
class CocoData:
    """A COCO-format data set.

    Attributes:
        images: The images in file order.
        class_names: Name of each contiguous label.
        category_ids: The COCO category id of each contiguous label.
    """

    images: tuple[CocoImage, ...]
    class_names: tuple[str, ...]
    category_ids: tuple[int, ...]


def _load_json(path: str) -> dict:
    if not os.path.isfile(path):
        raise ValueError(f"COCO annotations file not found. Received: path={path!r}")
    try:
        with open(path, "rb") as f:
            content = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{path}: not a valid JSON file ({error}).") from None
    if not isinstance(content, dict) or not isinstance(content.get("images"), list):
        raise ValueError(f"{path}: not a COCO annotations file (no 'images' list).")
    return content


def _image_size(path: str) -> tuple[int, int]:
    """(height, width) of an image file; ValueError naming it when it cannot be read."""
    from PIL import Image, UnidentifiedImageError  # Only needed to check files.

    if not os.path.isfile(path):
        raise ValueError(f"Image file not found: {path!r}")
    try:
        with Image.open(path) as image:
            image_format, (width, height) = image.format, image.size
    except (UnidentifiedImageError, OSError) as error:
        raise ValueError(f"Cannot read image file {path!r}: {error}") from None
    if image_format not in _DECODABLE:
        raise ValueError(
            f"Image file {path!r} is {image_format}; supported formats: {', '.join(_DECODABLE)}."
        )
    return height, width


def _boxes(annotations: list[dict], height: int, width: int, labels_of: dict, where: str):
    boxes, labels = [], []
    for annotation in annotations:
        if annotation.get("iscrowd", 0):
            continue
        bbox = annotation.get("bbox")
        if not isinstance(bbox, (list, tuple)) or len(bbox) != 4:
            raise ValueError(f"{where}: annotation {annotation.get('id')!r} has bbox={bbox!r}; "
                             "expected [x, y, width, height].")
        x, y, w, h = (float(v) for v in bbox)
        x0, y0 = min(max(x, 0.0), width), min(max(y, 0.0), height)
        x1, y1 = min(max(x + w, 0.0), width), min(max(y + h, 0.0), height)
        if x1 <= x0 or y1 <= y0:
            continue
        boxes.append((x0, y0, x1, y1))
        labels.append(labels_of[annotation["category_id"]])
    return np.array(boxes, np.float32).reshape(-1, 4), np.array(labels, np.int32)


def read_coco(images_dir: str, annotations_path: str, *, check_files: bool = True) -> CocoData:
    """Reads a COCO-format annotations file and the images it lists.

    Args:
        images_dir: Folder the images' `file_name`s are relative to.
        annotations_path: The annotations JSON (`images`, `annotations`, `categories`).
        check_files: Open every image header to check that it exists, is decodable and has the
            recorded size (in parallel threads). Turn off only for trusted, very large sets.

    Returns:
        The `CocoData`.

    Raises:
        ValueError: Missing or malformed JSON; an annotation naming an unknown image or
            category; a missing or unreadable image file, or one whose size differs from the
            JSON's `width`/`height` (boxes would not match it). The message names the file.
    """
    images_dir, annotations_path = os.fspath(images_dir), os.fspath(annotations_path)
    content = _load_json(annotations_path)
    for kind, keys in (("images", ("id", "file_name")), ("categories", ("id",))):
        for entry in content.get(kind) or []:
            if not isinstance(entry, dict) or any(key not in entry for key in keys):
                raise ValueError(f"{annotations_path}: {kind} entry {entry!r} needs {keys}.")
    categories = sorted(content.get("categories") or [], key=lambda c: c["id"])
    labels_of = {c["id"]: i for i, c in enumerate(categories)}
    by_image: dict[int, list[dict]] = {image["id"]: [] for image in content["images"]}
    if len(by_image) != len(content["images"]):
        raise ValueError(f"{annotations_path}: image ids are not unique.")
    for annotation in content.get("annotations") or []:
        where = f"{annotations_path}: annotation {annotation.get('id')!r}"
        if annotation.get("image_id") not in by_image:
            raise ValueError(f"{where} names unknown image_id={annotation.get('image_id')!r}.")
        if annotation.get("category_id") not in labels_of:
            raise ValueError(
                f"{where} names unknown category_id={annotation.get('category_id')!r}."
            )
        by_image[annotation["image_id"]].append(annotation)

    paths = [os.path.join(images_dir, image["file_name"]) for image in content["images"]]
    if check_files:
        with concurrent.futures.ThreadPoolExecutor(max_workers=16) as pool:
            sizes = list(pool.map(_image_size, paths))
    else:
        sizes = [(image.get("height"), image.get("width")) for image in content["images"]]
    images = []
    for image, path, (height, width) in zip(content["images"], paths, sizes):
        if height is None or width is None:
            raise ValueError(f"{annotations_path}: image {path!r} records no width and height "
                             "(needed with check_files=False).")
        recorded = (image.get("height", height), image.get("width", width))
        if recorded != (height, width):
            raise ValueError(
                f"Image file {path!r} is {width}x{height} pixels but {annotations_path} records "
                f"{recorded[1]}x{recorded[0]} (width x height); its boxes would not match."
            )
        boxes, labels = _boxes(by_image[image["id"]], height, width, labels_of, path)
        images.append(
            CocoImage(int(image["id"]), image["file_name"], path, height, width, boxes, labels)
        )
    return CocoData(
        images=tuple(images),
        class_names=tuple(str(c.get("name", c["id"])) for c in categories),
        category_ids=tuple(int(c["id"]) for c in categories),
    )


def _hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "big")


def split_images(
    images: tuple[CocoImage, ...] | list[CocoImage], valid_fraction: float = 0.05
) -> tuple[tuple[CocoImage, ...], tuple[CocoImage, ...]]:
    """Holds out a deterministic share of the images for validation.

    The `ceil(valid_fraction * N)` images whose file name has the smallest hash (at least one when
    `valid_fraction > 0`, never all of them) are held out: the same files always give the same
    split, whatever their order, and adding images moves few others.

    Args:
        images: The images.
        valid_fraction: Share to hold out, in `[0, 1)`.

    Returns:
        `(train, valid)`, each in the order of `images`.
    """
    if isinstance(valid_fraction, bool) or not isinstance(valid_fraction, (int, float)) or not (
        0 <= valid_fraction < 1
    ):
        raise ValueError(
            f"`valid_fraction` must be in [0, 1). Received: valid_fraction={valid_fraction!r}"
        )
    ranked = sorted(range(len(images)), key=lambda i: (_hash(images[i].file_name), i))
    count = max(min(math.ceil(valid_fraction * len(images)), len(images) - 1), 0)
    held_out = set(ranked[:count])
    train = tuple(image for i, image in enumerate(images) if i not in held_out)
    valid = tuple(image for i, image in enumerate(images) if i in held_out)
    return train, valid
