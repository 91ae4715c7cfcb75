"""Reader of COCO-format detection files: an images folder and one annotations JSON.

What is kept, following the usual DETR / detectron2 loaders:

- every image listed in `images`, including images without annotations;
- boxes `[x, y, w, h]` converted to absolute pixel `(x0, y0, x1, y1)`, clipped to the image;
  boxes empty after clipping (w or h <= 0) are dropped;
- crowd annotations (`iscrowd = 1`) are not training targets: they are kept apart
  (`CocoImage.crowd_boxes`), for the evaluation, where COCO ignores detections on them;
- category ids mapped to contiguous labels `0..C-1` in increasing id order, names kept.

The file is checked where it is read: a malformed entry (an image without `file_name`, an
annotation that is not an object, a `bbox` that is not four finite numbers, ...) is a
ValueError naming the file, the entry (`images[3]`, `annotations[7]` and its id) and, for an
annotation, its image. Each image file is decoded up front too (`vision.data.image_check`:
it exists, is complete and decodable, is not over PIL's decompression-bomb limit, and has the
size the JSON records, the size displayed with its EXIF orientation), so bad files are
reported by name before any training starts, or left out with their annotations
(``skip_bad_images``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os

import numpy as np

from tfx_transformer import checks
from vision.data.image_check import check_images, write_cache

__all__ = ["CocoData", "CocoImage", "read_coco", "split_images"]

_LISTED = 3  # bad image files named in the error


def _no_boxes() -> np.ndarray:
    return np.zeros((0, 4), np.float32)


def _no_labels() -> np.ndarray:
    return np.zeros((0,), np.int32)


@dataclasses.dataclass(frozen=True)
class CocoImage:
    """One image and its kept boxes.

    Attributes:
        image_id: The COCO image id.
        file_name: The file name the JSON records (relative to the images folder).
        path: Path of the image file.
        height: Image height in pixels.
        width: Image width in pixels.
        boxes: (N, 4) float32 absolute pixel `(x0, y0, x1, y1)` (no crowd boxes).
        labels: (N,) int32 contiguous labels.
        crowd_boxes: (K, 4) float32 boxes of the crowd annotations (clipped like `boxes`).
        crowd_labels: (K,) int32 their labels.
    """

    image_id: int
    file_name: str
    path: str
    height: int
    width: int
    boxes: np.ndarray
    labels: np.ndarray
    crowd_boxes: np.ndarray = dataclasses.field(default_factory=_no_boxes)
    crowd_labels: np.ndarray = dataclasses.field(default_factory=_no_labels)


@dataclasses.dataclass(frozen=True)
class CocoData:
    """A COCO-format data set.

    Attributes:
        images: The images in file order.
        class_names: Name of each contiguous label.
        category_ids: The COCO category id of each contiguous label.
        skipped: ``(path, reason)`` of each image file left out (``skip_bad_images``).
        skipped_annotations: Number of annotations of those images.
    """

    images: tuple[CocoImage, ...]
    class_names: tuple[str, ...]
    category_ids: tuple[int, ...]
    skipped: tuple[tuple[str, str], ...] = ()
    skipped_annotations: int = 0


def _short(value, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _load_json(path: str) -> dict:
    if os.path.isdir(path):
        raise ValueError(f"COCO annotations path is a folder, not a JSON file: {path!r}")
    if not os.path.isfile(path):
        raise ValueError(f"COCO annotations file not found. Received: path={path!r}")
    try:
        with open(path, "rb") as f:
            content = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{path}: not a valid JSON file ({error}).") from None
    if not isinstance(content, dict) or not isinstance(content.get("images"), list):
        raise ValueError(f"{path}: not a COCO annotations file (no 'images' list).")
    for key in ("annotations", "categories"):
        if content.get(key) is not None and not isinstance(content[key], list):
            raise ValueError(f"{path}: '{key}' must be a list. Received: "
                             f"{type(content[key]).__name__} {_short(content[key])}")
    if not content["images"]:
        raise ValueError(f"{path}: 'images' is empty: no images to train on or to score.")
    return content


def _check_images(path: str, images: list) -> None:
    for i, entry in enumerate(images):
        where = f"{path}: images[{i}]"
        if not isinstance(entry, dict):
            raise ValueError(f"{where} must be an object. Received: {_short(entry)}")
        if not _is_int(entry.get("id")):
            raise ValueError(f"{where} needs an integer 'id'. Received: {_short(entry)}")
        name = entry.get("file_name")
        if not isinstance(name, str) or not name:
            raise ValueError(f"{where} (id {entry['id']}) needs a 'file_name' string. "
                             f"Received: {_short(entry)}")
        for key in ("width", "height"):
            if key in entry and not (_is_int(entry[key]) and entry[key] > 0):
                raise ValueError(f"{where} ({name!r}) has {key}={entry[key]!r}; expected a "
                                 "positive integer.")
    ids = [entry["id"] for entry in images]
    if len(set(ids)) != len(ids):
        seen: set[int] = set()
        duplicate = next(i for i in ids if i in seen or seen.add(i))
        raise ValueError(f"{path}: image ids are not unique (id {duplicate} is repeated).")


def _categories(path: str, categories: list) -> list[dict]:
    for i, entry in enumerate(categories):
        if not isinstance(entry, dict) or not _is_int(entry.get("id")):
            raise ValueError(f"{path}: categories[{i}] must be an object with an integer 'id'. "
                             f"Received: {_short(entry)}")
    ids = [entry["id"] for entry in categories]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{path}: category ids are not unique. Received: ids={ids}")
    if not categories:
        raise ValueError(f"{path}: 'categories' is empty: no classes to detect.")
    return sorted(categories, key=lambda c: c["id"])


def _check_annotation(where: str, annotation: dict) -> None:
    if "bbox" not in annotation:
        raise ValueError(f"{where} has no 'bbox'; expected [x, y, width, height].")
    bbox = annotation["bbox"]
    if not isinstance(bbox, (list, tuple)) or len(bbox) != 4 or not all(map(_is_number, bbox)):
        raise ValueError(f"{where} has bbox={_short(bbox)}; expected [x, y, width, height], "
                         "four finite numbers.")
    if annotation.get("iscrowd", 0) not in (0, 1):  # False and True compare equal to 0 and 1
        raise ValueError(f"{where} has iscrowd={_short(annotation['iscrowd'])}; expected 0 or 1.")


def _annotations_by_image(path: str, content: dict, labels_of: dict) -> dict[int, list[dict]]:
    """The annotations of each image id, each checked (errors name its index and image)."""
    names = {image["id"]: image["file_name"] for image in content["images"]}
    by_image: dict[int, list[dict]] = {image_id: [] for image_id in names}
    for i, annotation in enumerate(content.get("annotations") or []):
        where = f"{path}: annotations[{i}]"
        if not isinstance(annotation, dict):
            raise ValueError(f"{where} must be an object. Received: {_short(annotation)}")
        where += f" (id {annotation.get('id')!r})"
        image_id = annotation.get("image_id")
        if not _is_int(image_id) or image_id not in by_image:
            raise ValueError(f"{where} names unknown image_id={_short(image_id)}.")
        where += f" of image {names[image_id]!r}"
        category_id = annotation.get("category_id")
        if not _is_int(category_id) or category_id not in labels_of:
            raise ValueError(f"{where} names unknown category_id={_short(category_id)}; the "
                             f"file's category ids: {sorted(labels_of)}.")
        _check_annotation(where, annotation)
        by_image[image_id].append(annotation)
    return by_image


def _boxes(annotations: list[dict], height: int, width: int, labels_of: dict):
    """`(boxes, labels, crowd_boxes, crowd_labels)` of one image's checked annotations."""
    kept: dict[bool, tuple[list, list]] = {False: ([], []), True: ([], [])}
    for annotation in annotations:
        x, y, w, h = (float(v) for v in annotation["bbox"])
        x0, y0 = min(max(x, 0.0), width), min(max(y, 0.0), height)
        x1, y1 = min(max(x + w, 0.0), width), min(max(y + h, 0.0), height)
        if x1 <= x0 or y1 <= y0:
            continue
        boxes, labels = kept[bool(annotation.get("iscrowd", 0))]
        boxes.append((x0, y0, x1, y1))
        labels.append(labels_of[annotation["category_id"]])
    return tuple(
        array
        for boxes, labels in (kept[False], kept[True])
        for array in (np.array(boxes, np.float32).reshape(-1, 4), np.array(labels, np.int32))
    )


