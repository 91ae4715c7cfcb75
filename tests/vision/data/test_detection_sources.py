"""Tests of the detection data sources (`vision.data.sources`, `vision.data.coco`): the specs,
COCO files (boxes kept, images decoded, the held-out split, bad files named) and the object
limit of a batch."""
import json

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from vision.data import coco
from vision.data import sources as data
from vision.data.batching import ObjectLimit, TooManyObjectsError, make_batches


def test_unknown_scheme_and_bad_specs():
    with pytest.raises(ValueError, match=r"'csv'.*embedded.*coco:IMAGES_DIR:ANNOTATIONS.*tfds:"):
        data.load_source("csv:/tmp/x.csv")
    with pytest.raises(ValueError, match=r"must be 'coco:IMAGES_DIR:ANNOTATIONS.json'"):
        data.parse_data_spec("coco:/only/images")
    assert data.parse_data_spec("coco:imgs:ann.json") == ("coco", ("imgs", "ann.json"))
    assert data.parse_data_spec("tfds:voc/2007") == ("tfds", ("voc/2007",))
    assert data.evaluation_split("coco:a:b.json") == "all"
    assert data.evaluation_split("embedded") == "valid"
    with pytest.raises(ValueError, match="no dataset 'no_such_dataset_xyz'"):
        data.load_source("tfds:no_such_dataset_xyz")
    with pytest.raises(ValueError, match="split=.*'test'"):
        data.load_source("embedded", num_train=2, num_valid=2).records("test")


def _image(path, mode, size, colour):
    Image.new(mode, size, colour).save(path)
    return path.name


@pytest.fixture()
def coco_files(tmp_path):
    """Four images (JPEG RGB, PNG grayscale, PNG RGBA, PNG without boxes) and their JSON."""
    names = [
        _image(tmp_path / "rgb.jpg", "RGB", (40, 30), (200, 40, 10)),  # (width, height)
        _image(tmp_path / "gray.png", "L", (20, 50), 77),
        _image(tmp_path / "rgba.png", "RGBA", (25, 25), (10, 20, 30, 40)),
        _image(tmp_path / "empty.png", "RGB", (16, 12), (1, 2, 3)),
    ]
    sizes = [(40, 30), (20, 50), (25, 25), (16, 12)]
    images = [
        {"id": 10 + i, "file_name": n, "width": w, "height": h}
        for i, (n, (w, h)) in enumerate(zip(names, sizes))
    ]
    boxes = [  # (image_id, category_id, bbox, iscrowd)
        (10, 7, [5, 6, 10, 8], 0),  # kept: (5, 6, 15, 14)
        (10, 3, [35.5, 20, 10, 20], 0),  # clipped to (35.5, 20, 40, 30)
        (10, 3, [1, 1, 5, 5], 1),  # crowd: no target, kept apart
        (10, 11, [10, 10, 0, 5], 0),  # zero width: dropped
        (10, 11, [45, 5, 5, 5], 0),  # right of the image: empty after clipping, dropped
        (11, 11, [2, 3, 4, 40], 0),  # kept: (2, 3, 6, 43)
        (12, 3, [-4, 0, 10, 10], 0),  # clipped to (0, 0, 6, 10)
    ]
    annotations = [
        {"id": i, "image_id": im, "category_id": c, "bbox": b, "iscrowd": crowd, "area": 1.0}
        for i, (im, c, b, crowd) in enumerate(boxes)
    ]
    categories = [{"id": 7, "name": "dog"}, {"id": 3, "name": "cat"}, {"id": 11, "name": "bird"}]
    path = tmp_path / "ann.json"
    content = {"images": images, "annotations": annotations, "categories": categories}
    path.write_text(json.dumps(content))
    return tmp_path, path, content


