"""Tests of detection augmentation and batching (`vision.data.augment`, `vision.data.batching`)
and the tfds sources under mock data."""

import tempfile

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from vision.data import augment
from vision.data import sources as data
from vision.data.batching import ObjectLimit, make_batches

MEAN, STD = np.array(augment.IMAGENET_MEAN), np.array(augment.IMAGENET_STD)


def test_horizontal_flip_maps_boxes():
    image = np.arange(4 * 6 * 3, dtype=np.float32).reshape(4, 6, 3)
    boxes = np.array([[1, 0, 3, 2], [0, 1, 6, 4]], np.float32)
    flipped, flipped_boxes = augment.horizontal_flip(image, boxes)
    np.testing.assert_array_equal(flipped, image[:, ::-1])
    np.testing.assert_allclose(flipped_boxes, [[3, 0, 5, 2], [0, 1, 6, 4]])  # x -> 6 - x


def test_crop_clips_and_drops_boxes():
    image = np.random.default_rng(0).random((20, 20, 3)).astype(np.float32)
    boxes = np.array(
        [[4, 3, 8, 6], [0, 0, 5, 4], [15, 15, 19, 19], [1, 5, 3, 9], [5, 9, 9, 16]], np.float32
    )
    labels = np.array([0, 1, 2, 3, 4], np.int32)
    cropped, kept_boxes, kept = augment.crop(image, boxes, labels, 2, 3, 10, 8)
    np.testing.assert_array_equal(cropped, image[2:12, 3:11])
    # Shifted by (3, 2), clipped to 8 x 10; box 2 (outside) and box 3 (left of the crop:
    # zero width after clipping) dropped.
    np.testing.assert_allclose(kept_boxes, [[1, 1, 5, 4], [0, 0, 2, 2], [2, 7, 6, 10]])
    np.testing.assert_array_equal(kept, [0, 1, 4])


def _detr_size(h, w, size, max_size=None):  # facebookresearch/detr get_size_with_aspect_ratio
    if max_size is not None:
        small, large = float(min(h, w)), float(max(h, w))
        if large / small * size > max_size:
            size = int(round(max_size * small / large))
    if (w <= h and w == size) or (h <= w and h == size):
        return h, w
    return (int(size * h / w), size) if w < h else (size, int(size * w / h))


def test_resized_shape_matches_detr():
    for h, w in [(480, 640), (640, 480), (333, 1000), (30, 40), (50, 20), (100, 100)]:
        for size, max_size in [(800, 1333), (128, 213), (77, None), (600, None)]:
            got = augment.resized_shape(h, w, size, max_size)
            assert tuple(int(v) for v in got) == _detr_size(h, w, size, max_size), (h, w, size)
    assert augment.DetrSizes.scaled(800) == augment.DetrSizes()
    sizes = augment.DetrSizes.scaled(128)
    assert sizes.scales[0] == 77 and sizes.scales[-1] == 128 and sizes.max_size == 213


def _records(images, boxes, labels):
    def gen():
        for i, (im, b, lab) in enumerate(zip(images, boxes, labels)):
            yield {"image": im, "boxes": np.float32(b).reshape(-1, 4),
                   "labels": np.int32(lab), "image_id": np.int64(i)}

    return tf.data.Dataset.from_generator(gen, output_signature={
        "image": tf.TensorSpec([None, None, 3], tf.uint8),
        "boxes": tf.TensorSpec([None, 4], tf.float32),
        "labels": tf.TensorSpec([None], tf.int32),
        "image_id": tf.TensorSpec([], tf.int64),
    })


