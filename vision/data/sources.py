"""Detection data: `--data` sources and padded, augmented batches for Keras `fit`.

Data specs:

- `embedded`: the synthetic shapes of `vision.data.shapes` (3 classes), generated on the fly.
- `coco:IMAGES_DIR:ANNOTATIONS.json`: COCO-format files (`vision.data.coco`); a deterministic
  `valid_fraction` of the images is held out for validation. Each file is decoded as displayed
  (`vision.data.decode`: EXIF orientation applied) and, with `max_side`, shrunk on read to that
  longer side, its boxes with it.
- `tfds:NAME`: a TensorFlow Datasets detection set with `objects/bbox` and `objects/label`,
  e.g. `tfds:coco/2017` or `tfds:voc/2007`; crowd boxes (`objects/is_crowd`) are dropped. Its
  "train" and "validation" splits are used; it must already be prepared in `data_dir`.

Splits are "train", "valid" and "all" (train followed by valid). A split's *records* are
`{"image": (H, W, 3) uint8, "boxes": (N, 4) float32 absolute pixel (x0, y0, x1, y1),
"labels": (N,) int32, "image_id": () int64, "crowd_boxes": (K, 4) float32, "crowd_labels":
(K,) int32}`. `boxes`/`labels` are the training targets; the crowd regions (COCO's
`iscrowd = 1`, TFDS's `objects/is_crowd`; none for `embedded`) are no targets, and only the
evaluation reads them (`vision.training.evaluate`: COCO ignores detections on them).
`vision.data.batching.make_batches` turns records into Keras elements, and
`DetectionSource.batches` does both steps.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterable

import numpy as np
import tensorflow as tf

from tfx_transformer import checks, data_spec
from tfx_transformer.data_spec import DataSpec
from vision.data import coco, decode, shapes, tfds_source
from vision.data.batching import ObjectLimit, TooManyObjectsError, make_batches

__all__ = [
    "EMBEDDED_VALID_ID_OFFSET",
    "SCHEMES",
    "SPLITS",
    "DetectionSource",
    "evaluation_split",
    "load_source",
    "parse_data_spec",
]

# scheme -> its parts
SCHEMES = {"embedded": (), "coco": ("IMAGES_DIR", "ANNOTATIONS.json"), "tfds": ("NAME",)}
SPLITS = ("train", "valid", "all")
# `embedded` validation image ids start here, so ids stay unique over the "all" split.
EMBEDDED_VALID_ID_OFFSET = 1_000_000


def parse_data_spec(spec: str) -> DataSpec:
    """Splits a `--data` spec: "embedded", "coco:IMAGES_DIR:ANNOTATIONS.json" or "tfds:NAME".

    Returns:
        `(scheme, parts)`: `("embedded", ())`, `("coco", (images_dir, annotations_path))` or
        `("tfds", (name,))`.

    Raises:
        ValueError: For an unknown scheme (naming it and the accepted ones) or bad arguments
            (naming `--data` and `spec`).
    """
    return data_spec.parse_data_spec(spec, SCHEMES)


def evaluation_split(spec: str) -> str:
    """The split evaluation scores: every image of a `coco:` source, else the held-out split."""
    return "all" if parse_data_spec(spec)[0] == "coco" else "valid"


@dataclasses.dataclass(frozen=True)
class _Split:
    """How to build one split: `build(shuffle, seed) -> records`, its size, its object counts."""

    build: Callable[[bool, int], tf.data.Dataset]
    size: int | None
    # Yields (image id, description, number of objects); None where counting would mean
    # reading everything.
    counts: Callable[[], Iterable[tuple[int, str, int]]] | None = None
    most_objects: int | None = None  # An upper bound of the counts, if known.


class DetectionSource:
    """A detection data set with "train", "valid" and "all" splits; see `load_source`.

    Attributes:
        spec: The `--data` spec.
        class_names: Name of each label `0..num_classes-1`.
        num_classes: Number of object classes (without the no-object class).
        category_ids: For `coco:` data, the COCO category id of each label, else None.
    """

    def __init__(
        self,
        spec: str,
        class_names: Iterable[str],
        splits: dict[str, _Split],
        category_ids: Iterable[int] | None = None,
    ):
        self.spec = spec
        self.class_names = tuple(class_names)
        self.category_ids = None if category_ids is None else tuple(category_ids)
        train, valid = splits["train"], splits["valid"]
        known = train.counts is not None and valid.counts is not None
        self._splits = dict(splits)
        self._splits["all"] = _Split(
            build=lambda shuffle, seed: train.build(shuffle, seed).concatenate(
                valid.build(shuffle, seed)
            ),
            size=None if train.size is None or valid.size is None else train.size + valid.size,
            counts=(lambda: itertools.chain(train.counts(), valid.counts())) if known else None,
            most_objects=max(train.most_objects, valid.most_objects) if known else None,
        )

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def _split(self, split: str) -> _Split:
        if split not in SPLITS:
            raise ValueError(f"`split` must be one of {SPLITS}. Received: split={split!r}")
        return self._splits[split]

    def num_examples(self, split: str = "train") -> int | None:
        """Number of images of `split`, or None where unknown without reading it (`tfds:`)."""
        return self._split(split).size

    def records(
        self, split: str = "train", *, shuffle: bool = False, seed: int = 0
    ) -> tf.data.Dataset:
        """The decoded records of `split` (format in the module docstring).

        Args:
            split: "train", "valid" or "all".
            shuffle: Shuffle before decoding (a new order each epoch, reproducible by `seed`).
            seed: Shuffle seed.
        """
        return self._split(split).build(shuffle, seed)

    def check_max_objects(self, split: str, max_objects: int) -> None:
        """Raises for the first image of `split` with more than `max_objects` objects.

        Sources whose counts need a full read (`tfds:`) are checked in the pipeline instead
        (`vision.data.batching.ObjectLimit`).

        Raises:
            TooManyObjectsError: naming the image (id and description) and the counts.
        """
        checks.positive_int("max_objects", max_objects)
        info = self._split(split)
        if info.counts is None or info.most_objects <= max_objects:
            return
        for image_id, name, count in info.counts():
            if count > max_objects:
                raise TooManyObjectsError(image_id, count, max_objects, image=name)

    def batches(
        self,
        split: str = "train",
        *,
        batch_size: int,
        object_limit: ObjectLimit,
        training: bool | None = None,
        seed: int = 0,
        **kwargs,
    ) -> tf.data.Dataset:
        """Checks object counts, then `make_batches(self.records(split, ...), ...)`.

        Args:
            split: "train", "valid" or "all".
            batch_size: Images per batch.
            object_limit: Target slots per image (the trainer's `ObjectLimit(num_queries)`);
                images over it that were not counted up front are recorded there.
            training: Shuffle and augment; default True for "train" only.
            seed: Seed of shuffling and augmentation.
            **kwargs: More arguments of `vision.data.batching.make_batches` (`image_size`, ...).

        Raises:
            TooManyObjectsError: For an image with more objects than the limit (see
                `check_max_objects`).
            ValueError: For bad arguments.
        """
        training = split == "train" if training is None else training
        if not isinstance(object_limit, ObjectLimit):
            raise ValueError(
                f"`object_limit` must be an ObjectLimit. Received: object_limit={object_limit!r}"
            )
        self.check_max_objects(split, object_limit.max_objects)
        return make_batches(
            self.records(split, shuffle=training, seed=seed),
            batch_size=batch_size,
            object_limit=object_limit,
            training=training,
            seed=seed,
            **kwargs,
        )


def _shuffled(ds: tf.data.Dataset, size: int, shuffle: bool, seed: int) -> tf.data.Dataset:
    if not shuffle:
        return ds
    return ds.shuffle(max(size, 1), seed=seed, reshuffle_each_iteration=True)


def _embedded_split(generator: shapes.ShapesGenerator, size: int, id_offset: int) -> _Split:
    def example(index):
        ex = generator.example(int(index))
        return ex["image"], ex["boxes"], ex["labels"]

    def load(index):
        image, boxes, labels = tf.numpy_function(
            example, [index], (tf.uint8, tf.float32, tf.int32), stateful=False
        )
        image.set_shape([None, None, 3])
        boxes.set_shape([None, 4])
        labels.set_shape([None])
        return {"image": image, "boxes": boxes, "labels": labels, "image_id": index + id_offset,
                "crowd_boxes": tf.zeros([0, 4], tf.float32),
                "crowd_labels": tf.zeros([0], tf.int32)}

    def build(shuffle, seed):
        ds = _shuffled(tf.data.Dataset.range(size), size, shuffle, seed)
        return ds.map(load, num_parallel_calls=tf.data.AUTOTUNE)

    def counts():
        for i in range(size):
            yield i + id_offset, f"`embedded` {generator.split} image {i}", generator.num_objects(i)

    return _Split(build, size, counts, generator.max_objects)


def _coco_split(images: tuple[coco.CocoImage, ...], max_side: int | None) -> _Split:
    lengths = [len(image.labels) for image in images]

    def ragged(field: str, empty: np.ndarray) -> tf.RaggedTensor:
        values = np.concatenate([empty] + [getattr(im, field) for im in images])
        counts = tf.constant([len(getattr(im, field)) for im in images], tf.int64, [len(images)])
        return tf.RaggedTensor.from_row_lengths(values, counts)

    def build(shuffle, seed):
        # Built on demand, so the tensors live in the graph (or eager context) that asks.
        table = {
            "path": tf.constant([im.path for im in images], tf.string, shape=[len(images)]),
            "image_id": tf.constant([im.image_id for im in images], tf.int64, [len(images)]),
        }
        for field, empty in (("boxes", np.zeros((0, 4), np.float32)),
                             ("labels", np.zeros((0,), np.int32)),
                             ("crowd_boxes", np.zeros((0, 4), np.float32)),
                             ("crowd_labels", np.zeros((0,), np.int32))):
            table[field] = ragged(field, empty)
        ds = _shuffled(tf.data.Dataset.from_tensor_slices(table), len(images), shuffle, seed)
        return ds.map(lambda row: _decode_file(row, max_side),
                      num_parallel_calls=tf.data.AUTOTUNE)

    def counts():
        for image in images:
            yield image.image_id, f"Image {image.path!r}", len(image.labels)

    return _Split(build, len(images), counts, max(lengths, default=0))


def _decode_file(row: dict, max_side: int | None) -> dict:
    image = decode.decode_image(tf.io.read_file(row["path"]))
    boxes, crowd_boxes = row["boxes"], row["crowd_boxes"]
    if max_side is not None:
        image, scale = decode.shrink(image, max_side)  # scale: (2,) (y, x)
        scale = tf.stack([scale[1], scale[0], scale[1], scale[0]])
        boxes, crowd_boxes = boxes * scale, crowd_boxes * scale
    return {"image": image, "image_id": row["image_id"], "boxes": boxes,
            "crowd_boxes": crowd_boxes, "labels": row["labels"],
            "crowd_labels": row["crowd_labels"]}


def load_source(
    spec: str,
    *,
    valid_fraction: float = 0.05,
    seed: int = 0,
    num_train: int = 5000,
    num_valid: int = 500,
    embedded_size: int = 128,
    embedded_min_size: int | None = None,
    data_dir: str | None = None,
    max_side: int | None = None,
    skip_bad_images: bool = False,
    check_cache: str | None = None,
    log: Callable[..., None] = print,
) -> DetectionSource:
    """Opens the detection data named by a `--data` spec.

    Args:
        spec: "embedded", "coco:IMAGES_DIR:ANNOTATIONS.json" or "tfds:NAME".
        valid_fraction: Share of a `coco:` source's images held out for "valid".
        seed: Generator seed of `embedded` (its two splits always differ).
        num_train: `embedded` training images.
        num_valid: `embedded` validation images.
        embedded_size: `embedded` image side (the largest one with `embedded_min_size`).
        embedded_min_size: If set, `embedded` heights and widths vary in
            `[embedded_min_size, embedded_size]`.
        data_dir: TensorFlow Datasets directory for `tfds:`.
        max_side: `coco:` images whose longer side is larger are shrunk to it on read (the
            boxes with them), so the pipeline never holds full-size huge photos. Training
            passes its longest resized side. None: full size.
        skip_bad_images: Leave out `coco:` image files that cannot be used, and their
            annotations (logged with their count), instead of raising.
        check_cache: Cache file of the `coco:` image check (`vision.data.image_check`).
        log: Where the line about skipped images goes.

    Returns:
        The `DetectionSource`.

    Raises:
        ValueError: Unknown scheme, bad arguments, or unusable `coco:` files (named; without
            `skip_bad_images`).
    """
    scheme, arguments = parse_data_spec(spec)
    if scheme == "tfds":
        names, builders = tfds_source.tfds_splits(arguments[0], data_dir)
        return DetectionSource(spec, names, {k: _Split(b, None) for k, b in builders.items()})
    if scheme == "coco":
        checks.positive_int("max_side", max_side, optional=True)
        data = coco.read_coco(*arguments, skip_bad_images=skip_bad_images, cache=check_cache)
        if data.skipped:
            names = ", ".join(repr(path) for path, _ in data.skipped[:3])
            log(f"skipped {len(data.skipped)} bad image files ({names}"
                f"{', ...' if len(data.skipped) > 3 else ''}) and their "
                f"{data.skipped_annotations} annotations")
        train, valid = coco.split_images(data.images, valid_fraction)
        splits = {"train": _coco_split(train, max_side), "valid": _coco_split(valid, max_side)}
        return DetectionSource(spec, data.class_names, splits, category_ids=data.category_ids)
    for name, value in (("num_train", num_train), ("num_valid", num_valid)):
        checks.integer(name, value, minimum=0, maximum=1_000_000)
    make = dict(seed=seed, image_size=embedded_size, min_image_size=embedded_min_size)
    splits = {
        "train": _embedded_split(shapes.ShapesGenerator(split="train", **make), num_train, 0),
        "valid": _embedded_split(
            shapes.ShapesGenerator(split="valid", **make), num_valid, EMBEDDED_VALID_ID_OFFSET
        ),
    }
    return DetectionSource(spec, shapes.CLASS_NAMES, splits)
