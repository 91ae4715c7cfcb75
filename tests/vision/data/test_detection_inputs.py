"""Detection inputs checked where they enter: COCO files, crowd regions, extreme aspect ratios."""

import contextlib
import io
import json
import re

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from vision.config import preset
from vision.data import augment
from vision.data import sources as data
from vision.data.batching import ObjectLimit, make_batches
from vision.training.evaluate import coco_evaluate, evaluate_records, match_labels

# --- crowd regions: our AP is pycocotools' on the file itself ---------------------------------

# Two images (distinct sizes, so each is its own `detect` call). Categories are listed out of
# id order; labels are contiguous in increasing id order: id 2 -> label 0, id 5 -> label 1.
CROWD_FILE = {
    "images": [{"id": 1, "file_name": "a.png", "width": 60, "height": 40},
               {"id": 2, "file_name": "b.png", "width": 50, "height": 30}],
    "categories": [{"id": 5, "name": "person"}, {"id": 2, "name": "car"}],
    "annotations": [
        {"id": 1, "image_id": 1, "category_id": 5, "bbox": [2, 2, 20, 20], "area": 400,
         "iscrowd": 0},
        {"id": 2, "image_id": 1, "category_id": 5, "bbox": [30, 5, 25, 30], "area": 750,
         "iscrowd": 1},
        {"id": 3, "image_id": 2, "category_id": 2, "bbox": [5, 5, 10, 10], "area": 100,
         "iscrowd": 0},
        {"id": 4, "image_id": 2, "category_id": 2, "bbox": [20, 2, 25, 25], "area": 625,
         "iscrowd": 1},
    ],
}
# (image_id, category_id, [x, y, w, h], score): a hit on each object, and detections on the
# crowd regions scored above them (false positives if the crowd regions were not ground truth).
DETECTIONS = [
    (1, 5, [2, 2, 20, 20], 0.8), (1, 5, [31, 6, 20, 25], 0.95), (1, 5, [33, 8, 10, 10], 0.9),
    (2, 2, [5, 5, 10, 10], 0.7), (2, 2, [21, 3, 22, 22], 0.85),
]


def _write_coco(folder, content):
    for image in content["images"]:
        Image.new("RGB", (image["width"], image["height"]), (image["id"], 0, 0)).save(
            folder / image["file_name"])
    path = folder / "ann.json"
    path.write_text(json.dumps(content))
    return path


def _pycocotools_on_file(path, detections):
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    with contextlib.redirect_stdout(io.StringIO()):
        gt = COCO(str(path))
        dt = gt.loadRes([{"image_id": i, "category_id": c, "bbox": b, "score": s}
                         for i, c, b, s in detections])
        evaluator = COCOeval(gt, dt, iouType="bbox")
        evaluator.evaluate()
        evaluator.accumulate()
        evaluator.summarize()
    return [round(float(v), 6) for v in evaluator.stats[:3]]


def _oracle(detections, label_of_category):
    """A `detect` returning the given detections of the image (found by its red pixel)."""
    def detect(images):
        image_id = int(images[0, 0, 0, 0])
        mine = [d for d in detections if d[0] == image_id]
        boxes = [[x, y, x + w, y + h] for _, _, (x, y, w, h), _ in mine]
        labels = [label_of_category.get(c, 0) for _, c, _, _ in mine]
        return {"boxes": np.array([boxes], np.float32), "labels": np.array([labels], np.int32),
                "scores": np.array([[s for *_, s in mine]], np.float32)}

    return detect


def test_crowd_regions_give_the_ap_of_pycocotools_on_the_same_file(tmp_path):
    path = _write_coco(tmp_path, CROWD_FILE)
    want = _pycocotools_on_file(path, DETECTIONS)
    source = data.load_source(f"coco:{tmp_path}:{path}", valid_fraction=0.0)
    records = list(source.records("all").as_numpy_iterator())
    # The crowd regions are no training targets ...
    assert [len(r["labels"]) for r in records] == [1, 1]
    np.testing.assert_allclose(records[0]["crowd_boxes"], [[30, 5, 55, 35]])
    np.testing.assert_array_equal(records[0]["crowd_labels"], [1])
    batches = source.batches("all", batch_size=2, object_limit=ObjectLimit(3), image_size=16)
    assert np.asarray(next(iter(batches))[1]["valid"]).sum() == 2
    # ... but evaluation ground truth, exactly as pycocotools reads them from the file.
    labels = dict(zip(source.category_ids, range(source.num_classes)))
    scores = evaluate_records(_oracle(DETECTIONS, labels), source.records("all"),
                              progress=False, num_classes=source.num_classes)
    assert [scores[k] for k in ("AP", "AP50", "AP75")] == want and scores["n"] == 2
    assert want[0] == 1.0
    # Without the crowd regions the detections on them are false positives: a lower AP.
    stripped = [{k: v for k, v in r.items() if not k.startswith("crowd")} for r in records]
    dropped = evaluate_records(_oracle(DETECTIONS, labels), stripped, progress=False)
    assert dropped["AP"] < want[0]