def test_padded_batch_masks_real_pixels_and_normalizes_boxes():
    sizes = [(30, 40), (50, 20), (25, 25)]  # (height, width)
    images = [np.full((h, w, 3), 10 * (i + 1), np.uint8) for i, (h, w) in enumerate(sizes)]
    boxes = [[[4, 3, 20, 15]], [[0, 0, 20, 50], [2, 10, 4, 30]], []]
    labels = [[2], [0, 1], []]
    batches = make_batches(_records(images, boxes, labels), batch_size=3,
                           object_limit=ObjectLimit(4), image_size=25, include_info=True)
    inputs, targets, info = next(iter(batches))
    expected_sizes = [_detr_size(h, w, 25, round(1333 * 25 / 800)) for h, w in sizes]
    np.testing.assert_array_equal(info["size"], expected_sizes)
    np.testing.assert_array_equal(info["orig_size"], sizes)
    np.testing.assert_array_equal(info["image_id"], [0, 1, 2])
    height, width = max(h for h, _ in expected_sizes), max(w for _, w in expected_sizes)
    assert inputs["images"].shape == (3, height, width, 3) and inputs["mask"].dtype == tf.bool
    for i, (h, w) in enumerate(expected_sizes):
        real = np.zeros((height, width), bool)
        real[:h, :w] = True
        np.testing.assert_array_equal(inputs["mask"][i], real)
        pixels = inputs["images"][i].numpy()
        np.testing.assert_allclose(pixels[:h, :w], np.broadcast_to(
            (10 * (i + 1) / 255 - MEAN) / STD, (h, w, 3)), atol=1e-5)
        assert np.all(pixels[~real] == 0)
    # Normalized (cx, cy, w, h) of the unpadded image do not change under the resize.
    np.testing.assert_allclose(targets["boxes"][0, 0], [12 / 40, 9 / 30, 16 / 40, 12 / 30],
                               atol=1e-6)
    np.testing.assert_allclose(targets["boxes"][1, :2], [[0.5, 0.5, 1, 1], [0.15, 0.4, 0.1, 0.4]],
                               atol=1e-6)
    np.testing.assert_array_equal(targets["valid"], [[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 0, 0]])
    np.testing.assert_array_equal(targets["labels"], [[2, 0, 0, 0], [0, 1, 0, 0], [0, 0, 0, 0]])
    fixed = make_batches(_records(images, boxes, labels), batch_size=2, object_limit=ObjectLimit(4),
                         image_size=25, pad_to=(48, 48), drop_remainder=True)
    assert [x["mask"].shape for x, _ in fixed] == [(2, 48, 48)]


def test_fixed_size_batches_stretch_every_image_and_keep_the_normalized_boxes():
    """RT-DETR's batches (`FixedSize`): every image resized to 16 x 24 whatever its aspect,
    scaled by 1/255 and not ImageNet-normalized, the mask all True; the boxes normalized to
    the image, which the stretch leaves as they are. With flips (training) a flipped image's
    boxes are mirrored."""
    sizes = [(30, 40), (50, 20)]
    images = [np.random.default_rng(i).integers(0, 256, (h, w, 3), dtype=np.uint8)
              for i, (h, w) in enumerate(sizes)]
    boxes, labels = [[[4, 3, 20, 15]], [[0, 0, 20, 50]]], [[2], [0]]
    size = augment.FixedSize(16, 24)
    inputs, targets = next(iter(make_batches(_records(images, boxes, labels), batch_size=2,
                                             object_limit=ObjectLimit(2), image_size=size)))
    assert inputs["images"].shape == (2, 16, 24, 3) and bool(tf.reduce_all(inputs["mask"]))
    for i, image in enumerate(images):
        np.testing.assert_allclose(inputs["images"][i], size(image), atol=1e-6)
        np.testing.assert_allclose(inputs["images"][i], tf.image.resize(
            image, [16, 24], antialias=True) / 255, atol=1e-6)
    np.testing.assert_allclose(targets["boxes"][:, 0], [[12 / 40, 9 / 30, 16 / 40, 12 / 30],
                                                        [0.5, 0.5, 1, 1]], atol=1e-6)
    flipped = make_batches(_records(images, boxes, labels), batch_size=2, training=True,
                           object_limit=ObjectLimit(2), image_size=size, augmentation="flip")
    seen = set()
    for _ in range(4):  # each pass is a new epoch, flipped anew
        inputs, targets = next(iter(flipped))
        for i, image in enumerate(images):
            plain = np.asarray(size(image))
            mirrored = np.allclose(inputs["images"][i], plain[:, ::-1], atol=1e-5)
            assert mirrored or np.allclose(inputs["images"][i], plain, atol=1e-5)
            seen.add(mirrored)
            cx = targets["boxes"][i, 0, 0]
            want = [12 / 40, 0.5][i]
            np.testing.assert_allclose(cx, 1 - want if mirrored else want, atol=1e-6)
    assert seen == {True, False}  # some image flipped, some not


def test_training_batches_are_augmented_reproducibly():
    source = data.load_source("embedded", num_train=8, num_valid=4, embedded_size=64)
    kwargs = dict(batch_size=4, object_limit=ObjectLimit(6), image_size=64, seed=3)
    batches = source.batches("train", **kwargs)
    spec = batches.element_spec
    assert spec[0]["images"].shape.as_list() == [None, None, None, 3]
    assert spec[1]["labels"].dtype == tf.int32 and spec[1]["valid"].dtype == tf.bool
    first = [(x["images"].numpy(), y["boxes"].numpy()) for x, y in batches]
    again = [(x["images"].numpy(), y["boxes"].numpy()) for x, y in
             source.batches("train", **kwargs)]
    assert all(np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
               for a, b in zip(first, again))
    shapes = {images.shape[1:3] for images, _ in first}
    assert all(38 <= min(s) and max(s) <= 107 for s in shapes)  # scales 38..64, cap 107
    for x, y in batches:
        boxes = y["boxes"].numpy()[y["valid"].numpy()]
        assert np.all((boxes >= 0) & (boxes <= 1)) and np.all(boxes[:, 2:] > 0)