def _bad_files_error(annotations_path: str, problems: dict, total: int) -> ValueError:
    listed = "; ".join(f"{path!r}: {reason}" for path, reason in list(problems.items())[:_LISTED])
    more = f"; and {len(problems) - _LISTED} more" if len(problems) > _LISTED else ""
    return ValueError(
        f"{len(problems)} of the {total} image files of {annotations_path} cannot be used: "
        f"{listed}{more}. Replace or remove them, or leave them out with their annotations "
        "(--skip-bad-images, `skip_bad_images=True`).")


def read_coco(images_dir: str, annotations_path: str, *, check_files: bool = True,
              skip_bad_images: bool = False, cache: str | os.PathLike | None = None,
              progress: bool = True) -> CocoData:
    """Reads a COCO-format annotations file and the images it lists.

    Args:
        images_dir: Folder the images' `file_name`s are relative to.
        annotations_path: The annotations JSON (`images`, `annotations`, `categories`).
        check_files: Decode every image file once (in parallel threads,
            `vision.data.image_check.check_images`) to check that it exists, decodes and has
            the recorded size. Turn off only for trusted, very large sets.
        skip_bad_images: Leave out the image files that cannot be used (missing, not
            decodable, truncated, over the decompression-bomb limit) and their annotations,
            recorded in `CocoData.skipped`, instead of raising.
        cache: The check's cache file (`vision.data.image_check.CACHE_FILE`), or None. It is
            written only when the data is read without error.
        progress: Show the check's progress bar.

    Returns:
        The `CocoData`.

    Raises:
        ValueError: Missing or malformed JSON (no images, an entry that is not an object, an
            image without `file_name`, an annotation without a valid `bbox` or naming an
            unknown image or category, ...; the message names the file, the entry's index and
            its image); image files that cannot be used (without ``skip_bad_images``: the
            first few named, and their count), or one whose size differs from the JSON's
            `width`/`height` (boxes would not match it; named).
    """
    images_dir, annotations_path = os.fspath(images_dir), os.fspath(annotations_path)
    content = _load_json(annotations_path)
    _check_images(annotations_path, content["images"])
    categories = _categories(annotations_path, content.get("categories") or [])
    labels_of = {c["id"]: i for i, c in enumerate(categories)}
    by_image = _annotations_by_image(annotations_path, content, labels_of)

    paths = [os.path.join(images_dir, image["file_name"]) for image in content["images"]]
    problems: dict[str, str] = {}
    checked = None
    if check_files:
        checked = check_images(paths, cache=cache, progress=progress)
        found, problems = checked.sizes, checked.problems
        if problems and not skip_bad_images:
            raise _bad_files_error(annotations_path, problems, len(set(paths)))
        sizes = [found.get(path, (None, None)) for path in paths]
    else:
        sizes = [(image.get("height"), image.get("width")) for image in content["images"]]
    images, skipped_annotations = [], 0
    for image, path, (height, width) in zip(content["images"], paths, sizes):
        if path in problems:
            skipped_annotations += len(by_image[image["id"]])
            continue
        if height is None or width is None:
            raise ValueError(f"{annotations_path}: image {path!r} records no width and height "
                             "(needed with check_files=False).")
        recorded = (image.get("height", height), image.get("width", width))
        if recorded != (height, width):
            raise ValueError(
                f"Image file {path!r} is {width}x{height} pixels (as displayed: EXIF "
                f"orientation applied) but {annotations_path} records {recorded[1]}x"
                f"{recorded[0]} (width x height); its boxes would not match."
            )
        boxes, labels, crowd_boxes, crowd_labels = _boxes(
            by_image[image["id"]], height, width, labels_of)
        images.append(CocoImage(image["id"], image["file_name"], path, height, width, boxes,
                                labels, crowd_boxes, crowd_labels))
    if checked is not None and cache is not None:
        write_cache(cache, checked)
    return CocoData(
        images=tuple(images),
        class_names=tuple(str(c.get("name", c["id"])) for c in categories),
        category_ids=tuple(c["id"] for c in categories),
        skipped=tuple(problems.items()),
        skipped_annotations=skipped_annotations,
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
    checks.fraction("valid_fraction", valid_fraction)
    ranked = sorted(range(len(images)), key=lambda i: (_hash(images[i].file_name), i))
    count = max(min(math.ceil(valid_fraction * len(images)), len(images) - 1), 0)
    held_out = set(ranked[:count])
    train = tuple(image for i, image in enumerate(images) if i not in held_out)
    valid = tuple(image for i, image in enumerate(images) if i in held_out)
    return train, valid