def test_to_coco_writes_crowd_regions_with_iscrowd():
    gt = [{"image_id": 3, "height": 10, "width": 10, "boxes": np.zeros((0, 4)),
           "labels": np.zeros(0), "crowd_boxes": [[1, 1, 4, 5]], "crowd_labels": [2]}]
    scores = coco_evaluate(gt, [{"image_id": 3, "boxes": [[1, 1, 4, 5]], "scores": [0.9],
                                 "labels": [2]}])
    assert scores["AP"] is None  # only crowd ground truth: nothing to find, COCO's -1


# --- the model's labels mapped to the data's ---------------------------------------------------

def test_labels_match_by_category_id_then_name_or_are_refused_naming_both_lists():
    ids = match_labels(["car", "person"], [2, 5], ["person", "car"], [5, 2])
    np.testing.assert_array_equal(ids, [1, 0])
    names = match_labels(["circle", "square", "triangle"], None,
                         ["triangle", "circle", "square"], [1, 2, 3])
    np.testing.assert_array_equal(names, [1, 2, 0])
    with pytest.raises(ValueError, match=r"category ids and names.*model \[2: 'car', 5: "
                       r"'person'\], data \[2: 'car', 7: 'person'\]"):
        match_labels(["car", "person"], [2, 5], ["car", "person"], [2, 7])
    with pytest.raises(ValueError, match=r"model \[2: 'car', 5: 'person'\], data \[2: 'person'"):
        match_labels(["car", "person"], [2, 5], ["person", "car"], [2, 5])  # names swapped
    with pytest.raises(ValueError, match=r"class names.*model \['a', 'b'\], data \['a', 'c'\]"):
        match_labels(["a", "b"], None, ["a", "c"], None)
    with pytest.raises(ValueError, match=r"model \['a', 'b'\], data \['a'\]"):
        match_labels(["a", "b"], None, ["a"], None)


def test_mapped_labels_give_the_ap_of_pycocotools_on_the_file(tmp_path):
    """A model whose label 0 is "person" (the data's label 1) scored through the mapping."""
    path = _write_coco(tmp_path, CROWD_FILE)
    source = data.load_source(f"coco:{tmp_path}:{path}", valid_fraction=0.0)
    model_label = {5: 0, 2: 1}  # the model's own order: person, car
    label_map = match_labels(["person", "car"], None, source.class_names, source.category_ids)
    scores = evaluate_records(_oracle(DETECTIONS, model_label), source.records("all"),
                              progress=False, num_classes=2, label_map=label_map)
    assert [scores[k] for k in ("AP", "AP50", "AP75")] == _pycocotools_on_file(path, DETECTIONS)
    unmapped = evaluate_records(_oracle(DETECTIONS, model_label), source.records("all"),
                                progress=False, num_classes=2)
    assert unmapped["AP"] < scores["AP"]


# --- COCO files: every malformed entry named where it is read ----------------------------------

def _entry_cases():
    def annotation(**changes):
        return lambda c: c["annotations"][1].update(changes)

    def replace(key, value):
        return lambda c: c.__setitem__(key, value)

    return [
        ("bbox null", annotation(bbox=None), r"annotations\[1\] \(id 2\) of image 'a.png' has "
         r"bbox=None; expected \[x, y, width, height\]"),
        ("bbox with null", annotation(bbox=[None, 1, 2, 3]),
         r"annotations\[1\] \(id 2\) of image 'a.png' has bbox=\[None, 1, 2, 3\]"),
        ("bbox a", annotation(bbox=["a", 1, 2, 3]),
         r"annotations\[1\] \(id 2\) of image 'a.png' has bbox=\['a', 1, 2, 3\]"),
        ("bbox NaN", annotation(bbox=[float("nan"), 1, 2, 3]), r"annotations\[1\].*bbox=\[nan"),
        ("bbox of 3", annotation(bbox=[1, 2, 3]), r"annotations\[1\].*bbox=\[1, 2, 3\]"),
        ("no bbox", lambda c: c["annotations"][1].pop("bbox"),
         r"annotations\[1\] \(id 2\) of image 'a.png' has no 'bbox'"),
        ("not an object", lambda c: c["annotations"].__setitem__(1, [1, 2]),
         r"annotations\[1\] must be an object\. Received: \[1, 2\]"),
        ("unknown category", annotation(category_id=9),
         r"annotations\[1\] \(id 2\) of image 'a.png' names unknown category_id=9.*\[2, 5\]"),
        ("unknown image", annotation(image_id=[1]), r"annotations\[1\].*unknown image_id=\[1\]"),
        ("iscrowd text", annotation(iscrowd="yes"), r"annotations\[1\].*iscrowd='yes'"),
        ("annotations not a list", replace("annotations", {"id": 1}),
         r"'annotations' must be a list\. Received: dict"),
        ("categories not a list", replace("categories", "car"), r"'categories' must be a list"),
        ("no categories", replace("categories", []), r"'categories' is empty"),
        ("image without file_name", lambda c: c["images"][1].pop("file_name"),
         r"images\[1\] \(id 2\) needs a 'file_name' string"),
        ("image not an object", lambda c: c["images"].__setitem__(0, "a.png"),
         r"images\[0\] must be an object"),
        ("image width text", lambda c: c["images"][1].update(width="50"),
         r"images\[1\] \('b.png'\) has width='50'"),
        ("repeated image id", lambda c: c["images"][1].update(id=1), r"id 1 is repeated"),
        ("no images", replace("images", []), r"'images' is empty: no images to train on"),
        ("not a COCO file", replace("images", None), r"no 'images' list"),
    ]