def test_coco_reader_keeps_exactly_the_valid_boxes(coco_files):
    folder, path, _ = coco_files
    result = coco.read_coco(folder, path)
    assert result.class_names == ("cat", "dog", "bird") and result.category_ids == (3, 7, 11)
    by_name = {image.file_name: image for image in result.images}
    assert [image.image_id for image in result.images] == [10, 11, 12, 13]
    np.testing.assert_allclose(by_name["rgb.jpg"].boxes, [[5, 6, 15, 14], [35.5, 20, 40, 30]])
    np.testing.assert_array_equal(by_name["rgb.jpg"].labels, [1, 0])
    # The crowd box is no target, but kept apart for the evaluation.
    np.testing.assert_allclose(by_name["rgb.jpg"].crowd_boxes, [[1, 1, 6, 6]])
    np.testing.assert_array_equal(by_name["rgb.jpg"].crowd_labels, [0])
    assert by_name["gray.png"].crowd_boxes.shape == (0, 4)
    np.testing.assert_allclose(by_name["gray.png"].boxes, [[2, 3, 6, 43]])
    np.testing.assert_array_equal(by_name["gray.png"].labels, [2])
    np.testing.assert_allclose(by_name["rgba.png"].boxes, [[0, 0, 6, 10]])
    assert by_name["empty.png"].boxes.shape == (0, 4) and by_name["empty.png"].labels.shape == (0,)
    assert (by_name["gray.png"].height, by_name["gray.png"].width) == (50, 20)


def test_coco_source_decodes_any_image_to_rgb(coco_files):
    folder, path, _ = coco_files
    source = data.load_source(f"coco:{folder}:{path}", valid_fraction=0.0)
    assert source.num_classes == 3 and source.num_examples("valid") == 0
    records = {int(r["image_id"]): r for r in source.records("all").as_numpy_iterator()}
    assert sorted(records) == [10, 11, 12, 13]
    assert records[10]["image"].shape == (30, 40, 3)
    np.testing.assert_allclose(records[10]["image"].mean(axis=(0, 1)), (200, 40, 10), atol=3)
    assert np.all(records[11]["image"] == 77) and records[11]["image"].shape == (50, 20, 3)
    assert np.all(records[12]["image"] == (10, 20, 30))  # alpha dropped
    assert records[13]["boxes"].shape == (0, 4)
    np.testing.assert_allclose(records[10]["boxes"], [[5, 6, 15, 14], [35.5, 20, 40, 30]])
    np.testing.assert_array_equal(records[10]["labels"], [1, 0])


def test_coco_validation_holdout_is_deterministic(coco_files):
    folder, path, _ = coco_files
    first = data.load_source(f"coco:{folder}:{path}", valid_fraction=0.5)
    ids = {s: [int(r["image_id"]) for r in first.records(s)] for s in ("train", "valid")}
    assert len(ids["valid"]) == 2 and sorted(ids["train"] + ids["valid"]) == [10, 11, 12, 13]
    again = data.load_source(f"coco:{folder}:{path}", valid_fraction=0.5)
    assert [int(r["image_id"]) for r in again.records("valid")] == ids["valid"]
    with pytest.raises(ValueError, match="valid_fraction=1.5"):
        data.load_source(f"coco:{folder}:{path}", valid_fraction=1.5)


def test_coco_bad_files_are_named(coco_files):
    folder, path, content = coco_files
    (folder / "gray.png").write_bytes(b"this is no image")
    with pytest.raises(ValueError, match="gray.png.: not a readable image"):
        data.load_source(f"coco:{folder}:{path}")
    (folder / "gray.png").unlink()
    with pytest.raises(ValueError, match="gray.png.: not found"):
        data.load_source(f"coco:{folder}:{path}")
    _image(folder / "gray.png", "L", (21, 50), 0)
    with pytest.raises(ValueError, match="gray.png.*21x50.*20x50"):
        data.load_source(f"coco:{folder}:{path}")
    with pytest.raises(ValueError, match="not found.*nothere.json"):
        data.load_source(f"coco:{folder}:{folder / 'nothere.json'}")