def test_flip_and_no_augmentation_keep_the_evaluation_resize():
    source = data.load_source("embedded", num_train=8, num_valid=4, embedded_size=64)
    kwargs = dict(batch_size=8, object_limit=ObjectLimit(6), image_size=48, seed=5)

    def batch(**more):  # unshuffled records, so that the batches can be compared
        return next(iter(make_batches(source.records("train"), **kwargs, **more)))

    plain = batch()
    none = batch(training=True, augmentation="none")
    np.testing.assert_array_equal(none[0]["images"], plain[0]["images"])
    np.testing.assert_array_equal(none[1]["boxes"], plain[1]["boxes"])
    flipped = batch(training=True, augmentation="flip")
    assert flipped[0]["images"].shape == plain[0]["images"].shape  # no scale, no crop
    mirrored = 0
    for i in range(8):
        image, plain_image = flipped[0]["images"][i].numpy(), plain[0]["images"][i].numpy()
        boxes, plain_boxes = flipped[1]["boxes"][i].numpy(), plain[1]["boxes"][i].numpy()
        valid = plain[1]["valid"][i].numpy()
        if np.array_equal(image, plain_image[:, ::-1]) and not np.array_equal(image, plain_image):
            mirrored += 1
            plain_boxes[:, 0] = 1 - plain_boxes[:, 0]  # cx mirrors; cy, w, h stay
        else:
            np.testing.assert_array_equal(image, plain_image)
        np.testing.assert_allclose(boxes[valid], plain_boxes[valid], atol=1e-6)
    assert 0 < mirrored < 8
    with pytest.raises(ValueError, match="augmentation"):
        make_batches(source.records("train"), augmentation="crop", **kwargs)


def _expected_tfds(example, crowd_key):
    h, w = example["image"].shape[:2]
    # Mock data draws each object field's length independently: the common prefix counts.
    keys = ["bbox", "label"] + ([crowd_key] if crowd_key else [])
    n = min(len(example["objects"][key]) for key in keys)
    objects = {key: example["objects"][key][:n] for key in keys}
    ymin, xmin, ymax, xmax = objects["bbox"].T
    boxes = np.stack([xmin * w, ymin * h, xmax * w, ymax * h], -1)
    boxes = np.clip(boxes, 0, [w, h, w, h])
    keep = (boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])
    crowd = keep & objects[crowd_key] if crowd_key else np.zeros_like(keep)
    keep &= ~crowd
    return boxes[keep], objects["label"][keep], boxes[crowd], objects["label"][crowd]


@pytest.mark.parametrize("name, num_classes, crowd", [("coco/2017", 80, "is_crowd"),
                                                      ("voc/2007", 20, None)])
def test_tfds_sources_under_mock_data(name, num_classes, crowd, tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # TFDS's info folders go here
    with tfds.testing.mock_data(num_examples=4):
        source = data.load_source(f"tfds:{name}")
        records = list(source.records("valid").as_numpy_iterator())
        raw = list(tfds.load(name, split="validation").as_numpy_iterator())
        x, y = next(iter(source.batches("train", batch_size=2, object_limit=ObjectLimit(50),
                                        image_size=32)))
    assert source.num_classes == num_classes and len(source.class_names) == num_classes
    assert len(records) == len(raw) == 4
    dropped = 0
    for record, example in zip(records, raw):
        boxes, labels, crowd_boxes, crowd_labels = _expected_tfds(example, crowd)
        dropped += min(len(example["objects"][k]) for k in ("bbox", "label")) - len(labels)
        np.testing.assert_array_equal(record["image"], example["image"])
        np.testing.assert_allclose(record["boxes"], boxes, rtol=1e-6)
        np.testing.assert_array_equal(record["labels"], labels)
        # Crowd boxes are no targets but kept apart for the evaluation.
        np.testing.assert_allclose(record["crowd_boxes"].reshape(-1, 4), crowd_boxes, rtol=1e-6)
        np.testing.assert_array_equal(record["crowd_labels"], crowd_labels)
        if crowd:
            assert record["image_id"] == example["image/id"]
    assert dropped > 0  # mock boxes are random: some are crowd or inverted
    assert x["images"].shape[0] == 2 and y["boxes"].shape[1:] == (50, 4)
