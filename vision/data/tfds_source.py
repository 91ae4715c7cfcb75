"""`tfds:NAME` detection data: TensorFlow Datasets builders with `objects/bbox` and `labels`.

Tested with `coco/2017` and `voc/2007` (under `tfds.testing.mock_data`). Boxes come as
normalized `(ymin, xmin, ymax, xmax)`; they become absolute pixel `(x0, y0, x1, y1)`, clipped to
the image, and empty boxes are dropped; crowd boxes (where `objects/is_crowd` exists) are no
training targets but the records' `crowd_boxes`/`crowd_labels`, for the evaluation. The data
must already be prepared in `data_dir`: nothing is downloaded.
"""

from __future__ import annotations

from collections.abc import Callable

import tensorflow as tf

__all__ = ["tfds_record", "tfds_splits"]

# The builders' split used for our "valid" split.
VALID_SPLIT = "validation"


def tfds_record(example: dict) -> dict:
    """Converts one TFDS detection example to a record (see `vision.data.sources`)."""
    image = example["image"]
    shape = tf.cast(tf.shape(image), tf.float32)
    fields = ["bbox", "label"] + (["is_crowd"] if "is_crowd" in example["objects"] else [])
    # All object fields have one length in real data; `tfds.testing.mock_data` draws each length
    # independently, so take the common prefix (a no-op on real data).
    count = tf.reduce_min([tf.shape(example["objects"][key])[0] for key in fields])
    objects = {key: example["objects"][key][:count] for key in fields}
    ymin, xmin, ymax, xmax = tf.unstack(tf.reshape(objects["bbox"], [-1, 4]), num=4, axis=-1)
    boxes = tf.stack([xmin * shape[1], ymin * shape[0], xmax * shape[1], ymax * shape[0]], -1)
    boxes = tf.clip_by_value(boxes, 0.0, tf.stack([shape[1], shape[0], shape[1], shape[0]]))
    keep = tf.logical_and(boxes[:, 2] > boxes[:, 0], boxes[:, 3] > boxes[:, 1])
    crowd = tf.zeros_like(keep)
    if "is_crowd" in objects:
        crowd = tf.logical_and(keep, tf.cast(objects["is_crowd"], tf.bool))
        keep = tf.logical_and(keep, tf.logical_not(crowd))
    labels = tf.cast(objects["label"], tf.int32)
    if "image/id" in example:
        image_id = tf.cast(example["image/id"], tf.int64)
    else:  # e.g. VOC: a stable id from the file name, exact in float64 (JSON, pycocotools).
        image_id = tf.strings.to_hash_bucket_fast(example["image/filename"], 2**53)
    return {
        "image": image,
        "boxes": tf.boolean_mask(boxes, keep),
        "labels": tf.boolean_mask(labels, keep),
        "image_id": image_id,
        "crowd_boxes": tf.boolean_mask(boxes, crowd),
        "crowd_labels": tf.boolean_mask(labels, crowd),
    }


def tfds_splits(
    name: str, data_dir: str | None = None
) -> tuple[tuple[str, ...], dict[str, Callable[[bool, int], tf.data.Dataset]]]:
    """Class names and the record builders `build(shuffle, seed)` of "train" and "valid".

    Args:
        name: TFDS name, e.g. "coco/2017".
        data_dir: TFDS data directory (default: TFDS's own).

    Raises:
        ValueError: Unknown name, not a detection data set, or data not prepared.
    """
    import tensorflow_datasets as tfds  # Heavy import, only for `tfds:` data.

    spec = f"tfds:{name}"
    try:
        builder = tfds.builder(name, data_dir=data_dir)
    except tfds.core.registered.DatasetNotFoundError:
        # Its own message lists every dataset TFDS knows: thousands of lines.
        raise ValueError(
            f"TensorFlow Datasets has no dataset {name!r}. Received: --data {spec!r}"
        ) from None
    features = builder.info.features
    objects = features["objects"] if "objects" in features else {}
    if "image" not in features or "bbox" not in objects or "label" not in objects:
        raise ValueError(
            f"`{spec}` is not a detection dataset: it needs image, objects/bbox and objects/label."
        )

    def builder_of(tfds_split: str) -> Callable[[bool, int], tf.data.Dataset]:
        def build(shuffle: bool, seed: int) -> tf.data.Dataset:
            try:
                ds = tfds.load(
                    name, split=tfds_split, data_dir=data_dir, download=False,
                    shuffle_files=shuffle, read_config=tfds.ReadConfig(shuffle_seed=seed),
                )
            except AssertionError as error:  # TFDS's "could not find data".
                raise ValueError(
                    f"`{spec}` split {tfds_split!r} is not prepared in data_dir={data_dir!r} "
                    f"(nothing is downloaded): {error}"
                ) from None
            # Files are shuffled; a small buffer of decoded images mixes them further.
            ds = ds.shuffle(64, seed=seed, reshuffle_each_iteration=True) if shuffle else ds
            return ds.map(tfds_record, num_parallel_calls=tf.data.AUTOTUNE)

        build(False, 0)  # Fails now, not at the first batch, when the data is missing.
        return build

    splits = {"train": builder_of("train"), "valid": builder_of(VALID_SPLIT)}
    return tuple(objects["label"].names), splits