def test_too_many_objects_names_image_and_count(coco_files):
    folder, path, _ = coco_files
    source = data.load_source(f"coco:{folder}:{path}", valid_fraction=0.0)
    # Counts known up front: raised before any batch, with the fields.
    with pytest.raises(TooManyObjectsError, match=r"rgb.jpg.*\(id 10\) has 2 objects.*max_"
                       r"objects=1.*num_queries") as raised:
        source.batches("train", batch_size=2, object_limit=ObjectLimit(1))
    error = raised.value
    assert isinstance(error, ValueError)
    assert (error.image_id, error.num_objects, error.max_objects) == (10, 2, 1)
    source.batches("train", batch_size=2, object_limit=ObjectLimit(2))  # fits
    with pytest.raises(TooManyObjectsError, match="embedded` train image .* has [4-6] objects"):
        data.load_source("embedded", num_train=30).batches(
            "train", batch_size=2, object_limit=ObjectLimit(3))


def test_images_over_the_object_limit_are_left_out_and_raised_by_the_callback(coco_files):
    folder, path, _ = coco_files
    source = data.load_source(f"coco:{folder}:{path}", valid_fraction=0.0)
    records = source.records("all")  # each pipeline below reads it anew
    counts = {int(r["image_id"]): len(r["labels"]) for r in records}
    assert counts == {10: 2, 11: 1, 12: 1, 13: 0}
    # Counts not known up front (as for tfds:): the pipeline leaves the image out ...
    limit = ObjectLimit(1)
    batches = make_batches(records, batch_size=4, object_limit=limit,
                           image_size=32, include_info=True)
    ids = [int(i) for _, _, info in batches for i in info["image_id"]]
    assert ids == [11, 12, 13]  # never truncated: image 10 is not there at all
    # ... and records it: `check` and the callback raise it with its fields.
    assert [(e.image_id, e.num_objects, e.max_objects) for e in limit.errors] == [(10, 2, 1)]
    with pytest.raises(TooManyObjectsError, match="Image id 10 has 2 objects.*max_objects=1"):
        limit.check()
    with pytest.raises(TooManyObjectsError, match="Image id 10"):
        limit.callback().on_train_batch_end(0)
    fine = ObjectLimit(2)
    assert len(list(make_batches(records, batch_size=4, object_limit=fine,
                                 image_size=32))) == 1
    fine.check()
    fine.callback().on_test_batch_end(0)  # nothing seen: no error
    with pytest.raises(ValueError, match="max_objects=0"):
        ObjectLimit(0)
    with pytest.raises(ValueError, match="object_limit=3"):
        make_batches(records, batch_size=4, object_limit=3)


def test_fit_stops_with_the_error_at_the_first_batch_after_the_image():
    import keras

    def gen():  # image 1 of 4 has 3 objects, over the limit of 2
        for i, n in enumerate([1, 3, 0, 2]):
            yield {"image": np.zeros((8, 8, 3), np.uint8),
                   "boxes": np.tile(np.float32([[1, 1, 4, 4]]), (n, 1)),
                   "labels": np.zeros(n, np.int32), "image_id": np.int64(100 + i)}

    records = tf.data.Dataset.from_generator(gen, output_signature={
        "image": tf.TensorSpec([None, None, 3], tf.uint8),
        "boxes": tf.TensorSpec([None, 4], tf.float32),
        "labels": tf.TensorSpec([None], tf.int32), "image_id": tf.TensorSpec([], tf.int64)})
    limit = ObjectLimit(2)
    batches = make_batches(records, batch_size=1, object_limit=limit, image_size=8)
    batches = batches.map(lambda x, y: (x["images"], y["boxes"][:, :1]))
    model = keras.Sequential([keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(4)])
    model.compile(optimizer="sgd", loss="mse")
    seen = []
    counter = keras.callbacks.LambdaCallback(on_train_batch_end=lambda b, logs: seen.append(b))
    with pytest.raises(TooManyObjectsError) as raised:
        model.fit(batches, epochs=1, verbose=0, shuffle=False,
                  callbacks=[counter, limit.callback()])
    assert (raised.value.image_id, raised.value.num_objects) == (101, 3)
    assert len(seen) < 3  # stopped, not after the whole epoch