@pytest.mark.parametrize("name, change, message", _entry_cases(), ids=[c[0] for c in
                                                                         _entry_cases()])
def test_malformed_coco_entries_are_named_with_file_and_index(tmp_path, name, change, message):
    content = json.loads(json.dumps(CROWD_FILE))
    _write_coco(tmp_path, content)
    change(content)
    path = tmp_path / "ann.json"
    path.write_text(json.dumps(content))
    with pytest.raises(ValueError, match=message) as raised:
        data.load_source(f"coco:{tmp_path}:{path}")
    assert str(path) in str(raised.value)


def test_annotations_path_that_is_a_folder_is_named(tmp_path):
    with pytest.raises(ValueError, match=f"folder, not a JSON file: '{re.escape(str(tmp_path))}'"):
        data.load_source(f"coco:{tmp_path}:{tmp_path}")


# --- extreme aspect ratios: at least one pixel per side everywhere -----------------------------

def test_resize_keeps_at_least_one_pixel_per_side():
    for (h, w), want in [((10, 5000), (1, 128)), ((5000, 10), (128, 1)), ((1, 1), (128, 128)),
                         ((20, 5000), (1, 250))]:
        got = augment.resized_shape(h, w, 128, 128)
        assert tuple(int(v) for v in got) == want, (h, w)
    # DETR's own formula wherever it gives a size (20 x 5000 above: the capped side rounds
    # to 1, and the longer side is DETR's 250 > max_size).
    assert tuple(int(v) for v in augment.resized_shape(10, 1500, 800, 1333)) == (9, 1350)
    assert tuple(int(v) for v in augment.resized_shape(10, 5000, 77)) == (77, 38500)


def _extreme_records():
    images = [np.full((10, 5000, 3), 90, np.uint8), np.full((5000, 10, 3), 30, np.uint8)]
    boxes = [np.array([[100, 2, 400, 8]], np.float32), np.array([[1, 10, 9, 900]], np.float32)]

    def gen():
        for i, (image, box) in enumerate(zip(images, boxes)):
            yield {"image": image, "boxes": box, "labels": np.array([i], np.int32),
                   "image_id": np.int64(i)}

    return tf.data.Dataset.from_generator(gen, output_signature={
        "image": tf.TensorSpec([None, None, 3], tf.uint8), "boxes": tf.TensorSpec([None, 4]),
        "labels": tf.TensorSpec([None], tf.int32), "image_id": tf.TensorSpec([], tf.int64)})


def test_a_5000x10_image_trains_and_evaluates():
    from vision.export.saved_model import make_detect_fn
    from vision.modeling.detr import build_criterion, build_model
    from vision.modeling.optimizer import build_optimizer

    config = preset("tiny", hidden_dim=16, num_heads=2, ffn_dim=32, num_queries=4,
                    tiny_filters=(8, 8, 16), num_encoder_layers=1, num_decoder_layers=1,
                    image_size=32, max_image_size=48)
    for seed in range(2):  # both branches of DETR's augmentation (plain, crop) are taken
        batches = make_batches(_extreme_records(), batch_size=1, object_limit=ObjectLimit(4),
                               training=True, seed=seed, image_size=32, max_size=48)
        for inputs, _ in batches:
            assert min(inputs["images"].shape[1:3]) >= 1
    plain = make_batches(_extreme_records(), batch_size=1, object_limit=ObjectLimit(4),
                         image_size=32, max_size=48)
    assert [tuple(x["images"].shape[1:3]) for x, _ in plain] == [(1, 48), (48, 1)]
    # One training step on both (one batch padded to 48 x 48, so one trace: fast).
    model = build_model(config, 2)
    model.compile(optimizer=build_optimizer(config, model), criterion=build_criterion(config, 2),
                  run_eagerly=True)  # one step: tracing the graph would take most of the time
    batches = make_batches(_extreme_records(), batch_size=2, object_limit=ObjectLimit(4),
                           training=True, image_size=32, max_size=48, augmentation="none")
    history = model.fit(batches, epochs=1, steps_per_epoch=1, shuffle=False, verbose=0).history
    assert np.isfinite(history["loss"][0])
    detect = make_detect_fn(model, config.image_size, config.max_image_size)
    scores = evaluate_records(detect, _extreme_records(), progress=False, num_classes=2)
    assert scores["n"] == 2 and 0.0 <= scores["AP"] <= 1.0
